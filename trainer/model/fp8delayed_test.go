package model

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/stretchr/testify/require"
)

// spyKernels are the CPU kernels that note every cast of a delayed-scaling
// model: the column its scale is read from, the scale, the host's amax of
// the tensor cast (tensor.Amax, read back) and its length.
type spyKernels struct {
	cpu.Kernels[float32]
	mem    tensor.Memory
	scales tensor.Buffer
	casts  []spyCast
}

type spyCast struct {
	col, n int
	amax   float32
	scale  float32
}

func (k *spyKernels) Quantize(dst, inv, x, scale tensor.Buffer) {
	if k.scales.Len() > 0 && scale.Storage() == k.scales.Storage() {
		host, s := make([]float32, x.Len()), make([]float32, 1)
		k.mem.Read(host, x)
		k.mem.Read(s, scale)
		k.casts = append(k.casts, spyCast{col: scale.Offset() - k.scales.Offset(), n: x.Len(), amax: tensor.Amax(host), scale: s[0]})
	}
	k.Kernels.Quantize(dst, inv, x, scale)
}

// fakeRank is a second data-parallel rank for FP8Step's all-gather: its
// amaxes are this rank's times a factor drawn per value (0.25 to 4, one in
// eight 0 or NaN), kept for the reference.
type fakeRank struct {
	mem   tensor.Memory
	rng   *rand.Rand
	other []float32
}

func (g *fakeRank) AllGather(dst, src tensor.Buffer) error {
	mine := make([]float32, src.Len())
	g.mem.Read(mine, src)
	g.other = make([]float32, len(mine))
	for i, a := range mine {
		switch g.rng.IntN(16) {
		case 0:
			g.other[i] = 0
		case 1:
			g.other[i] = float32(math.NaN())
		default:
			g.other[i] = a * float32(math.Ldexp(1, g.rng.IntN(5)-2))
		}
	}
	g.mem.Copy(dst.Slice(0, len(mine)), src)
	g.mem.Write(dst.Slice(len(mine), 2*len(mine)), g.other)
	return nil
}

// TestFP8DelayedScaling: a model under delayed scaling against a host
// reference of tensor.DelayedScaling, one per tensor, over six optimizer
// steps of two micro-batches each with an evaluation pass between steps
// (at larger weights),
// the weights moving every step, and a second rank's amaxes (fakeRank) in
// every step's maximum. Every cast quantises at its tensor's reference scale
// (the earlier steps' amaxes; 1 in the first step), every cast of a
// training pass is Recorded (its amax from the tensor read back), the
// evaluation's casts record nothing, and after each FP8Step the model's
// scales and histories are the reference's, bit for bit. The MoE model has
// a dense layer (18 tensors) and an MoE layer's attention (10); every column
// is cast each step, always with a tensor of one length. Algorithms max
// (history 3, margin 1, hybrid) and most_recent (history 1, e4m3), and the
// router in FP8 (13 tensors in the MoE layer).
func TestFP8DelayedScaling(t *testing.T) {
	cfg := tinyMoE(1, 0, 2)
	for name, c := range map[string]struct {
		grad   tensor.FP8Format
		d      Delayed
		router bool
	}{
		"max":         {tensor.E5M2, Delayed{History: 3, Algo: tensor.AmaxMax, Margin: 1, Ranks: 2}, false},
		"most_recent": {tensor.E4M3, Delayed{History: 1, Algo: tensor.AmaxMostRecent, Ranks: 2}, false},
		"router":      {tensor.E5M2, Delayed{History: 2, Algo: tensor.AmaxMax, Ranks: 2}, true},
	} {
		t.Run(name, func(t *testing.T) {
			table, err := parallel.ParamTable(cfg, 1, 1)
			require.NoError(t, err)
			w, g := make([][]float32, len(table)), make([][]float32, len(table))
			for i := range table {
				w[i], g[i] = make([]float32, table[i].LocalNumel()), make([]float32, table[i].LocalNumel())
				InitParam(w[i], &table[i], 0, 42, 0.3, cfg.Layers)
			}
			init := make([][]float32, len(w))
			for i := range w {
				init[i] = append([]float32(nil), w[i]...)
			}
			mem, wb, gb := onMemory(w, g, false)
			be := &spyKernels{mem: mem}
			rank := &fakeRank{mem: mem, rng: rand.New(rand.NewPCG(3, 4))}
			d := c.d
			d.Comm = rank
			B, T := 2, 5
			m, err := New[float32](cfg, table, wb, gb, be, B, T, WithMemory(mem), WithFP8(FP8{Grad: c.grad, First: 0, Last: 2, Delayed: &d, Router: c.router}))
			require.NoError(t, err)
			scales, hist := m.FP8Scaling()
			be.scales = scales
			fwd, n := parallel.DelayedFP8Tensors(cfg, 0, 2, c.router)
			if c.router { // the router's input, weight and output gradient too
				require.Equal(t, [2]int{11 + 8, 18 + 13}, [2]int{fwd, n})
			} else {
				require.Equal(t, [2]int{11 + 6, 18 + 10}, [2]int{fwd, n})
			}
			require.Equal(t, n, scales.Len())
			require.Equal(t, d.History*n, hist.Len())
			ref := make([]*tensor.DelayedScaling, n)
			for i := range ref {
				f := tensor.E4M3
				if i >= fwd {
					f = c.grad
				}
				ref[i], err = tensor.NewDelayedScaling(f, d.History, d.Algo, d.Margin)
				require.NoError(t, err)
			}
			lengths := make([]int, n)
			// check holds every noted cast to its column's reference scale and
			// records it when record is set.
			check := func(step int, record bool) {
				seen := make([]bool, n)
				for _, cs := range be.casts {
					require.True(t, cs.col >= 0 && cs.col < n, "column %d", cs.col)
					require.Equal(t, math.Float32bits(ref[cs.col].Scale), math.Float32bits(cs.scale), "step %d column %d: cast at scale %v, want %v", step, cs.col, cs.scale, ref[cs.col].Scale)
					if lengths[cs.col] == 0 {
						lengths[cs.col] = cs.n
					}
					require.Equal(t, lengths[cs.col], cs.n, "column %d casts tensors of one length", cs.col)
					if record {
						ref[cs.col].Record(cs.amax)
					}
					seen[cs.col] = true
				}
				if record {
					for i, s := range seen {
						require.True(t, s, "step %d: column %d is cast", step, i)
					}
				}
				be.casts = be.casts[:0]
			}
			loss := mem.Alloc(tensor.Float64, 1)
			hs, ss := make([]float32, hist.Len()), make([]float32, n)
			for step := range 6 {
				for i := range w { // the weights move from step to step
					for j := range w[i] {
						w[i][j] = init[i][j] * float32(1+0.3*float64(step))
					}
				}
				for mb := range 2 {
					tokens, targets := fp8Batch(cfg, B*T)
					for i := range tokens {
						tokens[i] = int32((int(tokens[i]) + 3*mb + step) % cfg.VocabSize)
					}
					m.ForwardBackward(tokens, targets, loss, mb > 0, 0.05)
				}
				check(step, true)
				require.NoError(t, m.FP8Step())
				require.NoError(t, m.Err())
				for i, r := range ref {
					r.Record(rank.other[i])
					r.Update()
				}
				mem.Read(ss, scales)
				mem.Read(hs, hist)
				for i, r := range ref {
					require.Equal(t, math.Float32bits(r.Scale), math.Float32bits(ss[i]), "step %d column %d: scale %v, want %v", step, i, ss[i], r.Scale)
					for j, v := range r.History {
						require.Equal(t, math.Float32bits(v), math.Float32bits(hs[j*n+i]), "step %d column %d: history[%d]", step, i, j)
					}
				}
				// An evaluation pass quantises at the new scales and records
				// nothing (its weights 8 times larger than any step's: a
				// recorded amax would raise the next step's).
				for i := range w {
					for j := range w[i] {
						w[i][j] = init[i][j] * 8
					}
				}
				tokens, targets := fp8Batch(cfg, B*T)
				m.Forward(tokens, targets, loss, false)
				check(step, false)
			}
			var changed bool
			for _, r := range ref {
				changed = changed || r.Scale != 1
			}
			require.True(t, changed, "the scales moved from 1")
		})
	}
}
