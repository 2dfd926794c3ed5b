package cpu

import (
	"fmt"
	"math"

	"github.com/shardline/shardline/tensor"
)

// The FP8 kernels (tensor.Kernels' Amax, FP8Scale, Quantize, and Matmul and
// MatmulBackward on FP8 operands). Amaxes, scales and scale inverses are
// values of host buffers here, read and written in place as the step
// statistics are; the rounding and the scales are tensor/fp8.go's functions,
// called as they are.

// fp8Chunk is the values a kernel widens to float32 at a time (bf16 or f64
// inputs of Amax and Quantize): 16 KiB of scratch on the stack.
const fp8Chunk = 4096

// failOn keeps err in b's memory when b is a CPU buffer.
func failOn(b tensor.Buffer, err error) {
	if s, ok := b.Storage().(*store); ok {
		s.mem.fail(err)
	}
}

// f32s is a CPU f32 buffer's elements in place, whatever the kernels' F (a
// scale or scale inverse is f32 on every backend); nil, with the failure
// kept, for another buffer or one of fewer than n values.
func f32s(op string, b tensor.Buffer, n int) []float32 {
	s, ok := b.Storage().(*store)
	if !ok || s.freed {
		return nil
	}
	if s.dt != tensor.Float32 || b.Len() < n {
		s.mem.fail(fmt.Errorf("cpu: %s: a buffer of %d %v values where an f32 buffer of at least %d is read", op, b.Len(), s.dt, n))
		return nil
	}
	lo, m := b.Offset(), b.Len()
	return s.f32[lo : lo+m : lo+m]
}

// fp8s is a CPU FP8 buffer's codes in place and their format; nil, with the
// failure kept, for any other buffer.
func fp8s(op string, b tensor.Buffer) ([]uint8, tensor.FP8Format) {
	s, ok := b.Storage().(*store)
	if !ok || s.freed {
		return nil, 0
	}
	f, isFP8 := s.dt.FP8()
	if !isFP8 {
		s.mem.fail(fmt.Errorf("cpu: %s: a %v buffer where FP8 codes (f8e4m3 or f8e5m2) are read", op, s.dt))
		return nil, 0
	}
	lo, n := b.Offset(), b.Len()
	return s.f8[lo : lo+n : lo+n], f
}

// scalar is the first value of an f32 buffer (a scale or scale inverse).
func (v *views[F]) scalar(op string, b tensor.Buffer) []float32 {
	x := f32s(op, b, 1)
	if x == nil {
		v.bad = true
	}
	return x
}

// fp8Per is the values of one chunk of Amax and Quantize shared among the
// cores (their results do not depend on the chunks: a maximum, and values
// rounded one by one).
const fp8Per = 1 << 15

// Amax sets dst[0] to max |x| (tensor.Kernels.Amax): each chunk's amax, then
// theirs.
func (Kernels[F]) Amax(dst, x tensor.Buffer, accumulate bool) {
	var v views[F]
	const op = "Amax"
	xs := v.w(op, x)
	d := statsView(op, dst, 1)
	if v.bad || d == nil {
		return
	}
	j := getJob[amaxJob[F]]()
	j.x = xs
	chunks := run(j, xs.Len(), fp8Per)
	a := 0.0
	for _, m := range j.part[:chunks] {
		if m != m {
			a = m
			break
		}
		a = max(a, m)
	}
	putJob(j)
	if accumulate && !(a > d[0] || a != a) {
		return
	}
	d[0] = a
}

// amaxJob is Amax's chunks: part[c] is chunk c's amax.
type amaxJob[F Float] struct {
	x    tensor.Weights[F]
	part [maxChunks]float64
}

func (j *amaxJob[F]) rows(c, lo, hi int) { j.part[c] = amaxOf(j.x.Slice(lo, hi)) }

// amaxOf is tensor.Amax over F or bf16 values, in float64: float32 values go
// to tensor.Amax as they are, bf16 ones widened a piece at a time (exact);
// float64 values (the gradient checks) are compared as they are.
func amaxOf[F Float](w tensor.Weights[F]) float64 {
	if x, ok := any(w.F).([]float32); ok && w.BF16 == nil {
		return float64(tensor.Amax(x))
	}
	if w.BF16 != nil {
		var buf [fp8Chunk]float32
		var m float32
		for lo := 0; lo < len(w.BF16); lo += fp8Chunk {
			c := buf[:min(fp8Chunk, len(w.BF16)-lo)]
			for i, h := range w.BF16[lo : lo+len(c)] {
				c[i] = h.Float32()
			}
			a := tensor.Amax(c)
			if a != a {
				return float64(a)
			}
			m = max(m, a)
		}
		return float64(m)
	}
	var m float64
	for _, x := range w.F {
		a := math.Abs(float64(x))
		if a != a {
			return a
		}
		m = max(m, a)
	}
	return m
}

// FP8Scale sets scale[0] from amax[0] (tensor.Kernels.FP8Scale).
func (Kernels[F]) FP8Scale(scale, amax tensor.Buffer, f tensor.FP8Format, margin int) {
	var v views[F]
	const op = "FP8Scale"
	s := v.scalar(op, scale)
	a := statsView(op, amax, 1)
	if v.bad || a == nil {
		return
	}
	if f > tensor.E5M2 {
		failOn(scale, fmt.Errorf("cpu: %s: format %v: want e4m3 or e5m2", op, f))
		return
	}
	if margin < 0 || margin > tensor.MaxScaleMargin {
		failOn(scale, fmt.Errorf("cpu: %s: margin %d: want 0 to %d (binades of headroom below the format's largest value)", op, margin, tensor.MaxScaleMargin))
		return
	}
	s[0], _ = f.ScaleFrom(float32(a[0]), margin)
}

// FP8DelayedScale records each rank's amaxes and updates every tensor's
// delayed scaling (tensor.Kernels.FP8DelayedScale): tensor.DelayedScaling's
// Record and Update, column by column.
func (Kernels[F]) FP8DelayedScale(scale, history, amax tensor.Buffer, f tensor.FP8Format, s tensor.DelayedShape) {
	const op = "FP8DelayedScale"
	n := scale.Len()
	if err := tensor.CheckDelayedShape(n, history.Len(), amax.Len(), f, s); err != nil {
		failOn(scale, fmt.Errorf("cpu: %s: %w", op, err))
		return
	}
	sc, h, a := f32s(op, scale, n), f32s(op, history, history.Len()), f32s(op, amax, amax.Len())
	if sc == nil || h == nil || a == nil || n == 0 {
		return
	}
	last := (s.Steps - 1) * s.Stride
	for i := range n {
		cur := h[i]
		for r := range s.Ranks {
			if v := a[r*s.Stride+i]; v > cur || v != v {
				cur = v
			}
		}
		m := cur
		if s.Algo == tensor.AmaxMax { // NaNs passed over, as Update's comparisons
			m = 0
			if cur > 0 {
				m = cur
			}
			for j := s.Stride; j <= last; j += s.Stride {
				if v := h[j+i]; v > m {
					m = v
				}
			}
		}
		for j := 0; j < last; j += s.Stride {
			h[j+i] = h[j+s.Stride+i]
		}
		h[last+i] = cur
		h[i] = 0
		if v, ok := f.ScaleFrom(m, s.Margin); ok {
			sc[i] = v
		}
	}
}

// Quantize rounds x·scale[0] into dst's codes and sets scaleInv[0]
// (tensor.Kernels.Quantize).
func (Kernels[F]) Quantize(dst, scaleInv, x, scale tensor.Buffer) {
	var v views[F]
	const op = "Quantize"
	q, f := fp8s(op, dst)
	if q == nil {
		v.bad = true
	}
	xs := v.w(op, x)
	inv, s := v.scalar(op, scaleInv), v.scalar(op, scale)
	if v.bad {
		return
	}
	if xs.Len() != len(q) {
		failOn(dst, fmt.Errorf("cpu: %s: %d values into %d FP8 codes: want one length", op, xs.Len(), len(q)))
		return
	}
	if &inv[0] == &s[0] {
		failOn(dst, fmt.Errorf("cpu: %s: the scale inverse written over the scale it is computed from: give them two buffers", op))
		return
	}
	j := getJob[quantizeJob[F]]()
	j.q, j.x, j.f, j.scale = q, xs, f, s[0]
	run(j, len(q), fp8Per)
	sc := j.scale
	putJob(j)
	inv[0] = 1 / sc
}

// quantizeJob is Quantize's chunks: codes [lo, hi) of x·scale.
type quantizeJob[F Float] struct {
	q     []uint8
	x     tensor.Weights[F]
	f     tensor.FP8Format
	scale float32
}

// rows rounds values [lo, hi): float32 values as they are
// (tensor.FP8Format.Quantize), bf16 and float64 ones widened (narrowed) to
// float32 a piece at a time first.
func (j *quantizeJob[F]) rows(_, lo, hi int) {
	q, xs := j.q[lo:hi], j.x.Slice(lo, hi)
	if x, ok := any(xs.F).([]float32); ok && xs.BF16 == nil {
		j.f.Quantize(q, x, j.scale, true)
		return
	}
	var buf [fp8Chunk]float32
	for lo := 0; lo < len(q); lo += fp8Chunk {
		c := buf[:min(fp8Chunk, len(q)-lo)]
		if xs.BF16 != nil {
			for i, h := range xs.BF16[lo : lo+len(c)] {
				c[i] = h.Float32()
			}
		} else {
			for i, e := range xs.F[lo : lo+len(c)] {
				c[i] = float32(e)
			}
		}
		j.f.Quantize(q[lo:lo+len(c)], c, j.scale, true)
	}
}

// operand is a product's operand as the FP8 products read it: F or bf16
// values (w), or FP8 codes (q) with their values (vals) and their scale
// inverse (inv, 1 for an operand that is not FP8).
type operand[F Float] struct {
	w    tensor.Weights[F]
	q    []uint8
	f    tensor.FP8Format
	vals [256]float32
	inv  float32
}

func (o *operand[F]) len() int {
	if o.q != nil {
		return len(o.q)
	}
	return o.w.Len()
}

// operand views b with its scale inverse sc (MatmulScales): an FP8 buffer
// must have one, any other must not.
func (v *views[F]) operand(op, name string, b, sc tensor.Buffer) operand[F] {
	if _, isFP8 := b.DType().FP8(); isFP8 && b.Storage() != nil {
		q, f := fp8s(op, b)
		if q == nil && b.Len() > 0 {
			v.bad = true
			return operand[F]{}
		}
		if sc.Len() == 0 {
			failOn(b, fmt.Errorf("cpu: %s: an FP8 (%v) %s without its scale inverse: set MatmulShape.Scales.%s to the f32 buffer Quantize wrote", op, b.DType(), name, name))
			v.bad = true
			return operand[F]{}
		}
		inv := v.scalar(op, sc)
		if inv == nil {
			return operand[F]{}
		}
		return operand[F]{q: q, f: f, vals: f.Values(), inv: inv[0]}
	}
	if sc.Len() > 0 {
		failOn(sc, fmt.Errorf("cpu: %s: a scale inverse (MatmulShape.Scales.%s) for a %v %s: only FP8 operands take one", op, name, b.DType(), name))
		v.bad = true
		return operand[F]{}
	}
	return operand[F]{w: v.w(op, b), inv: 1}
}

// size is an operand's values (have) and the values its product reads (want).
type size struct {
	name       string
	have, want int
}

// sized checks that each operand holds at least the values its product
// reads, keeping the first shortfall in at's memory.
func sized(op string, at tensor.Buffer, sizes ...size) bool {
	for _, z := range sizes {
		if z.have < z.want {
			failOn(at, fmt.Errorf("cpu: %s: %s of %d values where the shape reads %d", op, z.name, z.have, z.want))
			return false
		}
	}
	return true
}

// widenOperand is the first n values of o as F in recycled scratch (release
// puts it back), and the factor its values still need: on float32 the codes'
// values, exactly, and the scale inverse left to α (the product's alpha); on
// float64 the dequantised values value·inv (exact in float64), factor 1. An F
// operand is itself.
func widenOperand[F Float](o operand[F], n int) (x []F, factor float32, release func()) {
	if o.q == nil && o.w.BF16 == nil {
		return o.w.F, 1, func() {}
	}
	w := listOf[widenBuf[F]]().get()
	if cap(w.buf) < n {
		w.buf = make([]F, n)
	}
	x = w.buf[:n]
	factor = 1
	switch {
	case o.w.BF16 != nil:
		FromBF16(x, o.w.BF16[:n])
	case isF32[F]():
		for i, c := range o.q[:n] {
			x[i] = F(o.vals[c])
		}
		factor = o.inv
	default:
		for i, c := range o.q[:n] {
			x[i] = F(float64(o.vals[c]) * float64(o.inv))
		}
	}
	return x, factor, func() { listOf[widenBuf[F]]().put(w) }
}

func isF32[F Float]() bool {
	var z F
	_, ok := any(z).(float32)
	return ok
}

// gemmFP8 is C (M×N) = op(A)·op(B) + beta·C with A already F (its remaining
// factor fa) and B any operand: on float32, B's codes widened as B is packed
// (SgemmFP8), bf16 as SgemmBF16 widens it, and α = fa·B's scale inverse
// (Sgemm folds α into A's packing); on float64, B dequantised first.
func gemmFP8[F Float](tA, tB bool, M, N, K int, A []F, fa float32, lda int, B operand[F], ldb int, beta F, C []F, ldc int) {
	if a, ok := any(A).([]float32); ok {
		c := any(C).([]float32)
		alpha := fa * B.inv
		switch {
		case B.q != nil:
			SgemmFP8(tA, tB, M, N, K, alpha, a, lda, B.q, B.f, ldb, float32(beta), c, ldc)
		case B.w.BF16 != nil:
			SgemmBF16(tA, tB, M, N, K, alpha, a, lda, B.w.BF16, ldb, float32(beta), c, ldc)
		default:
			Sgemm(tA, tB, M, N, K, alpha, a, lda, any(B.w.F).([]float32), ldb, float32(beta), c, ldc)
		}
		return
	}
	b, _, release := widenOperand(B, B.len())
	gemm(nil, tA, tB, M, N, K, A, lda, b, ldb, beta, C, ldc)
	release()
}

// matmulFP8 is Kernels.Matmul with an FP8 operand (or scale inverses given).
func matmulFP8[F Float](out, inp, weight tensor.Buffer, s tensor.MatmulShape, accumulate bool) {
	var v views[F]
	const op = "Matmul"
	o := v.f(op, out)
	x, w := v.operand(op, "Inp", inp, s.Scales.Inp), v.operand(op, "Weight", weight, s.Scales.Weight)
	if s.Scales.Dout.Len() > 0 && !v.bad {
		failOn(s.Scales.Dout, fmt.Errorf("cpu: %s: a scale inverse for dout (MatmulShape.Scales.Dout): a forward product has none", op))
		v.bad = true
	}
	if v.bad || !sized(op, out, size{"out", len(o), s.BT * s.OC}, size{"inp", x.len(), s.BT * s.C}, size{"weight", w.len(), s.OC * s.C}) {
		return
	}
	beta := F(0)
	if accumulate {
		beta = 1
	}
	a, fa, release := widenOperand(x, s.BT*s.C)
	gemmFP8(false, true, s.BT, s.OC, s.C, a, fa, s.C, w, s.C, beta, o, s.OC)
	release()
}

// matmulBackwardFP8 is Kernels.MatmulBackward with an FP8 operand (or scale
// inverses given): dinp = dout·weight, dweight += doutᵀ·inp, a bf16 dweight a
// tile of rows at a time, each rounded once (MatmulBackwardInto's rule).
func matmulBackwardFP8[F Float](dinp, dweight, dout, inp, weight tensor.Buffer, s tensor.MatmulShape, accumulate bool) {
	var v views[F]
	const op = "MatmulBackward"
	var dx []F
	if dinp.Len() > 0 {
		dx = v.f(op, dinp)
	}
	noDW := dweight.Len() == 0 // the input gradient alone: no weight gradient, inp unread
	var dw Gradient[F]
	var x operand[F]
	if !noDW {
		dw = v.g(op, dweight)
		x = v.operand(op, "Inp", inp, s.Scales.Inp)
	}
	dy := v.operand(op, "Dout", dout, s.Scales.Dout)
	w := v.operand(op, "Weight", weight, s.Scales.Weight)
	dwLen, xLen := len(dw.F), x.len()
	if dw.H != nil {
		dwLen = len(dw.H)
	}
	if noDW {
		dwLen, xLen = s.OC*s.C, s.BT*s.C // nothing to check
	}
	dxLen := s.BT * s.C // no input gradient: nothing to check
	if dx != nil {
		dxLen = len(dx)
	}
	if v.bad || !sized(op, dout, size{"dinp", dxLen, s.BT * s.C}, size{"dweight", dwLen, s.OC * s.C}, size{"dout", dy.len(), s.BT * s.OC},
		size{"inp", xLen, s.BT * s.C}, size{"weight", w.len(), s.OC * s.C}) {
		return
	}
	BT, C, OC := s.BT, s.C, s.OC
	a, fa, release := widenOperand(dy, BT*OC)
	defer release()
	if dx != nil {
		beta := F(0)
		if accumulate {
			beta = 1
		}
		gemmFP8(false, false, BT, C, OC, a, fa, OC, w, C, beta, dx, C)
	}
	if noDW {
		return
	}
	if dw.H == nil {
		gemmFP8(true, false, OC, C, BT, a, fa, OC, x, C, 1, dw.F, C)
		return
	}
	intoBF16(dw.H[:OC*C], rowTile(OC, C), func(t []F, lo, hi int) {
		r0, r1 := lo/C, hi/C
		gemmFP8(true, false, r1-r0, C, BT, a[r0:], fa, OC, x, C, 1, t, C)
	})
}

// fp8Product reports whether a product takes the FP8 path: an FP8 operand,
// or scale inverses given (which that path checks against the operands).
func fp8Product(s tensor.MatmulShape, bs ...tensor.Buffer) bool {
	if s.Scales.FP8() {
		return true
	}
	for _, b := range bs {
		if _, ok := b.DType().FP8(); ok {
			return true
		}
	}
	return false
}

// fp8Experts reports whether the experts' grouped products take the FP8
// path: an FP8 operand, or scale inverses given.
func fp8Experts(s tensor.ExpertsShape, w []tensor.Buffer, bs ...tensor.Buffer) bool {
	return fp8Product(tensor.MatmulShape{Scales: s.Scales}, bs...) || fp8Product(tensor.MatmulShape{}, w...)
}

// expertsFP8 is Kernels.ExpertsMatmul (back false: out) or
// ExpertsMatmulBackward (back: dinp, dw, dout in out's place) with FP8
// operands: each expert's product over its segment as matmulFP8 or
// matmulBackwardFP8 runs it, with the grouped input's (or output
// gradient's) scale inverse and the expert's weight's (ExpertsShape.Expert).
// Each product shares the cores (Sgemm's split), one expert after another.
func expertsFP8[F Float](dinp tensor.Buffer, dw []tensor.Buffer, out, inp tensor.Buffer, w []tensor.Buffer, offsets tensor.Buffer, s tensor.ExpertsShape, accumulate, back bool) {
	var v views[F]
	op := "ExpertsMatmul"
	if back {
		op = "ExpertsMatmulBackward"
	}
	off := v.segments(op, offsets, s)
	switch {
	case v.bad:
		return
	case back && len(dw) != len(w):
		failOn(out, fmt.Errorf("cpu: %s: %d weight gradients for %d experts", op, len(dw), len(w)))
		return
	case s.Segment == 0 && len(off) <= len(w):
		failOn(offsets, fmt.Errorf("cpu: %s: %d offsets for %d experts: want one more than the experts", op, len(off), len(w)))
		return
	}
	if err := s.ExpertScalesShort(len(w)); err != nil {
		failOn(s.Scales.Weight, fmt.Errorf("cpu: %s: %w", op, err))
		return
	}
	rows := 0 // the rows the segments reach
	for e := range w {
		lo, hi := s.Span(off, e)
		if lo < 0 || hi < lo {
			failOn(out, fmt.Errorf("cpu: %s: expert %d's segment %d..%d", op, e, lo, hi))
			return
		}
		rows = max(rows, hi)
	}
	outName, outW := "out", s.OC
	if back {
		outName = "dout"
	}
	dxLen := rows * s.C
	if back && dinp.Len() > 0 {
		dxLen = dinp.Len()
	}
	if !sized(op, out, size{outName, out.Len(), rows * outW}, size{"inp", inp.Len(), rows * s.C}, size{"dinp", dxLen, rows * s.C}) {
		return
	}
	for e := range w {
		lo, hi := s.Span(off, e)
		if hi == lo {
			continue
		}
		ms := s.Expert(e, hi-lo)
		if back {
			var dx tensor.Buffer
			if dinp.Len() > 0 {
				dx = dinp.Slice(lo*s.C, hi*s.C)
			}
			matmulBackwardFP8[F](dx, dw[e], out.Slice(lo*s.OC, hi*s.OC), inp.Slice(lo*s.C, hi*s.C), w[e], ms, accumulate)
		} else {
			matmulFP8[F](out.Slice(lo*s.OC, hi*s.OC), inp.Slice(lo*s.C, hi*s.C), w[e], ms, accumulate)
		}
	}
}
