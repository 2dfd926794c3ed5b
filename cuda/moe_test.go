//go:build cuda

package cuda

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
)

func getI32(b Buffer) []int32 {
	out := make([]int32, b.N)
	dev.Download(out, b)
	return out
}

func moeRouting(t *testing.T, s MoEShape) MoERouting {
	n := s.BT * s.K
	i32s := func(k int) Buffer { return putI32(t, slices.Repeat([]int32{-7}, k)) }
	return MoERouting{Probs: poisoned(t, F32, s.BT*s.E), Gates: poisoned(t, F32, n), Idx: i32s(n), Row: i32s(n), Rank: i32s(n),
		Tok: i32s(s.Rows()), Counts: i32s(s.E), Offsets: i32s(s.E + 1)}
}

// TestMoE checks routing, dispatch (packed and padded), combine and their
// backward against tensor/cpu, with a capacity that drops copies (the router's
// backward and the aux loss run in the engine's kernels: TestKernelConformance).
func TestMoE(t *testing.T) {
	for _, dt := range dtypes {
		r := rand.New(rand.NewPCG(10, uint64(dt)))
		BT, E, K, C := 200, 16, 2, 48
		capacity := 30 // below the mean share (25) for some experts: some copies drop
		logits := roundTo(dt, randn(r, BT*E, 1))
		for i := 0; i < E; i++ { // skew: experts 0..3 popular, so capacity binds
			for tt := 0; tt < BT; tt++ {
				if i < 4 {
					logits[tt*E+i] += 0.75
				}
			}
		}
		logits = roundTo(dt, logits)
		x := roundTo(dt, randn(r, BT*C, 1))
		probs, idx, gates := make([]float32, BT*E), make([]int32, BT*K), make([]float32, BT*K)
		ts := tensor.MoEShape{BT: BT, E: E, K: K, C: C, Capacity: capacity}
		row, tok, offsets, cursor := make([]int32, BT*K), make([]int32, BT*K), make([]int32, E+1), make([]int32, E)
		crt := cpu.Routing{Idx: idx, Row: row, Tok: tok, Offsets: offsets, Cursor: cursor}
		cpu.Router(probs, gates, logits, nil, crt, ts)
		xperm := make([]float32, BT*K*C)
		cpu.Dispatch(xperm, x, crt, ts)
		n := int(offsets[E])
		if n == BT*K {
			t.Fatalf("capacity %d dropped nothing: the test would not cover drops", capacity)
		}
		y := roundTo(dt, randn(r, BT*K*C, 1))
		out0 := roundTo(dt, randn(r, BT*C, 1))
		out := append([]float32(nil), out0...)
		cpu.Combine(out, y, gates, crt, ts)
		dout := roundTo(dt, randn(r, BT*C, 1))
		dy, dgates := make([]float32, BT*K*C), make([]float32, BT*K)
		cpu.CombineBackward(dy, dgates, dout, y, gates, crt, ts)
		dx := make([]float32, BT*C)
		cpu.DispatchBackward(dx, y, crt, ts)
		onDevice(t, func() {
			s := ts
			rt := moeRouting(t, s)
			dev.Router(rt, put(t, dt, logits), s)
			check(t, "router probs", F32, get(rt.Probs), probs, 1e-6)
			check(t, "router gates", F32, get(rt.Gates), gates, 1e-6)
			if got := getI32(rt.Idx); !slices.Equal(got, idx) {
				t.Errorf("router (%s): top-k differs from the CPU's", dt)
			}
			bx := put(t, dt, x)
			bxp := poisoned(t, dt, s.Rows()*C)
			dev.Upload(rt.Idx, idx) // dispatch exactly the CPU's choice
			dev.Dispatch(bxp, rt, bx, s)
			if !slices.Equal(getI32(rt.Offsets), offsets) || !slices.Equal(getI32(rt.Row), row) || !slices.Equal(getI32(rt.Tok)[:n], tok[:n]) {
				t.Errorf("dispatch (%s): offsets, rows or tokens differ from the CPU's", dt)
			}
			check(t, "dispatch xperm", dt, get(bxp)[:n*C], xperm[:n*C], 0)
			by := put(t, dt, y[:s.Rows()*C])
			bo := put(t, dt, out0)
			dev.Upload(rt.Gates, gates)
			dev.Combine(bo, by, rt, s)
			check(t, "combine", dt, get(bo), out, 1e-6)
			bdy, bdg := put(t, dt, make([]float32, s.Rows()*C)), poisoned(t, F32, BT*K)
			dev.CombineBackward(bdy, bdg, put(t, dt, dout), by, rt, s)
			check(t, "combine dy", dt, get(bdy)[:n*C], dy[:n*C], 1e-6)
			check(t, "combine dgates", F32, get(bdg), dgates, 1e-5)
			bdx := poisoned(t, dt, BT*C)
			dev.DispatchBackward(bdx, by, rt, s, false)
			check(t, "dispatch backward", dt, get(bdx), dx, 1e-6)

			// padded layout: expert e's copies at e·capacity + rank, zeros after
			sp := s
			sp.Padded = true
			rp := moeRouting(t, sp)
			dev.Upload(rp.Idx, idx)
			bxpp := poisoned(t, dt, sp.Rows()*C)
			dev.Dispatch(bxpp, rp, bx, sp)
			prow, pxp := getI32(rp.Row), get(bxpp)
			want := make([]float32, sp.Rows()*C)
			for i, e := range idx {
				wr := int32(-1)
				if row[i] >= 0 {
					wr = row[i] - offsets[e] + e*int32(capacity)
					copy(want[int(wr)*C:int(wr+1)*C], x[(i/K)*C:(i/K+1)*C])
				}
				if prow[i] != wr {
					t.Errorf("padded dispatch (%s): copy %d at row %d, want %d", dt, i, prow[i], wr)
					break
				}
			}
			check(t, "padded dispatch xperm", dt, pxp, want, 0)
		})
	}
}

// TestExpertsMatmul checks the strided-batch expert product against one CPU
// matmul per expert, with expert weights interleaved as the parameter table lays
// them out (w1, w3, w2 of expert 0, then expert 1, ...). The engine's backward
// products (Kernels.ExpertsMatmulBackward) are TestExpertsStaticSegments' and
// TestKernelConformance's.
func TestExpertsMatmul(t *testing.T) {
	for _, dt := range dtypes {
		r := rand.New(rand.NewPCG(11, uint64(dt)))
		E, rows, C, OC := 6, 40, 64, 96
		stride := 3 * OC * C
		w := roundTo(dt, randn(r, E*stride, 0.1))
		inp := roundTo(dt, randn(r, E*rows*C, 1))
		out := make([]float32, E*rows*OC)
		for e := 0; e < E; e++ {
			we := w[e*stride : e*stride+OC*C]
			cpu.Matmul(out[e*rows*OC:], tensor.FloatWeights(inp[e*rows*C:]), tensor.FloatWeights(we), tensor.MatmulShape{BT: rows, C: C, OC: OC}, false)
		}
		onDevice(t, func() {
			s := ExpertsShape{E: E, Rows: rows, C: C, OC: OC, WStride: stride}
			bw, bi := put(t, dt, w), put(t, dt, inp)
			bo := poisoned(t, dt, E*rows*OC)
			dev.ExpertsMatmul(bo, bi, bw, s, false)
			check(t, "experts matmul", dt, get(bo), out, 1e-5)
		})
	}
}
