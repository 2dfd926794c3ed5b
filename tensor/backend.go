package tensor

// Float is an element type kernels run in: float32 in training, float64 in the
// gradient checks of whole models.
type Float interface{ ~float32 | ~float64 }

// Backend is the kernel set training runs: float32.
type Backend = Kernels[float32]

// Kernels is the kernel set of a Llama-style decoder over element type F. Argument
// order: outputs, saved statistics, inputs, weights, sizes (or a shape struct).
// Weights a kernel reads, and the matmuls' inputs, are Weights views: F values
// or bf16 storage widened as read; every kernel computes and accumulates in F.
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

	// Matmul is out (BT,OC) = inp (BT,C) · weight (OC,C)ᵀ (+= with accumulate).
	// inp is a view too: a bf16 run's saved activation is read from its bf16
	// store.
	Matmul(out []F, inp, weight Weights[F], s MatmulShape, accumulate bool)
	// MatmulBackward accumulates into dweight always, into dinp when accumulate
	// is set (it overwrites dinp otherwise).
	MatmulBackward(dinp, dweight, dout []F, inp, weight Weights[F], s MatmulShape, accumulate bool)

	Embedding(out []F, tokens []int32, wte Weights[F], BT, C int)
	EmbeddingBackward(dwte, dout []F, tokens []int32, BT, C int)

	RMSNorm(out, rstd, inp []F, weight Weights[F], BT, C int, eps float64)
	RMSNormBackward(dinp, dweight, dout, inp []F, weight Weights[F], rstd []F, BT, C int)

	// RopeTables fills cos and sin (T, len(inv)) for positions 0..T−1 at the
	// inverse frequencies inv (RopeInvFreq).
	RopeTables(cos, sin []F, T int, inv []float64)
	Rope(x, cos, sin []F, s RopeShape)
	RopeBackward(dx, cos, sin []F, s RopeShape)

	// FlashAttention keeps only out and each row's log-sum-exp lse (B,NH,Tq), no
	// (T,T) probabilities; FlashAttentionBackward remakes them block by block.
	// It is the only attention the kernel set has: no (T,T) buffer exists at any
	// sequence length.
	FlashAttention(out, lse, q, k, v []F, s AttentionShape)
	FlashAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v []F, s AttentionShape)

	SwiGLU(out, gate, up []F, n int)
	SwiGLUBackward(dgate, dup, dout, gate, up []F, n int, accumulate bool) // overwrites dgate, dup unless accumulate

	CrossEntropy(losses, probs, logits []F, targets []int32, BT, V int)
	CrossEntropyBackward(dlogits, dloss, probs []F, targets []int32, BT, V int)

	Add(out, a, b []F, n int)
	AddInto(dst, src []F, n int)

	// Mixture of experts: routing, expert-major permutation of token copies, and the
	// gated combination. gates are (BT,K); the index arrays are r's (Routing).
	Router(probs, gates, logits []F, r Routing, s MoEShape)
	RouterBackward(dlogits, dgates, dprobs, gates, probs []F, r Routing, s MoEShape)
	Dispatch(xperm, x []F, r Routing, s MoEShape) int
	DispatchBackward(dx, dxperm []F, r Routing, n int, s MoEShape)
	Combine(out, y, gates []F, r Routing, s MoEShape)
	CombineBackward(dy, dgates, dout, y, gates []F, r Routing, s MoEShape)

	// Optimizers on a flat slice of parameters (one rank's shard or a whole model).
	AdamW(params, grads, m, v []F, lr, beta1, beta2, eps, wd float64, t int)
	SGD(params, grads, buf []F, lr, momentum, wd float64)
	// SumSquares is Σ x² in float64 (gradient norms), the same on any number of
	// cores; Scale multiplies x by f in place (gradient clipping).
	SumSquares(x []F) float64
	Scale(x []F, f float64)
	// ToBF16 rounds src to bf16 into dst (same length): the compute weights of a
	// bf16 run, and the activations its layers keep for backward, stored in bf16.
	ToBF16(dst []BF16, src []F)
	// FromBF16 widens src into dst (same length), exactly: a bf16 run's saved
	// activations, brought back for a layer's backward.
	FromBF16(dst []F, src []BF16)
}

// MatmulShape is a product of BT rows of C inputs with an (OC,C) weight.
type MatmulShape struct{ BT, C, OC int }

// RopeShape is x (B,T,NH,HD): B sequences of T positions, NH heads of HD.
type RopeShape struct{ B, T, NH, HD int }

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

// Routing is one MoE layer's index arrays: Idx (BT,K) each token's chosen experts
// (Router writes it); Row (BT,K) the permuted row of each copy, −1 when dropped
// past capacity, Tok (BT·K) the token of each permuted row, and Offsets (E+1) the
// start of each expert's segment (Dispatch writes them); Cursor (E) is Dispatch's
// scratch.
type Routing struct {
	Idx, Row, Tok, Offsets, Cursor []int32
}

// MoEShape is one MoE layer's routing: BT tokens, E experts, the top K of them per
// token, C channels, and at most Capacity copies kept per expert (BT·K keeps every
// copy).
type MoEShape struct{ BT, E, K, C, Capacity int }
