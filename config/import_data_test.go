package config

import (
	"fmt"
	"strings"
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
		"--tokenizer-type HuggingFaceTokenizer --data-path /d/a":                        "--tokenizer-type HuggingFaceTokenizer reads --tokenizer-model's file, and the script gives none",
		"--tokenizer-type HuggingFaceTokenizer --tokenizer-model gpt2 --data-path /d/a": "a hub name is not fetched",
		"--tokenizer-type BertWordPieceCase --data-path /d/a":                           "--tokenizer-type BertWordPieceCase cannot be carried",
		"--tokenizer-type GPT2BPETokenizer --mock-data":                                 "--mock-data: Megatron's mock data are random tokens",
		"--tokenizer-type GPT2BPETokenizer":                                             "the script names no --data-path",
		"--data-path /d/a":                                                              "the script names no --tokenizer-type",
		"--tokenizer-type GPT2BPETokenizer --data-path /d/a --split 90,5,5":             "holds out a test part",
		"--tokenizer-type GPT2BPETokenizer --data-path 0.5 /d/a 0.5":                    "mixes weights and prefixes",
	} {
		_, diags := ImportMegatron("job.sh", []byte("python pretrain_gpt.py "+model+args+"\n"))
		require.True(t, diags.HasErrors(), args)
		require.Contains(t, fmt.Sprint(diags), want, args)
	}
}

// importTTClean is ImportTorchtitan less its refusals of the job's data and
// tokenizer (every torchtitan job reads a Hugging Face tokenizer, which
// shardline cannot carry; TestImportTorchtitanData checks them), for the tests
// of everything else an import translates.
func importTTClean(t *testing.T, path string, src []byte, worldSize int) (*Resolved, Diagnostics) {
	t.Helper()
	res, diags := ImportTorchtitan(path, src, worldSize)
	var kept Diagnostics
	for _, d := range diags {
		if d.Severity == SevError && (strings.Contains(d.Message, "cannot carry") || strings.Contains(d.Message, "cannot be carried")) {
			continue
		}
		kept = append(kept, d)
	}
	return res, kept
}

// A torchtitan job's data is carried or refused: dataset_path becomes
// data.path (and the validation one data.val_path); a hub dataset is refused,
// naming the setting, unless --set gives data.path; hf_assets_path's
// tokenizer is data.tokenizer.
func TestImportTorchtitanData(t *testing.T) {
	job := "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\nhf_assets_path = \"./assets/hf/Llama-3.1-8B\"\n[training]\nsteps = 10\ndataset = \"c4\"\n"
	_, diags := ImportTorchtitan("job.toml", []byte(job), 8)
	text := fmt.Sprint(diags)
	require.Contains(t, text, `job.toml:7:1: error[SL010]: [training] dataset = "c4": torchtitan downloads "c4" from the Hugging Face hub`)
	res, diags := ImportTorchtitanWith("job.toml", []byte(job), 8, []string{"data.path=/data/c4"})
	require.NotContains(t, fmt.Sprint(diags), "error[", "--set data.path gives the data")
	require.Equal(t, "/data/c4", res.Recipe.Data.Path)
	require.Equal(t, "./assets/hf/Llama-3.1-8B", res.Recipe.Data.Tokenizer)
	res, diags = ImportTorchtitan("job.toml", []byte(job+"dataset_path = \"/data/c4\"\n[validation]\nenable = true\ndataset_path = \"/data/c4-val\"\n"), 8)
	require.NotContains(t, fmt.Sprint(diags), "Hugging Face hub")
	require.Equal(t, "/data/c4", res.Recipe.Data.Path)
	require.Equal(t, "/data/c4-val", res.Recipe.Data.ValPath)
	require.Equal(t, 0.0, res.Recipe.Data.ValFraction)
	require.False(t, diags.HasErrors(), "%v", diags)
	// No dataset given: torchtitan's default, c4_test, from the hub.
	_, diags = ImportTorchtitan("job.toml", []byte("[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n[training]\nsteps = 10\n"), 8)
	require.Contains(t, fmt.Sprint(diags), `torchtitan downloads "c4_test" from the Hugging Face hub`)
}
