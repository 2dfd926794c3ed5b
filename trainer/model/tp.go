package model

import (
	"fmt"

	"github.com/shardline/shardline/tensor"
)

// Tensor parallelism, as Megatron runs it with sequence parallelism: the q, k, v,
// gate and up projections are column-parallel (a rank holds heads/tp heads and
// ffn/tp columns), the attention output and down projections row-parallel; the
// residual stream, the norms and their inputs are split over the tp ranks by rows
// (rank t holds rows t·BT/tp … of the B·T tokens). Before a column-parallel GEMM
// the normed rows are all-gathered; after a row-parallel GEMM the partial sums are
// reduce-scattered back to row shards; backward runs the transposes (all-gather of
// the residual gradient, reduce-scatter of the input gradient), gathering the
// normed input again rather than keeping it whole. The embedding and the output
// head are vocabulary-parallel (a rank holds vocab/tp rows): the embedding's
// partial rows are reduce-scattered, and the cross-entropy combines the ranks'
// log-sum-exps and target logits, so the logits are never gathered. Norm gains are
// replicated over tp and see only the rank's rows: their gradients are summed over
// the tp group each pass, as are an MoE router's.

// TPComm is what tensor parallelism needs from the tp group, on f32 buffers of
// the model's memory (collective.Group has it).
type TPComm interface {
	AllGather(dst, src tensor.Buffer) error
	ReduceScatter(dst, src tensor.Buffer) error
	AllReduce(buf tensor.Buffer) error
}

// TensorParallel splits the model's layers over the Size ranks of a
// tensor-parallel group; this rank is Rank. It needs float32, the table
// partitioned for tp = Size and B·T divisible by Size. MoE layers route this
// rank's rows to whole experts (expert tensor parallelism is 1; the experts'
// gradients are summed over the expert-data-parallel group, which holds the tp
// ranks) and split their shared experts like the MLP.
type TensorParallel struct {
	Comm       TPComm
	Rank, Size int
}

// WithTensorParallel splits the model over a tensor-parallel group.
func WithTensorParallel(tp TensorParallel) Option { return func(o *options) { o.tp = &tp } }

// tpState holds tensor parallelism's scratch: the gathered normed input (gx), the
// gathered residual gradient (gd), a whole-rows partial sum before its
// reduce-scatter (px) and its row shard (red), the norm-gain and router gradients
// being summed (gnorm, grouter), and the cross-entropy's per-row log-sum-exps
// (this rank's, every rank's) and target logits.
type tpState[F tensor.Float] struct {
	TensorParallel
	gx, gd, px, red tensor.Buffer
	gnorm, grouter  tensor.Buffer
	gqk             tensor.Buffer // QK-norm's gain gradient, summed over the group (model.qk_norm)
	lse, lseAll     tensor.Buffer
	tlogit          tensor.Buffer
}

func (m *Model[F]) setupTP(tp TensorParallel, B, T int) error {
	var z F
	if _, ok := any(z).(float32); !ok || tp.Comm == nil || tp.Rank < 0 || tp.Rank >= tp.Size {
		return fmt.Errorf("model: tensor parallelism needs float32, a communicator and a rank in 0..%d", tp.Size-1)
	}
	if moe := m.Cfg.MoE; moe.NumExperts > 0 && moe.SharedExperts > 0 && moe.ExpertFFNHidden%tp.Size != 0 {
		return fmt.Errorf("model: shared experts' ffn %d must divide by tp %d", moe.ExpertFFNHidden, tp.Size)
	}
	if c := m.Cfg; c.Heads%tp.Size != 0 || c.EffectiveKVHeads()%tp.Size != 0 || c.FFNHidden%tp.Size != 0 || c.VocabSize%tp.Size != 0 {
		return fmt.Errorf("model: heads %d, kv heads %d, ffn %d and vocabulary %d must all divide by tp %d", c.Heads, c.EffectiveKVHeads(), c.FFNHidden, c.VocabSize, tp.Size)
	}
	m.tp = &tpState[F]{TensorParallel: tp}
	return nil
}

// tpSize is the tensor-parallel degree (1 without tensor parallelism).
func (m *Model[F]) tpSize() int {
	if m.tp == nil {
		return 1
	}
	return m.tp.Size
}

// rows is how many of the micro-batch's B·T token rows this rank's residual
// stream holds: all of them, or 1/tp under tensor (sequence) parallelism.
func (m *Model[F]) rows() int { return m.B * m.T / m.tpSize() }

func (m *Model[F]) allocTP() {
	BT, C := m.B*m.T, m.Cfg.Hidden
	p := m.tp
	p.gx, p.gd, p.px, p.red = m.alloc1(BT*C), m.alloc1(BT*C), m.alloc1(BT*C), m.alloc1(m.rows()*C)
	p.gnorm, p.grouter = m.alloc1(C), m.alloc1(m.Cfg.MoE.NumExperts*C)
	if m.Cfg.QKNorm {
		p.gqk = m.alloc1(m.Cfg.HeadSize())
	}
	p.lse, p.lseAll, p.tlogit = m.alloc1(BT), m.alloc1(p.Size*BT), m.alloc1(BT)
}

func (m *Model[F]) tpErr(what string, err error) {
	if err != nil && m.hookErr == nil {
		m.hookErr = fmt.Errorf("tensor-parallel %s: %w", what, err)
	}
}

// gather returns all B·T rows of a row-sharded (rows × C) activation: src itself
// without tensor parallelism, else the tp group's all-gather into scratch.
func (m *Model[F]) gather(src tensor.Buffer) tensor.Buffer {
	if m.tp == nil {
		return src
	}
	m.tpErr("all-gather", m.tp.Comm.AllGather(m.tp.gx, src))
	return m.tp.gx
}

// gatherGrad is gather for a gradient of the residual stream (its own scratch,
// alive while the normed input is gathered again).
func (m *Model[F]) gatherGrad(src tensor.Buffer) tensor.Buffer {
	if m.tp == nil {
		return src
	}
	m.tpErr("all-gather", m.tp.Comm.AllGather(m.tp.gd, src))
	return m.tp.gd
}

// rowParallel adds inp (B·T × K) · wᵀ (w is C × K, this rank's columns of a
// row-parallel weight) into out, this rank's rows of the residual stream: without
// tensor parallelism one accumulating matmul; with it, the matmul's partial sums
// over all rows are reduce-scattered and the rank's rows added.
func (m *Model[F]) rowParallel(out, inp, w tensor.Buffer, K int) {
	BT, C := m.B*m.T, m.Cfg.Hidden
	if m.tp == nil {
		m.be.Matmul(out, inp, w, tensor.MatmulShape{BT: BT, C: K, OC: C}, true)
		return
	}
	m.be.Matmul(m.tp.px, inp, w, tensor.MatmulShape{BT: BT, C: K, OC: C}, false)
	m.addRows(out)
}

// addRows reduce-scatters the partial sums of a row-parallel product over all
// B·T rows (in the tp scratch px) and adds this rank's rows into out.
func (m *Model[F]) addRows(out tensor.Buffer) {
	p := m.tp
	m.tpErr("reduce-scatter", p.Comm.ReduceScatter(p.red, p.px))
	m.be.AddInto(out, p.red, p.red.Len())
}

// inputGrad is the buffer a column-parallel GEMM's input gradient (all B·T rows,
// partial over tp) is accumulated in: dx itself without tensor parallelism.
func (m *Model[F]) inputGrad(dx tensor.Buffer) tensor.Buffer {
	if m.tp == nil {
		return dx
	}
	return m.tp.px
}

// scatterGrad sums the input gradient inputGrad returned over the tp group and
// returns this rank's rows (in dx): dx itself without tensor parallelism.
func (m *Model[F]) scatterGrad(dx tensor.Buffer) tensor.Buffer {
	if m.tp == nil {
		return dx
	}
	m.tpErr("reduce-scatter", m.tp.Comm.ReduceScatter(dx, m.tp.px))
	return dx
}

// normBackward is RMSNormBackward over this rank's rows, setting dinp (adding
// into it with accumulate); under tensor parallelism the gain's gradient (from
// these rows only) is summed over the tp group before it is added.
func (m *Model[F]) normBackward(dinp, dw, dout, inp, w, rstd tensor.Buffer, accumulate bool) {
	R, C := m.rows(), m.Cfg.Hidden
	if m.tp == nil {
		m.be.RMSNormBackward(dinp, dw, dout, inp, w, rstd, R, C, accumulate)
		return
	}
	g := m.tp.gnorm
	m.mem.Zero(g)
	m.be.RMSNormBackward(dinp, g, dout, inp, w, rstd, R, C, accumulate)
	m.tpErr("all-reduce", m.tp.Comm.AllReduce(g))
	m.be.AddInto(dw, g, C)
}

// headNormBackward is QK-norm's backward over rows rows of one head each:
// dinp set (overwritten) to the input gradient, the gain's gradient added into
// dw. Under tensor parallelism each rank saw its heads only: the gain's
// gradient is summed over the tp group.
func (m *Model[F]) headNormBackward(dinp, dw, dout, inp, w, rstd tensor.Buffer, rows int) {
	HD := m.Cfg.HeadSize()
	if m.tp == nil {
		m.be.RMSNormBackward(dinp, dw, dout, inp, w, rstd, rows, HD, false)
		return
	}
	g := m.tp.gqk
	m.mem.Zero(g)
	m.be.RMSNormBackward(dinp, g, dout, inp, w, rstd, rows, HD, false)
	m.tpErr("all-reduce", m.tp.Comm.AllReduce(g))
	m.be.AddInto(dw, g, HD)
}

// vocabRange is the vocabulary rows this rank holds: [lo, lo+n).
func (m *Model[F]) vocabRange() (lo, n int) {
	n = m.Cfg.VocabSize / m.tpSize()
	if m.tp != nil {
		lo = m.tp.Rank * n
	}
	return lo, n
}

// embedShape is the embedding of all B·T tokens in this rank's vocabulary rows.
func (m *Model[F]) embedShape() tensor.EmbeddingShape {
	lo, n := m.vocabRange()
	return tensor.EmbeddingShape{BT: m.B * m.T, C: m.Cfg.Hidden, Lo: lo, N: n}
}

// embed writes the embedding of tokens (all B·T) into x, this rank's rows: under
// tensor parallelism each rank looks up the tokens in its vocabulary rows (zeros
// for the others) and the partial rows are reduce-scattered.
func (m *Model[F]) embed(x, tokens tensor.Buffer) {
	if m.tp == nil {
		m.be.Embedding(x, tokens, m.w.embed, m.embedShape())
		return
	}
	p := m.tp
	m.be.Embedding(p.px, tokens, m.w.embed, m.embedShape())
	m.tpErr("reduce-scatter", p.Comm.ReduceScatter(x, p.px))
}

// embedBackward accumulates the embedding's gradient from dres, the gradient of
// this rank's rows of the residual stream (all rows' under tensor parallelism,
// into this rank's vocabulary rows).
func (m *Model[F]) embedBackward(dres, tokens tensor.Buffer) {
	m.be.EmbeddingBackward(m.g.embed, m.gatherGrad(dres), tokens, m.embedShape())
}

// crossEntropy computes every row's loss and this rank's softmax probabilities
// from its logits (B·T × V/tp): each rank's log-sum-exp per row is all-gathered
// and combined in rank order, and the target's logit comes from the rank holding
// it (an all-reduce of rows that are zero elsewhere).
func (m *Model[F]) crossEntropy(lossesB, probsB, logitsB, targets tensor.Buffer) {
	s := m.vocabShape()
	if m.tp == nil {
		m.be.CrossEntropy(lossesB, probsB, logitsB, targets, s)
		return
	}
	p := m.tp
	m.be.CrossEntropyParts(p.lse, p.tlogit, logitsB, targets, s)
	m.tpErr("all-gather", p.Comm.AllGather(p.lseAll, p.lse))
	m.tpErr("all-reduce", p.Comm.AllReduce(p.tlogit))
	m.be.CrossEntropyCombine(lossesB, probsB, logitsB, p.lseAll, p.tlogit, targets, s)
}

// vocabShape is the loss's logits: this rank's vocabulary rows of B·T tokens.
func (m *Model[F]) vocabShape() tensor.VocabShape {
	lo, V := m.vocabRange()
	parts := 1
	if m.tp != nil {
		parts = m.tp.Size
	}
	return tensor.VocabShape{BT: m.B * m.T, V: V, Lo: lo, Parts: parts}
}

// crossEntropyBackward sets dlogits = (probs − onehot(target))·dloss over this
// rank's vocabulary rows (0 for ignored targets, < 0); dlogits may be probs.
func (m *Model[F]) crossEntropyBackward(dlogitsB, dlossB, probsB, targets tensor.Buffer) {
	m.be.CrossEntropyBackward(dlogitsB, dlossB, probsB, targets, m.vocabShape())
}
