package cpu

import (
	"fmt"
	"math"
	"math/rand"
	"testing"

	"github.com/shardline/shardline/tensor"
)

// naiveAttention is the float64 formula for FlashAttention's contract: rows in
// (b, i, h) order like out, lse as (b, h, i); a row that sees no key gives 0 and
// −Inf.
func naiveAttention(s tensor.AttentionShape, q, k, v []float64) (out, lse []float64) {
	scale := 1 / math.Sqrt(float64(s.HD))
	out, lse = make([]float64, s.B*s.Tq*s.NH*s.HD), make([]float64, s.B*s.NH*s.Tq)
	for b := 0; b < s.B; b++ {
		for i := 0; i < s.Tq; i++ {
			for h := 0; h < s.NH; h++ {
				kh := h / (s.NH / s.NKV)
				qi := ((b*s.Tq+i)*s.NH + h) * s.HD
				sc := make([]float64, s.Tk)
				m := math.Inf(-1)
				for j := range sc {
					sc[j] = math.Inf(-1)
					if s.Causal && s.KOff+j > s.QOff+i {
						continue
					}
					kj := ((b*s.Tk+j)*s.NKV + kh) * s.HD
					sc[j] = scale * dot(q[qi:qi+s.HD], k[kj:kj+s.HD])
					m = math.Max(m, sc[j])
				}
				var z float64
				for j := range sc {
					if !math.IsInf(sc[j], -1) {
						z += math.Exp(sc[j] - m)
					}
				}
				lse[(b*s.NH+h)*s.Tq+i] = math.Inf(-1)
				if z == 0 {
					continue
				}
				lse[(b*s.NH+h)*s.Tq+i] = m + math.Log(z)
				for j := range sc {
					if math.IsInf(sc[j], -1) {
						continue
					}
					p := math.Exp(sc[j]-m) / z
					kj := ((b*s.Tk+j)*s.NKV + kh) * s.HD
					for d := 0; d < s.HD; d++ {
						out[qi+d] += p * v[kj+d]
					}
				}
			}
		}
	}
	return out, lse
}

func maxRel(got, want []float64) float64 {
	var worst float64
	for i := range want {
		if math.IsInf(want[i], -1) {
			if !math.IsInf(got[i], -1) {
				return math.Inf(1)
			}
			continue
		}
		worst = max(worst, math.Abs(got[i]-want[i])/(1+math.Abs(want[i])))
	}
	return worst
}

var flashShapes = []tensor.AttentionShape{
	{B: 2, Tq: 150, Tk: 150, NH: 4, NKV: 2, HD: 8, Causal: true},                   // three blocks, the last short; GQA
	{B: 1, Tq: 70, Tk: 130, NH: 2, NKV: 1, HD: 4, QOff: 60, KOff: 0, Causal: true}, // queries after some keys (context parallelism)
	{B: 1, Tq: 40, Tk: 30, NH: 2, NKV: 2, HD: 4, QOff: 0, KOff: 20, Causal: true},  // the first 20 queries see no key at all
	{B: 1, Tq: 65, Tk: 66, NH: 3, NKV: 3, HD: 4, Causal: false},                    // bidirectional
}

// TestFlashAttention checks the forward against the float64 formula and, where the
// shapes allow, the materialised Attention's forward and backward (float64:
// 1e-12, a different summation order; float32: 1e-5).
func TestFlashAttention(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(21))
		for _, s := range flashShapes {
			q, k, v := randF64(r, s.B*s.Tq*s.NH*s.HD), randF64(r, s.B*s.Tk*s.NKV*s.HD), randF64(r, s.B*s.Tk*s.NKV*s.HD)
			out, lse := make([]float64, len(q)), make([]float64, s.B*s.NH*s.Tq)
			FlashAttention(out, lse, q, k, v, s)
			wo, wl := naiveAttention(s, q, k, v)
			if e := max(maxRel(out, wo), maxRel(lse, wl)); e > 1e-12 {
				t.Fatalf("%+v: forward differs from the formula by %.3g", s, e)
			}
			q32, k32, v32 := toF32(q), toF32(k), toF32(v)
			o32, l32 := make([]float32, len(q)), make([]float32, len(lse))
			FlashAttention(o32, l32, q32, k32, v32, s)
			if e := max(maxRel(toF64(o32), wo), maxRel(toF64(l32), wl)); e > 1e-5 {
				t.Fatalf("%+v: float32 forward differs from the formula by %.3g", s, e)
			}
			if s.QOff != 0 || s.KOff != 0 || !s.Causal || s.Tq != s.Tk {
				continue
			}
			// the materialised kernel: forward and backward
			dout := randF64(r, len(q))
			ao, att := make([]float64, len(q)), make([]float64, s.B*s.NH*s.Tq*s.Tk)
			Attention(ao, att, q, k, v, tensor.AttentionShape{B: s.B, Tq: s.Tq, Tk: s.Tq, NH: s.NH, NKV: s.NKV, HD: s.HD, Causal: true})
			dq, dk, dv := make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
			AttentionBackward(dq, dk, dv, dout, att, q, k, v, tensor.AttentionShape{B: s.B, Tq: s.Tq, Tk: s.Tq, NH: s.NH, NKV: s.NKV, HD: s.HD, Causal: true})
			fq, fk, fv := make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
			FlashAttentionBackward(fq, fk, fv, dout, out, lse, q, k, v, s)
			for name, p := range map[string][2][]float64{"out": {out, ao}, "dq": {fq, dq}, "dk": {fk, dk}, "dv": {fv, dv}} {
				if e := maxRel(p[0], p[1]); e > 1e-12 {
					t.Fatalf("%+v: %s differs from the materialised kernel's by %.3g", s, name, e)
				}
			}
		}
	})
}

// TestFlashAttentionGrad checks the backward against central finite differences
// of L = Σ out·R in float64 (tolerance as the other gradient checks), for every
// shape kind above at a small size.
func TestFlashAttentionGrad(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(22))
		for _, s := range []tensor.AttentionShape{
			{B: 1, Tq: 5, Tk: 9, NH: 2, NKV: 1, HD: 3, QOff: 6, KOff: 2, Causal: true},
			{B: 2, Tq: 4, Tk: 4, NH: 2, NKV: 2, HD: 2, Causal: true},
			{B: 1, Tq: 3, Tk: 5, NH: 1, NKV: 1, HD: 4, Causal: false},
			{B: 1, Tq: 4, Tk: 3, NH: 2, NKV: 1, HD: 2, QOff: 0, KOff: 2, Causal: true}, // rows 0, 1 see nothing
		} {
			q, k, v := randF64(r, s.B*s.Tq*s.NH*s.HD), randF64(r, s.B*s.Tk*s.NKV*s.HD), randF64(r, s.B*s.Tk*s.NKV*s.HD)
			R := randF64(r, len(q))
			out, lse := make([]float64, len(q)), make([]float64, s.B*s.NH*s.Tq)
			loss := func() float64 { FlashAttention(out, lse, q, k, v, s); return dot(out, R) }
			loss()
			dq, dk, dv := make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
			FlashAttentionBackward(dq, dk, dv, R, out, lse, q, k, v, s)
			checkGrads(t, fmt.Sprintf("flash attention %+v", s), map[string][]float64{"q": q, "k": k, "v": v},
				map[string][]float64{"q": dq, "k": dk, "v": dv}, loss)
		}
	})
}

func toF32(x []float64) []float32 {
	y := make([]float32, len(x))
	for i, v := range x {
		y[i] = float32(v)
	}
	return y
}

func toF64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// BenchmarkAttention compares the materialised attention with flash attention,
// forward and backward, at the tiny recipe's head shape (4 heads of 32) for
// several sequence lengths (B·T = 8192 tokens each), and from 512 tokens
// flash attention within chunks and within documents of 256 tokens.
func BenchmarkAttention(b *testing.B) {
	for _, T := range []int{64, 128, 256, 512, 1024, 2048} {
		s := tensor.AttentionShape{B: 8192 / T, Tq: T, Tk: T, NH: 4, NKV: 4, HD: 32, Causal: true}
		n := s.B * T * s.NH * s.HD
		r := rand.New(rand.NewSource(1))
		q, k, v, do := toF32(randF64(r, n)), toF32(randF64(r, n)), toF32(randF64(r, n)), toF32(randF64(r, n))
		out, dq, dk, dv := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
		b.Run(fmt.Sprintf("materialised/T=%d", T), func(b *testing.B) {
			att := make([]float32, s.B*s.NH*T*T)
			for range b.N {
				Attention(out, att, q, k, v, tensor.AttentionShape{B: s.B, Tq: T, Tk: T, NH: s.NH, NKV: s.NKV, HD: s.HD, Causal: true})
				AttentionBackward(dq, dk, dv, do, att, q, k, v, tensor.AttentionShape{B: s.B, Tq: T, Tk: T, NH: s.NH, NKV: s.NKV, HD: s.HD, Causal: true})
			}
		})
		b.Run(fmt.Sprintf("flash/T=%d", T), func(b *testing.B) {
			lse := make([]float32, s.B*s.NH*T)
			for range b.N {
				FlashAttention(out, lse, q, k, v, s)
				FlashAttentionBackward(dq, dk, dv, do, out, lse, q, k, v, s)
			}
		})
		if T >= 512 {
			// Chunked attention (chunks of 256) and documents (of 256 tokens):
			// the key blocks a chunk or document hides are skipped, so the time
			// falls toward T/256 chunks' worth of attention.
			chunked := s
			chunked.Chunk = 256
			b.Run(fmt.Sprintf("flash-chunk256/T=%d", T), func(b *testing.B) {
				lse := make([]float32, s.B*s.NH*T)
				for range b.N {
					FlashAttention(out, lse, q, k, v, chunked)
					FlashAttentionBackward(dq, dk, dv, do, out, lse, q, k, v, chunked)
				}
			})
			starts := make([]int32, s.B*T)
			for i := range starts {
				starts[i] = int32(i % T / 256 * 256)
			}
			b.Run(fmt.Sprintf("flash-documents256/T=%d", T), func(b *testing.B) {
				lse := make([]float32, s.B*s.NH*T)
				for range b.N {
					FlashAttentionMasked(out, lse, q, k, v, starts, s)
					FlashAttentionBackwardMasked(dq, dk, dv, do, out, lse, q, k, v, starts, s)
				}
			})
		}
	}
}

// TestMaxOf: the vectorised maximum equals a scalar scan on every length from 1
// to 100 (bulk of sixteen plus tails), with negative values, -Inf (masked scores)
// and the maximum at either end.
func TestMaxOf(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(5))
		for n := 1; n <= 100; n++ {
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(r.NormFloat64()*10 - 20)
				if r.Intn(7) == 0 {
					x[i] = float32(math.Inf(-1))
				}
			}
			for _, at := range []int{0, n - 1, r.Intn(n)} {
				y := append([]float32(nil), x...)
				y[at] = 99
				if got, want := maxOf(y), maxScan(y); got != want || got != 99 {
					t.Fatalf("n=%d, max at %d: got %v, want %v", n, at, got, want)
				}
			}
			if got, want := maxOf(x), maxScan(x); got != want {
				t.Fatalf("n=%d: got %v, want %v", n, got, want)
			}
		}
	})
}

// TestAffineAndDSoftmax: the vectorised row updates of flash attention equal the
// scalar expressions bit for bit on every length from 1 to 70 (the same
// roundings: a product, then a sum; a difference, then two products).
func TestAffineAndDSoftmax(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(6))
		for n := 1; n <= 70; n++ {
			x, d, p := toF32(randF64(r, n)), toF32(randF64(r, n)), toF32(randF64(r, n))
			a, b, dot, scale := float32(r.NormFloat64()), float32(r.NormFloat64()), float32(r.NormFloat64()), float32(0.125)
			wx, wd := make([]float32, n), make([]float32, n)
			for i := range x {
				wx[i] = a*x[i] + b
				wd[i] = p[i] * (d[i] - dot) * scale
			}
			affine(x, a, b)
			dsoftmax(d, p, dot, scale)
			for i := range x {
				if x[i] != wx[i] || d[i] != wd[i] {
					t.Fatalf("n=%d, element %d: affine %v want %v, dsoftmax %v want %v", n, i, x[i], wx[i], d[i], wd[i])
				}
			}
		}
	})
}

// TestMergeAttention: attention over two key blocks, each computed apart (the
// second at its key offset) and merged, equals the float64 formula over all
// keys, causal with GQA; the first block alone sees no key for the early
// queries (their rows start at −∞ and take the second block's result).
// float64 kernels, tolerance 1e-12: the same sums in another order.
func TestMergeAttention(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	const B, T, NH, NKV, HD, split = 2, 7, 4, 2, 5, 3
	full := tensor.AttentionShape{B: B, Tq: T, Tk: T, NH: NH, NKV: NKV, HD: HD, Causal: true}
	q, k, v := make([]float64, B*T*NH*HD), make([]float64, B*T*NKV*HD), make([]float64, B*T*NKV*HD)
	for _, x := range [][]float64{q, k, v} {
		for i := range x {
			x[i] = r.NormFloat64()
		}
	}
	want, wantLSE := naiveAttention(full, q, k, v)
	// Keys [split, T) first (queries before split see none of them), then [0, split).
	block := func(lo, hi int) (out, lse []float64) {
		kb, vb := make([]float64, B*(hi-lo)*NKV*HD), make([]float64, B*(hi-lo)*NKV*HD)
		for b := 0; b < B; b++ {
			n := (hi - lo) * NKV * HD
			copy(kb[b*n:(b+1)*n], k[(b*T+lo)*NKV*HD:(b*T+hi)*NKV*HD])
			copy(vb[b*n:(b+1)*n], v[(b*T+lo)*NKV*HD:(b*T+hi)*NKV*HD])
		}
		s := full
		s.Tk, s.KOff = hi-lo, lo
		out, lse = make([]float64, len(want)), make([]float64, len(wantLSE))
		FlashAttention(out, lse, q, kb, vb, s)
		return out, lse
	}
	out, lse := block(split, T)
	ob, lb := block(0, split)
	MergeAttention(out, lse, ob, lb, full)
	for i := range want {
		if math.Abs(out[i]-want[i]) > 1e-12*(1+math.Abs(want[i])) {
			t.Fatalf("out[%d] = %.15g, want %.15g", i, out[i], want[i])
		}
	}
	for i := range wantLSE {
		if math.Abs(lse[i]-wantLSE[i]) > 1e-12*(1+math.Abs(wantLSE[i])) {
			t.Fatalf("lse[%d] = %.15g, want %.15g", i, lse[i], wantLSE[i])
		}
	}
}
