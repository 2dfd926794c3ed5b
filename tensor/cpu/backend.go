package cpu

import (
	"fmt"

	"github.com/shardline/shardline/tensor"
)

// Kernels is the CPU implementation of tensor.Kernels for any float type.
type Kernels[F tensor.Float] struct{}

// Backend is the CPU backend training runs: float32.
type Backend = Kernels[float32]

var (
	_ tensor.Backend          = Backend{}
	_ tensor.Kernels[float64] = Kernels[float64]{}
	_ tensor.HostMemory       = (*Memory)(nil)
)

// Name reports the backend and its matmul micro-kernel.
func (Kernels[F]) Name() string { return "cpu (" + KernelName() + ")" }

// NewMemory returns a new CPU memory (Memory).
func (Kernels[F]) NewMemory() tensor.Memory { return NewMemory() }

// BF16Matmul says how products with bf16 weights run: "dot" (bf16 pairs,
// AVX-512 BF16) or "widened" (the weights widened to float32).
func (Kernels[F]) BF16Matmul() string {
	if BF16Dot() {
		return "dot"
	}
	return "widened"
}

// views reaches the elements of a kernel's buffers in place (floats, or for a
// weight an F or bf16 buffer as tensor.Weights); bad is set when one of them
// is not a live CPU buffer of the kernel's element type (the failure is kept
// in its memory), and the kernel then does nothing: work after a failure is
// skipped, as a GPU stream skips it.
type views[F Float] struct{ bad bool }

func (v *views[F]) f(op string, b tensor.Buffer) []F {
	x := floats[F](op, b)
	if x == nil && b.Len() > 0 {
		v.bad = true
	}
	return x
}

// i views an int32 buffer (token ids, targets, offsets).
func (v *views[F]) i(op string, b tensor.Buffer) []int32 {
	x := int32s(op, b)
	if x == nil && b.Len() > 0 {
		v.bad = true
	}
	return x
}

// starts views an attention's document starts (s.Starts, (B,Tq) int32; nil
// for none): a buffer of another length, or starts without a causal mask,
// is a failure kept in its memory.
func (v *views[F]) starts(op string, s tensor.AttentionShape) []int32 {
	if s.Starts.Len() == 0 {
		return nil
	}
	x := v.i(op, s.Starts)
	if x != nil && (len(x) != s.B*s.Tq || !s.Causal) {
		s.Starts.Storage().(*store).mem.fail(fmt.Errorf("cpu: %s: document starts of %d values for %d queries (B·Tq), causal %v: they take one per query and a causal mask", op, len(x), s.B*s.Tq, s.Causal))
		v.bad = true
		return nil
	}
	return x
}

// segments views the experts' offsets, which static segments (s.Segment) leave
// unread: nil then.
func (v *views[F]) segments(op string, offsets tensor.Buffer, s tensor.ExpertsShape) []int32 {
	if s.Segment > 0 {
		return nil
	}
	return v.i(op, offsets)
}

// rt views a routing's int32 buffers.
func (v *views[F]) rt(op string, r tensor.Routing) Routing {
	return Routing{Idx: v.i(op, r.Idx), Row: v.i(op, r.Row), Tok: v.i(op, r.Tok), Offsets: v.i(op, r.Offsets), Cursor: v.i(op, r.Cursor)}
}

// compute views an optimizer's optional bf16 output of n values: nil for the
// empty Buffer.
func (v *views[F]) compute(op string, b tensor.Buffer, n int) []tensor.BF16 {
	if b.Len() == 0 {
		return nil
	}
	h := bf16s(op, b)
	if h != nil && len(h) != n {
		b.Storage().(*store).mem.fail(fmt.Errorf("cpu: %s: a compute copy of %d values for %d parameters", op, len(h), n))
		h = nil
	}
	if h == nil {
		v.bad = true
	}
	return h
}

// g views a parameter gradient: F values, or bf16 ones (Gradient).
func (v *views[F]) g(op string, b tensor.Buffer) Gradient[F] {
	if b.DType() == tensor.BFloat16 && b.Storage() != nil {
		h := bf16s(op, b)
		if h == nil && b.Len() > 0 {
			v.bad = true
		}
		return Gradient[F]{H: h}
	}
	return FloatGradient(v.f(op, b))
}

func (v *views[F]) w(op string, b tensor.Buffer) tensor.Weights[F] {
	if b.DType() == tensor.BFloat16 && b.Storage() != nil {
		h := bf16s(op, b)
		if h == nil && b.Len() > 0 {
			v.bad = true
		}
		return tensor.BF16Weights[F](h)
	}
	return tensor.FloatWeights(v.f(op, b))
}

func (Kernels[F]) Matmul(out, inp, weight tensor.Buffer, s tensor.MatmulShape, accumulate bool) {
	if fp8Product(s, inp, weight) {
		matmulFP8[F](out, inp, weight, s, accumulate)
		return
	}
	var v views[F]
	o, x, w := v.f("Matmul", out), v.w("Matmul", inp), v.w("Matmul", weight)
	if !v.bad {
		Matmul(o, x, w, s, accumulate)
	}
}
func (Kernels[F]) MatmulBackward(dinp, dweight, dout, inp, weight tensor.Buffer, s tensor.MatmulShape, accumulate bool) {
	if fp8Product(s, dout, inp, weight) {
		matmulBackwardFP8[F](dinp, dweight, dout, inp, weight, s, accumulate)
		return
	}
	var v views[F]
	dx, dw, dy, x, w := v.f("MatmulBackward", dinp), v.g("MatmulBackward", dweight), v.f("MatmulBackward", dout), v.w("MatmulBackward", inp), v.w("MatmulBackward", weight)
	if !v.bad {
		MatmulBackwardInto(dx, dw, dy, x, w, s, accumulate)
	}
}
func (Kernels[F]) Embedding(out, tokens, wte tensor.Buffer, s tensor.EmbeddingShape) {
	var v views[F]
	tok := v.i("Embedding", tokens)
	o, w := v.f("Embedding", out), v.w("Embedding", wte)
	if !v.bad {
		Embedding(o, tok, w, s)
	}
}
func (Kernels[F]) EmbeddingBackward(dwte, dout, tokens tensor.Buffer, s tensor.EmbeddingShape) {
	var v views[F]
	tok := v.i("EmbeddingBackward", tokens)
	dw, dy := v.g("EmbeddingBackward", dwte), v.f("EmbeddingBackward", dout)
	if !v.bad {
		EmbeddingBackwardInto(dw, dy, tok, s)
	}
}
func (Kernels[F]) MergeAttention(out, lse, outB, lseB tensor.Buffer, s tensor.AttentionShape) {
	var v views[F]
	o, l, ob, lb := v.f("MergeAttention", out), v.f("MergeAttention", lse), v.f("MergeAttention", outB), v.f("MergeAttention", lseB)
	if !v.bad {
		MergeAttention(o, l, ob, lb, s)
	}
}
func (Kernels[F]) RMSNorm(out, rstd, inp, weight tensor.Buffer, BT, C int, eps float64) {
	var v views[F]
	o, r, x, w := v.f("RMSNorm", out), v.f("RMSNorm", rstd), v.f("RMSNorm", inp), v.w("RMSNorm", weight)
	if !v.bad {
		RMSNorm(o, r, x, w, BT, C, eps)
	}
}
func (Kernels[F]) RMSNormBackward(dinp, dweight, dout, inp, weight, rstd tensor.Buffer, BT, C int, accumulate bool) {
	var v views[F]
	dx, dw, dy, x, w, r := v.f("RMSNormBackward", dinp), v.g("RMSNormBackward", dweight), v.f("RMSNormBackward", dout),
		v.f("RMSNormBackward", inp), v.w("RMSNormBackward", weight), v.f("RMSNormBackward", rstd)
	if !v.bad {
		RMSNormBackwardInto(dx, dw, dy, x, w, r, BT, C, accumulate)
	}
}
func (Kernels[F]) RopeTables(cos, sin tensor.Buffer, T int, inv []float64) {
	var v views[F]
	c, s := v.f("RopeTables", cos), v.f("RopeTables", sin)
	if !v.bad {
		RopeTables(c, s, T, inv)
	}
}
func (Kernels[F]) Rope(x, cos, sin tensor.Buffer, s tensor.RopeShape) {
	var v views[F]
	xs, c, sn := v.f("Rope", x), v.f("Rope", cos), v.f("Rope", sin)
	if !v.bad {
		Rope(xs, c, sn, s)
	}
}
func (Kernels[F]) RopeBackward(dx, cos, sin tensor.Buffer, s tensor.RopeShape) {
	var v views[F]
	d, c, sn := v.f("RopeBackward", dx), v.f("RopeBackward", cos), v.f("RopeBackward", sin)
	if !v.bad {
		RopeBackward(d, c, sn, s)
	}
}
func (Kernels[F]) FlashAttention(out, lse, q, k, v tensor.Buffer, s tensor.AttentionShape) {
	var a views[F]
	o, l, qs, ks, vs := a.f("FlashAttention", out), a.f("FlashAttention", lse), a.f("FlashAttention", q), a.f("FlashAttention", k), a.f("FlashAttention", v)
	st := a.starts("FlashAttention", s)
	if !a.bad {
		FlashAttentionMasked(o, l, qs, ks, vs, st, s)
	}
}
func (Kernels[F]) FlashAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v tensor.Buffer, s tensor.AttentionShape, accumulate bool) {
	var a views[F]
	const op = "FlashAttentionBackward"
	dqs, dks, dvs, dos := a.f(op, dq), a.f(op, dk), a.f(op, dv), a.f(op, dout)
	o, l, qs, ks, vs := a.f(op, out), a.f(op, lse), a.f(op, q), a.f(op, k), a.f(op, v)
	st := a.starts(op, s)
	if !a.bad {
		if !accumulate { // FlashAttentionBackward adds: from zero, it sets
			clear(dqs)
			clear(dks)
			clear(dvs)
		}
		FlashAttentionBackwardMasked(dqs, dks, dvs, dos, o, l, qs, ks, vs, st, s)
	}
}
func (Kernels[F]) SwiGLU(out, gate, up tensor.Buffer, n int) {
	var v views[F]
	o, g, u := v.f("SwiGLU", out), v.f("SwiGLU", gate), v.f("SwiGLU", up)
	if !v.bad {
		SwiGLU(o, g, u, n)
	}
}
func (Kernels[F]) SwiGLUBackward(dgate, dup, dout, gate, up tensor.Buffer, n int, accumulate bool) {
	var v views[F]
	const op = "SwiGLUBackward"
	dg, du, dy, g, u := v.f(op, dgate), v.f(op, dup), v.f(op, dout), v.f(op, gate), v.f(op, up)
	if !v.bad {
		SwiGLUBackward(dg, du, dy, g, u, n, accumulate)
	}
}
func (Kernels[F]) CrossEntropy(losses, probs, logits, targets tensor.Buffer, s tensor.VocabShape) {
	var v views[F]
	tgt := v.i("CrossEntropy", targets)
	l, p, z := v.f("CrossEntropy", losses), v.f("CrossEntropy", probs), v.f("CrossEntropy", logits)
	if !v.bad {
		CrossEntropy(l, p, z, tgt, s.BT, s.V)
	}
}

// HeadWork is one chunk's logits: the loss and its gradient are written over
// them in place.
func (Kernels[F]) HeadWork(s tensor.HeadShape) int { return s.Rows * s.V }

func (Kernels[F]) HeadLoss(losses, dx, dw, work, x, w, targets, dloss tensor.Buffer, s tensor.HeadShape) {
	var v views[F]
	const op = "HeadLoss"
	tgt := v.i(op, targets)
	l, z, xs, ws := v.f(op, losses), v.f(op, work), v.w(op, x), v.w(op, w)
	var dxs, dl []F
	var dws Gradient[F]
	train := dx.Len() > 0
	if train {
		dxs, dws, dl = v.f(op, dx), v.g(op, dw), v.f(op, dloss)
	}
	if !v.bad {
		HeadLossInto(l, dxs, dws, z, xs, ws, tgt, dl, s)
	}
}

func (Kernels[F]) CrossEntropyBackward(dlogits, dloss, probs, targets tensor.Buffer, s tensor.VocabShape) {
	var v views[F]
	tgt := v.i("CrossEntropyBackward", targets)
	dz, dl, p := v.f("CrossEntropyBackward", dlogits), v.f("CrossEntropyBackward", dloss), v.f("CrossEntropyBackward", probs)
	if !v.bad {
		CrossEntropyBackwardVocab(dz, dl, p, tgt, s)
	}
}
func (Kernels[F]) CrossEntropyParts(lse, tlogit, logits, targets tensor.Buffer, s tensor.VocabShape) {
	var v views[F]
	tgt := v.i("CrossEntropyParts", targets)
	l, t, z := v.f("CrossEntropyParts", lse), v.f("CrossEntropyParts", tlogit), v.f("CrossEntropyParts", logits)
	if !v.bad {
		CrossEntropyParts(l, t, z, tgt, s)
	}
}
func (Kernels[F]) CrossEntropyCombine(losses, probs, logits, lseAll, tlogit, targets tensor.Buffer, s tensor.VocabShape) {
	var v views[F]
	tgt := v.i("CrossEntropyCombine", targets)
	l, p, z, a, t := v.f("CrossEntropyCombine", losses), v.f("CrossEntropyCombine", probs), v.f("CrossEntropyCombine", logits),
		v.f("CrossEntropyCombine", lseAll), v.f("CrossEntropyCombine", tlogit)
	if !v.bad {
		CrossEntropyCombine(l, p, z, a, t, tgt, s)
	}
}
func (Kernels[F]) Add(out, a, b tensor.Buffer, n int) {
	var v views[F]
	o, x, y := v.f("Add", out), v.f("Add", a), v.f("Add", b)
	if !v.bad {
		Add(o, x, y, n)
	}
}
func (Kernels[F]) AddInto(dst, src tensor.Buffer, n int) {
	var v views[F]
	d, x := v.g("AddInto", dst), v.w("AddInto", src)
	switch {
	case v.bad:
	case d.H != nil:
		AddIntoBF16(d.H, x, n)
	default:
		AddIntoW(d.F, x, n)
	}
}
func (Kernels[F]) Router(probs, gates, logits tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	var v views[F]
	rv := v.rt("Router", r)
	p, g, z, b := v.f("Router", probs), v.f("Router", gates), v.f("Router", logits), v.f("Router", r.Bias)
	if !v.bad {
		Router(p, g, z, b, rv, s)
	}
}
func (Kernels[F]) ScaleCopies(xperm, gates tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	var v views[F]
	rv := v.rt("ScaleCopies", r)
	xp, g := v.f("ScaleCopies", xperm), v.f("ScaleCopies", gates)
	if !v.bad {
		ScaleCopies(xp, g, rv, s)
	}
}
func (Kernels[F]) ScaleCopiesBackward(dgates, dxperm, x, gates tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	var v views[F]
	const op = "ScaleCopiesBackward"
	rv := v.rt(op, r)
	dg, dxp, xs, g := v.f(op, dgates), v.f(op, dxperm), v.f(op, x), v.f(op, gates)
	if !v.bad {
		ScaleCopiesBackward(dg, dxp, xs, g, rv, s)
	}
}
func (Kernels[F]) ExpertBiasUpdate(bias, load tensor.Buffer, E, lo int, rate float64) {
	var v views[F]
	b, l := v.f("ExpertBiasUpdate", bias), v.f("ExpertBiasUpdate", load)
	if !v.bad && lo >= 0 && lo+len(b) <= E && len(l) >= E {
		ExpertBiasUpdate(b, l, E, lo, rate)
	}
}
func (Kernels[F]) RouterBackward(dlogits, dgates, dprobs, gates, probs tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	var v views[F]
	rv := v.rt("RouterBackward", r)
	const op = "RouterBackward"
	dz, dg, dp, g, p := v.f(op, dlogits), v.f(op, dgates), v.f(op, dprobs), v.f(op, gates), v.f(op, probs)
	if !v.bad {
		RouterBackward(dz, dg, dp, g, p, rv, s)
	}
}
func (Kernels[F]) Dispatch(xperm, x tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	var v views[F]
	rv := v.rt("Dispatch", r)
	xp, xs := v.f("Dispatch", xperm), v.f("Dispatch", x)
	if !v.bad {
		Dispatch(xp, xs, rv, s)
	}
}
func (Kernels[F]) DispatchBackward(dx, dxperm tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	var v views[F]
	rv := v.rt("DispatchBackward", r)
	d, dp := v.f("DispatchBackward", dx), v.f("DispatchBackward", dxperm)
	if !v.bad {
		DispatchBackward(d, dp, rv, s)
	}
}

// ExpertsMatmul runs the package's ExpertsMatmul over buffers.
func (Kernels[F]) ExpertsMatmul(out, inp tensor.Buffer, w []tensor.Buffer, offsets tensor.Buffer, s tensor.ExpertsShape, accumulate bool) {
	if fp8Experts(s, w, inp) {
		expertsFP8[F](tensor.Buffer{}, nil, out, inp, w, offsets, s, accumulate, false)
		return
	}
	var v views[F]
	const op = "ExpertsMatmul"
	j := getExpertsJob[F]()
	defer j.put()
	j.offsets, j.s, j.accumulate = v.segments(op, offsets, s), s, accumulate
	j.out, j.inp = v.f(op, out), v.w(op, inp)
	for _, b := range w {
		j.w = append(j.w, v.w(op, b))
	}
	if v.bad || (s.Segment == 0 && len(j.offsets) <= len(w)) {
		return // a bad buffer or offsets (kept in its memory)
	}
	j.run()
}

// ExpertsMatmulBackward runs the package's ExpertsMatmulBackward over buffers.
func (Kernels[F]) ExpertsMatmulBackward(dinp tensor.Buffer, dw []tensor.Buffer, dout, inp tensor.Buffer, w []tensor.Buffer, offsets tensor.Buffer, s tensor.ExpertsShape, accumulate bool) {
	if fp8Experts(s, w, dout, inp) {
		expertsFP8[F](dinp, dw, dout, inp, w, offsets, s, accumulate, true)
		return
	}
	var v views[F]
	const op = "ExpertsMatmulBackward"
	j := getExpertsJob[F]()
	defer j.put()
	j.offsets, j.s, j.accumulate, j.back = v.segments(op, offsets, s), s, accumulate, true
	j.dinp, j.out, j.inp = v.f(op, dinp), v.f(op, dout), v.w(op, inp)
	if len(dw) != len(w) {
		return // the engine passes a gradient per expert
	}
	for e := range w {
		j.w, j.dw = append(j.w, v.w(op, w[e])), append(j.dw, v.g(op, dw[e]))
	}
	if v.bad || (s.Segment == 0 && len(j.offsets) <= len(w)) {
		return // a bad buffer or offsets (kept in its memory)
	}
	j.run()
}
func (Kernels[F]) ExpertsSwiGLU(out, gate, up tensor.Buffer, offsets tensor.Buffer, width int) {
	var v views[F]
	off := v.i("ExpertsSwiGLU", offsets)
	o, g, u := v.f("ExpertsSwiGLU", out), v.f("ExpertsSwiGLU", gate), v.f("ExpertsSwiGLU", up)
	if !v.bad {
		ExpertsSwiGLU(o, g, u, off, width)
	}
}
func (Kernels[F]) ExpertsSwiGLUBackward(dgate, dup, dout, gate, up tensor.Buffer, offsets tensor.Buffer, width int, accumulate bool) {
	var v views[F]
	off := v.i("ExpertsSwiGLUBackward", offsets)
	const op = "ExpertsSwiGLUBackward"
	dg, du, dy, g, u := v.f(op, dgate), v.f(op, dup), v.f(op, dout), v.f(op, gate), v.f(op, up)
	if !v.bad {
		ExpertsSwiGLUBackward(dg, du, dy, g, u, off, width, accumulate)
	}
}
func (Kernels[F]) RouterStats(stats, probs tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	var v views[F]
	rv := v.rt("RouterStats", r)
	st, p := v.f("RouterStats", stats), v.f("RouterStats", probs)
	if !v.bad {
		RouterStats(st, p, rv, s)
	}
}
func (Kernels[F]) AuxLoss(dst, stats tensor.Buffer, r tensor.Routing, s tensor.MoEShape, tokens int, accumulate bool) {
	var v views[F]
	rv := v.rt("AuxLoss", r)
	if st := v.f("AuxLoss", stats); !v.bad {
		AuxLoss(dst, st, rv, s, tokens, accumulate)
	}
}
func (Kernels[F]) AuxLossBackward(dprobs, stats tensor.Buffer, s tensor.MoEShape, tokens int, coeff float64) {
	var v views[F]
	dp, st := v.f("AuxLossBackward", dprobs), v.f("AuxLossBackward", stats)
	if !v.bad {
		AuxLossBackward(dp, st, s, tokens, coeff)
	}
}
func (Kernels[F]) Axpy(dst, src tensor.Buffer, a float64) { Axpy(dst, src, a) }
func (Kernels[F]) Combine(out, y, gates tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	var v views[F]
	rv := v.rt("Combine", r)
	o, ys, g := v.f("Combine", out), v.f("Combine", y), v.f("Combine", gates)
	if !v.bad {
		Combine(o, ys, g, rv, s)
	}
}
func (Kernels[F]) CombineBackward(dy, dgates, dout, y, gates tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	var v views[F]
	rv := v.rt("CombineBackward", r)
	const op = "CombineBackward"
	d, dg, do, ys, g := v.f(op, dy), v.f(op, dgates), v.f(op, dout), v.f(op, y), v.f(op, gates)
	if !v.bad {
		CombineBackward(d, dg, do, ys, g, rv, s)
	}
}
func (Kernels[F]) AdamW(params, compute, grads, m, v tensor.Buffer, lr, beta1, beta2, eps, wd float64, st tensor.Buffer) {
	var a views[F]
	p, g, mm, vv := a.f("AdamW", params), a.g("AdamW", grads), a.f("AdamW", m), a.f("AdamW", v)
	c := a.compute("AdamW", compute, len(p))
	switch {
	case a.bad:
	case g.H != nil:
		AdamWStepBF16(p, c, g.H, mm, vv, lr, beta1, beta2, eps, wd, st)
	default:
		AdamWStep(p, c, g.F, mm, vv, lr, beta1, beta2, eps, wd, st)
	}
}
func (Kernels[F]) SGD(params, compute, grads, buf tensor.Buffer, lr, momentum, wd float64, st tensor.Buffer) {
	var a views[F]
	p, g, b := a.f("SGD", params), a.g("SGD", grads), a.f("SGD", buf)
	c := a.compute("SGD", compute, len(p))
	switch {
	case a.bad:
	case g.H != nil:
		SGDStepBF16(p, c, g.H, b, lr, momentum, wd, st)
	default:
		SGDStep(p, c, g.F, b, lr, momentum, wd, st)
	}
}
func (Kernels[F]) LossSum(dst, losses, targets tensor.Buffer, accumulate bool) {
	var v views[F]
	tgt := v.i("LossSum", targets)
	if l := v.f("LossSum", losses); !v.bad {
		LossSum(dst, l, tgt, accumulate)
	}
}
func (Kernels[F]) SumSquares(dst tensor.Buffer, accumulate bool, xs ...tensor.Buffer) {
	var v views[F]
	if len(xs) == 0 {
		SumSquaresInto[F](dst, nil, accumulate)
	}
	for i, x := range xs {
		switch x := v.g("SumSquares", x); {
		case v.bad:
		case x.H != nil:
			sumSquaresBF16Into(dst, x.H, accumulate || i > 0)
		default:
			SumSquaresInto(dst, x.F, accumulate || i > 0)
		}
	}
}
func (Kernels[F]) CloseStep(st tensor.Buffer, maxNorm float64) { CloseStep(st, maxNorm) }
