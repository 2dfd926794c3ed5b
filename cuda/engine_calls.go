//go:build cuda || cudaemu

package cuda

import "github.com/shardline/shardline/tensor"

// Kernels' methods: each runs its kernel on the device's goroutine (Device.run).

func (k *Kernels) Name() string             { return k.k.Name() }
func (k *Kernels) NewMemory() tensor.Memory { return k.k.NewMemory() }

// Device is the GPU the kernels run on.
func (k *Kernels) Device() *Device { return k.k.d }
func (k *Kernels) Matmul(out, inp, weight tensor.Buffer, s tensor.MatmulShape, accumulate bool) {
	k.k.d.run(func() { k.k.Matmul(out, inp, weight, s, accumulate) })
}
func (k *Kernels) MatmulBackward(dinp, dweight, dout, inp, weight tensor.Buffer, s tensor.MatmulShape, accumulate bool) {
	k.k.d.run(func() { k.k.MatmulBackward(dinp, dweight, dout, inp, weight, s, accumulate) })
}
func (k *Kernels) Amax(dst, x tensor.Buffer, accumulate bool) {
	k.k.d.run(func() { k.k.Amax(dst, x, accumulate) })
}
func (k *Kernels) FP8Scale(scale, amax tensor.Buffer, f tensor.FP8Format, margin int) {
	k.k.d.run(func() { k.k.FP8Scale(scale, amax, f, margin) })
}
func (k *Kernels) FP8DelayedScale(scale, history, amax tensor.Buffer, f tensor.FP8Format, s tensor.DelayedShape) {
	k.k.d.run(func() { k.k.FP8DelayedScale(scale, history, amax, f, s) })
}
func (k *Kernels) Quantize(dst, scaleInv, x, scale tensor.Buffer) {
	k.k.d.run(func() { k.k.Quantize(dst, scaleInv, x, scale) })
}
func (k *Kernels) Embedding(out, tokens, wte tensor.Buffer, s tensor.EmbeddingShape) {
	k.k.d.run(func() { k.k.Embedding(out, tokens, wte, s) })
}
func (k *Kernels) EmbeddingBackward(dwte, dout, tokens tensor.Buffer, s tensor.EmbeddingShape) {
	k.k.d.run(func() { k.k.EmbeddingBackward(dwte, dout, tokens, s) })
}
func (k *Kernels) RMSNorm(out, rstd, inp, weight tensor.Buffer, BT, C int, eps float64) {
	k.k.d.run(func() { k.k.RMSNorm(out, rstd, inp, weight, BT, C, eps) })
}
func (k *Kernels) RMSNormBackward(dinp, dweight, dout, inp, weight, rstd tensor.Buffer, BT, C int, accumulate bool) {
	k.k.d.run(func() { k.k.RMSNormBackward(dinp, dweight, dout, inp, weight, rstd, BT, C, accumulate) })
}
func (k *Kernels) RopeTables(cos, sin tensor.Buffer, T int, inv []float64) {
	k.k.d.run(func() { k.k.RopeTables(cos, sin, T, inv) })
}
func (k *Kernels) Rope(x, cos, sin tensor.Buffer, s tensor.RopeShape) {
	k.k.d.run(func() { k.k.Rope(x, cos, sin, s) })
}
func (k *Kernels) RopeBackward(dx, cos, sin tensor.Buffer, s tensor.RopeShape) {
	k.k.d.run(func() { k.k.RopeBackward(dx, cos, sin, s) })
}
func (k *Kernels) FlashAttention(out, lse, q, kb, v tensor.Buffer, s tensor.AttentionShape) {
	k.k.d.run(func() { k.k.FlashAttention(out, lse, q, kb, v, s) })
}
func (k *Kernels) FlashAttentionBackward(dq, dk, dv, dout, out, lse, q, kb, v tensor.Buffer, s tensor.AttentionShape, accumulate bool) {
	k.k.d.run(func() { k.k.FlashAttentionBackward(dq, dk, dv, dout, out, lse, q, kb, v, s, accumulate) })
}
func (k *Kernels) MergeAttention(out, lse, outB, lseB tensor.Buffer, s tensor.AttentionShape) {
	k.k.d.run(func() { k.k.MergeAttention(out, lse, outB, lseB, s) })
}
func (k *Kernels) SwiGLU(out, gate, up tensor.Buffer, n int) {
	k.k.d.run(func() { k.k.SwiGLU(out, gate, up, n) })
}
func (k *Kernels) SwiGLUBackward(dgate, dup, dout, gate, up tensor.Buffer, n int, accumulate bool) {
	k.k.d.run(func() { k.k.SwiGLUBackward(dgate, dup, dout, gate, up, n, accumulate) })
}
func (k *Kernels) CrossEntropy(losses, probs, logits, targets tensor.Buffer, s tensor.VocabShape) {
	k.k.d.run(func() { k.k.CrossEntropy(losses, probs, logits, targets, s) })
}
func (k *Kernels) HeadWork(s tensor.HeadShape) int { return k.k.HeadWork(s) }
func (k *Kernels) HeadLoss(losses, dx, dw, work, x, w, targets, dloss tensor.Buffer, s tensor.HeadShape) {
	k.k.d.run(func() { k.k.HeadLoss(losses, dx, dw, work, x, w, targets, dloss, s) })
}
func (k *Kernels) CrossEntropyParts(lse, tlogit, logits, targets tensor.Buffer, s tensor.VocabShape) {
	k.k.d.run(func() { k.k.CrossEntropyParts(lse, tlogit, logits, targets, s) })
}
func (k *Kernels) CrossEntropyCombine(losses, probs, logits, lseAll, tlogit, targets tensor.Buffer, s tensor.VocabShape) {
	k.k.d.run(func() { k.k.CrossEntropyCombine(losses, probs, logits, lseAll, tlogit, targets, s) })
}
func (k *Kernels) CrossEntropyBackward(dlogits, dloss, probs, targets tensor.Buffer, s tensor.VocabShape) {
	k.k.d.run(func() { k.k.CrossEntropyBackward(dlogits, dloss, probs, targets, s) })
}
func (k *Kernels) Add(out, a, b tensor.Buffer, n int) {
	k.k.d.run(func() { k.k.Add(out, a, b, n) })
}
func (k *Kernels) AddInto(dst, src tensor.Buffer, n int) {
	k.k.d.run(func() { k.k.AddInto(dst, src, n) })
}
func (k *Kernels) Router(probs, gates, logits tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	k.k.d.run(func() { k.k.Router(probs, gates, logits, r, s) })
}
func (k *Kernels) ScaleCopies(xperm, gates tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	k.k.d.run(func() { k.k.ScaleCopies(xperm, gates, r, s) })
}
func (k *Kernels) ScaleCopiesBackward(dgates, dxperm, x, gates tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	k.k.d.run(func() { k.k.ScaleCopiesBackward(dgates, dxperm, x, gates, r, s) })
}
func (k *Kernels) ExpertBiasUpdate(bias, load tensor.Buffer, E, lo int, rate float64) {
	k.k.d.run(func() { k.k.ExpertBiasUpdate(bias, load, E, lo, rate) })
}
func (k *Kernels) RouterBackward(dlogits, dgates, dprobs, gates, probs tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	k.k.d.run(func() { k.k.RouterBackward(dlogits, dgates, dprobs, gates, probs, r, s) })
}
func (k *Kernels) Dispatch(xperm, x tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	k.k.d.run(func() { k.k.Dispatch(xperm, x, r, s) })
}
func (k *Kernels) DispatchBackward(dx, dxperm tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	k.k.d.run(func() { k.k.DispatchBackward(dx, dxperm, r, s) })
}
func (k *Kernels) Combine(out, y, gates tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	k.k.d.run(func() { k.k.Combine(out, y, gates, r, s) })
}
func (k *Kernels) CombineBackward(dy, dgates, dout, y, gates tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	k.k.d.run(func() { k.k.CombineBackward(dy, dgates, dout, y, gates, r, s) })
}
func (k *Kernels) ExpertsMatmul(out, inp tensor.Buffer, w []tensor.Buffer, offsets tensor.Buffer, s tensor.ExpertsShape, accumulate bool) {
	k.k.d.run(func() { k.k.ExpertsMatmul(out, inp, w, offsets, s, accumulate) })
}
func (k *Kernels) ExpertsMatmulBackward(dinp tensor.Buffer, dw []tensor.Buffer, dout, inp tensor.Buffer, w []tensor.Buffer, offsets tensor.Buffer, s tensor.ExpertsShape, accumulate bool) {
	k.k.d.run(func() { k.k.ExpertsMatmulBackward(dinp, dw, dout, inp, w, offsets, s, accumulate) })
}
func (k *Kernels) ExpertsSwiGLU(out, gate, up tensor.Buffer, offsets tensor.Buffer, width int) {
	k.k.d.run(func() { k.k.ExpertsSwiGLU(out, gate, up, offsets, width) })
}
func (k *Kernels) ExpertsSwiGLUBackward(dgate, dup, dout, gate, up tensor.Buffer, offsets tensor.Buffer, width int, accumulate bool) {
	k.k.d.run(func() { k.k.ExpertsSwiGLUBackward(dgate, dup, dout, gate, up, offsets, width, accumulate) })
}
func (k *Kernels) RouterStats(stats, probs tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	k.k.d.run(func() { k.k.RouterStats(stats, probs, r, s) })
}
func (k *Kernels) AuxLoss(dst, stats tensor.Buffer, r tensor.Routing, s tensor.MoEShape, tokens int, accumulate bool) {
	k.k.d.run(func() { k.k.AuxLoss(dst, stats, r, s, tokens, accumulate) })
}
func (k *Kernels) AuxLossBackward(dprobs, stats tensor.Buffer, s tensor.MoEShape, tokens int, coeff float64) {
	k.k.d.run(func() { k.k.AuxLossBackward(dprobs, stats, s, tokens, coeff) })
}
func (k *Kernels) LossSum(dst, losses, targets tensor.Buffer, accumulate bool) {
	k.k.d.run(func() { k.k.LossSum(dst, losses, targets, accumulate) })
}
func (k *Kernels) SumSquares(dst tensor.Buffer, accumulate bool, xs ...tensor.Buffer) {
	k.k.d.run(func() { k.k.SumSquares(dst, accumulate, xs...) })
}
func (k *Kernels) CloseStep(stats tensor.Buffer, maxNorm float64) {
	k.k.d.run(func() { k.k.CloseStep(stats, maxNorm) })
}
func (k *Kernels) Axpy(dst, src tensor.Buffer, a float64) {
	k.k.d.run(func() { k.k.Axpy(dst, src, a) })
}
func (k *Kernels) AdamW(params, compute, grads, m, v tensor.Buffer, lr, beta1, beta2, eps, wd float64, stats tensor.Buffer) {
	k.k.d.run(func() { k.k.AdamW(params, compute, grads, m, v, lr, beta1, beta2, eps, wd, stats) })
}
func (k *Kernels) SGD(params, compute, grads, buf tensor.Buffer, lr, momentum, wd float64, stats tensor.Buffer) {
	k.k.d.run(func() { k.k.SGD(params, compute, grads, buf, lr, momentum, wd, stats) })
}
