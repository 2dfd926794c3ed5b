package trainer

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/trainer/optim"
)

// DeviceEngine runs whole training steps on an accelerator (the GPU runner built
// with -tags cuda provides one; the trainer cannot import it, since the binary
// that lints and plans must start without a GPU). The trainer keeps everything
// else: data, schedule, metrics, evaluation, the run directory and the outputs.
// One rank, the whole model on the device.
type DeviceEngine interface {
	// Name says what runs the steps (device, driver, libraries), for logs and run.json.
	Name() string
	// Start binds the engine to the recipe's model at micro-batch B of T tokens and
	// uploads the initial weights (table order).
	Start(r *config.Recipe, table []parallel.Param, weights [][]float32, B, T int) error
	// Step runs micro forward and backward passes (batch fills micro-batch mb),
	// accumulating the gradient of scale·Σ token losses, reads the loss sum and the
	// gradient norm back once, and, when both are finite, clips to clip and takes
	// one AdamW step at lr (train.* hyper-parameters from Start's recipe).
	Step(batch func(mb int, tokens, targets []int32), micro int, scale, lr, clip float64) (DeviceStep, error)
	// Eval is the loss sum and token count of one batch (forward only).
	Eval(tokens, targets []int32) (sum float64, count int, err error)
	// Logits returns the logits (V) at position k−1 of a window of seq_len tokens
	// (the first k real), for sampling; it may run a whole batch.
	Logits(window []int32, k int) ([]float32, error)
	// Weights downloads the fp32 main weights into dst (table order).
	Weights(dst [][]float32) error
	// State downloads what a checkpoint holds, in table order: the fp32 main
	// weights and AdamW's two moments into main, m and v, and returns the
	// updates taken (the bias corrections' step count).
	State(main, m, v [][]float32) (optSteps int, err error)
	// Restore continues a run from a checkpoint after Start (which uploaded its
	// main weights): AdamW's moments (table order) and the updates taken.
	Restore(m, v [][]float32, optSteps int) error
	// Held is the device memory held, by the plan's components.
	Held() Memory
	Close()
}

// DeviceStep is what one step on a device reports.
type DeviceStep struct {
	LossSum  float64
	Count    int
	GradNorm float64
	AuxLoss  float64 // MoE load-balancing loss (times its coefficient), mean over micro-batches
	Dropped  int     // routed copies dropped past expert capacity, over micro-batches
	Updated  bool    // false when the loss or gradient was not finite
}

// trainDevice is train's loop for a run whose steps execute on opts.Device,
// from startStep (after optSteps updates) when resumed. Checkpoints are the CPU
// runs' (one rank): the state comes back from the device into the rank's shards
// and is written in the background; a resumed run's moments go up to the device.
func (t *run) trainDevice(ctx context.Context, out *Result, world comm.Communicator, startStep, optSteps int) (*Result, error) {
	r, eng := t.r, t.opts.Device
	if t.st.perUnit {
		if err := t.st.gatherFull(); err != nil {
			return nil, err
		}
	}
	B, T := r.Train.MicroBatchSize, r.Model.SeqLen
	views := t.st.floatViews() // the engine takes fp32 values and keeps its own storage
	if err := eng.Start(r, t.plan.Params, views, B, T); err != nil {
		return nil, err
	}
	defer eng.Close()
	t.openCheckpointer(startStep)
	// The optimizer's state in the rank's shards, table order, for checkpoints
	// and resuming.
	main, mom, vel, err := t.st.tableViews()
	if err != nil {
		return nil, err
	}
	if startStep > 0 {
		if err := eng.Restore(mom, vel, optSteps); err != nil {
			return nil, fmt.Errorf("resuming on %s: %w", eng.Name(), err)
		}
	}
	// save reads the device's state back into the shards and writes it as the
	// checkpoint of step done, in the background (after the previous one is
	// committed).
	save := func(done int) error {
		if err := t.finishSave(world); err != nil {
			return err
		}
		n, err := eng.State(main, mom, vel)
		if err != nil {
			return fmt.Errorf("checkpoint of step %d: reading the state back from %s: %w", done, eng.Name(), err)
		}
		t.startSave(done, n)
		return nil
	}
	if t.metrics, err = t.openMetrics(startStep); err != nil {
		return nil, err
	}
	defer t.metrics.Close()
	out.UnigramBits = unigramEntropy(t.ds.Train, t.ds.Tok.VocabSize())
	sched := optim.Schedule{Peak: r.Train.LR, Warmup: r.Train.WarmupSteps, Steps: r.Train.Steps, MinFactor: r.Train.MinLRFactor, Decay: r.Train.LRSchedule,
		DecaySteps: r.Train.LRDecaySteps}
	micro := t.plan.MicroBatches
	scale := 1 / float64(micro*B*T)
	if !r.FSDP.CalculatePerTokenLoss {
		scale = 1 / float64(B*T) / float64(micro)
	}
	t.log.Info().Str("dir", t.dir).Str("device", eng.Name()).Int64("parameters", t.plan.ParamsTotal).
		Int("train_tokens", t.ds.Train.Len()).Int("val_tokens", t.ds.Val.Len()).Str("plan", t.plan.Fingerprint).Msg("training")
	var last, good Metrics
	if len(t.curve) > 0 { // resumed: the steps before the checkpoint
		last, good = t.curve[len(t.curve)-1], t.goodAtEnd()
	}
	var rates []float64
	lastSkipped, lastEvaluated := false, false
	start := time.Now()
	done := startStep
	for step := startStep; step < r.Train.Steps; step++ {
		if c := t.ckpt; c != nil && c.pending != nil { // commit a save whose file is written
			if c.pending.poll(); c.pending.finished {
				if err := t.finishSave(world); err != nil {
					return nil, err
				}
			}
		}
		if ctx.Err() != nil || (t.opts.StopAfter > 0 && step >= t.opts.StopAfter) {
			out.Interrupted = true
			t.log.Warn().Int("step", step).Msg("interrupted: writing what the run has so far")
			break
		}
		t0 := time.Now()
		lr := sched.LR(step)
		res, err := eng.Step(func(mb int, tokens, targets []int32) {
			t.ds.TrainSampler.Fill(tokens, targets, (step*micro+mb)*B, B)
		}, micro, scale, lr, r.Train.ClipGrad)
		if err != nil {
			return nil, fmt.Errorf("step %d on %s: %w", step+1, eng.Name(), err)
		}
		loss := res.LossSum / float64(res.Count)
		met := Metrics{Step: step + 1, Loss: loss, LR: lr, GradNorm: res.GradNorm, MemHeld: eng.Held().Total, MemPlan: t.plan.Memory.Total}
		if r.Model.MoE.NumExperts > 0 {
			aux, dropped := res.AuxLoss, res.Dropped
			met.AuxLoss, met.Dropped = &aux, &dropped
		}
		if !res.Updated {
			if !r.Train.SkipNonfinite {
				if err := t.finishSave(world); err != nil { // a save of an earlier, finite step
					return nil, err
				}
				return nil, t.nonFinite(fmt.Errorf("step %d: %w (loss %v, grad_norm %v); %s; lower train.lr or set train.skip_nonfinite = true",
					step+1, ErrNonFinite, loss, res.GradNorm, describeGood(good)))
			}
			met.Skipped, lastSkipped = true, true
			t.log.Warn().Int("step", step+1).Float64("loss", loss).Msg("non-finite step skipped (train.skip_nonfinite)")
		} else {
			good, lastSkipped = met, false
		}
		met.TokensPerS = float64(micro*B*T) / time.Since(t0).Seconds()
		rates = append(rates, met.TokensPerS)
		lastEvaluated = false
		if ev := r.Train.EvalInterval; ev > 0 && ((step+1)%ev == 0 || step+1 == r.Train.Steps) && t.ds.Val.Len() > T {
			v, err := t.evaluateDevice()
			if err != nil {
				return nil, err
			}
			met.ValLoss, lastEvaluated = &v, true
		}
		if err := t.record(met); err != nil {
			return nil, err
		}
		if t.opts.Progress != nil {
			t.showProgress(step+1, met.Loss, start)
		}
		last, done = met, step+1
		if c := t.ckpt; c != nil && c.interval > 0 && done%c.interval == 0 && !lastSkipped {
			if err := save(done); err != nil {
				return nil, err
			}
		}
	}
	if lastSkipped {
		if err := t.finishSave(world); err != nil { // a save of an earlier, finite step
			return nil, err
		}
		return nil, t.nonFinite(fmt.Errorf("the run ended on non-finite steps (skipped by train.skip_nonfinite): %w; %s; lower train.lr", ErrNonFinite, describeGood(good)))
	}
	if c := t.ckpt; c != nil {
		// At the end, and on an interrupt: the state as it is, unless just saved.
		if c.saved != done {
			if err := save(done); err != nil {
				return nil, err
			}
		}
		if err := t.finishSave(world); err != nil {
			return nil, err
		}
	}
	if t.opts.Progress != nil {
		fmt.Fprintln(t.opts.Progress)
	}
	out.Steps, out.FinalLoss = last.Step, last.Loss
	if last.ValLoss != nil {
		out.FinalValLoss = last.ValLoss
	} else if !lastEvaluated && t.ds.Val.Len() > T {
		v, err := t.evaluateDevice()
		if err != nil {
			return nil, err
		}
		out.FinalValLoss = &v
	}
	if v := out.FinalValLoss; v != nil && (math.IsNaN(*v) || math.IsInf(*v, 0)) {
		return nil, t.nonFinite(fmt.Errorf("the final validation loss is %v: %w; %s; lower train.lr", *v, ErrNonFinite, describeGood(good)))
	}
	if len(rates) > 0 {
		out.TokensPerS = median(rates[min(1, len(rates)-1):])
	}
	if err := eng.Weights(views); err != nil {
		return nil, err
	}
	t.deviceHeld = eng.Held()
	t.finalTable, t.finalViews = t.plan.Params, views // one GPU: the whole model
	return out, t.finish(out)
}

// evaluateDevice is evaluate on the device.
func (t *run) evaluateDevice() (float64, error) {
	var sum float64
	var count int
	var err error
	t.evalBatches(func(_ int, tokens, targets []int32) {
		if err == nil {
			var s float64
			var n int
			s, n, err = t.opts.Device.Eval(tokens, targets)
			sum, count = sum+s, count+n
		}
	})
	return sum / float64(count), err
}
