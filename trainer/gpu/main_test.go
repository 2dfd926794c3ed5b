//go:build cuda || cudaemu

package gpu

// What the device tests share, on a GPU (-tags cuda) and on the host
// emulator (-tags cudaemu, where the tests of engine_test.go run in make test).

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/cuda"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/shardline/shardline/trainer/model"
	"github.com/stretchr/testify/require"
)

var dev *cuda.Device

func TestMain(m *testing.M) {
	d, err := cuda.Open(0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dev = d
	code := m.Run()
	d.Close()
	os.Exit(code)
}

func loadRecipe(t testing.TB, name string, sets ...string) config.Recipe {
	res, diags := config.Load(filepath.Join("..", "..", "recipes", name+".toml"), config.Options{Sets: sets})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return res.Recipe
}

// initWeights draws every parameter as the trainer does (seed, name, index).
// cpuModel builds the CPU reference model on w and grads (nil: the weights'
// buffers serve, for a model that runs no backward), moved into a CPU memory:
// w[i] and grads[i] become views of its buffers in place, so the test updates
// the weights and reads the gradients through them.
func cpuModel(t *testing.T, cfg config.Model, table []parallel.Param, w, grads [][]float32, B, T int) *model.Model[float32] {
	t.Helper()
	mem := cpu.NewMemory()
	wb := tensor.Upload(mem, tensor.Float32, w)
	gb := wb
	if grads != nil {
		gb = tensor.Upload(mem, tensor.Float32, grads)
	}
	for i := range w {
		w[i] = mem.Float32s(wb[i])
		if grads != nil {
			grads[i] = mem.Float32s(gb[i])
		}
	}
	m, err := model.New[float32](cfg, table, wb, gb, cpu.Backend{}, B, T, model.WithMemory(mem))
	require.NoError(t, err)
	return m
}

func initWeights(r config.Recipe, table []parallel.Param) [][]float32 {
	w := make([][]float32, len(table))
	for i := range table {
		w[i] = make([]float32, table[i].LocalNumel())
		model.InitParam(w[i], &table[i], 0, r.Run.Seed, r.Model.InitStd, r.Model.Layers)
	}
	return w
}

// opticksPath is Newton's Opticks from Go's source tree, or $SHARDLINE_OPTICKS where
// the tests run without Go (the GPU machine: `make cuda-test` copies it to bin/).
func opticksPath() string {
	if p := os.Getenv("SHARDLINE_OPTICKS"); p != "" {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "src", "testdata", "Isaac.Newton-Opticks.txt")
}

// opticks returns B·T tokens and targets of step s from Newton's Opticks as bytes
// (the byte tokenizer), each sequence at a fixed pseudo-random offset.
func opticks(t testing.TB, B, T, s int) (tokens, targets []int32) {
	text, err := os.ReadFile(opticksPath())
	require.NoError(t, err, "set SHARDLINE_OPTICKS to a copy of $(go env GOROOT)/src/testdata/Isaac.Newton-Opticks.txt")
	tokens, targets = make([]int32, B*T), make([]int32, B*T)
	for b := 0; b < B; b++ {
		at := (s*7919 + b*104729) % (len(text) - T - 1)
		for i := 0; i < T; i++ {
			tokens[b*T+i], targets[b*T+i] = int32(text[at+i]), int32(text[at+i+1])
		}
	}
	return tokens, targets
}
