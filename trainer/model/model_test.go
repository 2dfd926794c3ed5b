package model

import (
	"fmt"
	"math"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func tinyMoE(shared int, capacity float64, freq int) config.Model {
	m := tinyConfig(false)
	m.MoE.NumExperts, m.MoE.TopK, m.MoE.ExpertFFNHidden, m.MoE.SharedExperts = 4, 2, 6, shared
	m.MoE.CapacityFactor, m.MoE.AuxLossCoeff, m.MoE.LayerFreq = capacity, 0.3, freq
	return m
}

func tinyConfig(tied bool) config.Model {
	m := config.Default().Model
	m.Layers, m.Hidden, m.Heads, m.KVHeads, m.FFNHidden, m.VocabSize, m.SeqLen = 2, 8, 2, 1, 12, 11, 6
	m.TieEmbeddings = tied
	return m
}

// build allocates one view per parameter and initialises it.
func build[F float32 | float64](t *testing.T, cfg config.Model, B, T int, opt ...Option) (*Model[F], [][]F, [][]F, []parallel.Param) {
	t.Helper()
	table, err := parallel.ParamTable(cfg, 1, 1)
	require.NoError(t, err)
	w, g := make([][]F, len(table)), make([][]F, len(table))
	for i := range table {
		w[i], g[i] = make([]F, table[i].LocalNumel()), make([]F, table[i].LocalNumel())
		InitParam(w[i], &table[i], 0, 42, 0.3, cfg.Layers) // large std: gradients well above rounding
	}
	mem, wb, gb := onMemory(w, g, false)
	m, err := New[F](cfg, table, wb, gb, cpu.Kernels[F]{}, B, T, append([]Option{WithMemory(mem)}, opt...)...)
	require.NoError(t, err)
	return m, w, g, table
}

// TestModelGradient checks every parameter's gradient of the whole model (mean
// token loss) against central finite differences in float64. h = 1e-5 and a
// relative tolerance of 1e-5: truncation O(h²) and rounding O(1e-16/h) are both far
// below it, and a wrong gradient is off by O(1).
func TestModelGradient(t *testing.T) {
	type gradCase struct {
		cfg       config.Model
		recompute string
	}
	// Attention is flash attention throughout (the engine's only kernel).
	cases := map[string]gradCase{
		"dense": {tinyConfig(false), "none"}, "tied": {tinyConfig(true), "none"},
		// MoE with shared experts; MoE every other layer; a capacity that drops copies.
		"moe": {tinyMoE(1, 0, 1), "none"}, "moe-interleaved": {tinyMoE(0, 0, 2), "none"}, "moe-capacity": {tinyMoE(0, 0.6, 1), "none"},
		// Recompute must not change a single gradient.
		"full-recompute": {tinyConfig(false), "full"}, "tied-full-recompute": {tinyConfig(true), "full"},
		"moe-full-recompute":  {tinyMoE(1, 0, 2), "full"},
		"selective-recompute": {tinyConfig(false), "selective"}, "moe-selective-recompute": {tinyMoE(1, 0, 2), "selective"},
		// A head size other than hidden/heads (Megatron's --kv-channels).
		"head-dim": {headDim(tinyConfig(false), 6), "none"}, "tied-head-dim": {headDim(tinyConfig(true), 6), "none"},
		// QK-norm (Qwen3), with recompute and a decoupled head size; NoPE layers
		// (Llama 4's iRoPE: the second layer has no rotary embedding).
		"qk-norm": {qkNorm(tinyConfig(false)), "none"}, "qk-norm-full-recompute": {qkNorm(tinyConfig(false)), "full"},
		"qk-norm-head-dim": {qkNorm(headDim(tinyConfig(false), 6)), "none"}, "nope": {nope(tinyConfig(false), 2), "none"},
	}
	// The routers of the 2025-26 MoE models (routers_test.go), each with an
	// expert bias set away from zero where it balances by bias.
	for name, cfg := range newRouters() {
		cases["router-"+name] = gradCase{cfg, "none"}
	}
	cases["router-llama4-full-recompute"] = gradCase{newRouters()["llama4"], "full"}
	for name, tc := range cases {
		cfg, tied := tc.cfg, name
		B, T := 2, 5
		m, w, g, table := build[float64](t, cfg, B, T, WithRecompute(tc.recompute))
		setBias(w, table)
		tokens := []int32{1, 4, 2, 9, 0, 3, 3, 10, 5, 6}
		targets := []int32{4, 2, 9, 0, 7, 3, 10, -1, 6, 1}
		// The objective Backward(scale = 1/n) differentiates: the mean token loss plus
		// the load-balancing loss weighted by the micro-batch's share of the counted
		// tokens, scale·B·T (10/9 here: one target is ignored).
		loss := func() float64 {
			s, n := m.Loss(tokens, targets)
			return s/float64(n) + m.AuxLoss()*float64(B*T)/float64(n)
		}
		_, n := m.Loss(tokens, targets)
		m.Backward(tokens, targets, 1/float64(n))
		const h = 1e-5
		for i := range table {
			for j := range w[i] {
				orig := w[i][j]
				w[i][j] = orig + h
				lp := loss()
				w[i][j] = orig - h
				lm := loss()
				w[i][j] = orig
				num := (lp - lm) / (2 * h)
				if math.Abs(num-g[i][j]) > 1e-5*(1+math.Abs(num)) {
					t.Fatalf("%s: d/d %s[%d]: analytic %.9g, numeric %.9g", tied, table[i].Name, j, g[i][j], num)
				}
			}
		}
	}
}

// headDim sets model.head_dim (the attention width heads·head_dim then differs from
// hidden).
func headDim(m config.Model, d int) config.Model { m.HeadDim = d; return m }

// TestShardedInitEqualsFull: initialising any slice of a parameter alone gives the
// same bits as the same slice of a full initialisation.
func TestShardedInitEqualsFull(t *testing.T) {
	cfg := config.Default().Model
	table, err := parallel.ParamTable(cfg, 1, 1)
	require.NoError(t, err)
	for i := range table {
		p := &table[i]
		full := make([]float32, p.LocalNumel())
		InitParam(full, p, 0, 7, cfg.InitStd, cfg.Layers)
		for _, shards := range []int{2, 3, 8} {
			per := (len(full) + shards - 1) / shards
			for s := 0; s < shards; s++ {
				lo, hi := s*per, min((s+1)*per, len(full))
				if lo >= hi {
					continue
				}
				part := make([]float32, hi-lo)
				InitParam(part, p, int64(lo), 7, cfg.InitStd, cfg.Layers)
				for k := range part {
					require.Equal(t, math.Float32bits(full[lo+k]), math.Float32bits(part[k]), "%s shard %d/%d element %d", p.Name, s, shards, lo+k)
				}
			}
		}
	}
}

// TestInitStatistics: matrices are N(0, std²) (residual projections scaled by
// 1/sqrt(2L)), norms are ones, and different parameters get different streams.
// Tolerance: the sample std of n normals has relative error ~1/sqrt(2n); for
// n ≥ 16k that is < 0.6%, so 3% is a >5σ bound.
func TestInitStatistics(t *testing.T) {
	cfg := config.Default().Model
	table, err := parallel.ParamTable(cfg, 1, 1)
	require.NoError(t, err)
	var wq0, wq1 []float32
	for i := range table {
		p := &table[i]
		x := make([]float32, p.LocalNumel())
		InitParam(x, p, 0, 1, cfg.InitStd, cfg.Layers)
		want := InitStd(p, cfg.InitStd, cfg.Layers)
		if want == 0 {
			for _, v := range x {
				require.Equal(t, float32(1), v, p.Name)
			}
			continue
		}
		var s, ss float64
		for _, v := range x {
			s += float64(v)
			ss += float64(v) * float64(v)
		}
		n := float64(len(x))
		mean, std := s/n, math.Sqrt(ss/n-(s/n)*(s/n))
		require.Less(t, math.Abs(mean), 5*want/math.Sqrt(n), "%s mean", p.Name)
		require.InDelta(t, want, std, 0.03*want, "%s std", p.Name)
		switch p.Name {
		case "layers.0.attn.wq":
			wq0 = x
		case "layers.1.attn.wq":
			wq1 = x
		}
	}
	require.NotEqual(t, wq0[:8], wq1[:8])
}

// TestBF16Weights: a model bound to bf16 weight views computes exactly what the
// same model computes on the fp32 widening of those weights (every kernel widens
// exactly, then runs as for fp32), for the loss and every gradient: dense, tied,
// MoE with shared experts and full recompute. On the bf16
// dot-product path (cpu.BF16Dot: the matmuls that read a weight round their other
// operand to bf16, as on a GPU) the loss stays within 0.1% of the widened
// model's and every gradient within 6% (relative L2 norm) of its gradient:
// measured at most 0.04% and 2.0% (a norm gain's gradient, a sum with
// cancellation) on these models, whose activations round by a relative 2⁻⁹
// before every such product.
func TestBF16Weights(t *testing.T) {
	cases := map[string]struct {
		cfg  config.Model
		opts []Option
	}{
		"dense": {cfg: tinyConfig(false)}, "tied": {cfg: tinyConfig(true)},
		"moe":           {cfg: tinyMoE(1, 0, 1)},
		"moe-full":      {cfg: tinyMoE(1, 0, 2), opts: []Option{WithRecompute("full")}},
		"moe-selective": {cfg: tinyMoE(1, 0, 2), opts: []Option{WithRecompute("selective")}},
	}
	for name, tc := range cases {
		table, err := parallel.ParamTable(tc.cfg, 1, 1)
		require.NoError(t, err)
		w32, hv := make([][]float32, len(table)), make([][]tensor.BF16, len(table))
		g32, gh := make([][]float32, len(table)), make([][]float32, len(table))
		for i := range table {
			n := table[i].LocalNumel()
			w := make([]float32, n)
			InitParam(w, &table[i], 0, 42, 0.3, tc.cfg.Layers)
			h := make([]tensor.BF16, n)
			tensor.CastToBF16(h, w)
			tensor.CastToFloat32(w, h) // the fp32 model runs on the widened bf16 values
			w32[i], hv[i] = w, h
			g32[i], gh[i] = make([]float32, n), make([]float32, n)
		}
		B, T := 2, 5
		tokens := []int32{1, 4, 2, 9, 0, 3, 3, 10, 5, 6}
		targets := []int32{4, 2, 9, 0, 7, 3, 10, -1, 6, 1}
		mem := cpu.NewMemory()
		w32b, hvb := tensor.Upload(mem, tensor.Float32, w32), tensor.Upload(mem, tensor.BFloat16, hv)
		step := func(w []tensor.Buffer, g [][]float32, dot bool) float64 {
			defer cpu.SetBF16Dot(dot)()
			gb := tensor.Upload(mem, tensor.Float32, g)
			for i := range g {
				clear(g[i])
				mem.Write(gb[i], g[i])
				g[i] = mem.Float32s(gb[i])
			}
			m, err := New[float32](tc.cfg, table, w, gb, cpu.Backend{}, B, T, append([]Option{WithMemory(mem)}, tc.opts...)...)
			require.NoError(t, err)
			loss, n := m.Loss(tokens, targets)
			require.Equal(t, 9, n, name)
			m.Backward(tokens, targets, 1/float64(n))
			return loss
		}
		la := step(w32b, g32, false)
		lb := step(hvb, gh, false)
		require.Equal(t, la, lb, "%s: loss", name)
		for i := range table {
			require.Equal(t, g32[i], gh[i], "%s: gradient of %s", name, table[i].Name)
		}
		ld := step(hvb, gh, true)
		require.InEpsilon(t, la, ld, 1e-3, "%s: loss on the dot-product path", name)
		for i := range table {
			if r, ok := relL2(gh[i], g32[i]); ok {
				require.Less(t, r, 0.06, "%s: gradient of %s on the dot-product path", name, table[i].Name)
			}
		}
	}
}

// relL2 is ‖got − want‖ / ‖want‖ (false where want is all zeros).
func relL2(got, want []float32) (float64, bool) {
	var diff, norm float64
	for j, v := range want {
		d := float64(got[j] - v)
		diff, norm = diff+d*d, norm+float64(v)*float64(v)
	}
	if norm == 0 {
		return 0, false
	}
	return math.Sqrt(diff / norm), true
}

// TestMoESums: the MoE sums a forward leaves on the backend (the load-balancing
// loss over layers, the copies dropped past capacity) equal the host's
// computation of Switch Transformer's loss from the routing each layer made, and
// full recompute, which runs every layer's forward again in backward, leaves
// them as the forward made them (it once left the last recomputed layer's).
// Relative 1e-12: the same float64 sums in the same order, the probability
// sums rounded to F as RouterStats keeps them.
func TestMoESums(t *testing.T) {
	cfg := tinyMoE(0, 0.6, 1) // every layer MoE, a capacity that drops copies
	cfg.Layers = 3
	B, T := 3, 6
	tokens, targets := make([]int32, B*T), make([]int32, B*T)
	for i := range tokens {
		tokens[i], targets[i] = int32(i*5%cfg.VocabSize), int32((i*5+1)%cfg.VocabSize)
	}
	sums := map[string][2]float64{}
	for _, mode := range []string{"none", "full"} {
		m, _, _, _ := build[float32](t, cfg, B, T, WithRecompute(mode))
		_, n := m.Loss(tokens, targets)
		if mode == "none" { // every layer keeps its own routing
			var aux float64
			dropped := 0
			E, k, BT := cfg.MoE.NumExperts, cfg.MoE.TopK, B*T
			for _, a := range m.a.moe {
				probs, off := make([]float32, a.probs.Len()), make([]int32, E+1)
				m.mem.Read(probs, a.probs)
				m.mem.Read(off, a.rt.Offsets)
				for e := 0; e < E; e++ {
					var pe float64
					for tk := 0; tk < BT; tk++ {
						pe += float64(probs[tk*E+e])
					}
					aux += float64(E) * float64(off[e+1]-off[e]) / float64(BT*k) * float64(float32(pe)) / float64(BT)
				}
				dropped += BT*k - int(off[E])
			}
			require.Greater(t, dropped, 0, "the capacity should drop copies")
			require.InEpsilon(t, aux*cfg.MoE.AuxLossCoeff, m.AuxLoss(), 1e-12)
			require.Equal(t, dropped, m.Dropped())
		}
		m.Backward(tokens, targets, 1/float64(n))
		sums[mode] = [2]float64{m.AuxLoss(), float64(m.Dropped())}
		m.Close()
	}
	require.Equal(t, sums["none"], sums["full"], "full recompute keeps the forward's sums")
}

// TestForwardRefusesAMisfitBatch: token ids and targets are uploaded into the
// model's int32 buffers of B·T; a micro-batch of another length (or targets of
// another length than the tokens) runs nothing and leaves an error naming the
// lengths for Err, instead of reading past a buffer; the next right-sized
// batch runs as before.
func TestForwardRefusesAMisfitBatch(t *testing.T) {
	cfg := ShakespeareChar()
	cfg.Layers, cfg.Hidden, cfg.Heads, cfg.FFNHidden, cfg.SeqLen = 1, 32, 2, 64, 16
	const B, T = 2, 16
	m, _, _, _ := build[float32](t, cfg, B, T)
	defer m.Close()
	tok := make([]int32, B*T)
	for _, c := range []struct{ tokens, targets []int32 }{{tok[:B*T-1], tok[:B*T-1]}, {tok, tok[:3]}, {append(tok, 0), nil}} {
		loss := m.mem.Alloc(tensor.Float64, 1)
		assert.Zero(t, m.Forward(c.tokens, c.targets, loss, false))
		err := m.Err()
		require.Error(t, err)
		assert.Contains(t, err.Error(), fmt.Sprintf("%d tokens", len(c.tokens)))
	}
	sum, n := m.Loss(tok, tok)
	require.NoError(t, m.Err())
	assert.Equal(t, B*T, n)
	assert.Greater(t, sum, 0.0)
}
