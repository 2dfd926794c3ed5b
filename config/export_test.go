package config

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestExportMegatronRoundTrip: every shipped recipe, exported as Megatron
// arguments (plus the keys no argument carries, as --set), loads back onto
// shardline's defaults to the same fingerprint.
func TestExportMegatronRoundTrip(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "recipes", "*.toml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		res, diags := Load(f, Options{})
		require.False(t, diags.HasErrors(), "%s: %v", f, diags)
		want, err := Fingerprint(&res.Recipe)
		require.NoError(t, err)
		e := ExportMegatron(&res.Recipe)
		var flags []FlagValue
		for i := 0; i < len(e.Args); i++ {
			name := strings.TrimPrefix(e.Args[i], "--")
			value := "true"
			if i+1 < len(e.Args) && !strings.HasPrefix(e.Args[i+1], "--") {
				i++
				value = e.Args[i]
			}
			flags = append(flags, FlagValue{Name: name, Value: value})
		}
		back, diags := LoadBytes("exported.toml", nil, Options{Flags: flags, Sets: e.Unexpressed})
		for _, d := range diags {
			require.NotEqual(t, SevError, d.Severity, "%s: %v", f, d)
		}
		got, err := Fingerprint(&back.Recipe)
		require.NoError(t, err)
		require.Equal(t, want, got, "%s: exported as %v, unexpressed %v", f, e.Args, e.Unexpressed)
		script := e.Script(f, want)
		require.Contains(t, script, "SHARDLINE_ARGS=(\n    --swiglu\n")
	}
}

// TestImportMegatronRoundTrip: every shipped recipe exported as a launch script
// (recipe export megatron's array and key list) imports back to the same
// fingerprint, every value from the argument that carried it.
func TestImportMegatronRoundTrip(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "recipes", "*.toml"))
	require.NoError(t, err)
	for _, f := range files {
		res, diags := Load(f, Options{})
		require.False(t, diags.HasErrors(), "%s: %v", f, diags)
		want, err := Fingerprint(&res.Recipe)
		require.NoError(t, err)
		script := ExportMegatron(&res.Recipe).Script(f, want) + "torchrun --nproc-per-node 8 pretrain_gpt.py \"${SHARDLINE_ARGS[@]}\"\n"
		back, diags := ImportMegatron("launch.sh", []byte(script))
		for _, d := range diags {
			require.NotEqual(t, SevError, d.Severity, "%s: %v\n%s", f, d, script)
		}
		got, err := Fingerprint(&back.Recipe)
		require.NoError(t, err)
		require.Equal(t, want, got, "%s\n%s", f, script)
	}
}

// TestImportMegatronScript reads a launch script in the shape of Megatron-LM's
// Llama examples, with the awkward parts real ones have: comments, continuations,
// quoted values, ${VAR:-default}, arrays spread with "${ARR[@]}", an environment
// prefix and torchrun in front.
func TestImportMegatronScript(t *testing.T) {
	script := `#!/bin/bash
# Llama-style pretraining, 4 layers
set -euo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NUM_LAYERS=4   # small
HIDDEN=${HIDDEN:-256}
TOKENIZER_ARGS=( --vocab-size 32000 )
MODEL_ARGS=(
    --use-mcore-models
    --num-layers ${NUM_LAYERS}
    --hidden-size "$HIDDEN"
    --ffn-hidden-size 704
    --num-attention-heads 8 --group-query-attention --num-query-groups 4
    --seq-length 512 --max-position-embeddings 4096
    --position-embedding-type rope --rotary-base 500000 --use-rope-scaling --rotary-scaling-factor 8.0
    --normalization "RMSNorm" --swiglu --disable-bias-linear --untie-embeddings-and-output-weights
    --attention-dropout 0.0 --hidden-dropout 0.0
)
TRAINING_ARGS=(
    --micro-batch-size 2 --global-batch-size 64
    --train-iters 1000 --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine --lr-warmup-iters 100
    --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0 --bf16
)
PARALLEL_ARGS=(--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1)

NCCL_DEBUG=WARN torchrun --nproc-per-node $GPUS_PER_NODE --nnodes 1 \
    pretrain_gpt.py \
    "${TOKENIZER_ARGS[@]}" "${MODEL_ARGS[@]}" \
    "${TRAINING_ARGS[@]}" ${PARALLEL_ARGS[@]} \
    --log-interval 10 --eval-interval 100 --eval-iters 10 --save-interval 500 --save "/ckpt/llama small"
`
	res, diags := ImportMegatron("pretrain_llama.sh", []byte(script))
	for _, d := range diags {
		require.NotEqual(t, SevError, d.Severity, "%v", d)
	}
	m, tr := res.Recipe.Model, res.Recipe.Train
	require.Equal(t, 4, m.Layers)
	require.Equal(t, 256, m.Hidden)
	require.Equal(t, 4, m.KVHeads)
	require.Equal(t, "llama3", m.RopeScaling)
	require.False(t, m.TieEmbeddings)
	require.Equal(t, 32000, m.VocabSize)
	require.InDelta(t, 0.1, tr.MinLRFactor, 1e-12)
	require.True(t, res.Recipe.Precision.BF16)
	require.Equal(t, "/ckpt/llama small", res.Recipe.Checkpoint.Dir)
	require.Equal(t, "flag --hidden-size=256", res.Origin("model.hidden").Describe())

	// A script that leaves Megatron's defaults in place asks for what shardline
	// does not train: each is named, with the argument that fixes it.
	_, diags = ImportMegatron("bare.sh", []byte("python pretrain_gpt.py --num-layers 2\n"))
	var msgs []string
	for _, d := range diags {
		if d.Code == "SL010" {
			msgs = append(msgs, d.Message+" / "+d.Help)
		}
	}
	require.Len(t, msgs, 6, "%v", msgs)
	require.Contains(t, strings.Join(msgs, "\n"), "without --swiglu Megatron's MLP is GeLU; shardline's is SwiGLU / add --swiglu")
}
