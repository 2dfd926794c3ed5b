package model

import (
	"fmt"
	"math"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// eos is the end-of-text token of the masks' tests (tinyConfig's vocabulary is 11).
const eos = 3

// TestDocumentStarts: a position's document begins one past the last EOS
// before it; an EOS closes its own document.
func TestDocumentStarts(t *testing.T) {
	tokens := []int32{1, 3, 2, 2, 3, 3, 0 /* next sequence */, 3, 1, 1, 1, 1, 1, 1}
	starts := make([]int32, len(tokens))
	DocumentStarts(starts, tokens, 2, 7, eos)
	assert.Equal(t, []int32{0, 0, 2, 2, 2, 5, 6, 0, 1, 1, 1, 1, 1, 1}, starts)
}

// TestMaskedModelGradient checks the whole model's gradients under chunked
// attention and document masks against central finite differences in float64
// (h and tolerance as TestModelGradient: 1e-5 relative), with and without full
// recompute.
func TestMaskedModelGradient(t *testing.T) {
	chunked := tinyConfig(false)
	chunked.AttentionChunkSize = 2
	// iRoPE (Llama 4): the rotary layer attends in chunks, the NoPE layer
	// over the whole sequence; NoPE last (Hugging Face's layer 1) and first
	// (torchtitan's layer 0).
	irope, iropeFirst := nope(chunked, 2), nope(chunked, 2)
	iropeFirst.NoPEFirst = true
	docs := WithDocumentMasks(DocumentMasks{EOS: eos, MaskLoss: true, ResetAttention: true})
	for _, c := range []struct {
		name      string
		cfg       config.Model
		recompute string
		opts      []Option
	}{
		{"chunked", chunked, "none", nil},
		{"documents", tinyConfig(false), "none", []Option{docs}},
		{"chunked documents, full recompute", chunked, "full", []Option{docs}},
		{"moe documents", tinyMoE(1, 0, 1), "none", []Option{docs}},
		{"irope", irope, "none", nil},
		{"irope nope first, documents, full recompute", iropeFirst, "full", []Option{docs}},
	} {
		B, T := 2, 5
		m, w, g, table := build[float64](t, c.cfg, B, T, append([]Option{WithRecompute(c.recompute)}, c.opts...)...)
		tokens := []int32{1, 3, 2, 9, 3, 3, 3, 10, 5, 6}
		targets := []int32{4, 2, 9, 0, 7, 3, 10, -1, 6, 1}
		loss := func() float64 {
			s, n := m.Loss(tokens, targets)
			return s/float64(n) + m.AuxLoss()*float64(B*T)/float64(n)
		}
		_, n := m.Loss(tokens, targets)
		if c.opts != nil {
			require.Equal(t, 5, n, "%s: the targets of the four EOS inputs and the one ignored are not counted", c.name)
		}
		m.Backward(tokens, targets, 1/float64(n))
		require.NoError(t, m.Err())
		const h = 1e-5
		for i := range table {
			for j := range w[i] {
				orig := w[i][j]
				w[i][j] = orig + h
				lp := loss()
				w[i][j] = orig - h
				lm := loss()
				w[i][j] = orig
				num := (lp - lm) / (2 * h)
				if math.Abs(num-g[i][j]) > 1e-5*(1+math.Abs(num)) {
					t.Fatalf("%s: d/d %s[%d]: analytic %.9g, numeric %.9g", c.name, table[i].Name, j, g[i][j], num)
				}
			}
		}
	}
}

// TestDocumentsTrainApart: two documents packed in one sequence, with
// reset_attention_mask and eod_mask_loss, give each position the logits it has
// with its document run alone (positions from 0: RoPE's scores depend on
// distances only), the sum of the two documents' losses and the sum of their
// gradients; the documents alone run on a model without masks, their EOS
// position's target ignored (what eod_mask_loss ignores). float64: what differs
// is RoPE's angles at other positions and the order of sums, about 1e-15
// relative; tolerance 1e-10 of the largest value.
func TestDocumentsTrainApart(t *testing.T) {
	cfg := tinyConfig(false)
	cfg.SeqLen = 12
	doc1, doc2 := []int32{1, 4, 2, 9, eos}, []int32{5, 6, 0, 7, 10, 2, eos}
	tokens := append(append([]int32{}, doc1...), doc2...)
	targets := append(append([]int32{}, tokens[1:]...), 8) // the next token; the last one made up
	packed, _, gp, table := build[float64](t, cfg, 1, len(tokens), WithDocumentMasks(DocumentMasks{EOS: eos, MaskLoss: true, ResetAttention: true}))
	sum, n := packed.Loss(tokens, targets)
	packed.Backward(tokens, targets, 1)
	require.NoError(t, packed.Err())
	logits := func(m *Model[float64], toks []int32) []float64 {
		m.ForwardLogits(toks, 0, len(toks))
		out := make([]float64, len(toks)*cfg.VocabSize)
		m.ReadLogits(out, 0)
		require.NoError(t, m.Err())
		return out
	}
	lp := logits(packed, tokens)

	var apartSum float64
	apartN, at := 0, 0
	apartGrad := make([][]float64, len(table))
	for i := range table {
		apartGrad[i] = make([]float64, len(gp[i]))
	}
	var apartLogits []float64
	for _, doc := range [][]int32{doc1, doc2} {
		m, _, g, _ := build[float64](t, cfg, 1, len(doc))
		tgt := append([]int32{}, targets[at:at+len(doc)]...)
		tgt[len(doc)-1] = -1 // the EOS input: eod_mask_loss
		s, c := m.Loss(doc, tgt)
		apartSum, apartN = apartSum+s, apartN+c
		m.Backward(doc, tgt, 1)
		require.NoError(t, m.Err())
		for i := range g {
			for j := range g[i] {
				apartGrad[i][j] += g[i][j]
			}
		}
		apartLogits = append(apartLogits, logits(m, doc)...)
		at += len(doc)
	}
	assert.Equal(t, apartN, n)
	assert.InDelta(t, apartSum, sum, 1e-10*math.Abs(apartSum))
	worst, top := 0.0, 0.0
	for i := range lp {
		worst, top = math.Max(worst, math.Abs(lp[i]-apartLogits[i])), math.Max(top, math.Abs(apartLogits[i]))
	}
	t.Logf("logits: worst difference %.3g of %.3g", worst, top)
	assert.Less(t, worst, 1e-10*top, "logits")
	worst, top = 0, 0
	for i := range gp {
		for j := range gp[i] {
			worst, top = math.Max(worst, math.Abs(gp[i][j]-apartGrad[i][j])), math.Max(top, math.Abs(apartGrad[i][j]))
		}
	}
	t.Logf("gradients: worst difference %.3g of %.3g", worst, top)
	assert.Less(t, worst, 1e-10*top, "gradients")
}

// TestMasksUnderMeshEqualOneRank: chunked attention (a chunk of 5 that cuts
// the context-parallel chunks of 4 and 2 positions, on the rotary layer of an
// iRoPE model whose NoPE layer attends over the whole sequence) and document masks (ends
// inside and at the edges of those chunks, so a document begins on another
// rank) give one rank's loss and gradients under tensor parallelism 2, context
// parallelism 2 and 4, and both. fp32; tolerance as
// TestContextParallelEqualsOneRank (1e-5 of the largest gradient).
func TestMasksUnderMeshEqualOneRank(t *testing.T) {
	cfg := tinyConfig(false)
	cfg.Hidden, cfg.Heads, cfg.KVHeads, cfg.FFNHidden, cfg.VocabSize, cfg.SeqLen = 16, 4, 4, 24, 12, 16
	cfg.AttentionChunkSize = 5
	cfg.NoPEInterval = 2 // iRoPE: layer 0 attends in chunks, layer 1 (NoPE) over the whole sequence
	B, T := 2, 16
	tokens, targets := make([]int32, B*T), make([]int32, B*T)
	for i := range tokens {
		tokens[i], targets[i] = int32(i*7%cfg.VocabSize), int32((i*5+3)%cfg.VocabSize)
		if tokens[i] == eos {
			tokens[i] = 4
		}
	}
	for _, p := range []int{1, 3, 4, 9, 16 + 7, 16 + 8} { // document ends
		tokens[p] = eos
	}
	docs := WithDocumentMasks(DocumentMasks{EOS: eos, MaskLoss: true, ResetAttention: true})
	for _, recompute := range []string{"none", "full"} {
		refSum, refCount, _, refGrad := meshPass(t, cfg, B, T, 1, 1, recompute, tokens, targets, docs)
		require.Equal(t, B*T-6, refCount)
		gmax := largest(refGrad)
		for _, mesh := range [][2]int{{2, 1}, {1, 2}, {1, 4}, {2, 2}} {
			name := fmt.Sprintf("tp %d cp %d recompute %s", mesh[0], mesh[1], recompute)
			sum, count, _, grad := meshPass(t, cfg, B, T, mesh[0], mesh[1], recompute, tokens, targets, docs)
			assert.Equal(t, refCount, count, name)
			assert.InDelta(t, refSum, sum, 1e-5*math.Abs(refSum), name)
			worst := largestDiff(grad, refGrad)
			t.Logf("%s: loss %.9g vs %.9g, worst gradient difference %.3g of %.3g", name, sum, refSum, worst, gmax)
			assert.Less(t, worst, 1e-5*gmax, name)
		}
	}
	// The masks matter: without them the loss differs.
	plain := cfg
	plain.AttentionChunkSize = 0
	refSum, _, _, _ := meshPass(t, cfg, B, T, 1, 1, "none", tokens, targets, docs)
	sum, _, _, _ := meshPass(t, plain, B, T, 1, 1, "none", tokens, targets)
	assert.Greater(t, math.Abs(sum-refSum), 1e-3*math.Abs(refSum))
}

// TestDocumentMasksNeedEOS: a tokenizer without an end-of-text token (id −1)
// cannot mark documents.
func TestDocumentMasksNeedEOS(t *testing.T) {
	cfg := tinyConfig(false)
	_, err := newForTest(cfg, WithDocumentMasks(DocumentMasks{EOS: -1, ResetAttention: true}))
	require.ErrorContains(t, err, "document masks need the tokenizer's end-of-text token")
}

// newForTest makes a float64 model of cfg over 1 sequence of 5 tokens, or
// New's error.
func newForTest(cfg config.Model, opt ...Option) (*Model[float64], error) {
	table, err := parallel.ParamTable(cfg, 1, 1)
	if err != nil {
		return nil, err
	}
	w, g := make([][]float64, len(table)), make([][]float64, len(table))
	for i := range table {
		w[i], g[i] = make([]float64, table[i].LocalNumel()), make([]float64, table[i].LocalNumel())
	}
	mem, wb, gb := onMemory(w, g, false)
	return New[float64](cfg, table, wb, gb, cpu.Kernels[float64]{}, 1, 5, append([]Option{WithMemory(mem)}, opt...)...)
}

// noComm is a context-parallel group that is never called: the models of
// TestDocumentMasksFollowThePlan are built and measured, not run.
type noComm struct{}

func (noComm) SendRecv(dst, src tensor.Buffer, to, from int) error { return nil }
func (noComm) AllReduce(buf tensor.Buffer) error                   { return nil }

// TestDocumentMasksFollowThePlan: what document masks add to the model's
// buffers (each token's document start, int32, among the activations; under
// context parallelism each sequence chunk's last document end, f32, in the
// scratch) is what the plan adds for data.reset_attention_mask, to the byte,
// without and with cp 2; chunked attention adds nothing.
func TestDocumentMasksFollowThePlan(t *testing.T) {
	for _, cp := range []int{1, 2} {
		bytes := func(docs bool, chunk int) (planAct, planScratch, act, scratch int64) {
			r := config.Default()
			r.Model = tinyConfig(false)
			r.Model.SeqLen, r.Model.AttentionChunkSize = 8, chunk
			r.Parallel.WorldSize, r.Parallel.ContextParallel = cp, cp
			r.Train.MicroBatchSize, r.Train.GlobalBatchSize = 2, 2
			r.Data.ResetAttentionMask = docs
			topo, err := parallel.TopologyOf(r.Parallel, nil)
			require.NoError(t, err)
			plan, err := parallel.Compile(&r, topo)
			require.NoError(t, err)
			w, g := make([][]float32, len(plan.Params)), make([][]float32, len(plan.Params))
			for i := range plan.Params {
				w[i], g[i] = make([]float32, plan.Params[i].LocalNumel()), make([]float32, plan.Params[i].LocalNumel())
			}
			mem, wb, gb := onMemory(w, g, false)
			opts := []Option{WithMemory(mem), WithDocumentMasks(DocumentMasks{EOS: eos, ResetAttention: docs})}
			if cp > 1 {
				opts = append(opts, WithContextParallel(ContextParallel{Comm: noComm{}, Rank: 0, Size: cp}))
			}
			m, err := New[float32](r.Model, plan.Params, wb, gb, cpu.Kernels[float32]{}, 2, r.Model.SeqLen, opts...)
			require.NoError(t, err)
			a, _ := m.ActivationBytes()
			return plan.Memory.Activations, plan.Memory.Scratch, a, m.ScratchBytes()
		}
		pa0, ps0, a0, s0 := bytes(false, 0)
		pa1, ps1, a1, s1 := bytes(true, 3)
		assert.Positive(t, a1-a0, "cp %d", cp)
		assert.Equal(t, pa1-pa0, a1-a0, "cp %d: activations", cp)
		assert.Equal(t, ps1-ps0, s1-s0, "cp %d: scratch", cp)
		assert.Equal(t, ps0, s0, "cp %d: the plan's scratch is the model's", cp)
	}
}

// TestIRoPEChunksRotaryLayersOnly: with NoPE layers interleaved only the
// rotary layers attend in chunks (Llama 4's iRoPE). A model whose every layer
// is NoPE computes the same loss with and without a chunk size (every layer
// attends over the whole sequence), bit for bit; an iRoPE model's loss differs
// from the unchunked one's (its rotary layer attends in chunks) and moves with
// nope_first.
func TestIRoPEChunksRotaryLayersOnly(t *testing.T) {
	tokens := []int32{1, 3, 2, 9, 3, 3, 3, 10, 5, 6}
	targets := []int32{4, 2, 9, 0, 7, 3, 10, -1, 6, 1}
	loss := func(cfg config.Model) float64 {
		m, _, _, _ := build[float64](t, cfg, 2, 5)
		s, n := m.Loss(tokens, targets)
		require.NoError(t, m.Err())
		return s / float64(n)
	}
	chunked := tinyConfig(false)
	chunked.AttentionChunkSize = 2
	plain := tinyConfig(false)
	assert.Equal(t, loss(nope(plain, 1)), loss(nope(chunked, 1)), "every layer NoPE: the chunk size changes nothing")
	irope := loss(nope(chunked, 2))
	assert.Greater(t, math.Abs(irope-loss(nope(plain, 2))), 1e-6, "the rotary layer attends in chunks")
	first := nope(chunked, 2)
	first.NoPEFirst = true
	assert.NotEqual(t, irope, loss(first), "nope_first moves the NoPE layer")
}
