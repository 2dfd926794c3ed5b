package trainer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/trainer/tensorboard"
)

// measure fills a step's measured step time (stepS seconds) and what follows
// from it by the plan's FLOP count: TFLOP/s per device (the model's FLOPs of
// a step, ModelFLOPs, over the ranks and the step time) and MFU (that over
// the device's peak, PeakFLOPS: the profile's, or parallel.device_peak_tflops),
// with the plan's predictions of the three beside them. The plan's own MFU is
// the same quotient over its predicted step time.
func measure(met *Metrics, plan *parallel.Plan, stepS float64) {
	perDevice := plan.ModelFLOPs / float64(plan.Mesh.World)
	peak := plan.Topology.Device.PeakFLOPS
	met.StepS, met.StepSPlan = stepS, plan.StepTimeS
	if stepS > 0 {
		met.TFLOPS = perDevice / stepS / 1e12
		if peak > 0 {
			met.MFU = perDevice / stepS / peak
		}
	}
	if plan.StepTimeS > 0 {
		met.TFLOPSPlan = perDevice / plan.StepTimeS / 1e12
	}
	met.MFUPlan = plan.MFU
}

// tensorboardGroups puts a metrics.jsonl key under a TensorBoard section
// ("section/key"): the validation loss under eval, speed under perf, memory
// under memory, everything else under train.
var tensorboardGroups = map[string]string{
	"val_loss":     "eval",
	"tokens_per_s": "perf", "step_s": "perf", "step_s_plan": "perf", "tflops": "perf", "tflops_plan": "perf", "mfu": "perf", "mfu_plan": "perf",
	"mem_held": "memory", "mem_plan": "memory",
}

// scalarsOf is a metrics.jsonl line as TensorBoard scalars: every number of
// the line but its step, tagged "section/key" (tensorboardGroups), a value
// written as null because it was not finite as NaN, and a true flag
// (skipped) as 1; sorted by tag. It reads the line as JSON, so that every
// scalar metrics.jsonl holds, now or later, is in the events too.
func scalarsOf(line []byte) ([]tensorboard.Scalar, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(line, &m); err != nil {
		return nil, err
	}
	var nonFinite []string
	if raw, ok := m["nonfinite"]; ok {
		if err := json.Unmarshal(raw, &nonFinite); err != nil {
			return nil, fmt.Errorf("nonfinite: %w", err)
		}
	}
	var out []tensorboard.Scalar
	for k, raw := range m {
		if k == "step" || k == "nonfinite" {
			continue
		}
		if k == "data" {
			// What each data source gave so far: data/SOURCE/samples, tokens
			// and epochs (SOURCE is data.path for the one path).
			var srcs []SourceConsumed
			if err := json.Unmarshal(raw, &srcs); err != nil {
				return nil, fmt.Errorf("data: %w", err)
			}
			for _, s := range srcs {
				name := "data/" + sourceTag(s.Source) + "/"
				out = append(out, tensorboard.Scalar{Tag: name + "samples", Value: float32(s.Samples)},
					tensorboard.Scalar{Tag: name + "tokens", Value: float32(s.Tokens)}, tensorboard.Scalar{Tag: name + "epochs", Value: float32(s.Epochs)})
			}
			continue
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		var x float64
		switch v := v.(type) {
		case float64:
			x = v
		case bool:
			if !v {
				continue
			}
			x = 1
		case nil:
			if !slices.Contains(nonFinite, k) {
				continue
			}
			x = math.NaN()
		default:
			continue
		}
		group := tensorboardGroups[k]
		if group == "" {
			group = "train"
		}
		out = append(out, tensorboard.Scalar{Tag: group + "/" + k, Value: float32(x)})
	}
	slices.SortFunc(out, func(a, b tensorboard.Scalar) int { return strings.Compare(a.Tag, b.Tag) })
	return out, nil
}

// sourceTag names a data source in TensorBoard tags: its path as the recipe
// gives it, or data.path for the one path (recorded as "").
func sourceTag(source string) string {
	if source == "" {
		return "data.path"
	}
	return source
}

// eventsName is the name of the TensorBoard event file a run writes when it
// starts at started on host (tensorboard.FileName); "" when
// logging.tensorboard is off.
func eventsName(on bool, started time.Time, host string) string {
	if !on {
		return ""
	}
	return tensorboard.FileName(started, host)
}

// openEvents starts rank 0's TensorBoard event file (logging.tensorboard),
// named as run.json records it: written whole, atomically, with the version
// event and the steps the run already has (a resume's, read from
// metrics.jsonl: their wall time is now), then opened for appending, never
// through a link. A resume in place then removes the event file its run
// directory's run.json named before (the steps past the checkpoint, which
// this run trains again, would otherwise show twice).
func (t *run) openEvents() error {
	o := t.opts.own
	if o == nil || o.events == "" {
		return nil
	}
	path := filepath.Join(t.dir, o.events)
	now := time.Now()
	var buf bytes.Buffer
	w := tensorboard.NewWriter(&buf)
	if err := w.Version(now); err != nil {
		return err
	}
	for _, m := range t.curve {
		line, err := json.Marshal(m)
		if err != nil {
			return err
		}
		vals, err := scalarsOf(line)
		if err != nil {
			return err
		}
		if err := w.Scalars(now, int64(m.Step), vals); err != nil {
			return err
		}
	}
	if err := fileio.WriteAtomic(path, buf.Bytes()); err != nil {
		return fmt.Errorf("writing the TensorBoard events: %w", err)
	}
	f, err := fileio.OpenAppend(path)
	if err != nil {
		return fmt.Errorf("writing the TensorBoard events: %w", err)
	}
	t.eventsFile, t.events = f, tensorboard.NewWriter(f)
	if old := o.oldEvents; old != "" && old != o.events && ownEventsName(old) {
		if err := removeFile(filepath.Join(t.dir, old)); err != nil {
			return fmt.Errorf("removing the TensorBoard events of the run before the resume: %w", err)
		}
	}
	return nil
}

// ownEventsName says whether a name run.json gives for the run's event file
// is one shardline writes: a plain file name beginning events.out.tfevents.
// (run.json is a file anyone may edit: any other name is left alone).
func ownEventsName(name string) bool {
	return strings.HasPrefix(name, tensorboard.FilePrefix) && name == filepath.Base(name) && !strings.ContainsAny(name, `/\`)
}

// removeFile removes a regular file or a link (the link itself); a missing
// one is no error, and anything else (a directory) is left alone.
func removeFile(path string) error {
	st, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case !st.Mode().IsRegular() && st.Mode()&fs.ModeSymlink == 0:
		return nil
	}
	return os.Remove(path)
}

// writeEvents writes a recorded step's metrics line (line, as metrics.jsonl
// holds it) to the event file, if the run writes one.
func (t *run) writeEvents(step int, line []byte) error {
	if t.events == nil {
		return nil
	}
	vals, err := scalarsOf(line)
	if err == nil {
		err = t.events.Scalars(time.Now(), int64(step), vals)
	}
	if err != nil {
		return fmt.Errorf("writing the TensorBoard events %s: %w", t.eventsFile.Name(), err)
	}
	return nil
}

// closeMetrics closes metrics.jsonl and the event file.
func (t *run) closeMetrics() {
	if t.metrics != nil {
		t.metrics.Close()
	}
	if t.eventsFile != nil {
		t.eventsFile.Close()
	}
}
