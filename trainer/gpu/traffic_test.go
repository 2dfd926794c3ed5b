//go:build cudaemu

package gpu

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/shardline/shardline/cuda"
	"github.com/shardline/shardline/parallel"
	"github.com/stretchr/testify/require"
)

var updateTraffic = flag.Bool("update", false, "rewrite trainer/testdata/traffic/ from this run")

// trafficBar is where this engine's counts are kept: the bar the shared
// engine's counts are held to (trainer's TestStepTrafficOnGPU), kept after
// this package is gone.
var trafficBar = filepath.Join("..", "testdata", "traffic", "dense-125m-trainer-gpu.json")

// TestStepTraffic counts, on the host emulator without running them (a dry
// run), the operations of one training step of BenchmarkStep134M's shape
// (the dense-125m model, 134M parameters, bf16, one micro-batch of 16
// sequences of 1024 tokens: ForwardBackward, ClipNorm and Apply), with the
// bytes each moves (cuda.KernelTraffic: nominal operand sizes). The counts
// must equal trainer/testdata/traffic/dense-125m-trainer-gpu.json exactly
// (go test -tags cudaemu ./trainer/gpu -run TestStepTraffic -update rewrites
// it): a step's work depends only on the shapes, so any change to it is a
// change of this engine, to be looked at.
func TestStepTraffic(t *testing.T) {
	r := loadRecipe(t, "dense-125m")
	const B, T = 16, 1024 // BenchmarkStep134M's micro-batch
	table, err := parallel.ParamTable(r.Model, 1, 1)
	require.NoError(t, err)
	w := make([][]float32, len(table)) // a dry run reads no value
	for i := range table {
		w[i] = make([]float32, table[i].LocalNumel())
	}
	require.NoError(t, dev.SetDryRun(true))
	defer func() { require.NoError(t, dev.SetDryRun(false)) }()
	m, err := New(dev, r.Model, table, w, B, T, Options{Compute: cuda.BF16})
	require.NoError(t, err)
	defer m.Close()
	tokens, targets := make([]int32, B*T), make([]int32, B*T)
	o := Optimizer{Beta1: r.Train.Beta1, Beta2: r.Train.Beta2, Eps: r.Train.Eps, WeightDecay: r.Train.WeightDecay, ClipGrad: r.Train.ClipGrad}
	dev.CountTraffic(true)
	var ferr error
	dev.Do(func() {
		_, ferr = m.ForwardBackward(tokens, targets, 1/float64(B*T), false)
		m.Update(r.Train.LR, o)
	})
	require.NoError(t, ferr)
	got := dev.Traffic()
	dev.CountTraffic(false)
	require.NoError(t, dev.Err())
	total, kernels := got.Total(), got.Kernels()
	t.Logf("one step: %d operations, %d kernels and products (%.2f GB read, %.2f GB written by them)\n%s",
		total.Ops, kernels.Ops, float64(kernels.Read)/1e9, float64(kernels.Written)/1e9, got)
	if *updateTraffic {
		b, err := json.MarshalIndent(got, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(trafficBar, append(b, '\n'), 0o644))
	}
	b, err := os.ReadFile(trafficBar)
	require.NoError(t, err, "go test -tags cudaemu ./trainer/gpu -run TestStepTraffic -update writes it")
	var want cuda.Traffic
	require.NoError(t, json.Unmarshal(b, &want))
	require.Equal(t, want, got, "the step's operations changed: look at the difference, then rewrite %s with -update", trafficBar)
}
