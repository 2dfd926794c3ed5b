//go:build cuda

package main

// Device tests of the shardline-cuda build (need an NVIDIA GPU; make cuda-test
// builds bin/cli.test, run from cmd/shardline with SHARDLINE_OPTICKS set).

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRunOnGPU trains the tiny and moe-tiny recipes through the CLI on the GPU
// (--device cuda) and on the CPU, 30 steps each, with two micro-batches per step
// (gradient accumulation on the device), and compares the loss curves, aux losses
// and dropped copies (fp32 both: 1e-5 relative, the kernels summing in other
// orders than the CPU's, about 1e-6 per kernel; validation losses, averaged over
// batches, within ten times that). The GPU run writes the same outputs, and
// run.json names the GPU.
func TestRunOnGPU(t *testing.T) {
	// moe-tiny: 5e-3 (a router's top-k can flip on a near-tie, after which the runs
	// route slightly differently).
	for recipe, tol := range map[string]float64{"tiny": 1e-5, "moe-tiny": 5e-3} {
		t.Run(recipe, func(t *testing.T) { runOnGPU(t, recipe, tol) })
	}
}

func runOnGPU(t *testing.T, recipe string, tol float64) {
	env := []string{"PATH=" + os.Getenv("PATH")}
	dirs := map[string]string{}
	for _, device := range []string{"cpu", "cuda"} {
		out := t.TempDir()
		code, stdout, stderr := shardline(t, env, "run", filepath.Join(recipesDir, recipe+".toml"), "--device", device, "--train-iters", "30",
			"--micro-batch-size", "8", "--global-batch-size", "16", "--set", "data.path="+opticksFile(), "--set", "run.output_dir="+out,
			"--set", "train.eval_interval=10")
		require.Equal(t, 0, code, stderr)
		dir := strings.TrimSpace(strings.TrimPrefix(strings.SplitN(stdout, "\n", 2)[0], "run directory:"))
		dirs[device] = dir
		for _, f := range []string{"weights.bin", "loss.png", "sample.txt", "resolved.toml", "run.json"} {
			require.FileExists(t, filepath.Join(dir, f))
		}
	}
	cpuCurve, gpuCurve := readCurve(t, dirs["cpu"]), readCurve(t, dirs["cuda"])
	require.Len(t, gpuCurve, 30)
	worst := 0.0
	for i := range cpuCurve {
		rel := math.Abs(gpuCurve[i].Loss-cpuCurve[i].Loss) / cpuCurve[i].Loss
		worst = max(worst, rel)
		require.LessOrEqual(t, rel, tol, "step %d: gpu %v cpu %v", i+1, gpuCurve[i].Loss, cpuCurve[i].Loss)
		if c := cpuCurve[i].AuxLoss; c != nil {
			require.NotNil(t, gpuCurve[i].AuxLoss)
			require.InDelta(t, *c, *gpuCurve[i].AuxLoss, 4*tol**c, "step %d aux loss (4·tol: the loss sums a square of the routing's sums)", i+1)
			require.Equal(t, *cpuCurve[i].Dropped, *gpuCurve[i].Dropped, "step %d dropped", i+1) // dropless here: 0
		}
		if cpuCurve[i].ValLoss != nil {
			require.NotNil(t, gpuCurve[i].ValLoss)
			require.InDelta(t, *cpuCurve[i].ValLoss, *gpuCurve[i].ValLoss, 10*tol**cpuCurve[i].ValLoss)
		}
	}
	t.Logf("worst relative loss difference over 30 steps: %.3g", worst)
	info, err := os.ReadFile(filepath.Join(dirs["cuda"], "run.json"))
	require.NoError(t, err)
	require.Contains(t, string(info), `"backend": "cuda (NVIDIA`)
	t.Logf("gpu run held %d bytes (the plan: %d)", gpuCurve[len(gpuCurve)-1].MemHeld, gpuCurve[len(gpuCurve)-1].MemPlan)
}
