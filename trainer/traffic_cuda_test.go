//go:build cudaemu

package trainer

import (
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/cuda"
	"github.com/stretchr/testify/require"
)

var updateTraffic = flag.Bool("update-traffic", false, "rewrite testdata/traffic/dense-125m-engine.json from this run")

// TestStepTrafficOnGPU counts, on the host emulator without running them (a
// dry run: cuda.Device.SetDryRun), the operations of one training step of the
// engine (the FSDP runtime and trainer/model over cuda.Kernels) at world size
// 1 on the dense-125m model (134M parameters, bf16, the recipe's settings), one
// micro-batch of 16 sequences of 1024 tokens, and the bytes each moves
// (cuda.KernelTraffic: nominal operand sizes), beside trainer/gpu's counts of
// the same step (testdata/traffic/dense-125m-trainer-gpu.json, written by its
// TestStepTraffic). The engine's counts must equal
// testdata/traffic/dense-125m-engine.json exactly (-update-traffic rewrites
// it): a step's work depends only on the shapes, so any change shows here. The
// log compares the two engines, operation by operation. The engine is held to
// the bar: no more launches and no more bytes than trainer/gpu made.
func TestStepTrafficOnGPU(t *testing.T) {
	d, err := cuda.Open(0)
	require.NoError(t, err)
	defer d.Close()
	require.NoError(t, d.SetDryRun(true))
	got := stepTraffic(t, d)
	bar := readTraffic(t, "dense-125m-trainer-gpu.json")
	t.Logf("one step, the engine against trainer/gpu:\n%s", compareTraffic(got, bar))
	g, w := got.Kernels(), bar.Kernels()
	require.LessOrEqual(t, g.Ops, w.Ops, "the engine launches more kernels and products than trainer/gpu did")
	require.LessOrEqual(t, g.Bytes(), w.Bytes(), "the engine's kernels and products move more bytes than trainer/gpu's did")

	path := filepath.Join("testdata", "traffic", "dense-125m-engine.json")
	if *updateTraffic {
		b, err := json.MarshalIndent(got, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, append(b, '\n'), 0o644))
	}
	_, err = os.Stat(path)
	require.NoError(t, err, "go test -tags cudaemu ./trainer -run TestStepTrafficOnGPU -update-traffic writes it")
	want := readTraffic(t, "dense-125m-engine.json")
	require.Equal(t, want, got, "the step's operations changed: look at the difference, then rewrite %s with -update-traffic", path)
}

// stepTraffic counts, on d, the operations of one training step of the
// dense-125m model at world size 1 with one micro-batch of 16 sequences of
// 1024 tokens (trainer/gpu's BenchmarkStep134M micro-batch) and the recipe's
// settings with sets, after a first step that may set things up.
func stepTraffic(t *testing.T, d *cuda.Device, sets ...string) cuda.Traffic {
	t.Helper()
	const B, T = 16, 1024
	res, diags := config.Load(filepath.Join("..", "recipes", "dense-125m.toml"), config.Options{Sets: append([]string{
		"parallel.world_size=1", fmt.Sprintf("train.micro_batch_size=%d", B), fmt.Sprintf("train.global_batch_size=%d", B),
		fmt.Sprintf("model.seq_len=%d", T), "run.output_dir=" + t.TempDir()}, sets...)})
	require.False(t, diags.HasErrors(), "%v", diags)
	step, _ := rankStepsWith(t, res, t.TempDir(), false, Options{Backend: d.Kernels(), Version: "test"})
	step()
	d.CountTraffic(true)
	step()
	got := d.Traffic()
	d.CountTraffic(false)
	require.NoError(t, d.Err())
	return got
}

// readTraffic reads a step's counts kept in testdata/traffic.
func readTraffic(t *testing.T, name string) cuda.Traffic {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "traffic", name))
	require.NoError(t, err)
	var tr cuda.Traffic
	require.NoError(t, json.Unmarshal(b, &tr))
	return tr
}

// compareTraffic lays two counts side by side: the kernels' launches and
// bytes in all, then every operation of either.
func compareTraffic(got, bar cuda.Traffic) string {
	var sb strings.Builder
	g, w := got.Kernels(), bar.Kernels()
	fmt.Fprintf(&sb, "kernels and products: %d launches against %d (%.3fx), %.2f GB against %.2f GB (%.3fx)\n",
		g.Ops, w.Ops, float64(g.Ops)/float64(w.Ops), float64(g.Bytes())/1e9, float64(w.Bytes())/1e9, float64(g.Bytes())/float64(w.Bytes()))
	names := slices.Sorted(maps.Keys(got))
	for n := range bar {
		if _, ok := got[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	fmt.Fprintf(&sb, "%-34s %14s %14s\n", "operation", "engine ops/MB", "trainer/gpu")
	for _, n := range names {
		a, b := got[n], bar[n]
		fmt.Fprintf(&sb, "%-34s %5d %8.1f %5d %8.1f\n", n, a.Ops, float64(a.Bytes())/1e6, b.Ops, float64(b.Bytes())/1e6)
	}
	return sb.String()
}

// TestFP8StepTrafficOnGPU counts, as TestStepTrafficOnGPU does (a dry run on
// the host emulator, which reports compute capability 9.0), one step of the
// dense-125m model with its dense products in FP8 (hybrid, tensorwise): every
// one of a layer's seven products runs on cuBLASLt's FP8 kernels in forward
// and in both backward products (none widened to fp32), so the step's FP8
// products are at least 21 a layer (more with recomputation). The log
// compares the step with the bf16 one TestStepTrafficOnGPU holds
// (testdata/traffic/dense-125m-engine.json), operation by operation.
func TestFP8StepTrafficOnGPU(t *testing.T) {
	d, err := cuda.Open(0)
	require.NoError(t, err)
	defer d.Close()
	require.NoError(t, d.SetDryRun(true))
	bf16 := readTraffic(t, "dense-125m-engine.json")
	fp8 := stepTraffic(t, d, "precision.fp8.format=hybrid", "precision.fp8.recipe=tensorwise")
	t.Logf("one step, FP8 against bf16:\n%s", compareTraffic(fp8, bf16))
	var products int64
	for op, k := range fp8 {
		require.False(t, strings.HasPrefix(op, "widen_scaled_e"), "%s: an FP8 operand widened to fp32 (%d ops): the product missed cuBLASLt's FP8 kernels", op, k.Ops)
		if strings.HasPrefix(op, "gemm f8") {
			products += k.Ops
		}
	}
	require.GreaterOrEqual(t, products, int64(21*12), "FP8 products in the step")
}
