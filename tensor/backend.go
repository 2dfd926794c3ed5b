package tensor

// Backend is the kernel set of a Llama-style decoder, in float32. Argument order:
// outputs, saved statistics, inputs, weights, sizes. Backward methods accumulate
// (+=) into every gradient. Shapes: BT tokens, C channels, OC output channels, V
// vocabulary, NH/NKV query/key-value heads, HD head size.
type Backend interface {
	// Name identifies the backend and its matmul kernel in logs.
	Name() string

	Matmul(out, inp, weight []float32, BT, C, OC int, accumulate bool)
	MatmulBackward(dinp, dweight, dout, inp, weight []float32, BT, C, OC int)

	Embedding(out []float32, tokens []int32, wte []float32, BT, C int)
	EmbeddingBackward(dwte, dout []float32, tokens []int32, BT, C int)

	RMSNorm(out, rstd, inp, weight []float32, BT, C int, eps float64)
	RMSNormBackward(dinp, dweight, dout, inp, weight, rstd []float32, BT, C int)

	RopeTables(cos, sin []float32, T, HD int, theta float64)
	Rope(x, cos, sin []float32, B, T, NH, HD int)
	RopeBackward(dx, cos, sin []float32, B, T, NH, HD int)

	Attention(out, att, q, k, v []float32, B, T, NH, NKV, HD int)
	AttentionBackward(dq, dk, dv, dout, att, q, k, v []float32, B, T, NH, NKV, HD int)

	SwiGLU(out, gate, up []float32, n int)
	SwiGLUBackward(dgate, dup, dout, gate, up []float32, n int)

	CrossEntropy(losses, probs, logits []float32, targets []int32, BT, V int)
	CrossEntropyBackward(dlogits, dloss, probs []float32, targets []int32, BT, V int)

	Add(out, a, b []float32, n int)
	AddInto(dst, src []float32, n int)
}
