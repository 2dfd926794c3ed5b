//go:build cuda || cudaemu

package model

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/cuda"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/stretchr/testify/require"
)

// TestEngineModelOnDevice runs the model (the code the FSDP runtime drives) on
// a GPU's kernel set and memory (on the host emulator under -tags cudaemu) (cuda.Kernels,
// cuda.Memory), one forward and backward of the tiny recipe, and compares the
// loss and every parameter's gradient with the same model on the CPU backend,
// for the dense and the MoE recipes.
// Tolerances, relative to |want| plus the gradient's root mean square: fp32,
// 1e-4 (both sum in fp32 in different orders, about 1e-6 per kernel, carried
// through four layers and back); bf16 weights, 2e-2 (both round the products'
// fp32 operands to bf16, in different places once the sums differ in the last
// bit: bf16's 2⁻⁹ relative, averaged over the inner dimensions).
func TestEngineModelOnDevice(t *testing.T) {
	for _, c := range []struct {
		recipe string
		bf16   bool
		tol    float64
		sets   []string
	}{
		{"tiny", false, 1e-4, nil}, {"tiny", true, 2e-2, nil},
		// MoE, dropless and with a capacity that drops copies (the padded layout
		// is expert parallelism's, which one device does not run).
		{"moe-tiny", false, 1e-4, nil}, {"moe-tiny", false, 1e-4, []string{"model.moe.capacity_factor=0.5"}},
		// QK-norm and NoPE layers (whose CPU gradients trainer/model checks by
		// finite differences), fp32 and bf16; the routers of DeepSeek-V3 (sigmoid,
		// renormalised and scaled, groups, an expert bias) and Llama 4 (sigmoid,
		// raw, top 1, the token scaled before its expert, a shared expert).
		{"tiny", false, 1e-4, []string{"model.qk_norm=true", "model.nope_interval=2"}},
		{"tiny", true, 2e-2, []string{"model.qk_norm=true", "model.nope_interval=2"}},
		{"moe-tiny", false, 1e-4, []string{"model.moe.score_function=sigmoid", "model.moe.top_k_scale=2.5", "model.moe.num_groups=4",
			"model.moe.group_top_k=2", "model.moe.expert_bias=true", "model.qk_norm=true"}},
		{"moe-tiny", false, 1e-4, []string{"model.moe.score_function=sigmoid", "model.moe.norm_top_k=false", "model.moe.top_k=1",
			"model.moe.score_before_expert=true", "model.moe.shared_experts=1", "model.moe.expert_bias=true", "model.moe.aux_loss_coeff=0", "model.nope_interval=4"}},
	} {
		name := fmt.Sprintf("%s/bf16=%v/%v", c.recipe, c.bf16, c.sets)
		t.Run(name, func(t *testing.T) {
			// Each case opens a device of its own: on the host emulator, whose
			// kernels run on the device's one thread, two cases at once use
			// both of a CI machine's cores.
			t.Parallel()
			engineOnDevice(t, loadRecipe(t, c.recipe, c.sets...), c.bf16, c.tol)
		})
	}
}

func engineOnDevice(t *testing.T, r config.Recipe, bf16 bool, tol float64) {
	cfg := r.Model
	table, err := parallel.ParamTable(cfg, 1, 1)
	require.NoError(t, err)
	B, T := 2, cfg.SeqLen
	w := initWeights(r, table)
	tokens, targets := opticks(t, B, T, 0)
	targets[5] = -1 // an ignored target
	wdt := tensor.Float32
	if bf16 {
		wdt = tensor.BFloat16
	}

	// run builds the model on be and mem and returns its loss, count and gradients.
	run := func(be tensor.Backend, mem tensor.Memory) (sum float64, n int, grads [][]float32, err error) {
		wb := tensor.Upload(mem, wdt, w)
		gb := make([]tensor.Buffer, len(w))
		for i := range gb {
			gb[i] = mem.Alloc(tensor.Float32, len(w[i]))
		}
		m, err := New[float32](cfg, table, wb, gb, be, B, T, WithMemory(mem))
		if err != nil {
			return 0, 0, nil, err
		}
		sum, n = m.Loss(tokens, targets)
		m.Backward(tokens, targets, 1/float64(n))
		grads = make([][]float32, len(gb))
		for i, g := range gb {
			grads[i] = make([]float32, g.Len())
			mem.Read(grads[i], g)
		}
		return sum, n, grads, mem.Err()
	}
	cs, cn, cg, err := run(cpu.Backend{}, cpu.NewMemory())
	require.NoError(t, err)
	var gs float64
	var gn int
	var gg [][]float32
	dev, err := cuda.Open(0)
	require.NoError(t, err)
	defer dev.Close()
	dev.Do(func() {
		k := dev.Kernels()
		gs, gn, gg, err = run(k, k.NewMemory())
	})
	require.NoError(t, err)
	require.Equal(t, cn, gn, "tokens counted")
	require.InDelta(t, cs/float64(cn), gs/float64(gn), tol*cs/float64(cn), "mean loss: cpu %.6f gpu %.6f", cs/float64(cn), gs/float64(gn))
	for i := range cg {
		if err := close32(cg[i], gg[i], tol); err != nil {
			t.Errorf("gradient of %s: %v", table[i].Name, err)
		}
	}
}

// close32 checks got against want: |got−want| ≤ tol·(|want| + rms(want)).
func close32(want, got []float32, tol float64) error {
	var ss float64
	for _, v := range want {
		ss += float64(v) * float64(v)
	}
	rms := math.Sqrt(ss / float64(max(len(want), 1)))
	for i, v := range want {
		if d := math.Abs(float64(got[i]) - float64(v)); !(d <= tol*(math.Abs(float64(v))+rms)) {
			return fmt.Errorf("element %d: %g, want %g (rms %.3g)", i, got[i], v, rms)
		}
	}
	return nil
}

func loadRecipe(t testing.TB, name string, sets ...string) config.Recipe {
	res, diags := config.Load(filepath.Join("..", "..", "recipes", name+".toml"), config.Options{Sets: sets})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return res.Recipe
}

// initWeights draws every parameter as the trainer does (seed, name, index).
func initWeights(r config.Recipe, table []parallel.Param) [][]float32 {
	w := make([][]float32, len(table))
	for i := range table {
		w[i] = make([]float32, table[i].LocalNumel())
		InitParam(w[i], &table[i], 0, r.Run.Seed, r.Model.InitStd, r.Model.Layers)
	}
	return w
}

// opticks returns B·T tokens and targets of step s from Newton's Opticks as
// bytes (the byte tokenizer), each sequence at a fixed pseudo-random offset:
// Go's source tree has the book, or $SHARDLINE_OPTICKS names a copy where the
// tests run without Go (the GPU machine: make gpu-bundle copies it to bin/gpu).
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

// opticksPath is Newton's Opticks in Go's source tree, or $SHARDLINE_OPTICKS.
func opticksPath() string {
	if p := os.Getenv("SHARDLINE_OPTICKS"); p != "" {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "src", "testdata", "Isaac.Newton-Opticks.txt")
}
