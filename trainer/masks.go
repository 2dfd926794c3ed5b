package trainer

import (
	"errors"
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
	errFound := errors.New("found")
	if err := ds.Train.Scan(func(c []int32) error {
		if slices.Contains(c, d.EOS) {
			return errFound
		}
		return nil
	}); err == nil {
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
// data alone (the sampler's sequences are a function of seed and global
// index): the per-token loss's divisor when eod_mask_loss leaves some
// positions out. It uses the step buffers' tokens and targets as scratch.
func (t *run) globalLossTokens(step int, d model.DocumentMasks) int {
	b, B := t.bufs, t.r.Train.MicroBatchSize
	per := t.plan.MicroBatches * t.plan.Mesh.DP // micro-batches a step, over the data-parallel ranks
	n := 0
	for i := 0; i < per; i++ {
		t.ds.TrainSampler.Fill(b.tokens, b.targets, (step*per+i)*B, B)
		n += lossTokens(b.tokens, b.targets, d)
	}
	return n
}
