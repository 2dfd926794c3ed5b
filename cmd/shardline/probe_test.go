package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/shardline/shardline/trainer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPlanProbesOnce: plan on the CPU scales the shipped table by a probe of
// this machine, says so (the time model's line, a note naming what calibrate
// would add) and caches the probe under the cache directory; the next plan
// reads it from there (a probe planted with known factors shows in the plan),
// and a cached probe of another table, or older than a day, is measured
// again. A run records the probe and the plan's step time beside its own in
// run.json, logs them after its first steps (run.log too), and plan --against
// plans the run with the run's probe. No timing is checked here.
func TestPlanProbesOnce(t *testing.T) {
	dir := t.TempDir()
	env := []string{"SHARDLINE_CACHE_DIR=" + filepath.Join(dir, "cache")}
	tiny := filepath.Join(recipesDir, "tiny.toml")
	code, out, errs := shardline(t, env, "plan", tiny)
	require.Equal(t, 0, code, errs)
	host := trainer.CalibrationHost(cpu.Backend{})
	assert.Contains(t, out, "scaled to "+host+" by a probe (matmuls ×")
	assert.Contains(t, errs, "scaled to this machine by a probe (measured now")
	assert.Contains(t, errs, "shardline calibrate -o FILE (about four minutes) measures every kernel on this machine")
	cached, err := filepath.Glob(filepath.Join(dir, "cache", "probe", "*.json"))
	require.NoError(t, err)
	require.Len(t, cached, 1)

	// The cached probe stands for this machine: plant known factors.
	var p parallel.Probe
	b, err := os.ReadFile(cached[0])
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &p))
	p.GEMM, p.Stream = 2.5, 1.5
	write := func(p parallel.Probe) {
		b, err := json.Marshal(p)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(cached[0], b, 0o644))
	}
	write(p)
	code, out, errs = shardline(t, env, "plan", tiny)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "by a probe (matmuls ×2.50, memory-bound kernels ×1.50; "+p.Date+")")
	assert.Contains(t, errs, "(cached from "+p.Date+": matmuls 2.50×, memory-bound kernels 1.50× that table's time)")

	// A run probes afresh (under the load it will see), caches that probe,
	// logs its plan beside its first steps and records both.
	code, out, errs = shardline(t, env, "run", tiny, "--num-layers", "1", "--train-iters", "3", "--set", "train.eval_interval=0",
		"--set", "run.output_dir="+filepath.Join(dir, "runs"), "--set", "logging.format=json")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, errs, `"message":"step time against the plan`)
	assert.Contains(t, errs, `"planned_step_s":`)
	run := strings.TrimSpace(strings.TrimPrefix(strings.SplitN(out, "\n", 2)[0], "run directory:"))
	log, err := os.ReadFile(filepath.Join(run, "run.log"))
	require.NoError(t, err)
	assert.Contains(t, string(log), "step time against the plan")
	var rec struct {
		Result struct {
			StepS        float64         `json:"step_s_median"`
			PlannedStepS float64         `json:"planned_step_s"`
			TimeModel    string          `json:"time_model"`
			Probe        *parallel.Probe `json:"probe"`
		} `json:"result"`
	}
	b, err = os.ReadFile(filepath.Join(run, "run.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &rec))
	assert.Greater(t, rec.Result.StepS, 0.0)
	assert.Greater(t, rec.Result.PlannedStepS, 0.0)
	require.NotNil(t, rec.Result.Probe)
	assert.NotEqual(t, 2.5, rec.Result.Probe.GEMM, "measured again")
	assert.Contains(t, rec.Result.TimeModel, "scaled to "+host+" by a probe")
	b, err = os.ReadFile(cached[0])
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &p))
	assert.Equal(t, *rec.Result.Probe, p, "the run's probe is the one cached")

	// plan --against plans the run with the run's probe, whatever the cache holds now.
	p.GEMM = 3.25
	write(p)
	code, out, errs = shardline(t, env, "plan", "--against", run, "--format", "json")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, errs, fmt.Sprintf("scaled to the run's machine by a probe (the run's, from %s: matmuls %.2f×", rec.Result.Probe.Date, rec.Result.Probe.GEMM))
	var against struct {
		Comparison []struct {
			What    string
			Planned float64
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &against))
	for _, c := range against.Comparison {
		if c.What == "step time" {
			assert.InEpsilon(t, rec.Result.PlannedStepS, c.Planned, 1e-9, "the run's own plan")
		}
	}

	// A cached probe of another table, or one older than a day, is measured again.
	p.Table = strings.Repeat("0", 64)
	write(p)
	code, _, errs = shardline(t, env, "plan", tiny)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, errs, "(measured now")
	b, err = os.ReadFile(cached[0])
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &p))
	p.Date = time.Now().Add(-25 * time.Hour).UTC().Format(time.RFC3339)
	write(p)
	code, _, errs = shardline(t, env, "plan", tiny)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, errs, "(measured now")

	// A GPU plan probes nothing.
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "cache")))
	code, _, errs = shardline(t, env, "plan", filepath.Join(recipesDir, "llama-1b.toml"))
	require.Equal(t, 0, code, errs)
	assert.NoDirExists(t, filepath.Join(dir, "cache", "probe"))
}
