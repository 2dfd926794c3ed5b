//go:build cuda || cudaemu

package cuda

import (
	"github.com/shardline/shardline/tensor"
)

// The FP8 kernels of the engine's kernel set (tensor.Kernels' Amax, FP8Scale,
// Quantize, and Matmul and MatmulBackward on FP8 operands): amaxes (f64),
// scales and scale inverses (f32) stay in device memory, read by the kernels
// that need them, so that no step reads one back.
//
// The products dequantise: each FP8 operand is widened to fp32 in scratch
// (exact: every FP8 value is an fp32), the first operand of each product
// times α, the product of the operands' scale inverses (read on the device:
// widen_scaled), and the product runs as an fp32 product through cuBLASLt (or
// the emulator's loops), into an fp32 or bf16 output. That is the CPU's
// arithmetic (its Sgemm folds α into its A as it packs it) on any GPU.
// That is the path of a device before compute capability 8.9, and of a
// product cuBLASLt's FP8 kernels do not take; the others run on those
// kernels (fp8gemm.go).

// Scratch slots of the FP8 products' widened operands.
const (
	scratchFP8A = iota + scratchEmbedLast + 1 // a product's first operand, widened and scaled
	scratchFP8B                               // its second operand, widened
)

// fp8Names is the kernel-name suffix of each FP8 dtype.
var fp8Names = map[DType]string{F8E4M3: "e4m3", F8E5M2: "e5m2"}

// isFP8 reports whether t is an FP8 dtype.
func isFP8(t DType) bool { _, ok := t.FP8(); return ok }

// Amax sets dst[0] to max |x| (tensor.Kernels.Amax): partial maxima over a
// grid of at most sumSqBlocks blocks into f64 scratch, then one block's
// maximum of them.
func (k *kernels) Amax(dst, x tensor.Buffer, accumulate bool) {
	o := k.ops("Amax")
	d, xs := o.st(dst, 1), o.w(x, x.Len())
	if !o.ok() {
		return
	}
	if xs.N == 0 {
		if !accumulate {
			k.d.Zero(d)
		}
		return
	}
	nb := min(k.d.grid(xs.N), sumSqBlocks)
	part := as(k.d.scratch(scratchSum64, 2*nb), F64, nb)
	k.d.launch("amax_partial"+suffix(xs.DType), nb, 1, threads, k.d.wr(part), k.d.rd(xs), i64(xs.N))
	k.d.launch("amax_finish", 1, 1, 1024, k.d.acc(d, accumulate), k.d.rd(part), i32(nb), flag(accumulate))
}

// FP8Scale sets scale[0] from amax[0] (tensor.Kernels.FP8Scale) in one thread.
func (k *kernels) FP8Scale(scale, amax tensor.Buffer, f tensor.FP8Format, margin int) {
	o := k.ops("FP8Scale")
	s, a := o.f(scale, 1), o.st(amax, 1)
	switch {
	case !o.ok():
	case f > tensor.E5M2:
		o.failf("format %v: want e4m3 or e5m2", f)
	case margin < 0 || margin > tensor.MaxScaleMargin:
		o.failf("margin %d: want 0 to %d (binades of headroom below the format's largest value)", margin, tensor.MaxScaleMargin)
	default:
		k.d.launch("fp8_scale", 1, 1, 1, k.d.wr(s), k.d.rd(a), f32(float64(f.Max())), i32(margin))
	}
}

// FP8DelayedScale records each rank's amaxes and updates every tensor's
// delayed scaling (tensor.Kernels.FP8DelayedScale), a thread a tensor.
func (k *kernels) FP8DelayedScale(scale, history, amax tensor.Buffer, f tensor.FP8Format, s tensor.DelayedShape) {
	o := k.ops("FP8DelayedScale")
	n := scale.Len()
	if err := tensor.CheckDelayedShape(n, history.Len(), amax.Len(), f, s); err != nil {
		o.buf(scale, 0, F32) // the memory that keeps the failure
		o.failf("%v", err)
		return
	}
	sc, h, a := o.f(scale, n), o.f(history, history.Len()), o.f(amax, amax.Len())
	if !o.ok() || n == 0 {
		return
	}
	k.d.launch("fp8_delayed_scale", k.d.grid(n), 1, threads, k.d.wr(sc), k.d.wr(h), k.d.rd(a), i32(n), i32(s.Steps), i32(s.Ranks), i64(s.Stride),
		f32(float64(f.Max())), i32(s.Margin), flag(s.Algo == tensor.AmaxMostRecent))
}

// Quantize rounds x·scale[0] into dst's codes and sets scaleInv[0]
// (tensor.Kernels.Quantize).
func (k *kernels) Quantize(dst, scaleInv, x, scale tensor.Buffer) {
	o := k.ops("Quantize")
	q := o.buf(dst, dst.Len(), F8E4M3, F8E5M2)
	xs := o.w(x, x.Len())
	inv, s := o.f(scaleInv, 1), o.f(scale, 1)
	switch {
	case !o.ok():
	case xs.N != q.N:
		o.failf("%d values into %d FP8 codes: want one length", xs.N, q.N)
	case inv.ptr == s.ptr:
		o.failf("the scale inverse written over the scale it is computed from: give them two buffers")
	default:
		name := "quantize" + suffix(xs.DType) + "_" + fp8Names[q.DType]
		k.d.launch(name, k.d.grid(max(q.N, 1)), 1, threads, k.d.wr(q), k.d.wr(inv), k.d.rd(xs), k.d.rd(s), i64(q.N))
	}
}

// fp8Operand is a product's operand on the device and its scale inverse (the
// null buffer for an operand that is not FP8).
type fp8Operand struct{ x, inv Buffer }

// operand resolves a product's operand of n values (fp32, bf16 or FP8) with
// its scale inverse sc (MatmulScales' entry name): an FP8 operand must have
// one, any other must not.
func (o *operands) operand(b tensor.Buffer, n int, sc tensor.Buffer, name string) fp8Operand {
	x := o.buf(b, n, F32, BF16, F8E4M3, F8E5M2)
	if o.bad {
		return fp8Operand{}
	}
	switch fp8 := isFP8(x.DType); {
	case fp8 && sc.Len() == 0:
		o.failf("an FP8 (%s) %s without its scale inverse: set MatmulShape.Scales.%s to the f32 buffer Quantize wrote", x.DType, name, name)
	case !fp8 && sc.Len() > 0:
		o.failf("a scale inverse (MatmulShape.Scales.%s) for a %s %s: only FP8 operands take one", name, x.DType, name)
	case fp8:
		return fp8Operand{x: x, inv: o.f(sc, 1)}
	default:
		return fp8Operand{x: x}
	}
	return fp8Operand{}
}

// scaled is a's values in fp32 scratch times α = a's and b's scale inverses'
// product (widen_scaled): a product's first operand.
func (k *kernels) scaled(a, b fp8Operand) Buffer {
	s := k.d.scratch(scratchFP8A, a.x.N)
	name := "widen_scaled" + suffix(a.x.DType)
	if n, ok := fp8Names[a.x.DType]; ok {
		name = "widen_scaled_" + n
	}
	k.d.launch(name, k.d.grid(a.x.N), 1, threads, k.d.wr(s), k.d.rd(a.x), k.d.rd(a.inv), k.d.rd(b.inv), i64(a.x.N))
	return s
}

// plain is b's values in fp32: itself, or widened (exact) into scratch.
func (k *kernels) plain(b fp8Operand) Buffer { return k.widened(b.x, scratchFP8B) }

// fp8Product reports whether a product takes the FP8 path: an FP8 operand,
// or scale inverses given (which that path checks against the operands).
func fp8Product(s tensor.MatmulShape, bs ...tensor.Buffer) bool {
	if s.Scales.FP8() {
		return true
	}
	for _, b := range bs {
		if isFP8(b.DType()) {
			return true
		}
	}
	return false
}

// matmulFP8 is Matmul with an FP8 operand: out = (inp·α)·weightᵀ in fp32.
func (k *kernels) matmulFP8(out, inp, weight tensor.Buffer, s tensor.MatmulShape, accumulate bool) {
	o := k.ops("Matmul")
	y := o.w(out, s.BT*s.OC)
	x, w := o.operand(inp, s.BT*s.C, s.Scales.Inp, "Inp"), o.operand(weight, s.OC*s.C, s.Scales.Weight, "Weight")
	if s.Scales.Dout.Len() > 0 && !o.bad {
		o.failf("a scale inverse for dout (MatmulShape.Scales.Dout): a forward product has none")
	}
	if !o.ok() || k.matmulNativeFP8(y, x, w, s, accumulate) {
		return
	}
	k.d.Matmul(y, k.scaled(x, w), k.plain(w), s, accumulate)
}

// matmulBackwardFP8 is MatmulBackward with an FP8 operand: dinp = (dout·α)·
// weight, dweight += (dout·α')ᵀ·inp, each α its product's scale inverses.
func (k *kernels) matmulBackwardFP8(dinp, dweight, dout, inp, weight tensor.Buffer, s tensor.MatmulShape, accumulate bool) {
	o := k.ops("MatmulBackward")
	dy := o.operand(dout, s.BT*s.OC, s.Scales.Dout, "Dout")
	w := o.operand(weight, s.OC*s.C, s.Scales.Weight, "Weight")
	var dx, dw Buffer
	var x fp8Operand
	if dinp.Len() > 0 {
		dx = o.w(dinp, s.BT*s.C)
	}
	if dweight.Len() > 0 { // none: the input gradient alone, inp unread
		dw, x = o.w(dweight, s.OC*s.C), o.operand(inp, s.BT*s.C, s.Scales.Inp, "Inp")
	}
	if !o.ok() || k.matmulBackwardNativeFP8(dx, dw, dy, x, w, s, accumulate) {
		return
	}
	if dx.N > 0 {
		k.d.gemm(false, false, s.C, s.BT, s.OC, k.plain(w), s.C, k.scaled(dy, w), s.OC, beta(accumulate), dx, s.C)
	}
	if dw.N > 0 {
		k.d.gemm(false, true, s.C, s.OC, s.BT, k.plain(x), s.C, k.scaled(dy, x), s.OC, 1, dw, s.C)
	}
}

// fp8Experts reports whether the experts' grouped products take the FP8
// path (an FP8 operand, or scale inverses given), failing o when the
// weights' scale inverses are fewer than the experts. That path runs each
// expert's product over its segment as Matmul or MatmulBackward runs an FP8
// product, with the grouped operand's scale inverse and the expert's
// weight's (tensor.ExpertsShape.Expert), all read on the device; static
// segments then run expert by expert too, not as one batched product (the
// scratch that widens an FP8 operand holds one expert's).
func fp8Experts(o *operands, s tensor.ExpertsShape, w []tensor.Buffer, bs ...tensor.Buffer) bool {
	if !fp8Product(tensor.MatmulShape{Scales: s.Scales}, append(bs, w...)...) {
		return false
	}
	if err := s.ExpertScalesShort(len(w)); err != nil && !o.bad {
		o.failf("%v", err)
	}
	return true
}
