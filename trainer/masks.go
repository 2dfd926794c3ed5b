package trainer

import (
	"fmt"
	"slices"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/trainer/data"
	"github.com/shardline/shardline/trainer/model"
)

// documentMasks are the model's document masks for the recipe's data settings
// (data.eod_mask_loss, data.reset_attention_mask) over the tokenizer's
// end-of-text token; an error, naming the key, where the tokenizer has none,
// or where the training tokens hold none (every sequence would be one
// document: the setting would change nothing).
func documentMasks(r *config.Recipe, ds *data.Dataset) (model.DocumentMasks, error) {
	tok := ds.Tok
	d := model.DocumentMasks{EOS: tok.Specials().EOS, MaskLoss: r.Data.EODMaskLoss, ResetAttention: r.Data.ResetAttentionMask}
	if !d.MaskLoss && !d.ResetAttention {
		return d, nil
	}
	key := "data.eod_mask_loss"
	if d.ResetAttention {
		key = "data.reset_attention_mask"
	}
	if d.EOS < 0 {
		return d, config.ValueProblem(key, true, fmt.Errorf("the %s tokenizer has no end-of-text token to mark where documents end", tok.Name()),
			`set data.tokenizer = "gpt2" (documents end with <|endoftext|>), or remove `+key)
	}
	if !slices.Contains(ds.Train, d.EOS) {
		return d, config.ValueProblem(key, true, fmt.Errorf("the training tokens of %s hold no end-of-text token (%d), so every sequence is one document and the setting would change nothing", r.Data.Path, d.EOS),
			"train on a corpus whose documents end with the tokenizer's end-of-text token, or remove "+key)
	}
	return d, nil
}

// lossTokens is how many positions of a micro-batch have a loss: a target
// (≥ 0) and, with eod_mask_loss, an input token other than EOS (what the
// model counts).
func lossTokens(tokens, targets []int32, d model.DocumentMasks) int {
	n := 0
	for i, t := range targets {
		if t >= 0 && (!d.MaskLoss || tokens[i] != d.EOS) {
			n++
		}
	}
	return n
}

// globalLossTokens is lossTokens over the step's whole global batch (every
// micro-batch of every data-parallel rank), which every rank computes from the
// data alone (data.Batch is a function of seed, step and index): the per-token
// loss's divisor when eod_mask_loss leaves some positions out. It uses the
// step buffers' tokens and targets as scratch.
func (t *run) globalLossTokens(step int, d model.DocumentMasks) int {
	r, b := t.r, t.bufs
	B, T := r.Train.MicroBatchSize, r.Model.SeqLen
	n := 0
	for i := 0; i < t.plan.MicroBatches*t.plan.Mesh.DP; i++ {
		data.Batch(b.tokens, b.targets, t.ds.Train, r.Run.Seed, step, i*B, B, T)
		n += lossTokens(b.tokens, b.targets, d)
	}
	return n
}
