package parallel

import (
	"fmt"

	"github.com/shardline/shardline/config"
)

// The plan counts elements and bytes in int64. The recipe's bounds keep each
// dimension small enough to multiply, but their products can still pass 2^63
// (hidden × vocab, or heads × seq_len² of attention probabilities), and a silent
// overflow plans an impossible model as a small one. checkSizes estimates the
// largest products in float64 first and refuses a recipe whose sizes a 64-bit
// count cannot hold with room to spare (2^56: 64 PiB, far past any machine).
const maxPlanned = float64(1 << 56)

// checkSizes refuses a recipe whose parameter count, activation bytes or logits
// bytes could overflow the plan's arithmetic, naming the key that dominates.
func checkSizes(r *config.Recipe, m Mesh) error {
	mo := r.Model
	h, f, v := float64(mo.Hidden), float64(mo.FFNHidden), float64(mo.VocabSize)
	layers, seq := float64(mo.Layers), float64(mo.SeqLen)
	e, ef := float64(mo.MoE.NumExperts+mo.MoE.SharedExperts), float64(mo.MoE.ExpertFFNHidden)
	// Every parameter, counted generously: dense and expert MLPs in every layer.
	params := 2*v*h + layers*(4*h*h+3*h*f+3*e*h*ef+e*h+2*h)
	tokens := float64(r.Train.MicroBatchSize) * seq
	k := float64(mo.MoE.TopK) * max(1, mo.MoE.CapacityFactor)
	perToken := float64(mo.Heads)*seq + 16*h + 3*f + k*(h+3*ef) + 3*e*ef + 2*e
	for _, c := range []struct {
		key, what string
		size      float64
	}{
		{"model.hidden", "parameters", params * 16}, // weights, grads, main weights, moments
		{"model.seq_len", "activation bytes", tokens * perToken * layers * 8},
		{"model.vocab_size", "logits bytes", tokens * v * 8},
	} {
		if !(c.size < maxPlanned) {
			return config.KeyProblem(c.key, fmt.Sprintf("the model's %s come to about %.3g bytes, more than shardline's 64-bit plan represents (%.3g); check model.hidden, seq_len, vocab_size, layers and the MoE sizes for a mistyped value", c.what, c.size, maxPlanned), "")
		}
	}
	return nil
}
