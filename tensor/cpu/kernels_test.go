package cpu

import (
	"fmt"
	"math"
	"math/rand"
	"runtime"
	"slices"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Gradient checks run every kernel in float64 and compare its backward with
// central finite differences of L = Σ out·R for a random R. With h = 1e-6 the
// truncation error is O(h²) ≈ 1e-12 and rounding O(ε/h) ≈ 1e-10, so a relative
// tolerance of 1e-6 separates a correct gradient from a wrong one (a bug is O(1)).

func randF64(r *rand.Rand, n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = r.NormFloat64()
	}
	return s
}

// checkGrads perturbs every element of every input and compares (L(x+h) − L(x−h))/2h
// with the analytic gradient.
func checkGrads(t *testing.T, name string, inputs map[string][]float64, grads map[string][]float64, loss func() float64) {
	t.Helper()
	const h = 1e-6
	for in, x := range inputs {
		g := grads[in]
		for i := range x {
			orig := x[i]
			x[i] = orig + h
			lp := loss()
			x[i] = orig - h
			lm := loss()
			x[i] = orig
			num := (lp - lm) / (2 * h)
			if math.Abs(num-g[i]) > 1e-6*(1+math.Abs(num)) {
				t.Fatalf("%s: d/d%s[%d]: analytic %.10g, numeric %.10g", name, in, i, g[i], num)
			}
		}
	}
}

func dot(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

func TestMatmulGrad(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	BT, C, OC := 5, 7, 3
	inp, w, R := randF64(r, BT*C), randF64(r, OC*C), randF64(r, BT*OC)
	out := make([]float64, BT*OC)
	loss := func() float64 {
		Matmul(out, tensor.FloatWeights(inp), tensor.FloatWeights(w), tensor.MatmulShape{BT: BT, C: C, OC: OC}, false)
		return dot(out, R)
	}
	dinp, dw := make([]float64, BT*C), make([]float64, OC*C)
	MatmulBackward(dinp, dw, R, tensor.FloatWeights(inp), tensor.FloatWeights(w), tensor.MatmulShape{BT: BT, C: C, OC: OC}, true)
	checkGrads(t, "matmul", map[string][]float64{"inp": inp, "w": w}, map[string][]float64{"inp": dinp, "w": dw}, loss)
	// Without accumulate dinp is overwritten (whatever it held) and dweight still
	// accumulates: exactly what the accumulating call gave on cleared buffers.
	stale, dw2 := randF64(r, BT*C), make([]float64, OC*C)
	MatmulBackward(stale, dw2, R, tensor.FloatWeights(inp), tensor.FloatWeights(w), tensor.MatmulShape{BT: BT, C: C, OC: OC}, false)
	for i := range stale {
		if stale[i] != dinp[i] {
			t.Fatalf("overwritten dinp[%d] = %v, want %v", i, stale[i], dinp[i])
		}
	}
	MatmulBackward(stale, dw2, R, tensor.FloatWeights(inp), tensor.FloatWeights(w), tensor.MatmulShape{BT: BT, C: C, OC: OC}, false)
	for i := range dw2 {
		if dw2[i] != 2*dw[i] {
			t.Fatalf("dweight[%d] = %v after two calls, want %v", i, dw2[i], 2*dw[i])
		}
	}
}

func TestEmbeddingGrad(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	BT, C, V := 6, 4, 5
	tokens := []int32{0, 3, 3, 4, 1, 0}
	wte, R := randF64(r, V*C), randF64(r, BT*C)
	out := make([]float64, BT*C)
	es := tensor.EmbeddingShape{BT: BT, C: C, N: len(wte) / C}
	loss := func() float64 { Embedding(out, tokens, tensor.FloatWeights(wte), es); return dot(out, R) }
	dwte := make([]float64, V*C)
	EmbeddingBackward(dwte, R, tokens, es)
	checkGrads(t, "embedding", map[string][]float64{"wte": wte}, map[string][]float64{"wte": dwte}, loss)
}

func TestRMSNormGrad(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	BT, C := 4, 8
	inp, w, R := randF64(r, BT*C), randF64(r, C), randF64(r, BT*C)
	out, rstd := make([]float64, BT*C), make([]float64, BT)
	loss := func() float64 { RMSNorm(out, rstd, inp, tensor.FloatWeights(w), BT, C, 1e-5); return dot(out, R) }
	loss()
	dinp, dw := make([]float64, BT*C), make([]float64, C)
	for i := range dinp {
		dinp[i] = 7 // overwritten: not accumulating
	}
	RMSNormBackward(dinp, dw, R, inp, tensor.FloatWeights(w), rstd, BT, C, false)
	checkGrads(t, "rmsnorm", map[string][]float64{"inp": inp, "w": w}, map[string][]float64{"inp": dinp, "w": dw}, loss)
}

func TestRopeGrad(t *testing.T) {
	r := rand.New(rand.NewSource(4))
	B, T, NH, HD := 2, 5, 3, 8
	x, R := randF64(r, B*T*NH*HD), randF64(r, B*T*NH*HD)
	cos, sin := make([]float64, T*HD/2), make([]float64, T*HD/2)
	RopeTables(cos, sin, T, tensor.RopeInvFreq(HD, 10000, tensor.RopeScaling{}))
	out := make([]float64, len(x))
	loss := func() float64 {
		copy(out, x)
		Rope(out, cos, sin, tensor.RopeShape{B: B, T: T, NH: NH, HD: HD})
		return dot(out, R)
	}
	dx := append([]float64(nil), R...)
	RopeBackward(dx, cos, sin, tensor.RopeShape{B: B, T: T, NH: NH, HD: HD})
	checkGrads(t, "rope", map[string][]float64{"x": x}, map[string][]float64{"x": dx}, loss)
	// Position 0 is not rotated; the rotation preserves norms.
	copy(out, x)
	Rope(out, cos, sin, tensor.RopeShape{B: B, T: T, NH: NH, HD: HD})
	for i := 0; i < NH*HD; i++ {
		if out[i] != x[i] {
			t.Fatalf("rope moved position 0")
		}
	}
}

func TestAttentionGrad(t *testing.T) {
	r := rand.New(rand.NewSource(5))
	for _, shape := range [][5]int{{2, 5, 4, 2, 4}, {1, 6, 2, 2, 6}, {1, 3, 3, 1, 2}} {
		B, T, NH, NKV, HD := shape[0], shape[1], shape[2], shape[3], shape[4]
		q, k, v := randF64(r, B*T*NH*HD), randF64(r, B*T*NKV*HD), randF64(r, B*T*NKV*HD)
		R := randF64(r, B*T*NH*HD)
		out, att := make([]float64, len(q)), make([]float64, B*NH*T*T)
		loss := func() float64 {
			Attention(out, att, q, k, v, tensor.AttentionShape{B: B, Tq: T, Tk: T, NH: NH, NKV: NKV, HD: HD, Causal: true})
			return dot(out, R)
		}
		loss()
		dq, dk, dv := make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
		AttentionBackward(dq, dk, dv, R, att, q, k, v, tensor.AttentionShape{B: B, Tq: T, Tk: T, NH: NH, NKV: NKV, HD: HD, Causal: true})
		checkGrads(t, "attention", map[string][]float64{"q": q, "k": k, "v": v}, map[string][]float64{"q": dq, "k": dk, "v": dv}, loss)
	}
}

func TestAttentionIsCausal(t *testing.T) {
	r := rand.New(rand.NewSource(6))
	B, T, NH, HD := 1, 6, 2, 4
	q, k, v := randF64(r, T*NH*HD), randF64(r, T*NH*HD), randF64(r, T*NH*HD)
	out1, att := make([]float64, len(q)), make([]float64, NH*T*T)
	Attention(out1, att, q, k, v, tensor.AttentionShape{B: B, Tq: T, Tk: T, NH: NH, NKV: NH, HD: HD, Causal: true})
	// Changing the last position's key and value changes no earlier output.
	for i := (T - 1) * NH * HD; i < len(k); i++ {
		k[i], v[i] = k[i]+1, v[i]-1
	}
	out2 := make([]float64, len(q))
	Attention(out2, att, q, k, v, tensor.AttentionShape{B: B, Tq: T, Tk: T, NH: NH, NKV: NH, HD: HD, Causal: true})
	for i := 0; i < (T-1)*NH*HD; i++ {
		if out1[i] != out2[i] {
			t.Fatalf("output %d saw the future", i)
		}
	}
}

func TestSwiGLUGrad(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	n := 20
	g, u, R := randF64(r, n), randF64(r, n), randF64(r, n)
	out := make([]float64, n)
	loss := func() float64 { SwiGLU(out, g, u, n); return dot(out, R) }
	dg, du := make([]float64, n), make([]float64, n)
	SwiGLUBackward(dg, du, R, g, u, n, true)
	checkGrads(t, "swiglu", map[string][]float64{"gate": g, "up": u}, map[string][]float64{"gate": dg, "up": du}, loss)
}

func TestCrossEntropyGrad(t *testing.T) {
	r := rand.New(rand.NewSource(8))
	BT, V := 5, 7
	logits, dloss := randF64(r, BT*V), randF64(r, BT)
	targets := []int32{1, 0, 6, -1, 3}
	losses, probs := make([]float64, BT), make([]float64, BT*V)
	loss := func() float64 { CrossEntropy(losses, probs, logits, targets, BT, V); return dot(losses, dloss) }
	loss()
	dlogits := make([]float64, BT*V)
	CrossEntropyBackward(dlogits, dloss, probs, targets, BT, V)
	checkGrads(t, "cross-entropy", map[string][]float64{"logits": logits}, map[string][]float64{"logits": dlogits}, loss)
	if losses[3] != 0 {
		t.Fatalf("ignored target has loss %v", losses[3])
	}
}

// TestVocabParallelCrossEntropy: a vocabulary split over ranks (here 3 of 4
// and 3 entries of 7, and a target in each part, one ignored) gives, through
// CrossEntropyParts, the collectives done by hand (the ranks' log-sum-exps
// gathered rank after rank, the target logits summed) and
// CrossEntropyCombine, the losses of the whole vocabulary and each rank's
// columns of its softmax; and CrossEntropyBackward over a part gives that
// part's columns of the whole gradient. Tolerance 1e-12 in float64: the split
// log-sum-exp differs from the whole one by a few roundings.
func TestVocabParallelCrossEntropy(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	BT, V := 5, 7
	logits, dloss := randF64(r, BT*V), randF64(r, BT)
	targets := []int32{1, 0, 6, -1, 4}
	losses, probs, dlogits := make([]float64, BT), make([]float64, BT*V), make([]float64, BT*V)
	CrossEntropy(losses, probs, logits, targets, BT, V)
	CrossEntropyBackward(dlogits, dloss, probs, targets, BT, V)
	parts := []struct{ lo, n int }{{0, 4}, {4, 3}}
	cols := func(x []float64, lo, n int) []float64 {
		out := make([]float64, 0, BT*n)
		for i := 0; i < BT; i++ {
			out = append(out, x[i*V+lo:i*V+lo+n]...)
		}
		return out
	}
	lseAll, tlogit := make([]float64, len(parts)*BT), make([]float64, BT)
	for k, p := range parts {
		tl := make([]float64, BT)
		CrossEntropyParts(lseAll[k*BT:(k+1)*BT], tl, cols(logits, p.lo, p.n), targets, tensor.VocabShape{BT: BT, V: p.n, Lo: p.lo, Parts: len(parts)})
		for i := range tl {
			tlogit[i] += tl[i]
		}
	}
	for _, p := range parts {
		s := tensor.VocabShape{BT: BT, V: p.n, Lo: p.lo, Parts: len(parts)}
		l, pr := make([]float64, BT), make([]float64, BT*p.n)
		CrossEntropyCombine(l, pr, cols(logits, p.lo, p.n), lseAll, tlogit, targets, s)
		assert.InDeltaSlice(t, losses, l, 1e-12, "part from %d: losses", p.lo)
		assert.InDeltaSlice(t, cols(probs, p.lo, p.n), pr, 1e-12, "part from %d: softmax", p.lo)
		d := make([]float64, BT*p.n)
		CrossEntropyBackwardVocab(d, dloss, pr, targets, s)
		assert.InDeltaSlice(t, cols(dlogits, p.lo, p.n), d, 1e-12, "part from %d: gradient", p.lo)
	}
}

// TestFloat32MatchesFloat64 runs the float32 instantiations on the same inputs.
// Tolerance 1e-4 relative: a handful of fp32 roundings (ε ≈ 6e-8) per output, over
// sums of at most a few hundred terms.
func TestFloat32MatchesFloat64(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(9))
		B, T, NH, NKV, HD := 2, 16, 4, 2, 8
		q64, k64, v64 := randF64(r, B*T*NH*HD), randF64(r, B*T*NKV*HD), randF64(r, B*T*NKV*HD)
		f32 := func(x []float64) []float32 {
			y := make([]float32, len(x))
			for i, v := range x {
				y[i] = float32(v)
			}
			return y
		}
		out64, att64 := make([]float64, len(q64)), make([]float64, B*NH*T*T)
		Attention(out64, att64, q64, k64, v64, tensor.AttentionShape{B: B, Tq: T, Tk: T, NH: NH, NKV: NKV, HD: HD, Causal: true})
		out32, att32 := make([]float32, len(q64)), make([]float32, B*NH*T*T)
		Attention(out32, att32, f32(q64), f32(k64), f32(v64), tensor.AttentionShape{B: B, Tq: T, Tk: T, NH: NH, NKV: NKV, HD: HD, Causal: true})
		for i := range out64 {
			if math.Abs(float64(out32[i])-out64[i]) > 1e-4*(1+math.Abs(out64[i])) {
				t.Fatalf("attention out[%d]: fp32 %v, fp64 %v", i, out32[i], out64[i])
			}
		}
		BT, C := B*T, NH*HD
		w := randF64(r, C*C)
		m64, m32 := make([]float64, BT*C), make([]float32, BT*C)
		Matmul(m64, tensor.FloatWeights(q64), tensor.FloatWeights(w), tensor.MatmulShape{BT: BT, C: C, OC: C}, false)
		Matmul(m32, tensor.FloatWeights(f32(q64)), tensor.FloatWeights(f32(w)), tensor.MatmulShape{BT: BT, C: C, OC: C}, false)
		for i := range m64 {
			if math.Abs(float64(m32[i])-m64[i]) > 1e-4*(1+math.Abs(m64[i])) {
				t.Fatalf("matmul out[%d]: fp32 %v, fp64 %v", i, m32[i], m64[i])
			}
		}
	})
}

// TestExp32 compares the float32 exp with math.Exp over the range softmax and
// SwiGLU use. Tolerance 4e-7 relative: about 3 ulp of float32.
func TestExp32(t *testing.T) {
	for x := -87.0; x <= 88.0; x += 0.01337 {
		got, want := float64(exp32(float32(x))), math.Exp(float64(float32(x)))
		if math.Abs(got-want) > 4e-7*want {
			t.Fatalf("exp32(%v) = %v, want %v", x, got, want)
		}
	}
	if exp32(-100) != 0 || !math.IsInf(float64(exp32(100)), 1) {
		t.Fatal("exp32 does not saturate")
	}
}

// TestVectorFunctions checks the vector exp and logistic function against
// float64 on lengths with and without a tail past the last whole vector (and
// that nothing past dst's length is written, and that a NaN stays NaN). exp:
// over the clamped range,
// relative tolerance as TestExp32 (about 3 ulp); sigmoid: into both saturated
// ends, absolute tolerance 1e-6 (the result lies in [0, 1] and float32 resolves
// about 6e-8 near 1).
func TestVectorFunctions(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		for _, f := range []struct {
			name    string
			vec     func(dst, src []float32)
			lo, hi  float64
			ref     func(float64) float64
			relTol  bool
			epsilon float64
		}{
			{"exp", vexp32, -87, 88, math.Exp, true, 4e-7},
			{"sigmoid", vsigmoid32, -120, 120, func(x float64) float64 { return 1 / (1 + math.Exp(-x)) }, false, 1e-6},
		} {
			for _, n := range []int{1, 15, 16, 17, 100, 1000} {
				src, dst := make([]float32, n), make([]float32, n, n+16)
				for i := range src {
					src[i] = float32(f.lo + (f.hi-f.lo)*float64(i)/float64(n))
				}
				past := dst[n : n+16]
				for i := range past {
					past[i] = -1
				}
				f.vec(dst, src)
				for i, v := range past {
					if v != -1 {
						t.Fatalf("n=%d: %s wrote %v at %d, past the end (%s)", n, f.name, v, n+i, KernelName())
					}
				}
				for i := range src {
					want, tol := f.ref(float64(src[i])), f.epsilon
					if f.relTol {
						tol *= want
					}
					if !(math.Abs(float64(dst[i])-want) <= tol) {
						t.Fatalf("n=%d: %s(%v) = %v, want %v (%s)", n, f.name, src[i], dst[i], want, KernelName())
					}
				}
				// A NaN stays NaN wherever it lies (a clamp must not make it a number).
				for _, at := range []int{0, n - 1} {
					src[at] = float32(math.NaN())
					f.vec(dst, src)
					if !math.IsNaN(float64(dst[at])) {
						t.Fatalf("n=%d: %s(NaN) at %d = %v (%s)", n, f.name, at, dst[at], KernelName())
					}
				}
			}
		}
	})
}

// TestSoftmaxRow32: the float32 softmax (vector exponentials, float64 sum) is
// the float64 one within 2e-6 relative: the difference x − max rounds in
// float32 to half an ulp of its size (under 1e-6 absolute for the |x − max| <
// 32 of these rows), which the exponential makes a relative error, and the
// exponential adds about 1 ulp (6e-8); on rows with and without a
// tail past the last vector; a row holding a NaN or +∞ (or only −∞) is NaN
// throughout, as in float64, so a broken step is never scored as a loss, and a
// −∞ logit beside finite ones gets no probability to speak of (at most the
// clamped exponential's 1.2e-38 of the row's sum).
func TestSoftmaxRow32(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(45))
		for _, n := range []int{1, 7, 16, 33, 256} {
			x32, x64 := make([]float32, n), make([]float64, n)
			for i := range x32 {
				x32[i] = float32(r.NormFloat64() * 4)
				x64[i] = float64(x32[i])
			}
			p32, p64 := make([]float32, n), make([]float64, n)
			softmaxRow(p32, x32)
			softmaxRow(p64, x64)
			for i := range p32 {
				if d := math.Abs(float64(p32[i]) - p64[i]); d > 2e-6*p64[i] {
					t.Fatalf("n=%d: p[%d] = %v, float64 %v (%s)", n, i, p32[i], p64[i], KernelName())
				}
			}
			for _, bad := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
				y := append([]float32(nil), x32...)
				y[n/2] = float32(bad)
				softmaxRow(p32, y)
				if n > 1 && math.IsInf(bad, -1) { // a −∞ logit beside finite ones: (nearly) no probability
					if p32[n/2] > 1e-30 {
						t.Fatalf("n=%d, a logit −∞: p = %v (%s)", n, p32[n/2], KernelName())
					}
					continue
				}
				for i, v := range p32 {
					if !math.IsNaN(float64(v)) {
						t.Fatalf("n=%d, a logit %v: p[%d] = %v, want NaN (%s)", n, bad, i, v, KernelName())
					}
				}
			}
		}
	})
}

// TestAdamWByHand: two steps on one parameter, computed by hand in float64.
// Tolerance 1e-6: float32 arithmetic on values of order 1.
func TestAdamWByHand(t *testing.T) {
	p, m, v := []float32{1}, []float32{0}, []float32{0}
	AdamW(p, nil, []float32{0.5}, m, v, 0.01, 0.9, 0.95, 1e-8, 0.1, 1, 1)
	// m̂ = 0.5, v̂ = 0.25: update = 0.5/0.5 = 1; p = 1 − 0.01·(1 + 0.1·1) = 0.989
	if math.Abs(float64(p[0])-0.989) > 1e-6 {
		t.Fatalf("step 1: %v", p[0])
	}
	AdamW(p, nil, []float32{-0.5}, m, v, 0.01, 0.9, 0.95, 1e-8, 0, 1, 2)
	m2, v2 := 0.9*0.05+0.1*-0.5, 0.95*0.0125+0.05*0.25
	mh, vh := m2/(1-0.81), v2/(1-0.9025)
	if want := 0.989 - 0.01*mh/(math.Sqrt(vh)+1e-8); math.Abs(float64(p[0])-want) > 1e-6 {
		t.Fatalf("step 2: %v, want %v", p[0], want)
	}
	buf := []float32{0}
	SGD(p[:1], nil, []float32{2}, buf, 0.1, 0.9, 0, 1)
	SGD(p[:1], nil, []float32{4}, buf, 0.1, 0.9, 0, 0.5) // buf = 2, then 3.8
	if want := float64(float32(0.989-0.01*mh/(math.Sqrt(vh)+1e-8))) - 0.1*2 - 0.1*3.8; math.Abs(float64(p[0])-want) > 1e-6 {
		t.Fatalf("sgd: %v, want %v", p[0], want)
	}
}

// TestAdamWLanesMatchScalar: over 1,003 values (whole 16-lane blocks and a tail,
// split among cores) and four steps, AdamW equals the update written out one
// float32 operation at a time, bit for bit: the vector code must round exactly
// as the scalar formula (no fused multiply-add, same order). Steps 2 to 4 clip:
// the gradients are read as Scale would have left them (g·clip rounded to
// float32); steps 3 and 4 write the bf16 compute copy, which must be the
// updated weights rounded as ToBF16 rounds them (and step 4 covers more values
// than one block of the copy).
func TestAdamWLanesMatchScalar(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(5))
		n := 1003
		p, g, m, v := randSlice(r, n), randSlice(r, n), make([]float32, n), make([]float32, n)
		wp, wm, wv := append([]float32(nil), p...), make([]float32, n), make([]float32, n)
		lr, b1, b2, eps, wd := 3e-3, 0.9, 0.95, 1e-8, 0.1
		for step := 1; step <= 4; step++ {
			if step == 4 { // longer than a block of the bf16 copy, not a multiple of one
				more := bf16Block + 37
				n += more
				p, wp = append(p, randSlice(r, more)...), append(wp, make([]float32, more)...)
				copy(wp[n-more:], p[n-more:])
				g = append(g, randSlice(r, more)...)
				m, v = append(m, make([]float32, more)...), append(v, make([]float32, more)...)
				wm, wv = append(wm, make([]float32, more)...), append(wv, make([]float32, more)...)
			}
			clip := 1.0
			if step > 1 {
				clip = 0.37
			}
			var compute []tensor.BF16
			if step > 2 {
				compute = make([]tensor.BF16, n)
			}
			scaled := append([]float32(nil), g...)
			Scale(scaled, clip)
			AdamW(p, compute, g, m, v, lr, b1, b2, eps, wd, clip, step)
			c1 := float32(1 / (1 - math.Pow(b1, float64(step))))
			c2 := float32(1 / (1 - math.Pow(b2, float64(step))))
			fb1, fb2 := float32(b1), float32(b2)
			for i, gi := range scaled {
				wm[i] = fb1*wm[i] + (1-fb1)*gi
				wv[i] = fb2*wv[i] + (1-fb2)*gi*gi
				den := float32(math.Sqrt(float64(wv[i]*c2))) + float32(eps)
				wp[i] = wp[i] - float32(lr)*(wm[i]*c1/den+float32(wd)*wp[i])
			}
			for i := range p {
				if p[i] != wp[i] || m[i] != wm[i] || v[i] != wv[i] {
					t.Fatalf("step %d element %d: p %v want %v, m %v want %v, v %v want %v (%s)", step, i, p[i], wp[i], m[i], wm[i], v[i], wv[i], KernelName())
				}
				if compute != nil && compute[i] != tensor.ToBF16(wp[i]) {
					t.Fatalf("step %d element %d: compute %v, want %v", step, i, compute[i], tensor.ToBF16(wp[i]))
				}
			}
			for i := range g {
				g[i] = float32(r.NormFloat64())
			}
		}
	})
}

// TestRMSNormBackwardSameOnAnyCores runs RMSNormBackward (several row blocks, so
// dweight is a sum of block parts) on one core and on all of them: the results
// must be identical bit for bit, as a run resumed on another machine needs.
func TestRMSNormBackwardSameOnAnyCores(t *testing.T) {
	r := rand.New(rand.NewSource(5))
	BT, C := 300, 48
	inp, w, dout := randSlice(r, BT*C), randSlice(r, C), randSlice(r, BT*C)
	out, rstd := make([]float32, BT*C), make([]float32, BT)
	RMSNorm(out, rstd, inp, tensor.FloatWeights(w), BT, C, 1e-5)
	grads := func(procs int) ([]float32, []float32) {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
		dinp, dw := make([]float32, BT*C), make([]float32, C)
		RMSNormBackward(dinp, dw, dout, inp, tensor.FloatWeights(w), rstd, BT, C, true)
		return dinp, dw
	}
	dinp1, dw1 := grads(1)
	dinpN, dwN := grads(4)
	if !slices.Equal(dinp1, dinpN) || !slices.Equal(dw1, dwN) {
		t.Fatal("RMSNormBackward differs between one core and four")
	}
}

// TestSumSquaresAndScale: SumSquares matches a plain float64 sum (relative 1e-12:
// both sum float64 squares of float32 values, only the order differs) and is
// identical on one core and on four; Scale multiplies every value.
func TestSumSquaresAndScale(t *testing.T) {
	r := rand.New(rand.NewSource(6))
	for _, n := range []int{0, 1, 1000, 1 << 16, 3<<18 + 5} {
		x := randSlice(r, n)
		var want float64
		for _, v := range x {
			want += float64(v) * float64(v)
		}
		sum := func(procs int) float64 {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			return SumSquares(x)
		}
		got1, got4 := sum(1), sum(4)
		if math.Abs(got1-want) > 1e-12*want || got1 != got4 {
			t.Fatalf("n=%d: SumSquares %v on one core, %v on four, want %v", n, got1, got4, want)
		}
		y := slices.Clone(x)
		Scale(y, 0.5)
		for i := range y {
			if y[i] != x[i]*0.5 {
				t.Fatalf("n=%d: Scale: y[%d] = %v, want %v", n, i, y[i], x[i]*0.5)
			}
		}
	}
}

// TestShareCores: each of the callers ShareCores counts gets GOMAXPROCS ÷ callers
// threads, at least one; restoring (once, however often it is called) gives
// them back; a product computed on a share is the same, bit for bit.
func TestShareCores(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	r := rand.New(rand.NewSource(7))
	M, N, K := 96, 160, 64
	a, b := randSlice(r, M*K), randSlice(r, N*K)
	product := func() []float32 {
		c := make([]float32, M*N)
		Sgemm(false, true, M, N, K, 1, a, K, b, K, 0, c, N)
		return c
	}
	want := product()
	require.Equal(t, 4, threads())
	undo2 := Backend{}.ShareCores(2)
	assert.Equal(t, 2, threads())
	assert.Equal(t, want, product(), "a product on 2 of 4 threads")
	undo3 := Backend{}.ShareCores(3)
	assert.Equal(t, 1, threads(), "5 callers on 4 cores: one thread each")
	assert.Equal(t, want, product(), "a product on 1 thread")
	undo2()
	undo2()
	assert.Equal(t, 1, threads(), "4 ÷ 3")
	undo3()
	assert.Equal(t, 4, threads())
}

// TestExpertsMatmulSameOnAnyCores: the experts' products, shared among the
// cores an expert per core (balanced segments) or each product shared in turn
// (one expert holding most rows), equal each expert's Matmul and
// MatmulBackward run alone, bit for bit, on one core and on four, with fp32
// and bf16 weights.
func TestExpertsMatmulSameOnAnyCores(t *testing.T) {
	r := rand.New(rand.NewSource(8))
	const E, C, OC = 8, 64, 48
	for _, layout := range []struct {
		name string
		rows []int
	}{{"balanced", []int{200, 180, 220, 0, 210, 190, 205, 195}}, {"one expert holds most", []int{1400, 10, 20, 0, 30, 5, 15, 20}}} {
		for _, bf16 := range []bool{false, true} {
			off := make([]int32, E+1)
			for e, n := range layout.rows {
				off[e+1] = off[e] + int32(n)
			}
			R := int(off[E])
			x, dy := randSlice(r, R*C), randSlice(r, R*OC)
			w := make([]tensor.Weights[float32], E)
			for e := range w {
				v := randSlice(r, OC*C)
				w[e] = tensor.FloatWeights(v)
				if bf16 {
					h := make([]tensor.BF16, len(v))
					ToBF16(h, v)
					w[e] = tensor.BF16Weights[float32](h)
				}
			}
			s := tensor.ExpertsShape{C: C, OC: OC}
			products := func(procs int, alone bool) (out, dx []float32, dw [][]float32) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				out, dx, dw = make([]float32, R*OC), make([]float32, R*C), make([][]float32, E)
				for e := range dw {
					dw[e] = make([]float32, OC*C)
				}
				if !alone {
					ExpertsMatmul(out, tensor.FloatWeights(x), w, off, s, false)
					ExpertsMatmulBackward(dx, dw, dy, tensor.FloatWeights(x), w, off, s, false)
					return
				}
				for e := range w {
					lo, hi := int(off[e]), int(off[e+1])
					if hi == lo {
						continue
					}
					sh := tensor.MatmulShape{BT: hi - lo, C: C, OC: OC}
					Matmul(out[lo*OC:hi*OC], tensor.FloatWeights(x[lo*C:hi*C]), w[e], sh, false)
					MatmulBackward(dx[lo*C:hi*C], dw[e], dy[lo*OC:hi*OC], tensor.FloatWeights(x[lo*C:hi*C]), w[e], sh, false)
				}
				return
			}
			wantOut, wantDx, wantDw := products(1, true)
			for _, procs := range []int{1, 4} {
				out, dx, dw := products(procs, false)
				name := fmt.Sprintf("%s, bf16 weights %v, %d cores", layout.name, bf16, procs)
				require.True(t, slices.Equal(wantOut, out), "%s: ExpertsMatmul differs from each expert's Matmul", name)
				require.True(t, slices.Equal(wantDx, dx), "%s: ExpertsMatmulBackward's input gradient differs", name)
				for e := range dw {
					require.True(t, slices.Equal(wantDw[e], dw[e]), "%s: expert %d's weight gradient differs", name, e)
				}
			}
		}
	}
}
