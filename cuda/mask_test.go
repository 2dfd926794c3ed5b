//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/shardline/shardline/tensor/cpu"
)

// TestFlashAttentionMaskGrad checks the device's masked flash attention
// backward against central finite differences of its own forward, L = Σ out·R
// (R also the backward's dout), for chunked attention and for chunks with
// document starts, on a sample of 12 entries of each of q, k and v. fp32, h =
// 1e-2: the truncation error is O(h²) ≈ 1e-4 of the scores' scale and the
// rounding of L (a few thousand fp32 terms, ≈ 1e-5) over 2h ≈ 5e-4, so a
// tolerance of 1e-2 × (|g| + rms(g)) separates a right gradient from one that
// a wrong mask leaves (off by the masked keys' share, O(0.1) or more).
func TestFlashAttentionMaskGrad(t *testing.T) {
	const B, T, NH, NKV, HD = 1, 48, 2, 1, 32
	for _, c := range []struct {
		name  string
		chunk int
		cuts  []int
	}{{"chunk 20", 20, nil}, {"chunk 40, documents", 40, []int{7, 30}}} {
		t.Run(c.name, func(t *testing.T) {
			s := AttentionShape{B: B, Tq: T, Tk: T, NH: NH, NKV: NKV, HD: HD, Causal: true, Chunk: c.chunk}
			var starts []int32
			if c.cuts != nil {
				starts = make([]int32, B*T)
				for i := range starts {
					for _, cut := range c.cuts {
						if cut <= i {
							starts[i] = int32(cut)
						}
					}
				}
			}
			r := rand.New(rand.NewPCG(41, uint64(c.chunk)))
			in := map[string][]float32{"q": randn(r, B*T*NH*HD, 1), "k": randn(r, B*T*NKV*HD, 1), "v": randn(r, B*T*NKV*HD, 1)}
			R := randn(r, B*T*NH*HD, 1)
			var st Buffer
			if starts != nil {
				st = putI32(t, starts)
			}
			forward := func() (float64, []float32, []float32) {
				var out, lse []float32
				onDevice(t, func() {
					o, l := poisoned(t, F32, len(R)), poisoned(t, F32, B*NH*T)
					dev.FlashAttentionMasked(o, l, put(t, F32, in["q"]), put(t, F32, in["k"]), put(t, F32, in["v"]), st, s)
					out, lse = get(o), get(l)
				})
				var L float64
				for i := range out {
					L += float64(out[i]) * float64(R[i])
				}
				return L, out, lse
			}
			_, out, lse := forward()
			grads := map[string][]float32{}
			onDevice(t, func() {
				dq, dk, dv := poisoned(t, F32, len(in["q"])), poisoned(t, F32, len(in["k"])), poisoned(t, F32, len(in["v"]))
				dev.FlashAttentionBackwardMasked(dq, dk, dv, put(t, F32, R), put(t, F32, out), put(t, F32, lse),
					put(t, F32, in["q"]), put(t, F32, in["k"]), put(t, F32, in["v"]), st, s, false)
				grads["q"], grads["k"], grads["v"] = get(dq), get(dk), get(dv)
			})
			const h = 1e-2
			for _, name := range []string{"q", "k", "v"} {
				x, g := in[name], grads[name]
				var ss float64
				for _, v := range g {
					ss += float64(v) * float64(v)
				}
				rms := math.Sqrt(ss / float64(len(g)))
				for n := 0; n < 12; n++ {
					i := r.IntN(len(x))
					orig := x[i]
					x[i] = orig + h
					lp, _, _ := forward()
					x[i] = orig - h
					lm, _, _ := forward()
					x[i] = orig
					num := (lp - lm) / (2 * h)
					if d := math.Abs(num - float64(g[i])); d > 1e-2*(math.Abs(float64(g[i]))+rms) {
						t.Fatalf("%s: d/d%s[%d]: analytic %.6g, numeric %.6g (rms %.3g)", fmt.Sprint(c.name), name, i, g[i], num, rms)
					}
				}
			}
		})
	}
}

// TestFlashAttentionMasksByDType: masked flash attention, forward and
// backward, in fp32 and bf16 (on a GPU the bf16 tensor-core kernels; the
// emulator runs bf16 through the fp32 kernels), against the CPU's float64
// kernels (checked against the formula in tensor/cpu) on the same inputs
// rounded to the storage dtype: chunks of 48 and documents over 160 positions,
// more than the tensor-core kernels' tiles of 64 (so whole tiles are skipped),
// and a context-parallel key block with both. Tolerance as the unmasked checks
// (TestFlashAttentionOffsets): fp32 1e-5 forward and 1e-4 backward relative,
// bf16 8e-3.
func TestFlashAttentionMasksByDType(t *testing.T) {
	cuts := func(B, Tq, qoff int, at [][]int) []int32 {
		st := make([]int32, B*Tq)
		for b := range B {
			for i := range Tq {
				for _, c := range at[b] {
					if c <= qoff+i {
						st[b*Tq+i] = int32(c)
					}
				}
			}
		}
		return st
	}
	for _, c := range []struct {
		name   string
		s      AttentionShape
		starts []int32
	}{
		{"chunks and documents", AttentionShape{B: 2, Tq: 160, Tk: 160, NH: 4, NKV: 2, HD: 64, Causal: true, Chunk: 48}, cuts(2, 160, 0, [][]int{{20, 90, 91}, {130}})},
		{"key block", AttentionShape{B: 1, Tq: 96, Tk: 128, NH: 2, NKV: 1, HD: 64, QOff: 192, KOff: 64, Causal: true, Chunk: 100}, cuts(1, 96, 192, [][]int{{150, 230}})},
	} {
		for _, dt := range dtypes {
			s := c.s
			r := rand.New(rand.NewPCG(43, uint64(dt)))
			q, k, v := roundTo(dt, randn(r, s.B*s.Tq*s.NH*s.HD, 1)), roundTo(dt, randn(r, s.B*s.Tk*s.NKV*s.HD, 1)), roundTo(dt, randn(r, s.B*s.Tk*s.NKV*s.HD, 1))
			dout := roundTo(dt, randn(r, len(q), 1))
			f64 := func(x []float32) []float64 {
				y := make([]float64, len(x))
				for i, v := range x {
					y[i] = float64(v)
				}
				return y
			}
			wo, wl := make([]float64, len(q)), make([]float64, s.B*s.NH*s.Tq)
			cpu.FlashAttentionMasked(wo, wl, f64(q), f64(k), f64(v), c.starts, s)
			wq, wk, wv := make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
			cpu.FlashAttentionBackwardMasked(wq, wk, wv, f64(dout), wo, wl, f64(q), f64(k), f64(v), c.starts, s)
			name := fmt.Sprintf("%s %s", c.name, dt)
			onDevice(t, func() {
				bq, bk, bv, st := put(t, dt, q), put(t, dt, k), put(t, dt, v), putI32(t, c.starts)
				bo, bl := poisoned(t, dt, len(q)), poisoned(t, F32, len(wl))
				dev.FlashAttentionMasked(bo, bl, bq, bk, bv, st, s)
				check(t, name+" out", dt, get(bo), f32s64(wo), 1e-5)
				check(t, name+" lse", F32, finiteOnly(get(bl), wl), finiteOnly(f32s64(wl), wl), 1e-6)
				bdq, bdk, bdv := poisoned(t, dt, len(q)), poisoned(t, dt, len(k)), poisoned(t, dt, len(v))
				dev.FlashAttentionBackwardMasked(bdq, bdk, bdv, put(t, dt, dout), bo, bl, bq, bk, bv, st, s, false)
				check(t, name+" dq", dt, get(bdq), f32s64(wq), 1e-4)
				check(t, name+" dk", dt, get(bdk), f32s64(wk), 1e-4)
				check(t, name+" dv", dt, get(bdv), f32s64(wv), 1e-4)
			})
		}
	}
}

// finiteOnly is x where want is finite, 0 where it is −∞ (a row that sees no
// key), so that a relative error compares the finite values and a −∞ lse that
// the device left finite shows as a difference.
func finiteOnly(x []float32, want []float64) []float32 {
	y := make([]float32, len(x))
	for i := range x {
		if !math.IsInf(want[i], -1) {
			y[i] = x[i]
		} else if !math.IsInf(float64(x[i]), -1) {
			y[i] = float32(math.NaN())
		}
	}
	return y
}

func f32s64(x []float64) []float32 {
	y := make([]float32, len(x))
	for i, v := range x {
		y[i] = float32(v)
	}
	return y
}
