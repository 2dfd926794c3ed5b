package config

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// The import carries a Megatron script's data: one --data-path prefix becomes
// data.path, --split's validation part data.val_fraction, GPT2BPETokenizer
// gpt2, and without --vocab-size the vocabulary is GPT-2's 50257 padded as
// Megatron pads it (to a multiple of --make-vocab-size-divisible-by × tensor
// parallel); --valid-data-path is the validation data.
func TestImportMegatronData(t *testing.T) {
	model := "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 " +
		"--micro-batch-size 1 --global-batch-size 8 --train-iters 10 --lr 1e-3 --swiglu --normalization RMSNorm " +
		"--position-embedding-type rope --disable-bias-linear --attention-dropout 0.0 --hidden-dropout 0.0 "
	for _, c := range []struct {
		args  string
		vocab int
	}{
		{"--tokenizer-type GPT2BPETokenizer --data-path /d/web_text_document --split 98,2,0", 50304},
		{"--tokenizer-type GPT2BPETokenizer --data-path /d/web_text_document --split 98,2,0 --make-vocab-size-divisible-by 64 --tensor-model-parallel-size 2", 50304},
		{"--tokenizer-type GPT2BPETokenizer --data-path /d/web_text_document --split 98,2,0 --make-vocab-size-divisible-by 1", 50257},
		{"--tokenizer-type GPT2BPETokenizer --data-path /d/web_text_document --split 98,2,0 --tensor-model-parallel-size 4", 50688},
	} {
		res, diags := ImportMegatron("job.sh", []byte("torchrun --nproc_per_node 4 pretrain_gpt.py "+model+c.args+"\n"))
		require.False(t, diags.HasErrors(), "%s: %v", c.args, diags)
		d := res.Recipe.Data
		require.Equal(t, "/d/web_text_document", d.Path)
		require.Equal(t, "gpt2", d.Tokenizer)
		require.InDelta(t, 0.02, d.ValFraction, 1e-12)
		require.Equal(t, c.vocab, res.Recipe.Model.VocabSize, c.args)
		require.Contains(t, res.Origin("model.vocab_size").Describe(), "padded to a multiple of")
	}
	res, diags := ImportMegatron("job.sh", []byte("python pretrain_gpt.py "+model+"--tokenizer-type GPT2BPETokenizer --data-path /d/a /d/b --valid-data-path /d/v --vocab-size 50304\n"))
	require.False(t, diags.HasErrors(), "%v", diags)
	require.Equal(t, []string{"1 /d/a", "1 /d/b"}, res.Recipe.Data.Sources, "prefixes alone: equal weights")
	require.Equal(t, "/d/v", res.Recipe.Data.ValPath)
	require.Equal(t, 0.0, res.Recipe.Data.ValFraction)

	// What cannot be carried is an error naming it.
	for args, want := range map[string]string{
		"--tokenizer-type HuggingFaceTokenizer --data-path /d/a":            "--tokenizer-type HuggingFaceTokenizer cannot be carried",
		"--tokenizer-type GPT2BPETokenizer --mock-data":                     "--mock-data: Megatron's mock data are random tokens",
		"--tokenizer-type GPT2BPETokenizer":                                 "the script names no --data-path",
		"--data-path /d/a":                                                  "the script names no --tokenizer-type",
		"--tokenizer-type GPT2BPETokenizer --data-path /d/a --split 90,5,5": "holds out a test part",
		"--tokenizer-type GPT2BPETokenizer --data-path 0.5 /d/a 0.5":        "mixes weights and prefixes",
	} {
		_, diags := ImportMegatron("job.sh", []byte("python pretrain_gpt.py "+model+args+"\n"))
		require.True(t, diags.HasErrors(), args)
		require.Contains(t, fmt.Sprint(diags), want, args)
	}
}
