package trainer

import (
	"context"
	"fmt"
	"slices"

	"github.com/shardline/shardline/parallel/comm"
)

// The training loop's policies, each a type of its own so that train reads
// as policy: when a run evaluates (evalPolicy), how a logging interval's step
// statistics come back and what a non-finite step does (statsDrain), and when
// checkpoints are taken and committed (checkpointer's due, and the run's
// boundary, saveAt and saveAtEnd).

// evalPolicy says when a run evaluates on the validation split: every
// interval steps and at the last step, on rank 0 alone unless evaluation
// needs every rank (collective: run.collectiveEval).
type evalPolicy struct {
	interval, steps  int
	lead, collective bool
	hasVal           bool // the validation split holds more than a sequence
}

// due says whether this rank evaluates after step done (steps count from 1).
func (e evalPolicy) due(done int) bool {
	return e.interval > 0 && (done%e.interval == 0 || done == e.steps) && (e.lead || e.collective)
}

// finalTogether says whether every rank evaluates once more at the end of
// the run: the last step did not (lastEvaluated), there is a validation
// split and evaluation needs every rank (rank 0 evaluates alone otherwise,
// where its result has none).
func (e evalPolicy) finalTogether(lastEvaluated bool) bool {
	return !lastEvaluated && e.hasVal && e.collective
}

// statsDrain reads the pending steps' statistics back (once per logging
// interval, and before an evaluation is recorded, a checkpoint is saved or
// the run ends) and handles them in order: a step whose loss or gradient
// norm is not finite was not applied (the kernels skip its update); it ends
// the run unless skipNonfinite, and rank 0 records every step. Every rank
// reads the same all-reduced values, so every rank stops alike.
type statsDrain struct {
	skipNonfinite bool
	lead          bool
	interval      int // logging.interval
	steps         int // train.steps
	// read returns the pending steps' metrics and the optimizer steps applied
	// by the end of the last; record writes a step's metrics line (rank 0);
	// stop ends the run on non-finite step met, good being the last finite
	// one; skipped reports a step skipped under skipNonfinite.
	read    func() ([]Metrics, int, error)
	record  func(met Metrics) error
	stop    func(met, good Metrics) error
	skipped func(met Metrics)

	last        Metrics // the last step recorded (rank 0)
	good        Metrics // the last step whose loss and gradient were finite
	lastSkipped bool    // the last step read was skipped
	optSteps    int     // optimizer steps applied, as of the last read
}

// due says whether the statistics come back after step done: a logging
// interval is over, the history is full, an evaluation is to be recorded
// (evaluated), a checkpoint to be saved (saving), or it is the last step.
func (d *statsDrain) due(done int, full, evaluated, saving bool) bool {
	return full || done%d.interval == 0 || done == d.steps || evaluated || saving
}

// drain reads the pending steps back and handles them; val is the last
// step's validation loss (nil: none).
func (d *statsDrain) drain(val *float64) error {
	steps, applied, err := d.read()
	if err != nil {
		return err
	}
	d.optSteps = applied
	for i := range steps {
		met := steps[i]
		if i == len(steps)-1 {
			met.ValLoss = val
		}
		if met.Skipped {
			if !d.skipNonfinite {
				return d.stop(met, d.good)
			}
			d.lastSkipped = true
			d.skipped(met)
		} else {
			d.good, d.lastSkipped = met, false
		}
		if d.lead {
			if err := d.record(met); err != nil {
				return err
			}
			d.last = met
		}
	}
	return nil
}

// newStatsDrain is the run's drain: the backend's history read back
// (readStats), metrics.jsonl and the console (record), and, on a non-finite
// step, a save of an earlier step still in flight finished before the run
// ends (nonFinite).
func (t *run) newStatsDrain(world comm.Communicator) *statsDrain {
	r := t.r
	d := &statsDrain{skipNonfinite: r.Train.SkipNonfinite, lead: t.rank == 0, interval: r.Logging.Interval, steps: r.Train.Steps,
		read: t.readStats, record: t.record}
	d.stop = func(met, good Metrics) error {
		// Every rank meets the same all-reduced loss here: a save of an earlier,
		// finite step still in flight is finished first.
		if err := t.finishSave(world); err != nil {
			return err
		}
		return t.nonFinite(fmt.Errorf("step %d: %w (loss %v, grad_norm %v); %s; lower train.lr or set train.skip_nonfinite = true",
			met.Step, ErrNonFinite, met.Loss, met.GradNorm, describeGood(good)))
	}
	d.skipped = func(met Metrics) {
		t.log.Warn().Int("step", met.Step).Float64("loss", met.Loss).Msg("non-finite step skipped (train.skip_nonfinite)")
	}
	if len(t.curve) > 0 { // resumed: the steps before the checkpoint
		d.last, d.good = t.curve[len(t.curve)-1], t.goodAtEnd()
	}
	return d
}

// due says whether a checkpoint is taken after step done: every interval
// steps, or when the boundary before the step found interval_minutes passed
// on rank 0's clock (none without a checkpointer).
func (c *checkpointer) due(done int) bool {
	return c != nil && ((c.interval > 0 && done%c.interval == 0) || c.timeDue)
}

// boundary is what the ranks agree on before step, in one all-reduce: how
// many ranks are interrupted (a signal to any rank's process, or StopAfter on
// rank 0), whether every rank has written the pending checkpoint's file,
// which is then committed, or one failed to, which ends the run, and whether
// rank 0's clock says a checkpoint is due after this step
// (checkpoint.interval_minutes: one clock decides for every rank).
func (t *run) boundary(ctx context.Context, world comm.Communicator, step int) (interrupted int, err error) {
	flag := t.bufs.flag // ranks interrupted; ranks whose pending file is written; ranks whose write failed; a save by time
	flag[0], flag[1], flag[2], flag[3] = 0, 0, 0, 0
	if ctx.Err() != nil || (t.rank == 0 && t.opts.StopAfter > 0 && step >= t.opts.StopAfter) {
		flag[0] = 1
	}
	if t.ckpt.timeUp() {
		flag[3] = 1
	}
	var pending *pendingSave
	if t.ckpt != nil {
		pending = t.ckpt.pending
	}
	if pending != nil {
		if pending.poll(); pending.finished {
			flag[1], flag[2] = 1, float32(btoi(pending.err != nil))
		}
	}
	if err := world.AllReduce(flag); err != nil {
		return 0, err
	}
	if t.ckpt != nil {
		t.ckpt.timeDue = t.ckpt.timeDue || flag[3] > 0
	}
	if flag[2] > 0 {
		return 0, saveFailed(pending)
	}
	if pending != nil && int(flag[1]) == world.Size() {
		if err := t.commitSave(world); err != nil {
			return 0, err
		}
	}
	return int(flag[0]), nil
}

// saveAt takes a checkpoint of step done (after optSteps updates): a save
// still in flight is finished first, and this one is written in the
// background.
func (t *run) saveAt(world comm.Communicator, done, optSteps int) error {
	if err := t.finishSave(world); err != nil {
		return err
	}
	t.startSave(done, optSteps)
	return nil
}

// saveAtEnd takes the run's last checkpoint, at the end or on an interrupt
// (the state as it is, unless just saved), and waits for it.
func (t *run) saveAtEnd(world comm.Communicator, done, optSteps int) error {
	if t.ckpt == nil {
		return nil
	}
	if t.ckpt.saved != done {
		if err := t.saveAt(world, done, optSteps); err != nil {
			return err
		}
	}
	return t.finishSave(world)
}

// planCheckSteps is the steps after which a run logs the plan's step time
// beside the measured one (checkPlan): the first, which warms caches up, and
// five measured.
const planCheckSteps = 6

// planCheckLimit is how far (either way) the measured step time may stray
// from the plan's before checkPlan warns.
const planCheckLimit = 1.25

// checkPlan logs the plan's step time beside the median of the steps measured
// so far (rates, tokens/s of each step, the first left out unless alone; a
// step holds tokens tokens), with the time model that planned it, so that a
// wrong prediction shows after the first few steps; beyond planCheckLimit
// either way it warns, naming what would time the plan on this machine.
func (t *run) checkPlan(tokens float64, rates []float64) {
	planned := t.plan.StepTimeS
	rate := median(slices.Clone(rates[min(1, max(len(rates)-1, 0)):]))
	if !(planned > 0) || !(rate > 0) {
		return
	}
	measured := tokens / rate
	ratio := measured / planned
	ev := t.log.Info()
	msg := "step time against the plan"
	if ratio > planCheckLimit || ratio < 1/planCheckLimit {
		ev = t.log.Warn()
		msg = "step time against the plan: the plan is off; on the CPU, shardline calibrate -o FILE times plans on this machine (SHARDLINE_CALIBRATION=FILE), or the machine is busy with other work"
	}
	ev.Int("steps", len(rates)).Float64("planned_step_s", round4(planned)).Float64("measured_step_s", round4(measured)).
		Float64("measured/planned", round4(ratio)).Str("time_model", t.plan.TimeModel).Msg(msg)
}
