package parallel

import (
	"errors"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/stretchr/testify/require"
)

// Sizes a 64-bit count cannot hold are refused by Compile, naming the key, never
// planned through an overflow (hidden = vocab = 2^62 once planned as 1 KiB and
// "fit"). The recipe loader bounds each key; these values bypass it, as a caller
// of the library could.
func TestOversizedModelsAreRefused(t *testing.T) {
	for _, c := range []struct {
		name, key string
		sets      []string
		edit      func(hidden, vocab, seq *int)
	}{
		{"hidden and vocab 2^62", "model.hidden", nil, func(h, v, s *int) { *h, *v = 1<<62, 1<<62 }},
		{"seq_len at its bound with long attention", "model.seq_len", []string{"model.seq_len=16777216", "train.micro_batch_size=64", "train.global_batch_size=64"}, nil},
		{"vocab and seq_len at their bounds", "model.vocab_size", []string{"model.seq_len=4096", "model.vocab_size=16777216", "train.micro_batch_size=1048576", "train.global_batch_size=1048576"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := load(t, "../recipes/tiny.toml", c.sets...)
			r := res.Recipe
			if c.edit != nil {
				c.edit(&r.Model.Hidden, &r.Model.VocabSize, &r.Model.SeqLen)
			}
			topo, err := TopologyOf(r.Parallel, nil)
			require.NoError(t, err)
			p, err := Compile(&r, topo)
			require.Nil(t, p)
			var ke *config.Diagnostic
			require.True(t, errors.As(err, &ke), "%v", err)
			require.Equal(t, c.key, ke.Key, ke.Message)
		})
	}
}

func TestParamTableIsBounded(t *testing.T) {
	res := load(t, "../recipes/moe-tiny.toml", "model.layers=4096", "model.moe.num_experts=4096", "model.moe.layer_freq=1")
	_, err := ParamTable(res.Recipe.Model, 1, 1)
	var ke *config.Diagnostic
	require.True(t, errors.As(err, &ke), "%v", err)
	require.Equal(t, "model.moe.num_experts", ke.Key)
	require.Contains(t, ke.Message, "parameter tensors")
}
