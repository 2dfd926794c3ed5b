package cpu

import "github.com/shardline/shardline/tensor"

// Kernels is the CPU implementation of tensor.Kernels for any float type.
type Kernels[F tensor.Float] struct{}

// Backend is the CPU backend training runs: float32.
type Backend = Kernels[float32]

var (
	_ tensor.Backend          = Backend{}
	_ tensor.Kernels[float64] = Kernels[float64]{}
)

// Name reports the backend and its matmul micro-kernel.
func (Kernels[F]) Name() string { return "cpu (" + KernelName() + ")" }

func (Kernels[F]) Matmul(out, inp, weight []F, BT, C, OC int, accumulate bool) {
	Matmul(out, inp, weight, BT, C, OC, accumulate)
}
func (Kernels[F]) MatmulBackward(dinp, dweight, dout, inp, weight []F, BT, C, OC int) {
	MatmulBackward(dinp, dweight, dout, inp, weight, BT, C, OC)
}
func (Kernels[F]) Embedding(out []F, tokens []int32, wte []F, BT, C int) {
	Embedding(out, tokens, wte, BT, C)
}
func (Kernels[F]) EmbeddingBackward(dwte, dout []F, tokens []int32, BT, C int) {
	EmbeddingBackward(dwte, dout, tokens, BT, C)
}
func (Kernels[F]) RMSNorm(out, rstd, inp, weight []F, BT, C int, eps float64) {
	RMSNorm(out, rstd, inp, weight, BT, C, eps)
}
func (Kernels[F]) RMSNormBackward(dinp, dweight, dout, inp, weight, rstd []F, BT, C int) {
	RMSNormBackward(dinp, dweight, dout, inp, weight, rstd, BT, C)
}
func (Kernels[F]) RopeTables(cos, sin []F, T, HD int, theta float64) {
	RopeTables(cos, sin, T, HD, theta)
}
func (Kernels[F]) Rope(x, cos, sin []F, B, T, NH, HD int) { Rope(x, cos, sin, B, T, NH, HD) }
func (Kernels[F]) RopeBackward(dx, cos, sin []F, B, T, NH, HD int) {
	RopeBackward(dx, cos, sin, B, T, NH, HD)
}
func (Kernels[F]) Attention(out, att, q, k, v []F, B, T, NH, NKV, HD int) {
	Attention(out, att, q, k, v, B, T, NH, NKV, HD)
}
func (Kernels[F]) AttentionBackward(dq, dk, dv, dout, att, q, k, v []F, B, T, NH, NKV, HD int) {
	AttentionBackward(dq, dk, dv, dout, att, q, k, v, B, T, NH, NKV, HD)
}
func (Kernels[F]) SwiGLU(out, gate, up []F, n int) { SwiGLU(out, gate, up, n) }
func (Kernels[F]) SwiGLUBackward(dgate, dup, dout, gate, up []F, n int) {
	SwiGLUBackward(dgate, dup, dout, gate, up, n)
}
func (Kernels[F]) CrossEntropy(losses, probs, logits []F, targets []int32, BT, V int) {
	CrossEntropy(losses, probs, logits, targets, BT, V)
}
func (Kernels[F]) CrossEntropyBackward(dlogits, dloss, probs []F, targets []int32, BT, V int) {
	CrossEntropyBackward(dlogits, dloss, probs, targets, BT, V)
}
func (Kernels[F]) Add(out, a, b []F, n int)    { Add(out, a, b, n) }
func (Kernels[F]) AddInto(dst, src []F, n int) { AddInto(dst, src, n) }
