package model

import (
	"math"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/stretchr/testify/require"
)

// TestBF16Activations runs one forward and backward with each layer's saved
// activations in bf16 storage and with them in float32, from the same bf16
// weights, over dense, tied and MoE models and both recompute modes. Tolerances: the loss within 1% and every gradient within 6% in
// relative L2 norm. Rounding one activation to bf16 moves it by at most 2⁻⁹, and
// the model's few layers compound that into a few percent of a gradient at most
// (measured: losses within 0.05%, gradients within 2.6%), while a layer backward
// that read another layer's activations, or a store that missed its values,
// moves gradients by O(1). Then: the bf16 run reruns to the same bits, and a
// 5-layer model holds under 75% of its float32 activations (one float32 work set
// beside five bf16 stores).
func TestBF16Activations(t *testing.T) {
	type tc struct {
		cfg  config.Model
		T    int
		mode string
	}
	cases := map[string]tc{}
	for _, mode := range []string{"none", "selective", "full"} {
		cases["dense-"+mode] = tc{tinyConfig(false), 5, mode}
		cases["moe-"+mode] = tc{tinyMoE(1, 0, 1), 5, mode}
	}
	deep := tinyConfig(true)
	deep.Layers = 5
	cases["tied-5-layers"] = tc{deep, 6, "none"}
	cases["moe-capacity-every-2nd"] = tc{tinyMoE(0, 1.0, 2), 6, "none"}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			table, hv := initHost(t, c.cfg)
			B := 2
			tokens, targets := make([]int32, B*c.T), make([]int32, B*c.T)
			for i := range tokens {
				tokens[i], targets[i] = int32(i*7%c.cfg.VocabSize), int32((i*7+3)%c.cfg.VocabSize)
			}
			targets[3] = -1
			step := func(opts ...Option) (float64, [][]float32, int64) {
				g := make([][]float32, len(table))
				for i := range g {
					g[i] = make([]float32, table[i].LocalNumel())
				}
				mem, wb, gb := onMemory(hv, g, true) // the weights in bf16
				opts = append(opts, WithRecompute(c.mode), WithMemory(mem))
				m, err := New[float32](c.cfg, table, wb, gb, cpu.Backend{}, B, c.T, opts...)
				require.NoError(t, err)
				var loss float64
				for range 2 { // a second pass starts from whatever the first left in the work set
					for _, x := range g {
						clear(x)
					}
					sum, n := m.Loss(tokens, targets)
					m.Backward(tokens, targets, 1/float64(n))
					loss = sum / float64(n)
				}
				act, _ := m.ActivationBytes()
				return loss, g, act
			}
			l32, g32, a32 := step()
			lh, gh, ah := step(WithBF16Activations())
			require.InEpsilon(t, l32, lh, 0.01, "loss %v %v", l32, lh)
			var worst float64
			for i := range table {
				if r, ok := relL2(gh[i], g32[i]); ok {
					worst = max(worst, r)
					require.Less(t, r, 0.06, "gradient of %s", table[i].Name)
				}
			}
			t.Logf("loss %.3g relative, worst gradient %.3g; activations %d bytes in bf16, %d in float32", math.Abs(lh-l32)/l32, worst, ah, a32)
			lr, gr, _ := step(WithBF16Activations())
			require.Equal(t, lh, lr, "a rerun's loss")
			require.Equal(t, gh, gr, "a rerun's gradients")
			if c.cfg.Layers >= 4 { // L layers' bf16 stores and one F work set: (L+2)/(2L) of float32
				require.Less(t, ah, a32*3/4, "bf16 storage holds less")
			}
		})
	}
}

// TestBF16ActivationsNeedFloat32: the float64 models of the gradient checks
// cannot store activations in bf16.
func TestBF16ActivationsNeedFloat32(t *testing.T) {
	cfg := tinyConfig(false)
	table, err := parallel.ParamTable(cfg, 1, 1)
	require.NoError(t, err)
	w, g := make([][]float64, len(table)), make([][]float64, len(table))
	for i := range table {
		w[i], g[i] = make([]float64, table[i].LocalNumel()), make([]float64, table[i].LocalNumel())
	}
	mem, wb, gb := onMemory(w, g, false)
	_, err = New[float64](cfg, table, wb, gb, cpu.Kernels[float64]{}, 1, 4, WithBF16Activations(), WithMemory(mem))
	require.ErrorContains(t, err, "bf16 activations need float32")
}
