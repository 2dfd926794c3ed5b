package tensor

// Float is an element type kernels run in: float32 in training, float64 in the
// gradient checks of whole models.
type Float interface{ ~float32 | ~float64 }

// Backend is the kernel set training runs: float32.
type Backend = Kernels[float32]

// Kernels is the kernel set of a Llama-style decoder over element type F. Argument
// order: outputs, saved statistics, inputs, weights, sizes (or a shape struct).
// Shapes: BT tokens, C channels, OC output channels, V vocabulary, NH/NKV
// query/key-value heads, HD head size.
//
// The overwrite/accumulate rule, stated here once: forward kernels overwrite
// their outputs, except Matmul with accumulate set and Combine, which add (+=).
// Backward kernels add (+=) into every gradient, parameters' and activations'
// alike, so the caller clears gradient buffers before a backward pass; the
// exceptions say so in their names' arguments: MatmulBackward's dinp and
// SwiGLUBackward's dgate and dup are overwritten unless accumulate is set (which
// spares clearing them), and CombineBackward sets dy's rows and dgates.
type Kernels[F Float] interface {
	// Name identifies the backend and its matmul kernel in logs.
	Name() string

	Matmul(out, inp, weight []F, BT, C, OC int, accumulate bool)
	// MatmulBackward accumulates into dweight always, into dinp when accumulate
	// is set (it overwrites dinp otherwise).
	MatmulBackward(dinp, dweight, dout, inp, weight []F, BT, C, OC int, accumulate bool)

	Embedding(out []F, tokens []int32, wte []F, BT, C int)
	EmbeddingBackward(dwte, dout []F, tokens []int32, BT, C int)

	RMSNorm(out, rstd, inp, weight []F, BT, C int, eps float64)
	RMSNormBackward(dinp, dweight, dout, inp, weight, rstd []F, BT, C int)

	// RopeTables fills cos and sin (T, len(inv)) for positions 0..T−1 at the
	// inverse frequencies inv (RopeInvFreq).
	RopeTables(cos, sin []F, T int, inv []float64)
	Rope(x, cos, sin []F, B, T, NH, HD int)
	RopeBackward(dx, cos, sin []F, B, T, NH, HD int)

	Attention(out, att, q, k, v []F, B, T, NH, NKV, HD int)
	AttentionBackward(dq, dk, dv, dout, att, q, k, v []F, B, T, NH, NKV, HD int)
	// FlashAttention keeps only out and each row's log-sum-exp lse (B,NH,Tq), no
	// (T,T) probabilities; FlashAttentionBackward remakes them block by block.
	FlashAttention(out, lse, q, k, v []F, s AttentionShape)
	FlashAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v []F, s AttentionShape)

	SwiGLU(out, gate, up []F, n int)
	SwiGLUBackward(dgate, dup, dout, gate, up []F, n int, accumulate bool) // overwrites dgate, dup unless accumulate

	CrossEntropy(losses, probs, logits []F, targets []int32, BT, V int)
	CrossEntropyBackward(dlogits, dloss, probs []F, targets []int32, BT, V int)

	Add(out, a, b []F, n int)
	AddInto(dst, src []F, n int)

	// Mixture of experts: routing, expert-major permutation of token copies, and the
	// gated combination. idx, gates and row are (BT,K); tok (BT·K); offsets (E+1).
	Router(probs []F, idx []int32, gates, logits []F, s MoEShape)
	RouterBackward(dlogits, dgates, dprobs, gates, probs []F, idx []int32, s MoEShape)
	Dispatch(xperm []F, row, tok, offsets, cursor []int32, x []F, idx []int32, s MoEShape) int
	DispatchBackward(dx, dxperm []F, tok []int32, n, C int)
	Combine(out, y, gates []F, row []int32, s MoEShape)
	CombineBackward(dy, dgates, dout, y, gates []F, row []int32, s MoEShape)

	// Optimizers on a flat slice of parameters (one rank's shard or a whole model).
	AdamW(params, grads, m, v []F, lr, beta1, beta2, eps, wd float64, t int)
	SGD(params, grads, buf []F, lr, momentum, wd float64)
	// SumSquares is Σ x² in float64 (gradient norms), the same on any number of
	// cores; Scale multiplies x by f in place (gradient clipping).
	SumSquares(x []F) float64
	Scale(x []F, f float64)
	// RoundBF16 rounds values to bf16 precision in place (compute weights of a bf16
	// run, kept in F for the kernels).
	RoundBF16(x []F)
}

// AttentionShape is attention of queries q (B,Tq,NH,HD) over keys and values k, v
// (B,Tk,NKV,HD). Query i sits at position QOff+i and key j at KOff+j; Causal lets
// a query see the keys at its position or before (a block of queries can so
// attend to keys held elsewhere: context parallelism). Query head h reads
// key/value head h/(NH/NKV).
type AttentionShape struct {
	B, Tq, Tk, NH, NKV, HD int
	QOff, KOff             int
	Causal                 bool
}

// MoEShape is one MoE layer's routing: BT tokens, E experts, the top K of them per
// token, C channels, and at most Capacity copies kept per expert (BT·K keeps every
// copy).
type MoEShape struct{ BT, E, K, C, Capacity int }
