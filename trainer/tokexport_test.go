package trainer

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestExportCarriesTokenizer: a run trained with a tokenizer file exports it
// beside the weights (the same bytes), with tokenizer_config.json,
// generation_config.json and BOS/EOS ids in config.json; --init-from that
// directory refuses a recipe tokenizing with something else and takes the
// directory itself as data.tokenizer. A char run exports no tokenizer file and
// null ids.
func TestExportCarriesTokenizer(t *testing.T) {
	tiny, err := filepath.Abs("tokenizer/testdata/tiny-tokenizer.json")
	require.NoError(t, err)
	sets := []string{"data.tokenizer=" + tiny, "model.vocab_size=560", "model.seq_len=16"}
	run, out := trainedForExport(t, sets, 1<<30)
	readJSON := func(name string) map[string]any {
		var m map[string]any
		require.NoError(t, json.Unmarshal(must(os.ReadFile(filepath.Join(out, name))), &m), name)
		return m
	}
	assert.Equal(t, must(os.ReadFile(tiny)), must(os.ReadFile(filepath.Join(out, "tokenizer.json"))))
	tc := readJSON("tokenizer_config.json")
	assert.Equal(t, "PreTrainedTokenizerFast", tc["tokenizer_class"])
	assert.Equal(t, "<|endoftext|>", tc["eos_token"])
	assert.Nil(t, tc["bos_token"])
	for _, name := range []string{"config.json", "generation_config.json"} {
		c := readJSON(name)
		assert.Equal(t, 556.0, c["eos_token_id"], name)
		assert.Contains(t, c, "bos_token_id", name)
		assert.Nil(t, c["bos_token_id"], name)
	}

	// --init-from: the recipe must tokenize with the directory's tokenizer.
	fr, err := loadRun(run)
	require.NoError(t, err)
	base := []string{"train.steps=1", "train.eval_interval=0", "train.lr=1e-30", "train.warmup_steps=0", "logging.sample_tokens=0", "model.vocab_size=560", "model.seq_len=16"}
	res, _ := tinyRun(t, base...) // char
	o := opts()
	o.InitFrom = out
	_, err = Run(context.Background(), res, o)
	assert.ErrorContains(t, err, "holds the model's tokenizer (tokenizer.json), but the recipe tokenizes with char")
	res, _ = tinyRun(t, append(base, "data.tokenizer="+out)...)
	r, err := Run(context.Background(), res, o)
	require.NoError(t, err)
	back, err := loadRun(r.Dir)
	require.NoError(t, err)
	assert.Equal(t, "hf-", back.tok.Name()[:3], "the run tokenized with the directory's tokenizer.json")
	for i := range fr.table {
		require.Equal(t, fr.weights[i], back.weights[i], fr.table[i].Name)
	}

	_, charOut := trainedForExport(t, nil, 1<<30)
	_, err = os.Stat(filepath.Join(charOut, "tokenizer.json"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	var c map[string]any
	require.NoError(t, json.Unmarshal(must(os.ReadFile(filepath.Join(charOut, "config.json"))), &c))
	assert.Nil(t, c["eos_token_id"])
}
