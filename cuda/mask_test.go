//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
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
