package cpu

import (
	"math"

	"github.com/shardline/shardline/tensor"
)

// Float is the element type of the kernels: float32 in training, float64 in the
// gradient checks, which run the very same code.
type Float = tensor.Float

// Shapes in comments: B batch, T time, C channels, V vocabulary, NH query heads,
// NKV key/value heads, HD head size, OC output channels, F feed-forward width.
// Backward kernels accumulate (+=) into every gradient, activations and parameters
// alike; the caller zeroes gradient buffers before a backward pass.

// Matmul computes out (BT,OC) = inp (BT,C) · weight (OC,C)ᵀ, the layout of y = x·Wᵀ.
// accumulate adds to out instead of overwriting it. A bf16 inp (a bf16 run's
// saved activation) is read as stored: on the dot-product path its rows are the
// product's bf16 operand as they are; otherwise it is widened first.
func Matmul[F Float](out []F, inp, weight tensor.Weights[F], s tensor.MatmulShape, accumulate bool) {
	BT, C, OC := s.BT, s.C, s.OC
	beta := F(0)
	if accumulate {
		beta = 1
	}
	if inp.BF16 == nil {
		gemmW(false, true, BT, OC, C, inp.F, C, weight, C, beta, out, OC)
		return
	}
	if o, ok := any(out).([]float32); ok && bf16Dot && weight.BF16 != nil {
		sgemmDotBF16A(BT, OC, C, inp.BF16, C, true, weight.BF16, C, float32(beta), o, OC)
		return
	}
	w := widened(inp, BT*C)
	gemmW(false, true, BT, OC, C, w.buf, C, weight, C, beta, out, OC)
	listOf[widenBuf[F]]().put(w)
}

// MatmulBackward: dinp (BT,C) += dout·weight (= when accumulate is false, which
// spares the caller clearing dinp and the product reading it); dweight (OC,C) +=
// doutᵀ·inp always, a bf16 inp widened as the product packs it. dinp may be nil
// when the input needs no gradient.
func MatmulBackward[F Float](dinp, dweight, dout []F, inp, weight tensor.Weights[F], s tensor.MatmulShape, accumulate bool) {
	MatmulBackwardInto(dinp, FloatGradient(dweight), dout, inp, weight, s, accumulate)
}

// widenBuf is recycled scratch for a bf16 operand widened to F.
type widenBuf[F Float] struct{ buf []F }

// widened returns a recycled buffer holding the first n values of x widened to F;
// the caller puts it back on its list.
func widened[F Float](x tensor.Weights[F], n int) *widenBuf[F] {
	w := listOf[widenBuf[F]]().get()
	if cap(w.buf) < n {
		w.buf = make([]F, n)
	}
	w.buf = w.buf[:n]
	FromBF16(w.buf, x.BF16[:n])
	return w
}

// gemmW is gemm with B a weights view. A float32 product with bf16 weights runs
// on the dot-product path where it is on (BF16Dot: A rounded to bf16, pairs
// multiplied by VDPBF16PS), else widens the weights while packing them
// (SgemmBF16); a float64 product (the gradient checks) widens them first.
func gemmW[F Float](tA, tB bool, M, N, K int, A []F, lda int, B tensor.Weights[F], ldb int, beta F, C []F, ldc int) {
	if B.BF16 == nil {
		gemm(nil, tA, tB, M, N, K, A, lda, B.F, ldb, beta, C, ldc)
		return
	}
	if a, ok := any(A).([]float32); ok {
		sgemm := SgemmBF16
		if bf16Dot {
			sgemm = SgemmDotBF16
		}
		sgemm(tA, tB, M, N, K, 1, a, lda, B.BF16, ldb, float32(beta), any(C).([]float32), ldc)
		return
	}
	w := make([]F, len(B.BF16))
	B.Widen(w, 0)
	gemm(nil, tA, tB, M, N, K, A, lda, w, ldb, beta, C, ldc)
}

// gemm dispatches float32 to Sgemm and float64 (the gradient checks) to a plain
// loop. Inside a parallel region a chunk passes its own packing buffers in b and
// the product runs on the calling goroutine; outside one b is nil.
func gemm[F Float](b *gemmBufs, tA, tB bool, M, N, K int, A []F, lda int, B []F, ldb int, beta F, C []F, ldc int) {
	gemmTri(b, full, tA, tB, M, N, K, A, lda, B, ldb, beta, C, ldc)
}

// gemmTri is gemm inside a parallel region (b not nil) told that op(A) is
// triangular, so the float32 product skips its zeros.
func gemmTri[F Float](b *gemmBufs, tri triangle, tA, tB bool, M, N, K int, A []F, lda int, B []F, ldb int, beta F, C []F, ldc int) {
	if a, ok := any(A).([]float32); ok {
		bb, cc := any(B).([]float32), any(C).([]float32)
		if b != nil {
			sgemmSerial(b, tri, tA, tB, M, N, K, 1, a, lda, bb, ldb, float32(beta), cc, ldc)
			return
		}
		Sgemm(tA, tB, M, N, K, 1, a, lda, bb, ldb, float32(beta), cc, ldc)
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
			if beta != 0 { // beta 0 never reads C (as BLAS, and Sgemm): a stale NaN or ±Inf there must not leak
				s += beta * C[i*ldc+j]
			}
			C[i*ldc+j] = s
		}
	}
}

// Embedding: out (BT,C) = wte[tokens] (wte is (V,C)).
func Embedding[F Float](out []F, tokens []int32, wte tensor.Weights[F], s tensor.EmbeddingShape) {
	C := s.C
	for i := 0; i < s.BT; i++ {
		if t := int(tokens[i]) - s.Lo; t >= 0 && t < s.N {
			wte.Widen(out[i*C:(i+1)*C], t*C)
		} else {
			clear(out[i*C : (i+1)*C]) // another rank's vocabulary row
		}
	}
}

// EmbeddingBackward: dwte[tokens] += dout, for the tokens in the table's rows.
func EmbeddingBackward[F Float](dwte, dout []F, tokens []int32, s tensor.EmbeddingShape) {
	C := s.C
	for i := 0; i < s.BT; i++ {
		t := int(tokens[i]) - s.Lo
		if t < 0 || t >= s.N {
			continue
		}
		row := dwte[t*C : (t+1)*C]
		for c, g := range dout[i*C : (i+1)*C] {
			row[c] += g
		}
	}
}

// MergeAttention folds one key block's attention (outB, lseB) into the running
// result (out, lse) of the same queries (tensor.Kernels.MergeAttention).
func MergeAttention[F Float](out, lse, outB, lseB []F, s tensor.AttentionShape) {
	B, Tq, NH, HD := s.B, s.Tq, s.NH, s.HD
	for b := 0; b < B; b++ {
		for h := 0; h < NH; h++ {
			for t := 0; t < Tq; t++ {
				li := (b*NH+h)*Tq + t
				l1, l2 := float64(lse[li]), float64(lseB[li])
				if math.IsInf(l2, -1) {
					continue
				}
				row := ((b*Tq+t)*NH + h) * HD
				o, ob := out[row:row+HD], outB[row:row+HD]
				if math.IsInf(l1, -1) {
					copy(o, ob)
					lse[li] = F(l2)
					continue
				}
				mx := math.Max(l1, l2)
				l := mx + math.Log(math.Exp(l1-mx)+math.Exp(l2-mx))
				w1, w2 := math.Exp(l1-l), math.Exp(l2-l)
				for d := range o {
					o[d] = F(w1*float64(o[d]) + w2*float64(ob[d]))
				}
				lse[li] = F(l)
			}
		}
	}
}

// RMSNorm: out = inp · rstd · weight, rstd (BT) = 1/sqrt(mean(inp²) + eps), saved for
// backward.
func RMSNorm[F Float](out, rstd, inp []F, weight tensor.Weights[F], BT, C int, eps float64) {
	g := getGain(weight, C)
	j := getJob[rmsNormJob[F]]()
	*j = rmsNormJob[F]{out, rstd, inp, g.vals, C, eps}
	parallel(j, BT, 3*C)
	putJob(j)
	g.put()
}

// gain is a norm's weights as F values: the view's own when it holds F, else
// bf16 weights widened into a recycled buffer (no allocation in the steady
// state).
type gain[F Float] struct {
	vals []F
	buf  []F
}

func getGain[F Float](w tensor.Weights[F], C int) *gain[F] {
	g := listOf[gain[F]]().get()
	if w.BF16 == nil {
		g.vals = w.F
		return g
	}
	if cap(g.buf) < C {
		g.buf = make([]F, C)
	}
	g.vals = g.buf[:C]
	w.Widen(g.vals, 0)
	return g
}

func (g *gain[F]) put() {
	g.vals = nil
	listOf[gain[F]]().put(g)
}

type rmsNormJob[F Float] struct {
	out, rstd, inp, weight []F
	C                      int
	eps                    float64
}

func (j *rmsNormJob[F]) rows(_, lo, hi int) {
	rmsNormRows(j.out, j.rstd, j.inp, j.weight, lo, hi, j.C, j.eps)
}

func rmsNormRows[F Float](out, rstd, inp, weight []F, lo, hi, C int, eps float64) {
	for i := lo; i < hi; i++ {
		x := inp[i*C : (i+1)*C]
		r := F(1 / math.Sqrt(sumSquares(x)/float64(C)+eps))
		rstd[i] = r
		o := out[i*C : (i+1)*C]
		for c, v := range x {
			o[c] = v * r * weight[c]
		}
	}
}

// RMSNormBackward: with g = dout·weight, dinp += rstd·g − inp·rstd³·mean(g·inp)
// (dinp = … unless accumulate: each row is cleared before its sum, which gives
// the same bits as zeroing dinp first); dweight += dout·inp·rstd.
//
// One pass over the rows: blocks of rmsBlock rows are shared among the cores, each
// block summing its own part of dweight, and the parts are added in block order.
// The blocks depend on BT alone, never on the number of cores or on timing, so the
// result is the same on any machine.
func RMSNormBackward[F Float](dinp, dweight, dout, inp []F, weight tensor.Weights[F], rstd []F, BT, C int, accumulate bool) {
	g := getGain(weight, C)
	defer g.put()
	j := getJob[rmsNormBackJob[F]]()
	j.rmsNormBackArgs = rmsNormBackArgs[F]{dinp, dweight, dout, inp, g.vals, rstd, C, accumulate}
	chunks := run(j, BT, rmsBlock)
	dw := dweight[:C]
	for c := range chunks {
		part := j.bufs.scratch[c][:C]
		for i := range dw {
			dw[i] += part[i]
		}
	}
	j.rmsNormBackArgs = rmsNormBackArgs[F]{}
	listOf[rmsNormBackJob[F]]().put(j) // with its buffers
}

// rmsBlock is the rows of one block of RMSNormBackward.
const rmsBlock = 64

type rmsNormBackArgs[F Float] struct {
	dinp, dweight, dout, inp, weight, rstd []F
	C                                      int
	accumulate                             bool
}

type rmsNormBackJob[F Float] struct {
	rmsNormBackArgs[F]
	bufs chunkBufs[F]
}

func (j *rmsNormBackJob[F]) rows(c, lo, hi int) {
	C := j.C
	dw := j.bufs.scratchFor(c, C)
	clear(dw)
	weight := j.weight[:C]
	for i := lo; i < hi; i++ {
		x := j.inp[i*C : (i+1)*C]
		d, dx := j.dout[i*C:(i+1)*C], j.dinp[i*C:(i+1)*C]
		if !j.accumulate {
			clear(dx)
		}
		r := j.rstd[i]
		k := dot3(d, weight, x) / F(C) * r * r * r
		rmsBackRow(dx, dw, d, weight, x, r, k)
	}
}

// rmsBackRowScalar is one row of RMSNorm's backward: dx[c] += r·d[c]·w[c] −
// x[c]·k and dw[c] += d[c]·x[c]·r.
func rmsBackRowScalar[F Float](dx, dw, d, w, x []F, r, k F) {
	dx, dw, d, w = dx[:len(x)], dw[:len(x)], d[:len(x)], w[:len(x)]
	for c, xc := range x {
		dx[c] += r*d[c]*w[c] - xc*k
		dw[c] += d[c] * xc * r
	}
}

// sumSquares is Σ x² in float64, over four independent running sums (one chain
// of dependent additions would wait on each one's latency).
func sumSquares[F Float](x []F) float64 {
	var s0, s1, s2, s3 float64
	n := len(x) &^ 3
	for c := 0; c < n; c += 4 {
		v := x[c : c+4 : c+4]
		s0 += float64(v[0]) * float64(v[0])
		s1 += float64(v[1]) * float64(v[1])
		s2 += float64(v[2]) * float64(v[2])
		s3 += float64(v[3]) * float64(v[3])
	}
	for _, v := range x[n:] {
		s0 += float64(v) * float64(v)
	}
	return (s0 + s1) + (s2 + s3)
}

// sum4 is Σ x over four independent running sums.
func sum4[F Float](x []F) F {
	var s0, s1, s2, s3 F
	n := len(x) &^ 3
	for i := 0; i < n; i += 4 {
		v := x[i : i+4 : i+4]
		s0, s1, s2, s3 = s0+v[0], s1+v[1], s2+v[2], s3+v[3]
	}
	for _, v := range x[n:] {
		s0 += v
	}
	return (s0 + s1) + (s2 + s3)
}

// dot2 is Σ a·b over len(a) elements, over four independent running sums.
func dot2[F Float](a, b []F) F {
	b = b[:len(a)]
	var s0, s1, s2, s3 F
	n := len(a) &^ 3
	for i := 0; i < n; i += 4 {
		x, y := a[i:i+4:i+4], b[i:i+4:i+4]
		s0, s1, s2, s3 = s0+x[0]*y[0], s1+x[1]*y[1], s2+x[2]*y[2], s3+x[3]*y[3]
	}
	for i := n; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// dot3 is Σ a·b·c over len(a) elements, over four independent running sums.
func dot3[F Float](a, b, c []F) F {
	b, c = b[:len(a)], c[:len(a)]
	var s0, s1, s2, s3 F
	n := len(a) &^ 3
	for i := 0; i < n; i += 4 {
		x, y, z := a[i:i+4:i+4], b[i:i+4:i+4], c[i:i+4:i+4]
		s0 += x[0] * y[0] * z[0]
		s1 += x[1] * y[1] * z[1]
		s2 += x[2] * y[2] * z[2]
		s3 += x[3] * y[3] * z[3]
	}
	for i := n; i < len(a); i++ {
		s0 += a[i] * b[i] * c[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// RopeTables fills cos and sin (T, len(inv)) for rotary embeddings: angle(t, i) =
// t · inv[i] (tensor.RopeInvFreq gives inv).
func RopeTables[F Float](cos, sin []F, T int, inv []float64) {
	half := len(inv)
	for t := 0; t < T; t++ {
		for i, f := range inv {
			a := float64(t) * f
			cos[t*half+i], sin[t*half+i] = F(math.Cos(a)), F(math.Sin(a))
		}
	}
}

// Rope rotates x (B,T,NH,HD) in place, pairing element i with i + HD/2 (the
// rotate-half convention of Llama's reference code).
func Rope[F Float](x, cos, sin []F, s tensor.RopeShape) {
	rope(x, cos, sin, s, 1)
}

// RopeBackward rotates the gradient dx (B,T,NH,HD) back in place: the transpose of
// the forward rotation.
func RopeBackward[F Float](dx, cos, sin []F, s tensor.RopeShape) {
	rope(dx, cos, sin, s, -1)
}

func rope[F Float](x, cos, sin []F, s tensor.RopeShape, dir F) {
	j := getJob[ropeJob[F]]()
	*j = ropeJob[F]{x, cos, sin, s.T, s.NH, s.HD, dir}
	parallel(j, s.B*s.T, 3*s.NH*s.HD)
	putJob(j)
}

// ropeJob rotates positions [lo, hi) of the B·T (batch, time) rows.
type ropeJob[F Float] struct {
	x, cos, sin []F
	T, NH, HD   int
	dir         F
}

func (j *ropeJob[F]) rows(_, lo, hi int) {
	half, NH, HD := j.HD/2, j.NH, j.HD
	for bt := lo; bt < hi; bt++ {
		t := bt % j.T
		cs, sn := j.cos[t*half:(t+1)*half], j.sin[t*half:(t+1)*half]
		for h := 0; h < NH; h++ {
			v := j.x[(bt*NH+h)*HD : (bt*NH+h+1)*HD]
			x1s, x2s := v[:half], v[half:half*2]
			x2s, sn = x2s[:len(x1s)], sn[:len(x1s)]
			cs = cs[:len(x1s)]
			for i, x1 := range x1s {
				x2 := x2s[i]
				s := j.dir * sn[i]
				x1s[i], x2s[i] = x1*cs[i]-x2*s, x1*s+x2*cs[i]
			}
		}
	}
}

// exp32 is e^x to float32 precision (about 1 ulp): x = n·ln2 + r with |r| ≤ ln2/2,
// e^r from Cephes' expf polynomial, scaled by 2^n through the exponent bits.
func exp32(x float32) float32 {
	switch {
	case x > 88.72283:
		return float32(math.Inf(1))
	case x < -87.33654:
		return 0
	case x != x:
		return x
	}
	t := x * 1.44269504088896341
	ni := int32(t + 0.5) // round to nearest: conversion truncates toward zero
	if t < -0.5 {
		ni = int32(t - 0.5)
	}
	n := float32(ni)
	r := x - n*0.693359375 + n*2.12194440e-4
	p := float32(1.9875691500e-4)
	p = p*r + 1.3981999507e-3
	p = p*r + 8.3334519073e-3
	p = p*r + 4.1665795894e-2
	p = p*r + 1.6666665459e-1
	p = p*r + 5.0000001201e-1
	y := p*r*r + r + 1
	return y * math.Float32frombits(uint32(ni+127)<<23)
}

// SwiGLU: out = silu(gate) · up, elementwise over n values; silu(x) = x·σ(x).
func SwiGLU[F Float](out, gate, up []F, n int) {
	j := getJob[swigluJob[F]]()
	*j = swigluJob[F]{out: out, gate: gate, up: up}
	parallel(j, n, 8)
	putJob(j)
}

type swigluJob[F Float] struct{ out, gate, up, dout []F }

func (j *swigluJob[F]) rows(_, lo, hi int) {
	out, gate, up := j.out, j.gate, j.up
	var s [256]F
	for b := lo; b < hi; b += len(s) {
		m := min(len(s), hi-b)
		g := gate[b : b+m]
		sigmoid(s[:m], g)
		swigluRow(out[b:b+m], g, up[b:b+m], s[:m])
	}
}

// swigluRowScalar sets o[i] = g[i]·s[i]·u[i] (s = σ(g)): SwiGLU's product.
func swigluRowScalar[F Float](o, g, u, s []F) {
	o, u, s = o[:len(g)], u[:len(g)], s[:len(g)]
	for i, x := range g {
		o[i] = x * s[i] * u[i]
	}
}

// SwiGLUBackward: dgate += dout·up·σ(g)·(1 + g·(1−σ(g))); dup += dout·silu(g)
// (= for both when accumulate is false, which spares clearing and reading them).
func SwiGLUBackward[F Float](dgate, dup, dout, gate, up []F, n int, accumulate bool) {
	j := getJob[swigluBackJob[F]]()
	*j = swigluBackJob[F]{dgate, dup, dout, gate, up, accumulate}
	parallel(j, n, 10)
	putJob(j)
}

type swigluBackJob[F Float] struct {
	dgate, dup, dout, gate, up []F
	accumulate                 bool
}

func (j *swigluBackJob[F]) rows(_, lo, hi int) {
	dgate, dup, dout, gate, up := j.dgate, j.dup, j.dout, j.gate, j.up
	var sg [256]F
	for b := lo; b < hi; b += len(sg) {
		m := min(len(sg), hi-b)
		g := gate[b : b+m]
		sigmoid(sg[:m], g)
		swigluBackRow(dgate[b:b+m], dup[b:b+m], dout[b:b+m], g, up[b:b+m], sg[:m], j.accumulate)
	}
}

// swigluBackRowScalar sets dg[i] = do[i]·u[i]·s[i]·(1 + g[i]·(1 − s[i])) and
// du[i] = do[i]·g[i]·s[i] (s = σ(g)), or adds them with acc.
func swigluBackRowScalar[F Float](dg, du, do, g, u, s []F, acc bool) {
	dg, du, do, u, s = dg[:len(g)], du[:len(g)], do[:len(g)], u[:len(g)], s[:len(g)]
	if !acc {
		for i, x := range g {
			s := s[i]
			dg[i] = do[i] * u[i] * s * (1 + x*(1-s))
			du[i] = do[i] * x * s
		}
		return
	}
	for i, x := range g {
		s := s[i]
		dg[i] += do[i] * u[i] * s * (1 + x*(1-s))
		du[i] += do[i] * x * s
	}
}

// sigmoid sets s[i] = 1 / (1 + e^−g[i]): vectorised for float32, math.Exp for
// float64.
func sigmoid[F Float](s, g []F) {
	if s32, ok := any(s).([]float32); ok {
		vsigmoid32(s32, any(g).([]float32))
		return
	}
	for i, x := range g {
		s[i] = F(1 / (1 + math.Exp(-float64(x))))
	}
}

// expInPlace sets x[i] = e^x[i]: vectorised for float32, math.Exp for float64.
func expInPlace[F Float](x []F) {
	if x32, ok := any(x).([]float32); ok {
		vexp32(x32, x32)
		return
	}
	for i, v := range x {
		x[i] = F(math.Exp(float64(v)))
	}
}

// CrossEntropy computes the softmax of logits (BT,V) into probs and each position's
// loss −log p[target] into losses (BT). Targets < 0 are ignored (loss 0).
func CrossEntropy[F Float](losses, probs, logits []F, targets []int32, BT, V int) {
	j := getJob[crossEntropyJob[F]]()
	*j = crossEntropyJob[F]{a: losses, probs: probs, b: logits, targets: targets, V: V}
	parallel(j, BT, 3*V)
	putJob(j)
}

// crossEntropyJob is the forward (a = losses, b = logits) or, with back set, the
// backward (a = dlogits, b = dloss), which overwrites dlogits.
type crossEntropyJob[F Float] struct {
	a, probs, b []F
	targets     []int32
	V, Lo       int // Lo: the first vocabulary entry of the rows (backward)
	back        bool
}

func (j *crossEntropyJob[F]) rows(_, lo, hi int) {
	V, probs, targets := j.V, j.probs, j.targets
	if j.back {
		dlogits, dloss := j.a, j.b
		for i := lo; i < hi; i++ {
			d, p, g := dlogits[i*V:(i+1)*V], probs[i*V:(i+1)*V], dloss[i]
			if targets[i] < 0 {
				clear(d)
				continue
			}
			for j := range d {
				d[j] = p[j] * g // in place when d is p: p[j] is read first
			}
			if t := int(targets[i]) - j.Lo; t >= 0 && t < V {
				d[t] -= g
			}
		}
		return
	}
	losses, logits := j.a, j.b
	for i := lo; i < hi; i++ {
		p := probs[i*V : (i+1)*V]
		softmaxRow(p, logits[i*V:(i+1)*V])
		if targets[i] < 0 {
			losses[i] = 0
			continue
		}
		losses[i] = F(-math.Log(math.Max(float64(p[targets[i]]), 1e-30)))
	}
}

// HeadLoss is the output head and its loss a chunk of s.Rows rows at a time
// (tensor.Kernels.HeadLoss): work (s.Rows·V) holds a chunk's logits, then its
// softmax, then, when dx is not nil, its gradient (each written over the
// last); dx's rows are set to dlogits·w and dw gains dlogitsᵀ·x. Each row's
// loss and dx row are those of the whole-vocabulary kernels (Matmul,
// CrossEntropy and their backward) on that row; dw sums the chunks' products
// in chunk order.
func HeadLoss[F Float](losses, dx, dw, work []F, x, w tensor.Weights[F], targets []int32, dloss []F, s tensor.HeadShape) {
	HeadLossInto(losses, dx, FloatGradient(dw), work, x, w, targets, dloss, s)
}

// CrossEntropyBackward: dlogits = (probs − onehot(target)) · dloss[i]; ignored
// positions get 0. dlogits may be probs itself.
func CrossEntropyBackward[F Float](dlogits, dloss, probs []F, targets []int32, BT, V int) {
	CrossEntropyBackwardVocab(dlogits, dloss, probs, targets, tensor.VocabShape{BT: BT, V: V, Parts: 1})
}

// CrossEntropyBackwardVocab is CrossEntropyBackward over a rank's part of a
// split vocabulary (entries s.Lo..s.Lo+s.V−1): a target outside it adds no
// one-hot term.
func CrossEntropyBackwardVocab[F Float](dlogits, dloss, probs []F, targets []int32, s tensor.VocabShape) {
	j := getJob[crossEntropyJob[F]]()
	*j = crossEntropyJob[F]{a: dlogits, probs: probs, b: dloss, targets: targets, V: s.V, Lo: s.Lo, back: true}
	parallel(j, s.BT, s.V)
	putJob(j)
}

// CrossEntropyParts sets lse[i] to the log-sum-exp of row i of a rank's logits
// (s.V entries of a split vocabulary, from s.Lo; in float64) and tlogit[i] to
// the target's logit where the target is among them, 0 elsewhere.
func CrossEntropyParts[F Float](lse, tlogit, logits []F, targets []int32, s tensor.VocabShape) {
	j := getJob[vocabJob[F]]()
	*j = vocabJob[F]{lse: lse, tlogit: tlogit, logits: logits, targets: targets, s: s}
	parallel(j, s.BT, 2*s.V)
	putJob(j)
}

// CrossEntropyCombine sets each row's loss, log Σ_ranks exp(lseAll) − tlogit
// (0 for a target < 0), and the rank's part of its softmax, from every rank's
// log-sum-exp (lseAll, s.Parts×s.BT, rank after rank, combined in rank order)
// and the target's logit summed over the ranks.
func CrossEntropyCombine[F Float](losses, probs, logits, lseAll, tlogit []F, targets []int32, s tensor.VocabShape) {
	j := getJob[vocabJob[F]]()
	*j = vocabJob[F]{losses: losses, probs: probs, logits: logits, lse: lseAll, tlogit: tlogit, targets: targets, s: s, combine: true}
	parallel(j, s.BT, 3*s.V)
	putJob(j)
}

// vocabJob is CrossEntropyParts, or with combine CrossEntropyCombine (lse is
// then every rank's).
type vocabJob[F Float] struct {
	lse, tlogit, logits, losses, probs []F
	targets                            []int32
	s                                  tensor.VocabShape
	combine                            bool
}

func (j *vocabJob[F]) rows(_, lo, hi int) {
	V, BT := j.s.V, j.s.BT
	for i := lo; i < hi; i++ {
		row := j.logits[i*V : (i+1)*V]
		if !j.combine {
			j.lse[i] = F(logSumExp(row, V, 1))
			j.tlogit[i] = 0
			if t := int(j.targets[i]) - j.s.Lo; j.targets[i] >= 0 && t >= 0 && t < V {
				j.tlogit[i] = row[t]
			}
			continue
		}
		l := logSumExp(j.lse[i:], j.s.Parts, BT) // the ranks' row i, in rank order
		p := j.probs[i*V : (i+1)*V]
		for k, x := range row {
			p[k] = F(math.Exp(float64(x) - l))
		}
		j.losses[i] = 0
		if j.targets[i] >= 0 {
			j.losses[i] = F(l - float64(j.tlogit[i]))
		}
	}
}

// logSumExp is log Σ exp over n values of x taken every stride elements, in
// float64.
func logSumExp[F Float](x []F, n, stride int) float64 {
	mx := math.Inf(-1)
	for k := 0; k < n; k++ {
		mx = math.Max(mx, float64(x[k*stride]))
	}
	var s float64
	for k := 0; k < n; k++ {
		s += math.Exp(float64(x[k*stride]) - mx)
	}
	return mx + math.Log(s)
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

// AddIntoW is AddInto with src F or bf16 values (widened as read): a bf16
// reduction's part of the sum added into fp32 gradients.
func AddIntoW[F Float](dst []F, src tensor.Weights[F], n int) {
	if src.BF16 == nil {
		AddInto(dst, src.F, n)
		return
	}
	d, h := dst[:n], src.BF16[:n]
	for i, v := range h {
		d[i] += F(v.Float32())
	}
}
