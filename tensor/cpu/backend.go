package cpu

import "github.com/shardline/shardline/tensor"

// Backend is the CPU implementation of tensor.Backend: the float32 instantiation of
// this package's kernels.
type Backend struct{}

var _ tensor.Backend = Backend{}

// Name reports the backend and its matmul micro-kernel.
func (Backend) Name() string { return "cpu (" + KernelName() + ")" }

func (Backend) Matmul(out, inp, weight []float32, BT, C, OC int, accumulate bool) {
	Matmul(out, inp, weight, BT, C, OC, accumulate)
}
func (Backend) MatmulBackward(dinp, dweight, dout, inp, weight []float32, BT, C, OC int) {
	MatmulBackward(dinp, dweight, dout, inp, weight, BT, C, OC)
}
func (Backend) Embedding(out []float32, tokens []int32, wte []float32, BT, C int) {
	Embedding(out, tokens, wte, BT, C)
}
func (Backend) EmbeddingBackward(dwte, dout []float32, tokens []int32, BT, C int) {
	EmbeddingBackward(dwte, dout, tokens, BT, C)
}
func (Backend) RMSNorm(out, rstd, inp, weight []float32, BT, C int, eps float64) {
	RMSNorm(out, rstd, inp, weight, BT, C, eps)
}
func (Backend) RMSNormBackward(dinp, dweight, dout, inp, weight, rstd []float32, BT, C int) {
	RMSNormBackward(dinp, dweight, dout, inp, weight, rstd, BT, C)
}
func (Backend) RopeTables(cos, sin []float32, T, HD int, theta float64) {
	RopeTables(cos, sin, T, HD, theta)
}
func (Backend) Rope(x, cos, sin []float32, B, T, NH, HD int) { Rope(x, cos, sin, B, T, NH, HD) }
func (Backend) RopeBackward(dx, cos, sin []float32, B, T, NH, HD int) {
	RopeBackward(dx, cos, sin, B, T, NH, HD)
}
func (Backend) Attention(out, att, q, k, v []float32, B, T, NH, NKV, HD int) {
	Attention(out, att, q, k, v, B, T, NH, NKV, HD)
}
func (Backend) AttentionBackward(dq, dk, dv, dout, att, q, k, v []float32, B, T, NH, NKV, HD int) {
	AttentionBackward(dq, dk, dv, dout, att, q, k, v, B, T, NH, NKV, HD)
}
func (Backend) SwiGLU(out, gate, up []float32, n int) { SwiGLU(out, gate, up, n) }
func (Backend) SwiGLUBackward(dgate, dup, dout, gate, up []float32, n int) {
	SwiGLUBackward(dgate, dup, dout, gate, up, n)
}
func (Backend) CrossEntropy(losses, probs, logits []float32, targets []int32, BT, V int) {
	CrossEntropy(losses, probs, logits, targets, BT, V)
}
func (Backend) CrossEntropyBackward(dlogits, dloss, probs []float32, targets []int32, BT, V int) {
	CrossEntropyBackward(dlogits, dloss, probs, targets, BT, V)
}
func (Backend) Add(out, a, b []float32, n int)    { Add(out, a, b, n) }
func (Backend) AddInto(dst, src []float32, n int) { AddInto(dst, src, n) }
