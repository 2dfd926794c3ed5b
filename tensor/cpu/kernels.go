package cpu

import (
	"math"
	"runtime"
	"sync"

	"github.com/shardline/shardline/tensor"
)

// Float is the element type of the kernels: float32 in training, float64 in the
// gradient checks, which run the very same code.
type Float = tensor.Float

// Shapes in comments: B batch, T time, C channels, V vocabulary, NH query heads,
// NKV key/value heads, HD head size, OC output channels, F feed-forward width.
// Backward kernels accumulate (+=) into every gradient, activations and parameters
// alike; the caller zeroes gradient buffers before a backward pass.

// parallelFor runs f(lo, hi) over [0, n) in one chunk per core when n·cost is
// large enough to pay for the goroutines.
func parallelFor(n, cost int, f func(lo, hi int)) {
	w := runtime.GOMAXPROCS(0)
	if w == 1 || n < 2 || n*cost < 1<<15 {
		f(0, n)
		return
	}
	w = min(w, n)
	var wg sync.WaitGroup
	per := (n + w - 1) / w
	for lo := 0; lo < n; lo += per {
		hi := min(lo+per, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(lo, hi)
		}()
	}
	wg.Wait()
}

// Matmul computes out (BT,OC) = inp (BT,C) · weight (OC,C)ᵀ, the layout of y = x·Wᵀ.
// accumulate adds to out instead of overwriting it.
func Matmul[F Float](out, inp, weight []F, BT, C, OC int, accumulate bool) {
	beta := F(0)
	if accumulate {
		beta = 1
	}
	gemm(false, true, BT, OC, C, inp, C, weight, C, beta, out, OC)
}

// MatmulBackward: dinp (BT,C) += dout·weight; dweight (OC,C) += doutᵀ·inp.
// dinp may be nil when the input needs no gradient (the embedding's lookup).
func MatmulBackward[F Float](dinp, dweight, dout, inp, weight []F, BT, C, OC int) {
	if dinp != nil {
		gemm(false, false, BT, C, OC, dout, OC, weight, C, 1, dinp, C)
	}
	gemm(true, false, OC, C, BT, dout, OC, inp, C, 1, dweight, C)
}

// gemm dispatches float32 to Sgemm and float64 (the gradient checks) to a plain loop.
func gemm[F Float](tA, tB bool, M, N, K int, A []F, lda int, B []F, ldb int, beta F, C []F, ldc int) {
	if a, ok := any(A).([]float32); ok {
		Sgemm(tA, tB, M, N, K, 1, a, lda, any(B).([]float32), ldb, float32(beta), any(C).([]float32), ldc)
		return
	}
	for i := 0; i < M; i++ {
		for j := 0; j < N; j++ {
			var s F
			for p := 0; p < K; p++ {
				ai, bi := i*lda+p, p*ldb+j
				if tA {
					ai = p*lda + i
				}
				if tB {
					bi = j*ldb + p
				}
				s += A[ai] * B[bi]
			}
			C[i*ldc+j] = beta*C[i*ldc+j] + s
		}
	}
}

// Embedding: out (BT,C) = wte[tokens] (wte is (V,C)).
func Embedding[F Float](out []F, tokens []int32, wte []F, BT, C int) {
	for i := 0; i < BT; i++ {
		copy(out[i*C:(i+1)*C], wte[int(tokens[i])*C:(int(tokens[i])+1)*C])
	}
}

// EmbeddingBackward: dwte[tokens] += dout.
func EmbeddingBackward[F Float](dwte, dout []F, tokens []int32, BT, C int) {
	for i := 0; i < BT; i++ {
		row := dwte[int(tokens[i])*C : (int(tokens[i])+1)*C]
		for c, g := range dout[i*C : (i+1)*C] {
			row[c] += g
		}
	}
}

// RMSNorm: out = inp · rstd · weight, rstd (BT) = 1/sqrt(mean(inp²) + eps), saved for
// backward.
func RMSNorm[F Float](out, rstd, inp, weight []F, BT, C int, eps float64) {
	for i := 0; i < BT; i++ {
		x := inp[i*C : (i+1)*C]
		var ss float64
		for _, v := range x {
			ss += float64(v) * float64(v)
		}
		r := F(1 / math.Sqrt(ss/float64(C)+eps))
		rstd[i] = r
		o := out[i*C : (i+1)*C]
		for c, v := range x {
			o[c] = v * r * weight[c]
		}
	}
}

// RMSNormBackward: with g = dout·weight, dinp += rstd·g − inp·rstd³·mean(g·inp);
// dweight += dout·inp·rstd.
func RMSNormBackward[F Float](dinp, dweight, dout, inp, weight, rstd []F, BT, C int) {
	for i := 0; i < BT; i++ {
		x, d, dx := inp[i*C:(i+1)*C], dout[i*C:(i+1)*C], dinp[i*C:(i+1)*C]
		r := rstd[i]
		var dot float64
		for c := range x {
			dot += float64(d[c]*weight[c]) * float64(x[c])
		}
		k := F(dot/float64(C)) * r * r * r
		for c := range x {
			dweight[c] += d[c] * x[c] * r
			dx[c] += r*d[c]*weight[c] - x[c]*k
		}
	}
}

// RopeTables fills cos and sin (T, HD/2) for rotary embeddings:
// angle(t, i) = t · theta^(−2i/HD).
func RopeTables[F Float](cos, sin []F, T, HD int, theta float64) {
	half := HD / 2
	for t := 0; t < T; t++ {
		for i := 0; i < half; i++ {
			a := float64(t) * math.Pow(theta, -2*float64(i)/float64(HD))
			cos[t*half+i], sin[t*half+i] = F(math.Cos(a)), F(math.Sin(a))
		}
	}
}

// Rope rotates x (B,T,NH,HD) in place, pairing element i with i + HD/2 (the
// rotate-half convention of Llama's reference code).
func Rope[F Float](x, cos, sin []F, B, T, NH, HD int) {
	rope(x, cos, sin, B, T, NH, HD, 1)
}

// RopeBackward rotates the gradient dx (B,T,NH,HD) back in place: the transpose of
// the forward rotation.
func RopeBackward[F Float](dx, cos, sin []F, B, T, NH, HD int) {
	rope(dx, cos, sin, B, T, NH, HD, -1)
}

func rope[F Float](x, cos, sin []F, B, T, NH, HD int, dir F) {
	half := HD / 2
	for b := 0; b < B; b++ {
		for t := 0; t < T; t++ {
			cs, sn := cos[t*half:(t+1)*half], sin[t*half:(t+1)*half]
			for h := 0; h < NH; h++ {
				v := x[((b*T+t)*NH+h)*HD:]
				for i := 0; i < half; i++ {
					x1, x2 := v[i], v[i+half]
					s := dir * sn[i]
					v[i], v[i+half] = x1*cs[i]-x2*s, x1*s+x2*cs[i]
				}
			}
		}
	}
}

// Attention is causal scaled-dot-product attention with grouped key/value heads:
// q (B,T,NH,HD), k and v (B,T,NKV,HD), out (B,T,NH,HD); att (B,NH,T,T) keeps the
// probabilities for backward (row t holds t+1 meaningful values). Query head h reads
// key/value head h / (NH/NKV).
func Attention[F Float](out, att, q, k, v []F, B, T, NH, NKV, HD int) {
	group, scale := NH/NKV, 1/math.Sqrt(float64(HD))
	parallelFor(B*NH, T*T*HD, func(lo, hi int) {
		for bh := lo; bh < hi; bh++ {
			b, h := bh/NH, bh%NH
			kh := h / group
			for t := 0; t < T; t++ {
				qt := q[((b*T+t)*NH+h)*HD:][:HD]
				row := att[(bh*T+t)*T:][:T]
				maxv := math.Inf(-1)
				for t2 := 0; t2 <= t; t2++ {
					kt := k[((b*T+t2)*NKV+kh)*HD:][:HD]
					var s F
					for d := range qt {
						s += qt[d] * kt[d]
					}
					row[t2] = s * F(scale)
					maxv = math.Max(maxv, float64(row[t2]))
				}
				var sum float64
				for t2 := 0; t2 <= t; t2++ {
					e := math.Exp(float64(row[t2]) - maxv)
					row[t2] = F(e)
					sum += e
				}
				o := out[((b*T+t)*NH+h)*HD:][:HD]
				clear(o)
				inv := F(1 / sum)
				for t2 := 0; t2 <= t; t2++ {
					row[t2] *= inv
					p := row[t2]
					vt := v[((b*T+t2)*NKV+kh)*HD:][:HD]
					for d := range o {
						o[d] += p * vt[d]
					}
				}
				clear(row[t+1:])
			}
		}
	})
}

// AttentionBackward accumulates dq, dk, dv from dout through the saved
// probabilities. Work is split by (batch, key/value head), so no two goroutines
// write the same dk or dv row.
func AttentionBackward[F Float](dq, dk, dv, dout, att, q, k, v []F, B, T, NH, NKV, HD int) {
	group, scale := NH/NKV, F(1/math.Sqrt(float64(HD)))
	parallelFor(B*NKV, group*T*T*HD, func(lo, hi int) {
		datt := make([]F, T)
		for bk := lo; bk < hi; bk++ {
			b, kh := bk/NKV, bk%NKV
			for h := kh * group; h < (kh+1)*group; h++ {
				bh := b*NH + h
				for t := 0; t < T; t++ {
					row := att[(bh*T+t)*T:][:T]
					do := dout[((b*T+t)*NH+h)*HD:][:HD]
					var dot F
					for t2 := 0; t2 <= t; t2++ {
						vt := v[((b*T+t2)*NKV+kh)*HD:][:HD]
						dvt := dv[((b*T+t2)*NKV+kh)*HD:][:HD]
						var s F
						for d := range do {
							s += do[d] * vt[d]
							dvt[d] += row[t2] * do[d]
						}
						datt[t2] = s
						dot += s * row[t2]
					}
					qt := q[((b*T+t)*NH+h)*HD:][:HD]
					dqt := dq[((b*T+t)*NH+h)*HD:][:HD]
					for t2 := 0; t2 <= t; t2++ {
						ds := row[t2] * (datt[t2] - dot) * scale
						kt := k[((b*T+t2)*NKV+kh)*HD:][:HD]
						dkt := dk[((b*T+t2)*NKV+kh)*HD:][:HD]
						for d := range qt {
							dqt[d] += ds * kt[d]
							dkt[d] += ds * qt[d]
						}
					}
				}
			}
		}
	})
}

// SwiGLU: out = silu(gate) · up, elementwise over n values; silu(x) = x·σ(x).
func SwiGLU[F Float](out, gate, up []F, n int) {
	for i := 0; i < n; i++ {
		g := float64(gate[i])
		out[i] = F(g/(1+math.Exp(-g))) * up[i]
	}
}

// SwiGLUBackward: dgate += dout·up·σ(g)·(1 + g·(1−σ(g))); dup += dout·silu(g).
func SwiGLUBackward[F Float](dgate, dup, dout, gate, up []F, n int) {
	for i := 0; i < n; i++ {
		g := float64(gate[i])
		s := 1 / (1 + math.Exp(-g))
		dgate[i] += dout[i] * up[i] * F(s*(1+g*(1-s)))
		dup[i] += dout[i] * F(g*s)
	}
}

// CrossEntropy computes the softmax of logits (BT,V) into probs and each position's
// loss −log p[target] into losses (BT). Targets < 0 are ignored (loss 0).
func CrossEntropy[F Float](losses, probs, logits []F, targets []int32, BT, V int) {
	parallelFor(BT, 3*V, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			l, p := logits[i*V:(i+1)*V], probs[i*V:(i+1)*V]
			maxv := float64(l[0])
			for _, x := range l {
				maxv = math.Max(maxv, float64(x))
			}
			var sum float64
			for j, x := range l {
				e := math.Exp(float64(x) - maxv)
				p[j] = F(e)
				sum += e
			}
			inv := 1 / sum
			for j := range p {
				p[j] = F(float64(p[j]) * inv)
			}
			if targets[i] < 0 {
				losses[i] = 0
				continue
			}
			losses[i] = F(-math.Log(math.Max(float64(p[targets[i]]), 1e-30)))
		}
	})
}

// CrossEntropyBackward: dlogits += (probs − onehot(target)) · dloss[i]; ignored
// positions contribute nothing.
func CrossEntropyBackward[F Float](dlogits, dloss, probs []F, targets []int32, BT, V int) {
	parallelFor(BT, V, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			if targets[i] < 0 {
				continue
			}
			d, p, g := dlogits[i*V:(i+1)*V], probs[i*V:(i+1)*V], dloss[i]
			for j := range d {
				d[j] += p[j] * g
			}
			d[targets[i]] -= g
		}
	})
}

// Add: out = a + b over n values (the residual connection; its backward passes the
// gradient to both inputs unchanged).
func Add[F Float](out, a, b []F, n int) {
	for i := 0; i < n; i++ {
		out[i] = a[i] + b[i]
	}
}

// AddInto: dst += src over n values.
func AddInto[F Float](dst, src []F, n int) {
	for i := 0; i < n; i++ {
		dst[i] += src[i]
	}
}
