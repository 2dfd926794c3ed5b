package trainer

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/trainer/ckpt"
	"github.com/shardline/shardline/trainer/tensorboard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// metricsLines reads a run's metrics.jsonl, each line as JSON values by key.
func metricsLines(t *testing.T, dir string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(must(os.ReadFile(filepath.Join(dir, "metrics.jsonl")))), []byte("\n")) {
		var m map[string]any
		require.NoError(t, json.Unmarshal(line, &m))
		out = append(out, m)
	}
	return out
}

// planOf compiles the plan a finished run trained (its resolved.toml, the
// shipped calibrations, as Run without Options.Calibrations).
func planOf(t *testing.T, dir string) *parallel.Plan {
	t.Helper()
	fr, err := loadRun(dir)
	require.NoError(t, err)
	topo, err := parallel.TopologyOf(fr.recipe.Parallel, nil)
	require.NoError(t, err)
	plan, err := parallel.Compile(fr.recipe, topo)
	require.NoError(t, err)
	return plan
}

// Measured MFU is the plan's FLOP count over the measured step time and the
// device's peak: every line of metrics.jsonl has mfu = ModelFLOPs / ranks /
// step_s / PeakFLOPS and tflops = ModelFLOPs / ranks / step_s / 1e12, the
// plan's predictions beside them, and tokens_per_s · step_s = the tokens of a
// step; run.json holds the same over the median step time. One rank on the
// calibrated CPU profile, two ranks (the FLOPs shared), and a peak the recipe
// gives (parallel.device_peak_tflops), and chunked attention, whose FLOPs the
// plan counts by chunk (parallel's TestPlanFLOPsFollowAttentionChunks). Tolerance 1e-12 relative: the same
// quotients in float64, in another order.
func TestMeasuredMFUIsPlanFLOPsOverStepTimeAndPeak(t *testing.T) {
	for _, sets := range [][]string{
		nil,
		{"parallel.world_size=2"},
		{"parallel.device_peak_tflops=0.75"},
		{"model.attention_chunk_size=12"}, // the plan counts chunks' attention (and the MFU with it)
	} {
		t.Run(strings.Join(sets, ","), func(t *testing.T) {
			res, _ := tinyRun(t, append([]string{"train.steps=4", "train.eval_interval=0", "logging.sample_tokens=0"}, sets...)...)
			out, err := Run(context.Background(), res, opts())
			require.NoError(t, err)
			plan := planOf(t, out.Dir)
			peak := plan.Topology.Device.PeakFLOPS
			if len(sets) > 0 && strings.HasPrefix(sets[0], "parallel.device_peak") {
				require.Equal(t, 0.75e12, peak, "the recipe's peak")
			}
			perDevice := plan.ModelFLOPs / float64(plan.Mesh.World)
			tokens := float64(res.Recipe.Train.GlobalBatchSize * res.Recipe.Model.SeqLen)
			lines := metricsLines(t, out.Dir)
			require.Len(t, lines, 4)
			for _, m := range lines {
				stepS := m["step_s"].(float64)
				require.Greater(t, stepS, 0.0)
				assert.InEpsilon(t, perDevice/stepS/peak, m["mfu"], 1e-12)
				assert.InEpsilon(t, perDevice/stepS/1e12, m["tflops"], 1e-12)
				assert.InEpsilon(t, tokens, m["tokens_per_s"].(float64)*stepS, 1e-12)
				assert.Equal(t, plan.MFU, m["mfu_plan"])
				assert.Equal(t, plan.StepTimeS, m["step_s_plan"])
				assert.InEpsilon(t, perDevice/plan.StepTimeS/peak, m["mfu_plan"], 1e-12, "the plan's MFU is the same quotient")
				assert.InEpsilon(t, perDevice/plan.StepTimeS/1e12, m["tflops_plan"], 1e-12)
			}
			info, err := readRunInfo(out.Dir)
			require.NoError(t, err)
			r := info.Result
			require.Greater(t, r.StepS, 0.0)
			assert.InEpsilon(t, perDevice/r.StepS/peak, r.MFU, 1e-12)
			assert.InEpsilon(t, perDevice/r.StepS/1e12, r.TFLOPS, 1e-12)
			assert.Equal(t, plan.MFU, r.PlannedMFU)
			assert.Equal(t, peak/1e12, r.PeakTFLOPS)
		})
	}
}

// eventsOf reads a run's event file, named in its run.json, with
// tensorboard.ReadEvents.
func eventsOf(t *testing.T, dir string) []tensorboard.Event {
	t.Helper()
	info, err := readRunInfo(dir)
	require.NoError(t, err)
	require.NotEmpty(t, info.TensorBoard, "run.json names the event file")
	evs, err := tensorboard.ReadEvents(must(os.ReadFile(filepath.Join(dir, info.TensorBoard))))
	require.NoError(t, err)
	return evs
}

// scalarEvent is a step's scalars as a reader gives them: tag to value.
type scalarEvent struct {
	step   int64
	values map[string]float32
}

// requireEventsEqualMetrics checks that the events after the version event
// are metrics.jsonl's lines in order, one per step, and that each holds
// every scalar of its line and nothing else: the tag's part after "/" is the
// line's key, the value the line's number as a float32 (NaN for a value
// listed under "nonfinite", 1 for a true flag).
func requireEventsEqualMetrics(t *testing.T, dir string, evs []scalarEvent) {
	t.Helper()
	lines := metricsLines(t, dir)
	require.Len(t, evs, len(lines), "one event per metrics line")
	for i, m := range lines {
		ev := evs[i]
		require.Equal(t, int64(m["step"].(float64)), ev.step)
		want := map[string]float32{}
		nonFinite := map[string]bool{}
		if nf, ok := m["nonfinite"].([]any); ok {
			for _, k := range nf {
				nonFinite[k.(string)] = true
			}
		}
		for k, v := range m {
			switch v := v.(type) {
			case []any: // data: what each source gave
				for _, s := range v {
					s := s.(map[string]any)
					name := sourceTag(s["source"].(string)) + "/"
					for _, f := range []string{"samples", "tokens", "epochs"} {
						want[name+f] = float32(s[f].(float64))
					}
				}
			case float64:
				if k != "step" {
					want[k] = float32(v)
				}
			case bool:
				if v {
					want[k] = 1
				}
			case nil:
				if nonFinite[k] {
					want[k] = float32(math.NaN())
				}
			}
		}
		got := map[string]float32{}
		for tag, v := range ev.values {
			_, key, ok := strings.Cut(tag, "/")
			require.True(t, ok, "tag %q has a section", tag)
			got[key] = v
		}
		require.Equal(t, keysOf(want), keysOf(got), "step %d: the scalars of the line", ev.step)
		for k, w := range want {
			if math.IsNaN(float64(w)) {
				assert.True(t, math.IsNaN(float64(got[k])), "step %d %s", ev.step, k)
				continue
			}
			assert.Equal(t, w, got[k], "step %d %s", ev.step, k)
		}
	}
}

func keysOf(m map[string]float32) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func scalarEvents(t *testing.T, evs []tensorboard.Event) []scalarEvent {
	t.Helper()
	require.NotEmpty(t, evs)
	require.Equal(t, tensorboard.FileVersion, evs[0].FileVersion, "the file begins with its version")
	var out []scalarEvent
	for _, ev := range evs[1:] {
		se := scalarEvent{step: ev.Step, values: map[string]float32{}}
		for _, v := range ev.Values {
			se.values[v.Tag] = v.Value
		}
		out = append(out, se)
	}
	return out
}

// The event file holds every step as metrics.jsonl does (every scalar, at
// float32), is written step by step (before each step, it holds the steps
// done), and loss.png is drawn at each evaluation, not only at the end; a
// run with logging.tensorboard = false writes no event file.
func TestEventsFollowTheRun(t *testing.T) {
	res, dir := tinyRun(t, "train.steps=9", "train.eval_interval=4", "logging.sample_tokens=0", "logging.interval=2")
	runDir := filepath.Join(dir, "runs", "t")
	plotAt := map[int]time.Time{}
	eventsAt := map[int]int{}
	o := opts()
	o.faults = &faults{lose: func(rank, step int) error {
		if rank != 0 {
			return nil
		}
		if st, err := os.Stat(filepath.Join(runDir, "loss.png")); err == nil {
			plotAt[step] = st.ModTime()
		}
		if info, err := readRunInfo(runDir); err == nil && info.TensorBoard != "" {
			if b, err := os.ReadFile(filepath.Join(runDir, info.TensorBoard)); err == nil {
				evs, err := tensorboard.ReadEvents(b)
				if err == nil {
					eventsAt[step] = len(evs) - 1
				}
			}
		}
		return nil
	}}
	out, err := Run(context.Background(), res, o)
	require.NoError(t, err)
	require.Equal(t, runDir, out.Dir)
	requireEventsEqualMetrics(t, out.Dir, scalarEvents(t, eventsOf(t, out.Dir)))
	for step := 1; step < 9; step++ {
		// Statistics come back every logging.interval steps (and before an
		// evaluation is recorded): the steps recorded before step.
		assert.Equal(t, step/2*2, eventsAt[step], "events before step %d", step+1)
	}
	_, before := plotAt[3]
	assert.False(t, before, "no plot before the first evaluation")
	require.Contains(t, plotAt, 4, "loss.png drawn at step 4's evaluation")
	require.Contains(t, plotAt, 8)
	assert.True(t, plotAt[8].After(plotAt[4]) || plotAt[8].Equal(plotAt[4]))
	assert.Equal(t, plotAt[4], plotAt[7], "not redrawn between evaluations")

	off, _ := tinyRun(t, "train.steps=2", "train.eval_interval=0", "logging.sample_tokens=0", "logging.tensorboard=false")
	out, err = Run(context.Background(), off, opts())
	require.NoError(t, err)
	names, _ := filepath.Glob(filepath.Join(out.Dir, tensorboard.FilePrefix+"*"))
	assert.Empty(t, names)
	info, err := readRunInfo(out.Dir)
	require.NoError(t, err)
	assert.Empty(t, info.TensorBoard)
}

// A run resumed in place writes its event file again from metrics.jsonl (the
// steps up to the checkpoint) and goes on in it; the event file the run
// wrote before, named in run.json, is removed, so that no step shows twice.
func TestResumeRewritesEvents(t *testing.T) {
	res, _ := tinyRun(t, "train.steps=8", "train.eval_interval=4", "checkpoint.interval=3", "logging.sample_tokens=0")
	o := opts()
	o.StopAfter = 5
	first, err := Run(context.Background(), res, o)
	require.NoError(t, err)
	require.True(t, first.Interrupted)
	// The first file, named as if it had been started a minute earlier, so
	// that the resume's name differs from it whatever the clock, and made a
	// symbolic link to a file elsewhere: the resume removes the link, never
	// what it points to.
	info, err := readRunInfo(first.Dir)
	require.NoError(t, err)
	old := tensorboard.FileName(time.Now().Add(-time.Minute), "elsewhere")
	victim := filepath.Join(t.TempDir(), "victim")
	require.NoError(t, os.Rename(filepath.Join(first.Dir, info.TensorBoard), victim))
	kept := must(os.ReadFile(victim))
	require.NoError(t, os.Symlink(victim, filepath.Join(first.Dir, old)))
	info.TensorBoard = old
	require.NoError(t, writeJSON(filepath.Join(first.Dir, "run.json"), info))

	latest, err := ckpt.Latest(filepath.Join(first.Dir, "checkpoints"))
	require.NoError(t, err)
	o = opts()
	o.Resume = latest
	again, err := Run(context.Background(), res, o)
	require.NoError(t, err)
	require.Equal(t, first.Dir, again.Dir)
	names, _ := filepath.Glob(filepath.Join(again.Dir, tensorboard.FilePrefix+"*"))
	require.Len(t, names, 1, "the old event file is gone")
	assert.NotEqual(t, old, filepath.Base(names[0]))
	requireEventsEqualMetrics(t, again.Dir, scalarEvents(t, eventsOf(t, again.Dir)))
	assert.Equal(t, kept, must(os.ReadFile(victim)), "the file the link named is untouched")
}

// Only a name shardline gives its event files is removed on a resume: run.json
// is a file anyone may edit.
func TestOwnEventsName(t *testing.T) {
	assert.True(t, ownEventsName("events.out.tfevents.1800000000.node-1"))
	for _, bad := range []string{"", "run.json", "../events.out.tfevents.1", "sub/events.out.tfevents.1", "events.out.tfevents.1/../../x", `a\events.out.tfevents.1`} {
		assert.False(t, ownEventsName(bad), "%q", bad)
	}
}

// The outside check: the event file read by other people's code, the npm
// packages @roboflow/tfrecords (the record framing: its CRC-32C and mask,
// each record's CRCs checked) and protobufjs (Event and Summary decoded from
// a schema written from TensorFlow's published field numbers), by
// testdata/tbread.js; every scalar equals metrics.jsonl's, at float32.
// SHARDLINE_TB_READER names the directory holding their node_modules: `make
// test` installs them (make tb-reader) and sets it, and then the test fails,
// not skips, where node or the packages are missing.
func TestEventsReadByOutsideReaders(t *testing.T) {
	mods := os.Getenv("SHARDLINE_TB_READER")
	if mods == "" {
		t.Skip("SHARDLINE_TB_READER is not set: `make tb-reader` installs the npm readers into bin/tb-reader, and make test sets it")
	}
	res, _ := tinyRun(t, "train.steps=6", "train.eval_interval=3", "logging.sample_tokens=0")
	out, err := Run(context.Background(), res, opts())
	require.NoError(t, err)
	info, err := readRunInfo(out.Dir)
	require.NoError(t, err)
	cmd := exec.Command("node", "testdata/tbread.js", filepath.Join(mods, "node_modules"), filepath.Join(out.Dir, info.TensorBoard))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	require.NoError(t, err, "node testdata/tbread.js: %s", stderr.String())
	var read []struct {
		WallTime    float64 `json:"wall_time"`
		Step        string  `json:"step"`
		FileVersion string  `json:"file_version"`
		Values      []struct {
			Tag   string `json:"tag"`
			Value string `json:"value"`
		} `json:"values"`
	}
	require.NoError(t, json.Unmarshal(b, &read))
	require.NotEmpty(t, read)
	assert.Equal(t, tensorboard.FileVersion, read[0].FileVersion)
	var evs []scalarEvent
	for _, ev := range read[1:] {
		step, err := strconv.ParseInt(ev.Step, 10, 64)
		require.NoError(t, err)
		assert.InDelta(t, float64(time.Now().Unix()), ev.WallTime, 600, "wall time in seconds")
		se := scalarEvent{step: step, values: map[string]float32{}}
		for _, v := range ev.Values {
			x, err := strconv.ParseFloat(v.Value, 64)
			require.NoError(t, err, "%s", v.Value)
			require.Equal(t, x, float64(float32(x)), "%s: a float32 read exactly", v.Tag)
			se.values[v.Tag] = float32(x)
		}
		evs = append(evs, se)
	}
	requireEventsEqualMetrics(t, out.Dir, evs)
}
