package cpu

import "github.com/shardline/shardline/tensor"

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

func (Kernels[F]) Matmul(out []F, inp, weight tensor.Weights[F], s tensor.MatmulShape, accumulate bool) {
	Matmul(out, inp, weight, s, accumulate)
}
func (Kernels[F]) MatmulBackward(dinp, dweight, dout []F, inp, weight tensor.Weights[F], s tensor.MatmulShape, accumulate bool) {
	MatmulBackward(dinp, dweight, dout, inp, weight, s, accumulate)
}
func (Kernels[F]) Embedding(out []F, tokens []int32, wte tensor.Weights[F], BT, C int) {
	Embedding(out, tokens, wte, BT, C)
}
func (Kernels[F]) EmbeddingBackward(dwte, dout []F, tokens []int32, BT, C int) {
	EmbeddingBackward(dwte, dout, tokens, BT, C)
}
func (Kernels[F]) RMSNorm(out, rstd, inp []F, weight tensor.Weights[F], BT, C int, eps float64) {
	RMSNorm(out, rstd, inp, weight, BT, C, eps)
}
func (Kernels[F]) RMSNormBackward(dinp, dweight, dout, inp []F, weight tensor.Weights[F], rstd []F, BT, C int) {
	RMSNormBackward(dinp, dweight, dout, inp, weight, rstd, BT, C)
}
func (Kernels[F]) RopeTables(cos, sin []F, T int, inv []float64) {
	RopeTables(cos, sin, T, inv)
}
func (Kernels[F]) Rope(x, cos, sin []F, s tensor.RopeShape)          { Rope(x, cos, sin, s) }
func (Kernels[F]) RopeBackward(dx, cos, sin []F, s tensor.RopeShape) { RopeBackward(dx, cos, sin, s) }
func (Kernels[F]) FlashAttention(out, lse, q, k, v []F, s tensor.AttentionShape) {
	FlashAttention(out, lse, q, k, v, s)
}
func (Kernels[F]) FlashAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v []F, s tensor.AttentionShape) {
	FlashAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, s)
}
func (Kernels[F]) SwiGLU(out, gate, up []F, n int) { SwiGLU(out, gate, up, n) }
func (Kernels[F]) SwiGLUBackward(dgate, dup, dout, gate, up []F, n int, accumulate bool) {
	SwiGLUBackward(dgate, dup, dout, gate, up, n, accumulate)
}
func (Kernels[F]) CrossEntropy(losses, probs, logits []F, targets []int32, BT, V int) {
	CrossEntropy(losses, probs, logits, targets, BT, V)
}
func (Kernels[F]) CrossEntropyBackward(dlogits, dloss, probs []F, targets []int32, BT, V int) {
	CrossEntropyBackward(dlogits, dloss, probs, targets, BT, V)
}
func (Kernels[F]) Add(out, a, b []F, n int)    { Add(out, a, b, n) }
func (Kernels[F]) AddInto(dst, src []F, n int) { AddInto(dst, src, n) }
func (Kernels[F]) Router(probs, gates, logits []F, r tensor.Routing, s tensor.MoEShape) {
	Router(probs, gates, logits, r, s)
}
func (Kernels[F]) RouterBackward(dlogits, dgates, dprobs, gates, probs []F, r tensor.Routing, s tensor.MoEShape) {
	RouterBackward(dlogits, dgates, dprobs, gates, probs, r, s)
}
func (Kernels[F]) Dispatch(xperm, x []F, r tensor.Routing, s tensor.MoEShape) {
	Dispatch(xperm, x, r, s)
}
func (Kernels[F]) DispatchBackward(dx, dxperm []F, r tensor.Routing, s tensor.MoEShape) {
	DispatchBackward(dx, dxperm, r, s)
}
func (Kernels[F]) ExpertsMatmul(out []F, inp tensor.Weights[F], w []tensor.Weights[F], offsets []int32, s tensor.ExpertsShape, accumulate bool) {
	ExpertsMatmul(out, inp, w, offsets, s, accumulate)
}
func (Kernels[F]) ExpertsMatmulBackward(dinp []F, dw [][]F, dout []F, inp tensor.Weights[F], w []tensor.Weights[F], offsets []int32, s tensor.ExpertsShape, accumulate bool) {
	ExpertsMatmulBackward(dinp, dw, dout, inp, w, offsets, s, accumulate)
}
func (Kernels[F]) ExpertsSwiGLU(out, gate, up []F, offsets []int32, width int) {
	ExpertsSwiGLU(out, gate, up, offsets, width)
}
func (Kernels[F]) ExpertsSwiGLUBackward(dgate, dup, dout, gate, up []F, offsets []int32, width int, accumulate bool) {
	ExpertsSwiGLUBackward(dgate, dup, dout, gate, up, offsets, width, accumulate)
}
func (Kernels[F]) RouterStats(stats, probs []F, r tensor.Routing, s tensor.MoEShape) {
	RouterStats(stats, probs, r, s)
}
func (Kernels[F]) AuxLoss(dst tensor.Buffer, stats []F, r tensor.Routing, s tensor.MoEShape, tokens int, accumulate bool) {
	AuxLoss(dst, stats, r, s, tokens, accumulate)
}
func (Kernels[F]) AuxLossBackward(dprobs, stats []F, s tensor.MoEShape, tokens int, coeff float64) {
	AuxLossBackward(dprobs, stats, s, tokens, coeff)
}
func (Kernels[F]) Axpy(dst, src tensor.Buffer, a float64) { Axpy(dst, src, a) }
func (Kernels[F]) Combine(out, y, gates []F, r tensor.Routing, s tensor.MoEShape) {
	Combine(out, y, gates, r, s)
}
func (Kernels[F]) CombineBackward(dy, dgates, dout, y, gates []F, r tensor.Routing, s tensor.MoEShape) {
	CombineBackward(dy, dgates, dout, y, gates, r, s)
}
func (Kernels[F]) AdamW(params, grads, m, v tensor.Buffer, lr, beta1, beta2, eps, wd float64, st tensor.Buffer) {
	p, g, mm, vv := floats[F]("AdamW", params), floats[F]("AdamW", grads), floats[F]("AdamW", m), floats[F]("AdamW", v)
	if p != nil && g != nil && mm != nil && vv != nil {
		AdamWStep(p, g, mm, vv, lr, beta1, beta2, eps, wd, st)
	}
}
func (Kernels[F]) SGD(params, grads, buf tensor.Buffer, lr, momentum, wd float64, st tensor.Buffer) {
	p, g, b := floats[F]("SGD", params), floats[F]("SGD", grads), floats[F]("SGD", buf)
	if p != nil && g != nil && b != nil {
		SGDStep(p, g, b, lr, momentum, wd, st)
	}
}
func (Kernels[F]) LossSum(dst tensor.Buffer, losses []F, targets []int32, accumulate bool) {
	LossSum(dst, losses, targets, accumulate)
}
func (Kernels[F]) SumSquares(dst tensor.Buffer, x []F, accumulate bool) {
	SumSquaresInto(dst, x, accumulate)
}
func (Kernels[F]) CloseStep(st tensor.Buffer, maxNorm float64) { CloseStep(st, maxNorm) }
func (Kernels[F]) Scale(x []F, st tensor.Buffer)               { ScaleBy(x, st) }
func (Kernels[F]) ToBF16(dst []tensor.BF16, src []F)           { ToBF16(dst, src) }
func (Kernels[F]) FromBF16(dst []F, src []tensor.BF16)         { FromBF16(dst, src) }
