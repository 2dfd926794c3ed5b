package trainer

import (
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/trainer/data"
	"github.com/shardline/shardline/trainer/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDocumentMasksNeedDocuments: document masks take the tokenizer's
// end-of-text token; a tokenizer without one, or training tokens without one
// (a single document: the masks would change nothing), is refused naming the
// key.
func TestDocumentMasksNeedDocuments(t *testing.T) {
	r := config.Default()
	r.Data.ResetAttentionMask, r.Data.EODMaskLoss = true, true
	_, err := documentMasks(&r, &data.Dataset{Tok: data.Byte{}, Train: data.NewTokens([]int32{1, 2, 3}, 1)})
	require.ErrorContains(t, err, "data.reset_attention_mask")
	require.ErrorContains(t, err, "the byte tokenizer has no end-of-text token")

	eos := data.GPT2{}.Specials().EOS
	_, err = documentMasks(&r, &data.Dataset{Tok: data.GPT2{}, Train: data.NewTokens([]int32{1, 2, 3}, 1)})
	require.ErrorContains(t, err, "hold no end-of-text token (50256)")

	d, err := documentMasks(&r, &data.Dataset{Tok: data.GPT2{}, Train: data.NewTokens([]int32{1, eos, 3}, 1)})
	require.NoError(t, err)
	assert.Equal(t, model.DocumentMasks{EOS: eos, MaskLoss: true, ResetAttention: true}, d)

	r.Data.ResetAttentionMask, r.Data.EODMaskLoss = false, false
	d, err = documentMasks(&r, &data.Dataset{Tok: data.Byte{}})
	require.NoError(t, err)
	assert.False(t, d.MaskLoss || d.ResetAttention)
}

// TestLossTokens: eod_mask_loss leaves out the positions whose input is EOS,
// beside the ignored targets, as the model counts them.
func TestLossTokens(t *testing.T) {
	tokens, targets := []int32{5, 9, 5, 1}, []int32{9, 5, -1, 2}
	assert.Equal(t, 3, lossTokens(tokens, targets, model.DocumentMasks{EOS: 9}))
	assert.Equal(t, 2, lossTokens(tokens, targets, model.DocumentMasks{EOS: 9, MaskLoss: true}))
}

// documentsCorpus writes a prepared gpt2 data directory whose documents (5 to
// 20 tokens of the first thousand ids) each end with <|endoftext|>: what a
// corpus of documents tokenizes to.
func documentsCorpus(t *testing.T) string {
	dir := t.TempDir()
	eos := data.GPT2{}.Specials().EOS
	r := rand.New(rand.NewPCG(3, 4))
	split := func(n int) []int32 {
		var toks []int32
		for len(toks) < n {
			for range 5 + r.IntN(16) {
				toks = append(toks, int32(r.IntN(1000)))
			}
			toks = append(toks, eos)
		}
		return toks[:n]
	}
	require.NoError(t, data.WriteShard(filepath.Join(dir, "train.tok"), split(4000), "gpt2", data.GPT2Vocab))
	require.NoError(t, data.WriteShard(filepath.Join(dir, "val.tok"), split(400), "gpt2", data.GPT2Vocab))
	require.NoError(t, data.SaveTokenizer(filepath.Join(dir, "tokenizer.json"), data.GPT2{}))
	return dir
}

// TestDocumentMasksTrainAsOneRank: a run with document masks and chunked
// attention on a corpus of documents trains the per-step losses, validation
// loss and final weights of one rank under context parallelism 2 (documents
// that begin on the other rank) and data parallelism 2, with the per-token
// mean and with the mean of micro-batch means (each divides by the positions
// eod_mask_loss leaves in); tolerance as TestContextParallelEquivalence
// (1e-5). The plan's scratch is what a cp rank holds, to the byte.
func TestDocumentMasksTrainAsOneRank(t *testing.T) {
	dir := documentsCorpus(t)
	base := []string{"data.path=" + dir, "data.tokenizer=gpt2", "model.vocab_size=50304", "data.reset_attention_mask=true", "data.eod_mask_loss=true",
		"model.attention_chunk_size=12", "train.steps=2", "train.micro_batch_size=2", "train.global_batch_size=8", "train.eval_interval=2",
		"train.eval_steps=1", "train.warmup_steps=1", "logging.sample_tokens=0"}
	run := func(sets ...string) *config.Resolved {
		res, _ := tinyRun(t, append(append([]string{}, base...), sets...)...)
		return res
	}
	ref := oneRank(t, run("parallel.world_size=1"))
	ref.assertMatched(t, "dp2", run("parallel.world_size=2"), 1e-5)
	// cp 2: the losses and weights, and the scratch the plan predicts
	out, l, w := trainedResult(t, run("parallel.world_size=2", "parallel.context_parallel=2"))
	assert.Less(t, maxRelDiff(ref.losses, l), 1e-5, "cp2 losses %v vs %v", l, ref.losses)
	assert.Less(t, maxAbsDiff(ref.w, w), 1e-5, "cp2 weights")
	assert.Equal(t, out.Predicted.Scratch, out.Held.Scratch, "scratch under cp 2 with documents")
	means := oneRank(t, run("parallel.world_size=1", "fsdp.calculate_per_token_loss=false"))
	means.assertMatched(t, "dp2 micro-batch means", run("parallel.world_size=2", "fsdp.calculate_per_token_loss=false"), 1e-5)
}
