package model

import (
	"math"
	"strings"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fp8Batch is a micro-batch of B·T tokens of cfg's vocabulary, one target
// ignored.
func fp8Batch(cfg config.Model, n int) (tokens, targets []int32) {
	tokens, targets = make([]int32, n), make([]int32, n)
	for i := range tokens {
		tokens[i], targets[i] = int32(i*7%cfg.VocabSize), int32((i*7+3)%cfg.VocabSize)
	}
	targets[3] = -1
	return tokens, targets
}

// fp8Step runs one ForwardBackward of a model over F buffers holding hv
// (float32 values, exact in either F) and returns its mean loss and
// gradients, in float64.
func fp8Step[F float32 | float64](t *testing.T, cfg config.Model, table []parallel.Param, hv [][]float32, B, T int, opts ...Option) (float64, [][]float64) {
	t.Helper()
	w, g := make([][]F, len(table)), make([][]F, len(table))
	for i := range table {
		w[i], g[i] = make([]F, len(hv[i])), make([]F, len(hv[i]))
		for j, x := range hv[i] {
			w[i][j] = F(x)
		}
	}
	mem, wb, gb := onMemory(w, g, false)
	m, err := New[F](cfg, table, wb, gb, cpu.Kernels[F]{}, B, T, append([]Option{WithMemory(mem)}, opts...)...)
	require.NoError(t, err)
	tokens, targets := fp8Batch(cfg, B*T)
	loss := mem.Alloc(tensor.Float64, 1)
	n := 0
	for _, x := range targets {
		if x >= 0 {
			n++
		}
	}
	m.ForwardBackward(tokens, targets, loss, false, 1/float64(n)) // the gradients of the mean loss
	require.NoError(t, m.Err())
	require.NoError(t, mem.Err())
	var s [1]float64
	mem.Read(s[:], loss)
	out := make([][]float64, len(g))
	for i := range g {
		out[i] = make([]float64, len(g[i]))
		for j, x := range g[i] {
			out[i][j] = float64(x)
		}
	}
	return s[0] / float64(n), out
}

// relL2All is |a − b| / |b| over every value of the lists.
func relL2All(a, b [][]float64) float64 {
	var d, n float64
	for i := range a {
		for j := range a[i] {
			d += (a[i][j] - b[i][j]) * (a[i][j] - b[i][j])
			n += b[i][j] * b[i][j]
		}
	}
	return math.Sqrt(d / n)
}

func fp8Cases() map[string]struct {
	cfg  config.Model
	mode string
	f    FP8
} {
	dense, qk, moe := tinyConfig(false), qkNorm(headDim(tinyConfig(false), 6)), tinyMoE(1, 0, 2)
	three := tinyConfig(true)
	three.Layers = 3
	return map[string]struct {
		cfg  config.Model
		mode string
		f    FP8
	}{
		"hybrid":           {dense, "none", FP8{Grad: tensor.E5M2, First: 0, Last: 2}},
		"e4m3":             {dense, "none", FP8{Grad: tensor.E4M3, First: 0, Last: 2}},
		"hybrid-selective": {dense, "selective", FP8{Grad: tensor.E5M2, First: 0, Last: 2}},
		"hybrid-full":      {dense, "full", FP8{Grad: tensor.E5M2, First: 0, Last: 2}},
		"qk-norm-head-dim": {qk, "none", FP8{Grad: tensor.E5M2, First: 0, Last: 2}},
		// MoE every other layer: attention in FP8 everywhere, the MLP of the
		// dense layer, the experts in bf16 (fp32 here).
		"moe": {moe, "none", FP8{Grad: tensor.E5M2, First: 0, Last: 2}},
		// The MoE layer's experts in FP8 too (fp8experts.go): dropless, with
		// copies dropped past capacity (a packed layout whose rows past the
		// kept copies are cleared), and under full recompute; routed and
		// shared experts, hybrid and e4m3.
		"moe-experts":          {moe, "none", FP8{Grad: tensor.E5M2, First: 0, Last: 2, Experts: true}},
		"moe-experts-e4m3":     {moe, "none", FP8{Grad: tensor.E4M3, First: 0, Last: 2, Experts: true}},
		"moe-experts-capacity": {tinyMoE(1, 1, 2), "none", FP8{Grad: tensor.E5M2, First: 0, Last: 2, Experts: true}},
		"moe-experts-full":     {tinyMoE(2, 0, 1), "full", FP8{Grad: tensor.E5M2, First: 0, Last: 2, Experts: true}},
		// The first and last of three layers kept out of FP8.
		"middle-layer": {three, "none", FP8{Grad: tensor.E5M2, First: 1, Last: 2}},
		// Weight gradients in bf16 (fp32 and float64 here) from the
		// unquantised operands, beside FP8 input gradients: dense under
		// none and full recompute, QK-norm (its backward remakes q and k
		// from the unquantised input), MoE.
		"bf16-wgrad":         {dense, "none", FP8{Grad: tensor.E5M2, First: 0, Last: 2, BF16Wgrad: true}},
		"bf16-wgrad-full":    {dense, "full", FP8{Grad: tensor.E4M3, First: 0, Last: 2, BF16Wgrad: true}},
		"bf16-wgrad-qk-norm": {qk, "selective", FP8{Grad: tensor.E5M2, First: 0, Last: 2, BF16Wgrad: true}},
		"bf16-wgrad-moe":     {moe, "none", FP8{Grad: tensor.E5M2, First: 0, Last: 2, BF16Wgrad: true}},
		// The MoE router's product in FP8 too (router_bf16 = false), with FP8
		// and with bf16 weight gradients.
		"moe-router":            {moe, "none", FP8{Grad: tensor.E5M2, First: 0, Last: 2, Router: true}},
		"moe-router-bf16-wgrad": {moe, "selective", FP8{Grad: tensor.E4M3, First: 0, Last: 2, Router: true, BF16Wgrad: true}},
	}
}

// TestFP8Model: a model whose layers compute their linear products in FP8
// (current scaling on the backend, codes multiplied with their scale
// inverses) against the same model with every product reading the
// dequantised operands in float64 (Model[float64] on the CPU kernels, whose
// FP8 products dequantise each code times its scale inverse exactly in
// float64 and sum in float64), and against the model without FP8.
//
// Tolerances: against float64 the FP8 codes are the same but where a value
// computed in float32 and in float64 falls on either side of a rounding
// boundary of E4M3 (float32 moves values by about 1e-7 relative, the
// format's spacing is 2⁻³: about one value in a million), so the loss and
// gradients agree to float32's summation error: the test allows 1e-6
// relative on the loss and 1e-5 relative L2 on all gradients (measured at
// most 5.0e-8 and 3.5e-7). Against the model without FP8 the difference is
// FP8's own error (E4M3 keeps 3 mantissa bits: up to 2⁻⁴ relative a value,
// E5M2 2⁻³): the loss within 3%, the gradients within 25% relative L2
// (measured at most 1.6% and 21%, QK-norm, whose per-head norms amplify
// the projections' error; 0.16–0.34% and 7–10% for the others; with FP8
// experts 0.12–0.78% and 7.6–15%, the most under full recompute with two
// shared experts in both layers), and not equal: the products do compute in
// FP8 (and with FP8 experts, not equal to the same run with bf16 experts:
// the experts' products do too).
func TestFP8Model(t *testing.T) {
	for name, c := range fp8Cases() {
		t.Run(name, func(t *testing.T) {
			table, hv := initHost(t, c.cfg)
			B, T := 2, 5
			l32, g32 := fp8Step[float32](t, c.cfg, table, hv, B, T, WithRecompute(c.mode), WithFP8(c.f))
			l64, g64 := fp8Step[float64](t, c.cfg, table, hv, B, T, WithRecompute(c.mode), WithFP8(c.f))
			lref, gref := fp8Step[float64](t, c.cfg, table, hv, B, T, WithRecompute(c.mode))
			dl, dg := math.Abs(l32-l64)/l64, relL2All(g32, g64)
			el, eg := math.Abs(l64-lref)/lref, relL2All(g64, gref)
			t.Logf("fp32 FP8 vs float64 FP8: loss %.2e, gradients %.2e; FP8 vs no FP8: loss %.2e, gradients %.2e", dl, dg, el, eg)
			assert.Less(t, dl, 1e-6, "loss, fp32 against float64")
			assert.Less(t, dg, 1e-5, "gradients, fp32 against float64")
			assert.Less(t, el, 0.03, "loss, FP8 against no FP8")
			assert.Less(t, eg, 0.25, "gradients, FP8 against no FP8")
			assert.NotEqual(t, l64, lref, "the products compute in FP8")
			if c.f.Experts {
				f := c.f
				f.Experts = false
				lx, _ := fp8Step[float64](t, c.cfg, table, hv, B, T, WithRecompute(c.mode), WithFP8(f))
				assert.NotEqual(t, l64, lx, "the experts' products compute in FP8")
			}
		})
	}
}

// TestFP8RecomputeModes: the FP8 copies are remade, not kept: backward
// quantises again what the layer keeps for it, and current scaling is a
// function of the tensor alone, so with fp32 activations a layer's products
// read the same codes under none, selective and full recompute: loss and
// every gradient bit for bit over two steps (a second step starts from what
// the first left in the shared buffers), dense and MoE, hybrid and e4m3,
// with the experts in FP8 too (dropless, and dropping copies past capacity:
// the rows past the kept copies are cleared before the grouped tensors'
// amaxes read them, else stale rows of the other modes' earlier products
// would set the scales and the modes would differ).
//
// With bf16 stores (a bf16 run on the CPU) the recompute modes already
// differ without FP8: selective rounds what the remade activations are made
// from to bf16 in the forward, and full keeps no store of the products'
// inputs, so its products read fp32 values. FP8 rounds those different
// inputs: the modes then agree within FP8's error, not bit for bit (the test
// allows 1% on the loss and 10% relative L2 on the gradients; measured at
// most 0.55% and 9.1%, full against none, where without FP8 the modes differ
// by 0.07% and 0.6%; with the experts in FP8 too, whose products read more
// such codes, 15%: measured at most 0.14% and 9.6%, selective against none
// dropping copies past capacity, where without FP8 0.09% and 0.96%).
func TestFP8RecomputeModes(t *testing.T) {
	for name, cfg := range map[string]config.Model{"dense": tinyConfig(false), "moe": tinyMoE(1, 0, 2), "moe-experts": tinyMoE(1, 0, 2), "moe-experts-capacity": tinyMoE(1, 1, 1)} {
		experts := strings.HasPrefix(name, "moe-experts")
		gradTol := 0.10
		if experts {
			gradTol = 0.15 // more products read FP8 codes of inputs the modes round differently
		}
		for _, grad := range []tensor.FP8Format{tensor.E5M2, tensor.E4M3} {
			t.Run(name+"/"+grad.String(), func(t *testing.T) {
				table, hv := initHost(t, cfg)
				B, T := 2, 5
				tokens, targets := fp8Batch(cfg, B*T)
				run := func(mode string, bf16, fp8 bool) (float64, [][]float64) {
					g := make([][]float32, len(table))
					for i := range g {
						g[i] = make([]float32, table[i].LocalNumel())
					}
					mem, wb, gb := onMemory(hv, g, bf16)
					opts := []Option{WithMemory(mem), WithRecompute(mode)}
					if bf16 {
						opts = append(opts, WithBF16Activations())
					}
					if fp8 {
						opts = append(opts, WithFP8(FP8{Grad: grad, First: 0, Last: cfg.Layers, Experts: experts}))
					}
					m, err := New[float32](cfg, table, wb, gb, cpu.Backend{}, B, T, opts...)
					require.NoError(t, err)
					loss := mem.Alloc(tensor.Float64, 1)
					var l float64
					for range 2 {
						for _, x := range g {
							clear(x)
						}
						n := m.ForwardBackward(tokens, targets, loss, false, 1)
						var s [1]float64
						mem.Read(s[:], loss)
						l = s[0] / float64(n)
					}
					require.NoError(t, mem.Err())
					out := make([][]float64, len(g))
					for i := range g {
						out[i] = make([]float64, len(g[i]))
						for j, x := range g[i] {
							out[i][j] = float64(x)
						}
					}
					return l, out
				}
				l0, g0 := run("none", false, true)
				for _, mode := range []string{"selective", "full"} {
					l, g := run(mode, false, true)
					assert.Equal(t, l0, l, "%s: loss", mode)
					assert.Equal(t, g0, g, "%s: gradients", mode)
				}
				b0, bg0 := run("none", true, true)
				p0, pg0 := run("none", true, false)
				for _, mode := range []string{"selective", "full"} {
					l, g := run(mode, true, true)
					pl, pg := run(mode, true, false)
					dl, dg := math.Abs(l-b0)/b0, relL2All(g, bg0)
					t.Logf("bf16 stores, %s against none: with FP8 loss %.2e, gradients %.2e; without FP8 loss %.2e, gradients %.2e",
						mode, dl, dg, math.Abs(pl-p0)/p0, relL2All(pg, pg0))
					assert.Less(t, dl, 0.01, "%s: loss", mode)
					assert.Less(t, dg, gradTol, "%s: gradients", mode)
				}
			})
		}
	}
}

// TestFP8Refusals: FP8 compute outside what is built is refused when the
// model is made (the trainer's recipe checks refuse it first).
func TestFP8Refusals(t *testing.T) {
	cfg := tinyConfig(false)
	table, err := parallel.ParamTable(cfg, 1, 1)
	require.NoError(t, err)
	w, g := make([][]float32, len(table)), make([][]float32, len(table))
	for i := range table {
		w[i], g[i] = make([]float32, table[i].LocalNumel()), make([]float32, table[i].LocalNumel())
	}
	mem, wb, gb := onMemory(w, g, false)
	for _, c := range []struct {
		f   FP8
		msg string
	}{
		{FP8{Grad: 7, First: 0, Last: 2}, "want e4m3 or e5m2"},
		{FP8{Grad: tensor.E5M2, First: 0, Last: 3}, "FP8 layers 0..2 of a model of 2 layers"},
		{FP8{Grad: tensor.E5M2, First: 2, Last: 1}, "FP8 layers 2..0"},
	} {
		_, err := New[float32](cfg, table, wb, gb, cpu.Backend{}, 1, 4, WithMemory(mem), WithFP8(c.f))
		require.ErrorContains(t, err, c.msg)
	}
}

// wgradSpy counts a model's MatmulBackward calls by what they read: weight
// gradients from FP8 codes or from unquantised operands, and input
// gradients from codes; and its forward products of FP8 codes.
type wgradSpy struct {
	cpu.Kernels[float64]
	fp8Wgrad, plainWgrad, fp8Dgrad, fp8Fwd int
}

func (k *wgradSpy) Matmul(out, inp, weight tensor.Buffer, s tensor.MatmulShape, accumulate bool) {
	if _, codes := inp.DType().FP8(); codes {
		k.fp8Fwd++
	}
	k.Kernels.Matmul(out, inp, weight, s, accumulate)
}

func (k *wgradSpy) MatmulBackward(dinp, dweight, dout, inp, weight tensor.Buffer, s tensor.MatmulShape, accumulate bool) {
	_, codes := dout.DType().FP8()
	switch {
	case dweight.Len() > 0 && codes:
		k.fp8Wgrad++
	case dweight.Len() > 0:
		k.plainWgrad++
	}
	if dinp.Len() > 0 && codes {
		k.fp8Dgrad++
	}
	k.Kernels.MatmulBackward(dinp, dweight, dout, inp, weight, s, accumulate)
}

// TestFP8BF16Wgrad: with the weight gradients computed apart (BF16Wgrad,
// precision.fp8.wgrad = false) the forward and every input gradient are
// those of the FP8 run with FP8 weight gradients, so the loss and every
// gradient but the FP8 layers' linear weights' are equal bit for bit (in
// float64); those weights' gradients differ, each made by a product of the
// unquantised input and output gradient (every weight-gradient product of
// the FP8 layers reads no FP8 operand: 7 a layer, 14 in all, beside the 14
// input-gradient products on FP8 codes; the output head's is HeadLoss's).
// TestFP8Model holds the arithmetic to float64.
func TestFP8BF16Wgrad(t *testing.T) {
	cfg := tinyConfig(false)
	table, hv := initHost(t, cfg)
	lq, gq, sq := spyStep(t, cfg, table, hv, FP8{Grad: tensor.E5M2, First: 0, Last: 2})
	lb, gb, sb := spyStep(t, cfg, table, hv, FP8{Grad: tensor.E5M2, First: 0, Last: 2, BF16Wgrad: true})
	require.Equal(t, lq, lb, "the forward is the FP8 run's")
	require.Equal(t, [3]int{14, 0, 14}, [3]int{sq.fp8Wgrad, sq.plainWgrad, sq.fp8Dgrad}, "FP8 weight gradients: every FP8 product's from codes")
	require.Equal(t, [3]int{0, 14, 14}, [3]int{sb.fp8Wgrad, sb.plainWgrad, sb.fp8Dgrad}, "bf16 weight gradients: none from codes, the input gradients from codes")
	linear := func(name string) bool {
		for _, s := range []string{".attn.wq", ".attn.wk", ".attn.wv", ".attn.wo", ".mlp.w1", ".mlp.w3", ".mlp.w2"} {
			if strings.HasSuffix(name, s) {
				return true
			}
		}
		return false
	}
	for i := range table {
		if linear(table[i].Name) {
			require.NotEqual(t, gq[i], gb[i], "%s: its gradient is computed from unquantised operands", table[i].Name)
		} else {
			require.Equal(t, gq[i], gb[i], "%s: its gradient comes from the FP8 input gradients alone", table[i].Name)
		}
	}
}

// spyStep runs one ForwardBackward of a float64 model with FP8 compute f
// on wgradSpy kernels: its loss, gradients and counts.
func spyStep(t *testing.T, cfg config.Model, table []parallel.Param, hv [][]float32, f FP8) (float64, [][]float64, *wgradSpy) {
	t.Helper()
	B, T := 2, 5
	be := &wgradSpy{}
	w, g := make([][]float64, len(table)), make([][]float64, len(table))
	for i := range table {
		w[i], g[i] = make([]float64, len(hv[i])), make([]float64, len(hv[i]))
		for j, x := range hv[i] {
			w[i][j] = float64(x)
		}
	}
	mem, wb, gb := onMemory(w, g, false)
	m, err := New[float64](cfg, table, wb, gb, be, B, T, WithMemory(mem), WithFP8(f))
	require.NoError(t, err)
	tokens, targets := fp8Batch(cfg, B*T)
	loss := mem.Alloc(tensor.Float64, 1)
	m.ForwardBackward(tokens, targets, loss, false, 0.1)
	require.NoError(t, m.Err())
	var l [1]float64
	mem.Read(l[:], loss)
	return l[0], g, be
}

// TestFP8Router: with router_bf16 = false (FP8.Router) an MoE layer's router
// product reads FP8 codes forward and backward beside its attention's (the
// test model's dense layer has 7 FP8 products, its MoE layer 4, and 5 with
// the router), its weight gradient comes from codes, and the loss and the
// router's gradient move from those of the run with the router in bf16
// (fp32 and float64 here); TestFP8Model holds the arithmetic to float64 and
// TestFP8DelayedScaling the router's delayed scales.
func TestFP8Router(t *testing.T) {
	cfg := tinyMoE(1, 0, 2)
	table, hv := initHost(t, cfg)
	l0, g0, s0 := spyStep(t, cfg, table, hv, FP8{Grad: tensor.E5M2, First: 0, Last: 2})
	l1, g1, s1 := spyStep(t, cfg, table, hv, FP8{Grad: tensor.E5M2, First: 0, Last: 2, Router: true})
	require.Equal(t, [3]int{11, 11, 11}, [3]int{s0.fp8Fwd, s0.fp8Dgrad, s0.fp8Wgrad}, "the router in bf16")
	require.Equal(t, [3]int{12, 12, 12}, [3]int{s1.fp8Fwd, s1.fp8Dgrad, s1.fp8Wgrad}, "the router in FP8")
	require.NotEqual(t, l0, l1, "the router's FP8 logits change the loss")
	var router int
	for i := range table {
		if strings.HasSuffix(table[i].Name, ".moe.router") {
			router = i
		}
	}
	require.NotZero(t, router)
	require.NotEqual(t, g0[router], g1[router], "the router's gradient")
}

// initHost is cfg's one-rank parameter table and its weights initialised on
// the host (seed 42, std 0.3: gradients well above rounding).
func initHost(t *testing.T, cfg config.Model) ([]parallel.Param, [][]float32) {
	t.Helper()
	table, err := parallel.ParamTable(cfg, 1, 1)
	require.NoError(t, err)
	hv := make([][]float32, len(table))
	for i := range table {
		hv[i] = make([]float32, table[i].LocalNumel())
		InitParam(hv[i], &table[i], 0, 42, 0.3, cfg.Layers)
	}
	return table, hv
}
