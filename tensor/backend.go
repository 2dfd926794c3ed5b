package tensor

import "fmt"

// Float is an element type kernels run in: float32 in training, float64 in the
// gradient checks of whole models.
type Float interface{ ~float32 | ~float64 }

// Backend is the kernel set training runs: float32.
type Backend = Kernels[float32]

// CoreSharer is a backend whose kernels run on this process's CPU cores and can
// divide them among callers that run kernels at the same time: the ranks of
// one process. ShareCores(n) counts n more such callers until restore is
// called; each caller's kernels then use GOMAXPROCS ÷ (callers counted) threads,
// at least one. Only the speed changes: the kernels' results do not depend on
// how many threads compute them.
type CoreSharer interface {
	ShareCores(n int) (restore func())
}

// BF16Storage is a backend whose kernels take bf16 activations and
// activation gradients where the interface's comment says F: the residual
// stream, the norms' outputs, q, k, v, the attention output, the MLP's
// buffers, their gradients, the embedding's output and the head's input and
// input gradient, with the statistics (the norms' reciprocal RMS, flash
// attention's and the loss's log-sum-exps, the token losses and their
// gradient scale) kept in F and parameter gradients in F. ComputesInBF16
// reports whether it does: a model asked for bf16 activations
// (model.WithBF16Activations) then allocates those buffers in bf16 and runs
// every kernel on them (no fp32 work set, no bf16 stores), where a backend
// without it (the CPU's, whose kernels compute on F slices) keeps fp32 work
// buffers and stores what backward reads in bf16. The dense layers' kernels
// are what it covers: a model with MoE layers, tensor or context parallelism
// keeps the stores (docs/engine.md).
type BF16Storage interface {
	ComputesInBF16() bool
}

// ComputesInBF16 reports whether be (a kernel set) declares BF16Storage and
// computes in bf16 storage.
func ComputesInBF16(be any) bool {
	s, ok := be.(BF16Storage)
	return ok && s.ComputesInBF16()
}

// Kernels is the kernel set of a Llama-style decoder over element type F. Every
// operand is a Buffer of the backend's memory, so that the same model drives
// host and device memory. Argument order: outputs, saved statistics, inputs,
// weights, sizes (or a shape struct). Activations and gradients are F buffers
// (the dense layers' activations and their gradients may be bf16 on a backend
// that declares BF16Storage); weights, and the matmuls' inputs, are F or bf16
// buffers (a bf16 run's compute weights and saved activations), widened as
// read (Matmul's and MatmulBackward's operands FP8 too, with their scale
// inverses: MatmulScales); every kernel computes and accumulates in F. Shapes: BT tokens, C channels, OC output
// channels, V vocabulary, NH/NKV query/key-value heads, HD head size. Token
// ids, targets, an MoE layer's routing (Routing) and the experts' segment
// offsets are int32 buffers. A kernel handed a buffer that is not its backend's, or not of the
// dtype it reads, keeps the failure in that buffer's memory and does nothing.
//
// Parameter gradients are F or bf16 buffers: a run that reduces its
// gradients in bf16 (grad_reduce_in_bf16) holds them in bf16, as
// Megatron-FSDP's main gradients are then. The kernels that add into one
// (MatmulBackward's dweight, EmbeddingBackward's dwte, RMSNormBackward's
// dweight, HeadLoss's dw, ExpertsMatmulBackward's dw) add in F and round each
// element to bf16 once per call (HeadLoss once per chunk of s.Rows rows, each
// chunk's product being one), to nearest, ties to even: what a product with a
// bf16 C computed in fp32 (β = 1) leaves. AddInto's dst, SumSquares'
// buffers and the optimizers' gradients may be bf16 too (widened as read;
// AddInto rounds its sums).
//
// The overwrite/accumulate rule, stated here once: forward kernels overwrite
// their outputs, except Matmul and ExpertsMatmul with accumulate set and
// Combine, which add (+=), and the statistics kernels (LossSum, SumSquares,
// AuxLoss), which add with accumulate. Backward kernels add (+=) into every
// gradient, parameters' and activations' alike, so the caller clears gradient
// buffers before a backward pass; the exceptions say so in their arguments:
// MatmulBackward's and ExpertsMatmulBackward's dinp, SwiGLUBackward's and
// ExpertsSwiGLUBackward's dgate and dup, and FlashAttentionBackward's dq, dk
// and dv are overwritten unless accumulate is set (which spares clearing
// them), CombineBackward sets dy's rows and dgates,
// and AuxLossBackward sets dprobs.
type Kernels[F Float] interface {
	// Name identifies the backend and its matmul kernel in logs.
	Name() string
	// NewMemory returns a memory of the backend's, with the stream its work is
	// issued on: one per rank.
	NewMemory() Memory

	// Matmul is out (BT,OC) = inp (BT,C) · weight (OC,C)ᵀ (+= with accumulate).
	// inp and weight may be FP8 (Float8E4M3 or Float8E5M2) with their scale
	// inverses in s.Scales: the product is then that of the values they
	// stand for (MatmulScales).
	Matmul(out, inp, weight Buffer, s MatmulShape, accumulate bool)
	// MatmulBackward accumulates into dweight, into dinp when accumulate
	// is set (it overwrites dinp otherwise). Either may be the empty Buffer:
	// no input gradient, or no weight gradient (inp is then not read, and
	// may be empty too), as a run whose weight gradients compute apart
	// (precision.fp8.wgrad = false) asks. dout, inp and weight may be FP8
	// with their scale inverses in s.Scales (MatmulScales); dinp and dweight
	// are never FP8.
	MatmulBackward(dinp, dweight, dout, inp, weight Buffer, s MatmulShape, accumulate bool)

	// FP8 (docs/engine.md, "FP8"). A tensor quantised to FP8 is a buffer of
	// codes (Float8E4M3 or Float8E5M2, one byte a value) and its scale
	// inverse, one f32 value in a buffer of the backend's beside it: code
	// value · scale inverse is the value it stands for. Amaxes, scales and
	// scale inverses live in the backend's memory and only its kernels read
	// them, so a step quantises and multiplies without any value going to
	// the host, as a step's statistics do. Current scaling is Amax, FP8Scale,
	// then Quantize; the products then read the scale inverse Quantize wrote.
	//
	// Amax sets dst[0] (f64) to max |x| over x (F or bf16; 0 for an empty
	// x), NaN where x holds a NaN (tensor.Amax: torch.amax's rule, so that a
	// non-finite tensor is seen; Transformer Engine's amax kernel, fmaxf,
	// passes NaNs over). With accumulate it raises dst[0] to that amax
	// instead (a NaN in either stays: tensor.DelayedScaling.Record, an amax
	// over micro-batches).
	Amax(dst, x Buffer, accumulate bool)
	// FP8Scale sets scale[0] (f32) to the scale that maps amax[0] (f64, an
	// Amax) onto f's largest value·2^−margin: tensor.FP8Format.ScaleFrom,
	// and 1 where the amax gives none (0, inf, NaN). Margin 0 is current
	// scaling's scale (tensor.FP8Format.CurrentScale, Transformer Engine's
	// compute_scale_from_amax). margin is 0 to MaxScaleMargin.
	FP8Scale(scale, amax Buffer, f FP8Format, margin int)
	// Quantize sets dst (FP8, its dtype's format) to each x·scale[0] (a
	// float32 product; x F or bf16, of dst's length) rounded to the format,
	// saturating (tensor.FP8Format.Quantize with saturate), and scaleInv[0]
	// (f32) to 1/scale[0] in float32: the scale inverse the products read.
	// scale is f32 (FP8Scale's, or a delayed scaling's scale), a buffer
	// other than scaleInv.
	Quantize(dst, scaleInv, x, scale Buffer)
	// FP8DelayedScale ends a step of delayed scaling for n = scale.Len()
	// tensors of format f (tensor.DelayedScaling, one per tensor, all of one
	// algorithm and margin: s). Tensor i's history is column i of history
	// (f32, s.Steps rows of s.Stride values, History[j] in row j) and its
	// scale scale[i] (f32); amax (f32) holds s.Ranks rows of s.Stride values,
	// row r rank r's amaxes of the step (column i tensor i's). For each
	// tensor it records every rank's amax in row 0 (DelayedScaling.Record,
	// rank by rank: a maximum, a NaN staying) and then updates
	// (DelayedScaling.Update: the scale from the history, kept where the
	// history gives none, and the history rolled, row 0 zero again). Columns
	// of another format are another call's, on the buffers sliced at their
	// first column. It reads and writes the backend's memory alone: a step's
	// scales never go to the host. s.Margin is 0 to MaxScaleMargin.
	FP8DelayedScale(scale, history, amax Buffer, f FP8Format, s DelayedShape)

	// Embedding writes the rows of wte that tokens (BT) pick into out (BT,C):
	// wte holds vocabulary rows s.Lo..s.Lo+s.N−1 (a vocabulary-parallel rank's),
	// and a token outside them gives a zero row. EmbeddingBackward adds dout's
	// rows into the rows of dwte its tokens picked (none for tokens outside).
	Embedding(out, tokens, wte Buffer, s EmbeddingShape)
	EmbeddingBackward(dwte, dout, tokens Buffer, s EmbeddingShape)

	RMSNorm(out, rstd, inp, weight Buffer, BT, C int, eps float64)
	// RMSNormBackward sets dinp (adds into it with accumulate) and adds into
	// dweight.
	RMSNormBackward(dinp, dweight, dout, inp, weight, rstd Buffer, BT, C int, accumulate bool)

	// RopeTables fills cos and sin (T, len(inv)) for positions 0..T−1 at the
	// inverse frequencies inv (RopeInvFreq).
	RopeTables(cos, sin Buffer, T int, inv []float64)
	Rope(x, cos, sin Buffer, s RopeShape)
	RopeBackward(dx, cos, sin Buffer, s RopeShape)

	// FlashAttention keeps only out and each row's log-sum-exp lse (B,NH,Tq), no
	// (T,T) probabilities; FlashAttentionBackward remakes them block by block.
	// It is the only attention the kernel set has: no (T,T) buffer exists at any
	// sequence length.
	FlashAttention(out, lse, q, k, v Buffer, s AttentionShape)
	FlashAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v Buffer, s AttentionShape, accumulate bool) // overwrites dq, dk, dv unless accumulate
	// MergeAttention folds one key block's attention (outB, lseB) into the
	// running result (out, lse) of the same queries, (B,Tq,NH,HD) and
	// (B,NH,Tq) by s: with l = logaddexp(lse, lseB), out = e^(lse−l)·out +
	// e^(lseB−l)·outB. A row that saw no key so far (lse −∞) takes the block's
	// result; a block row that saw none leaves the row. Ring attention
	// (context parallelism) merges its key blocks with it.
	MergeAttention(out, lse, outB, lseB Buffer, s AttentionShape)

	SwiGLU(out, gate, up Buffer, n int)
	SwiGLUBackward(dgate, dup, dout, gate, up Buffer, n int, accumulate bool) // overwrites dgate, dup unless accumulate

	// The loss over logits (s.BT, s.V): this rank's s.V entries of the
	// vocabulary, from s.Lo (all of it, Lo 0 and Parts 1, without tensor
	// parallelism). A target < 0 is ignored: loss 0 and no gradient.
	// CrossEntropy (a whole vocabulary) sets losses (BT) and probs (BT,V), the
	// softmax. A vocabulary split over s.Parts ranks takes two kernels around
	// two collectives: CrossEntropyParts sets lse (BT) to each row's
	// log-sum-exp over the rank's logits and tlogit (BT) to the target's logit
	// where the target is among them (0 elsewhere, so a sum over the ranks
	// gives it); once the ranks' lse are all-gathered (lseAll, Parts×BT, rank
	// after rank) and tlogit summed over them, CrossEntropyCombine sets
	// losses and the rank's part of probs. CrossEntropyBackward sets dlogits
	// to (probs − onehot(target − s.Lo))·dloss (0 in an ignored row).
	// CrossEntropy and CrossEntropyCombine may be given one buffer as probs
	// and logits, and CrossEntropyBackward one as dlogits and probs: each
	// value is read before the one computed from it is written over it.
	CrossEntropy(losses, probs, logits, targets Buffer, s VocabShape)
	// HeadLoss is the output head and its loss over a whole vocabulary
	// without a (BT,V) buffer: s.Rows rows of x (BT,C) at a time, their
	// logits (rows, V) = x·wᵀ are made in work (HeadWork(s) values of F, the
	// caller's, so that the plan counts them), each row's loss set in losses
	// (BT; 0 where the target is < 0) and, unless dx is empty, the loss's
	// gradient with dloss (BT) per row: dx's rows set (overwritten) to
	// dlogits·w and dw (V,C) += dlogitsᵀ·x, dlogits = (softmax −
	// onehot)·dloss. With dx empty it is the loss alone (evaluation), and dw
	// and dloss are not read. x and w may be F or bf16, and dx bf16 on a
	// backend that declares BF16Storage; the logits are F.
	HeadLoss(losses, dx, dw, work, x, w, targets, dloss Buffer, s HeadShape)
	// HeadWork is the F values HeadLoss's work buffer needs for s.
	HeadWork(s HeadShape) int
	CrossEntropyParts(lse, tlogit, logits, targets Buffer, s VocabShape)
	CrossEntropyCombine(losses, probs, logits, lseAll, tlogit, targets Buffer, s VocabShape)
	CrossEntropyBackward(dlogits, dloss, probs, targets Buffer, s VocabShape)

	Add(out, a, b Buffer, n int)
	// AddInto adds n values of src, F or bf16 (widened as read), into dst.
	AddInto(dst, src Buffer, n int)

	// Mixture of experts: routing, expert-major permutation of token copies, and the
	// gated combination. gates are (BT,K); the index arrays are r's (Routing).
	// Router sets probs (BT,E) to the scores s.Router names (softmax over the
	// experts, or each logit's sigmoid), picks each token's top K experts by
	// score plus r.Bias (when not empty; within its best groups under
	// group-limited routing) into r.Idx, ties to the lower index, and sets gates
	// to the chosen scores, divided by their sum unless s.Router.Raw, times
	// s.Router.Scale.
	Router(probs, gates, logits Buffer, r Routing, s MoEShape)
	// RouterBackward adds into dlogits the gradient through the gates (dgates)
	// and through the probabilities (dprobs, empty (the zero Buffer) when no aux
	// loss reaches them); the bias has none.
	RouterBackward(dlogits, dgates, dprobs, gates, probs Buffer, r Routing, s MoEShape)
	// ScaleCopies multiplies each kept copy's row of xperm (Dispatch's rows) by
	// its gate: the token scaled before its expert (RouterSpec's score before
	// the expert). ScaleCopiesBackward sets dgates (BT,K) to each kept copy's
	// dxperm row · x's row of its token (0 for a dropped copy) and then
	// multiplies dxperm's row by the gate, in place: the gradient of the
	// unscaled copy.
	ScaleCopies(xperm, gates Buffer, r Routing, s MoEShape)
	ScaleCopiesBackward(dgates, dxperm, x, gates Buffer, r Routing, s MoEShape)
	// ExpertBiasUpdate moves expert biases by rate towards balance: bias[i]
	// += rate·sign(mean(load) − load[lo+i]) for the experts lo..lo+len(bias)−1
	// it holds (auxiliary-loss-free balancing; load (E) is each expert's routed
	// copies, summed over the ranks, and is left as it is).
	ExpertBiasUpdate(bias, load Buffer, E, lo int, rate float64)
	// Dispatch writes r.Offsets, which the kernels that follow read: the count of
	// kept copies and the experts' segments never go back to the caller.
	Dispatch(xperm, x Buffer, r Routing, s MoEShape)
	DispatchBackward(dx, dxperm Buffer, r Routing, s MoEShape)
	Combine(out, y, gates Buffer, r Routing, s MoEShape)
	CombineBackward(dy, dgates, dout, y, gates Buffer, r Routing, s MoEShape)
	// The routed experts, each over its segment of the permuted rows (expert e
	// of w: rows offsets[e]..offsets[e+1], read by the kernel, or the static
	// segments ExpertsShape.Segment names): products (dinp overwritten unless
	// accumulate, dw accumulated) and SwiGLU over the rows of all segments.
	// The products' inp, w and dout may be FP8, with their scale inverses in
	// s.Scales (one per expert for w: ExpertsShape); dinp and dw never are.
	ExpertsMatmul(out, inp Buffer, w []Buffer, offsets Buffer, s ExpertsShape, accumulate bool)
	ExpertsMatmulBackward(dinp Buffer, dw []Buffer, dout, inp Buffer, w []Buffer, offsets Buffer, s ExpertsShape, accumulate bool)
	ExpertsSwiGLU(out, gate, up Buffer, offsets Buffer, width int)
	ExpertsSwiGLUBackward(dgate, dup, dout, gate, up Buffer, offsets Buffer, width int, accumulate bool)
	// RouterStats sets stats (2E) to each expert's kept copies, then its router
	// probabilities summed over the tokens. AuxLoss sets dst[0] (f64) to the
	// load-balancing loss E·Σ_e f_e·P_e those stats give over tokens tokens and
	// dst[1] to the copies dropped past capacity (adds with accumulate);
	// AuxLossBackward sets dprobs (BT,E) to coeff times its gradient through the
	// probabilities.
	RouterStats(stats, probs Buffer, r Routing, s MoEShape)
	AuxLoss(dst, stats Buffer, r Routing, s MoEShape, tokens int, accumulate bool)
	AuxLossBackward(dprobs, stats Buffer, s MoEShape, tokens int, coeff float64)

	// A step's statistics live in an f64 buffer of the backend's (NumStats
	// elements, laid out by the Stat constants): the kernels below write and read
	// them there, so a step needs no value on the host, and the trainer reads
	// them back once per logging interval (Memory.Read).
	//
	// LossSum sets dst[0] to Σ losses[i] over the tokens whose target is ≥ 0, in
	// float64 and token order (adds it with accumulate).
	LossSum(dst, losses, targets Buffer, accumulate bool)
	// SumSquares sets dst[0] to Σ x² over every x of xs, in float64 (adds it
	// with accumulate), the same on any number of cores (gradient norms). The
	// CPU adds each x's sum in turn, so a list sums as its buffers one by one;
	// a GPU sums buffers that lie end to end in memory as one, with one pair
	// of launches for the whole list.
	SumSquares(dst Buffer, accumulate bool, xs ...Buffer)
	// CloseStep finishes a step's statistics once its gradients are reduced and
	// their squares summed: the norm √(stats[StatSumSq] + stats[StatExpertSumSq]),
	// the factor that clips it to maxNorm (0: off), whether the step is applied
	// (its loss Σ/tokens and norm are finite), and the optimizer steps applied.
	CloseStep(stats Buffer, maxNorm float64)
	// Axpy adds a·src into dst (f64 buffers of one length).
	Axpy(dst, src Buffer, a float64)
	// Optimizers on buffers of F (one rank's shard of the main weights, its
	// gradients and the moments, or a whole model's). They update only when
	// stats[StatApplied] is set, at optimizer step stats[StatOptSteps] (AdamW's
	// bias correction), and clip as they read: each gradient g enters the
	// update as g·stats[StatClip], rounded to F (the values a pass multiplying
	// the gradients in place would leave; the gradients themselves are left
	// as they are). compute, when not the empty Buffer, is a bf16 buffer of
	// params' length that receives the updated params rounded to nearest, ties
	// to even, in the same pass (a bf16 run's compute weights; left as they are
	// when the step does not apply).
	AdamW(params, compute, grads, m, v Buffer, lr, beta1, beta2, eps, wd float64, stats Buffer)
	SGD(params, compute, grads, buf Buffer, lr, momentum, wd float64, stats Buffer)
}

// The layout of a step's statistics buffer (f64): what CloseStep reads and
// writes, and what the trainer reads back.
const (
	StatLoss        = iota // Σ token losses (this rank's, or the world's after the trainer's all-reduce)
	StatTokens             // tokens counted in StatLoss
	StatAux                // MoE load-balancing loss, the step's mean
	StatDropped            // routed copies dropped past expert capacity
	StatSumSq              // Σ g² of the gradients (the dense ones, when StatExpertSumSq is apart)
	StatExpertSumSq        // Σ g² of the expert gradients, when summed apart
	StatNorm               // the gradients' global L2 norm before clipping
	StatClip               // the factor the optimizers scale them by (1: not clipped)
	StatApplied            // 1 when the step's loss and norm are finite and its update applies, else 0
	StatOptSteps           // optimizer steps applied so far (kept across steps)
	NumStats
)

// ClipFactor is the factor that clips a gradient of norm norm to maxNorm (0:
// off): maxNorm/(norm+1e-6) above it, 1 otherwise.
func ClipFactor(norm, maxNorm float64) float64 {
	if maxNorm <= 0 || norm <= maxNorm || norm == 0 {
		return 1
	}
	return maxNorm / (norm + 1e-6)
}

// EmbeddingShape is BT token rows of C channels looked up in the vocabulary
// rows Lo..Lo+N−1 a table holds (Lo 0 and N the vocabulary, unless the table
// is split over tensor-parallel ranks).
type EmbeddingShape struct{ BT, C, Lo, N int }

// VocabShape is a loss's logits: BT rows of V logits, entries Lo..Lo+V−1 of a
// vocabulary split over Parts ranks (Lo 0, Parts 1: the whole vocabulary).
type VocabShape struct{ BT, V, Lo, Parts int }

// HeadShape is the output head and loss of BT rows of C channels over a
// vocabulary of V, Rows rows of logits at a time (the plan's
// parallel.HeadRows).
type HeadShape struct{ BT, C, V, Rows int }

// MatmulShape is a product of BT rows of C inputs with an (OC,C) weight;
// Scales are its FP8 operands' scale inverses (none when no operand is FP8).
type MatmulShape struct {
	BT, C, OC int
	Scales    MatmulScales
}

// MatmulScales are the scale inverses of a product's FP8 operands (Matmul's
// inp and weight, MatmulBackward's dout too): each an f32 buffer whose first
// value is the operand's scale inverse (Kernels.Quantize's), and the empty
// Buffer for an operand that is not FP8 (an FP8 operand without one, or one
// for an operand that is not FP8, is a failure kept in the memory).
//
// The scale inverses stay where they are, in the backend's memory: a
// product reads them there (a GPU through the pointers cuBLASLt's FP8
// products take), so no product waits for a value read back. They multiply
// the product, not each operand: a product of FP8 operands is α·(A·B) with
// A and B the codes' values, exact in float32 (each product of two FP8
// values is), accumulated in float32, and α the product of the operands'
// scale inverses (1 for an operand that is not FP8) in float32, as
// cuBLASLt's FP8 GEMM applies its A and B scales. It is the product of the
// dequantised values to within float32's rounding of α and of the sums, so
// the FP8 error of a product is its operands' quantisation alone.
type MatmulScales struct{ Inp, Weight, Dout Buffer }

// FP8 reports whether any operand has a scale inverse (any operand is FP8).
func (s MatmulScales) FP8() bool {
	return s.Inp.Len() > 0 || s.Weight.Len() > 0 || s.Dout.Len() > 0
}

// DelayedShape lays out Kernels.FP8DelayedScale's buffers: Steps rows of
// history (amax_history_len, 1 to MaxAmaxHistory), Ranks rows of amaxes
// (1 or more), each row Stride values apart (Stride at least the tensors
// updated), and the algorithm and margin of every tensor's scale.
type DelayedShape struct {
	Steps, Ranks, Stride int
	Algo                 AmaxAlgo
	Margin               int
}

// RopeShape is x (B,T,NH,HD): B sequences of T positions, NH heads of HD.
type RopeShape struct{ B, T, NH, HD int }

// AttentionShape is attention of queries q (B,Tq,NH,HD) over keys and values k, v
// (B,Tk,NKV,HD). Query i sits at position QOff+i and key j at KOff+j; Causal lets
// a query see the keys at its position or before (a block of queries can so
// attend to keys held elsewhere: context parallelism). Query head h reads
// key/value head h/(NH/NKV).
//
// Chunk and Starts narrow a causal mask to blocks (they need Causal): a query
// sees only keys of its own block, so it sees key positions Lo(p)..p, where
// Lo(p) is the larger of its chunk's first position ⌊p/Chunk⌋·Chunk (chunked,
// or local, attention: Llama 4's attention_chunk_size; 0 for none) and
// Starts[b·Tq+i] (an int32 buffer (B,Tq) of the backend's: the position where
// query i's document begins, the block-causal document mask; the empty Buffer
// for none). Both are positions of the whole sequence, so a block of queries
// held elsewhere (QOff, KOff) masks as the whole sequence does. Kernels skip
// key blocks no query of a block sees.
type AttentionShape struct {
	B, Tq, Tk, NH, NKV, HD int
	QOff, KOff             int
	Causal                 bool
	Chunk                  int
	Starts                 Buffer
}

// Masked reports whether s narrows the causal mask (Chunk or Starts).
func (s AttentionShape) Masked() bool { return s.Chunk > 0 || s.Starts.Len() > 0 }

// VisibleFrom is the first position the query at position p sees under
// Chunk and a document that starts at start (0 without Starts): Lo(p) above.
func (s AttentionShape) VisibleFrom(p, start int) int {
	if s.Chunk > 0 {
		start = max(start, p/s.Chunk*s.Chunk)
	}
	return start
}

// Routing is one MoE layer's index arrays: Idx (BT,K) each token's chosen experts
// (Router writes it); Row (BT,K) the permuted row of each copy, −1 when dropped
// past capacity, Tok (BT·K) the token of each permuted row, and Offsets (E+1) the
// start of each expert's segment (Dispatch writes them); Cursor (E) is Dispatch's
// scratch.
type Routing struct {
	Idx, Row, Tok, Offsets, Cursor Buffer
	// Bias (E, F) is added to the scores when experts are chosen (not to the
	// gates): auxiliary-loss-free balancing. Empty: no bias.
	Bias Buffer
}

// RouterSpec is how a router scores and gates its experts; the zero value is
// the softmax router whose gates are the chosen scores renormalised (Mixtral).
type RouterSpec struct {
	// Sigmoid scores each expert by its logit's sigmoid instead of a softmax
	// over the experts.
	Sigmoid bool
	// Raw keeps the chosen scores as gates instead of dividing them by their sum.
	Raw bool
	// Scale multiplies every gate (0 means 1).
	Scale float64
	// Groups > 0 routes within groups (DeepSeek-V3): the E experts form Groups
	// groups of E/Groups, each scored by the sum of its K/GroupK best scores
	// (plus bias); a token picks its GroupK best groups and its K experts among
	// them.
	Groups, GroupK int
}

// GateScale is Scale, 1 when unset.
func (r RouterSpec) GateScale() float64 {
	if r.Scale == 0 {
		return 1
	}
	return r.Scale
}

// ExpertsShape is each routed expert's product: C inputs, OC outputs. Segment,
// when above zero, says the experts' segments are static, expert e's at rows
// e·Segment..(e+1)·Segment (MoEShape.Padded's layout, each segment's unused rows
// zero): the grouped products then read no offsets (a device backend takes
// each product's rows from the host, and static segments spare it reading the
// routing back), and may run every expert over its whole segment. Zero, the
// segments are the offsets buffer's.
//
// Scales are the scale inverses of the grouped products' FP8 operands
// (MatmulScales' rule, operand by operand: an FP8 operand must have its
// scale inverses, any other none): Inp's first value is the grouped input's
// (one scale over every expert's rows: the tokens are quantised as one
// tensor), Dout's the grouped output gradient's, and Weight holds one per
// expert, expert e's at e (each expert's weight quantised with its own scale,
// as Transformer Engine's GroupedLinear keeps one FP8 meta per GEMM: an
// expert whose weights are small keeps its precision beside one whose weights
// are large). Expert e's product multiplies by Inp's (or Dout's) scale
// inverse times Weight's e-th value, as a MatmulShape of its rows would.
type ExpertsShape struct {
	C, OC, Segment int
	Scales         MatmulScales
}

// Expert is expert e's product over rows rows as a MatmulShape, with its
// operands' scale inverses: the grouped ones and expert e's weight's.
func (s ExpertsShape) Expert(e, rows int) MatmulShape {
	sc := s.Scales
	if sc.Weight.Len() > 0 {
		sc.Weight = sc.Weight.Slice(e, e+1)
	}
	return MatmulShape{BT: rows, C: s.C, OC: s.OC, Scales: sc}
}

// ExpertScalesShort reports, as an error's words, an FP8 weight's scale
// inverses that hold fewer values than experts (nil when they suffice or
// there are none): Expert would slice past them.
func (s ExpertsShape) ExpertScalesShort(experts int) error {
	if n := s.Scales.Weight.Len(); n > 0 && n < experts {
		return fmt.Errorf("%d weight scale inverses (ExpertsShape.Scales.Weight) for %d experts: want one per expert", n, experts)
	}
	return nil
}

// Span is expert e's rows lo..hi: the static segment when s.Segment is set,
// else offsets[e]..offsets[e+1].
func (s ExpertsShape) Span(offsets []int32, e int) (lo, hi int) {
	if s.Segment > 0 {
		return e * s.Segment, (e + 1) * s.Segment
	}
	return int(offsets[e]), int(offsets[e+1])
}

// MoEShape is one MoE layer's routing: BT tokens, E experts, the top K of them per
// token, C channels, and at most Capacity copies kept per expert (BT·K keeps every
// copy). Packed (Padded false), the kept copies fill rows 0..Offsets[E] in expert
// order; Padded, expert e's segment is rows e·Capacity..(e+1)·Capacity whatever
// its count, the unused rows zero: static shapes, so that the experts' products
// and expert parallelism's exchange need no count on the host.
type MoEShape struct {
	BT, E, K, C, Capacity int
	Padded                bool
	Router                RouterSpec // how Router scores and gates
}

// Rows is the number of permuted rows the layer's buffers need.
func (s MoEShape) Rows() int {
	if s.Padded {
		return s.E * s.Capacity
	}
	return min(s.BT*s.K, s.E*s.Capacity)
}
