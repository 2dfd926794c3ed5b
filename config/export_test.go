package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
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

// TestExportMegatronLeavesDerivedOut: a value shardline derives from 0
// (model.kv_heads 0: as many key/value heads as heads) is spelled by leaving
// its argument out, not as --num-query-groups 0.
func TestExportMegatronLeavesDerivedOut(t *testing.T) {
	res, diags := Load(filepath.Join("..", "recipes", "tiny.toml"), Options{Sets: []string{"model.kv_heads=0"}})
	require.False(t, diags.HasErrors(), "%v", diags)
	e := ExportMegatron(&res.Recipe)
	assert.NotContains(t, e.Args, "--num-query-groups")
	assert.NotContains(t, e.Args, "--group-query-attention")
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
		// The script as a user runs it: the export's torchrun line, uncommented.
		script := ExportMegatron(&res.Recipe).Script(f, want)
		script = strings.Replace(script, "\n# torchrun ", "\ntorchrun ", 1)
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
TOKENIZER_ARGS=( --tokenizer-type GPT2BPETokenizer --vocab-size 50304 )
DATA_ARGS=( --data-path 0.3 /data/web_text_document 0.7 /data/books_text_document --split 949,50,0 )
MODEL_ARGS=(
    --use-mcore-models
    --num-layers ${NUM_LAYERS}
    --hidden-size "$HIDDEN"
    --ffn-hidden-size 704
    --num-attention-heads 8 --group-query-attention --num-query-groups 4
    --seq-length 512 --max-position-embeddings 4096
    --position-embedding-type rope --rotary-base 500000 --use-rope-scaling --rope-scaling-factor 8.0
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
    "${TOKENIZER_ARGS[@]}" "${DATA_ARGS[@]}" "${MODEL_ARGS[@]}" \
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
	require.Equal(t, 50304, m.VocabSize)
	d := res.Recipe.Data
	require.Equal(t, "gpt2", d.Tokenizer)
	require.Equal(t, "", d.Path)
	require.Equal(t, []string{"0.3 /data/web_text_document", "0.7 /data/books_text_document"}, d.Sources)
	require.InDelta(t, 50.0/999, d.ValFraction, 1e-12)
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
	require.Len(t, msgs, 7, "%v", msgs)
	require.Contains(t, strings.Join(msgs, "\n"), "the script names no --data-path")
	require.Contains(t, strings.Join(msgs, "\n"), "without --swiglu Megatron's MLP is GeLU; shardline's is SwiGLU / add --swiglu")
}

// importScript imports a script of testdata/megatron. Megatron's examples
// train on mock data with tokenizers shardline does not have, which the import
// refuses (the recipe could not train on what they train on): those errors,
// each containing one of dataErrs, are the only ones allowed, and the script
// is imported again with the data replaced to check the rest.
func importScript(t *testing.T, file string, dataErrs ...string) (*Resolved, Diagnostics) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", "megatron", file))
	require.NoError(t, err)
	res, diags := ImportMegatron(file, src)
	var found []string
	for _, d := range diags {
		if d.Severity != SevError {
			continue
		}
		ok := false
		for _, w := range dataErrs {
			if strings.Contains(d.Message, w) {
				ok = true
				found = append(found, w)
			}
		}
		require.True(t, ok, "%s: %s", d.Location(), d.Message)
	}
	require.ElementsMatch(t, dataErrs, found)
	if len(dataErrs) > 0 {
		s := strings.NewReplacer("--mock-data", "--data-path /data/web_text_document", "--tokenizer-type NullTokenizer", "--tokenizer-type GPT2BPETokenizer",
			"99990,8,2", "99990,8,0").Replace(string(src))
		res, diags = ImportMegatron(file, []byte(s))
		for _, d := range diags {
			require.NotEqual(t, SevError, d.Severity, "%s: %s", d.Location(), d.Message)
		}
	}
	for _, d := range Lint(res, nil) {
		require.NotEqual(t, SevError, d.Severity, "lint %s: %s", d.Location(), d.Message)
	}
	return res, diags
}

// TestImportMegatronLlamaExample: a script in the shape of Megatron-LM's
// examples/llama train_llama3_8b_*.sh. The import follows its if/elif/else on the
// script's own variables (the bf16 branch, the mock-data branch), arrays grown with
// +=, quoted multi-word elements that an unquoted spread splits, sample-counted
// schedules, torchrun's ranks, and it is not fooled by the check that echoes the
// script's path before the real command.
func TestImportMegatronLlamaExample(t *testing.T) {
	// The mock-data branch: its data and tokenizer cannot be carried.
	res, diags := importScript(t, "llama3_8b.sh", "--mock-data: Megatron's mock data are random tokens", "--tokenizer-type NullTokenizer cannot be carried")
	r := res.Recipe
	m := r.Model
	require.Equal(t, []int{32, 4096, 32, 8, 128, 14336, 128256, 8192}, []int{m.Layers, m.Hidden, m.Heads, m.KVHeads, m.HeadDim, m.FFNHidden, m.VocabSize, m.SeqLen})
	require.Equal(t, "llama3", m.RopeScaling)
	require.False(t, m.TieEmbeddings)
	tr := r.Train
	// 1,280,000 samples / 128 = 10,000 steps; warmup 25,600 / 128 = 200; decay
	// 1,254,400 / 128 = 9,800 steps from step 0, so 9,600 after warmup.
	require.Equal(t, []int{10000, 200, 9600, 128, 1}, []int{tr.Steps, tr.WarmupSteps, tr.LRDecaySteps, tr.GlobalBatchSize, tr.MicroBatchSize})
	require.InDelta(t, 0.1, tr.MinLRFactor, 1e-12)
	require.True(t, r.Precision.BF16, "the elif [[ $DTYPE == bf16 ]] branch")
	require.Equal(t, []int{16, 8, 2}, []int{r.Parallel.WorldSize, r.Parallel.GPUsPerNode, r.Parallel.TensorParallel})
	require.Equal(t, "imported from torchrun --nproc_per_node 8 --nnodes 2 at llama3_8b.sh:146:1", res.Origin("parallel.world_size").Describe())
	require.True(t, r.FSDP.UseMegatronFSDP)
	require.True(t, r.FSDP.GradReduceInBF16, "from DDP_ARGS appended with +=")
	require.Equal(t, "checkpoints/llama3_8b", r.Checkpoint.Dir, "${1:-\"checkpoints/llama3_8b\"} without its quotes")
	var notes []string
	for _, d := range diags {
		notes = append(notes, d.Message)
	}
	all := strings.Join(notes, "\n")
	require.NotContains(t, all, "HuggingFaceTokenizer", "the else branch is not read")
	require.NotContains(t, all, "fp8", "the fp8 branch is not read")
	require.Contains(t, all, "--load checkpoints/llama3_8b: not part of the recipe")
	// --tensorboard-dir "$TENSORBOARD_LOGS_PATH" carries onto
	// logging.tensorboard; the directory is a note (the run directory holds
	// the events).
	require.True(t, r.Logging.Tensorboard)
	require.Contains(t, all, "--tensorboard-dir tensorboard_logs/llama3_8b: logging.tensorboard = true; shardline writes the event files into the run directory")
}

// TestImportMegatronMixtralExample: a script in the shape of Megatron-LM's
// examples/mixtral/train_mixtral_8x7b_distributed.sh. Megatron's defaults stand
// where it is silent: no Megatron-FSDP (the distributed optimizer shards optimizer
// state: "optim"), experts as wide as the dense MLP, linear decay, no warmup,
// beta2 0.999, per-micro-batch loss, torch_dist checkpoints; comments inside the
// arrays (some ending in a backslash) and the unevaluated wandb branch are skipped.
func TestImportMegatronMixtralExample(t *testing.T) {
	res, _ := importScript(t, "mixtral.sh", "--mock-data: Megatron's mock data are random tokens", "holds out a test part")
	r := res.Recipe
	require.Equal(t, []int{4, 2, 448, 448}, []int{r.Model.MoE.NumExperts, r.Model.MoE.TopK, r.Model.MoE.ExpertFFNHidden, r.Model.FFNHidden})
	require.InDelta(t, 0.01, r.Model.MoE.AuxLossCoeff, 1e-12)
	require.Equal(t, []int{4, 2}, []int{r.Parallel.WorldSize, r.Parallel.ExpertParallel})
	require.False(t, r.FSDP.UseMegatronFSDP)
	require.Equal(t, "optim", r.FSDP.DataParallelShardingStrategy)
	require.False(t, r.FSDP.CalculatePerTokenLoss)
	require.Equal(t, "torch_dist", r.Checkpoint.CkptFormat)
	require.Equal(t, "linear", r.Train.LRSchedule)
	require.Equal(t, 0, r.Train.WarmupSteps)
	require.Equal(t, 0.999, r.Train.Beta2)
	require.Equal(t, []int{10, 1000, 100}, []int{r.Train.EvalSteps, r.Train.EvalInterval, r.Logging.Interval})
	require.Equal(t, "Megatron's default: no --moe-ffn-hidden-size (the dense --ffn-hidden-size)", res.Origin("model.moe.expert_ffn_hidden").Name)
	require.False(t, r.Logging.Tensorboard, "no --tensorboard-dir: Megatron writes no events")
	require.Equal(t, "Megatron's default: no --tensorboard-dir", res.Origin("logging.tensorboard").Name)
	require.Equal(t, "/workspace/tokenizer.model", r.Data.Tokenizer, "--tokenizer-type Llama2Tokenizer reads --tokenizer-model's SentencePiece file")
	require.Contains(t, res.Origin("data.tokenizer").Describe(), "--tokenizer-model")
}

// TestImportMegatronTokenizers: --tokenizer-model's file becomes data.tokenizer;
// a hub name is a note, Megatron's TikTokenizer is refused.
func TestImportMegatronTokenizers(t *testing.T) {
	for _, c := range []struct {
		flags, tok, code string
	}{
		{"--tokenizer-type HuggingFaceTokenizer --tokenizer-model /m/llama3/tokenizer.json", "/m/llama3/tokenizer.json", "SL402"}, // not here: no vocabulary
		{"--tokenizer-model ./hf/llama3 --tokenizer-type HuggingFaceTokenizer", "./hf/llama3", ""},
		{"--tokenizer-type GPT2BPETokenizer --vocab-file v.json --merge-file m.txt", "gpt2", ""},
		{"--tokenizer-type HuggingFaceTokenizer --tokenizer-model gpt2", "byte", "SL011"},
		{"--tokenizer-type TikTokenizer --tokenizer-model /m/tok.tiktoken", "/m/tok.tiktoken", "SL010"},
	} {
		src := "torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 " + c.flags + "\n"
		res, diags := ImportMegatron("x.sh", []byte(src))
		require.NotNil(t, res, c.flags)
		assert.Equal(t, c.tok, res.Recipe.Data.Tokenizer, c.flags)
		codes := []string{}
		for _, d := range diags {
			codes = append(codes, d.Code)
		}
		if c.code != "" {
			assert.Contains(t, codes, c.code, c.flags)
		}
	}
}

// TestImportMegatronControlFlow: conditions the import evaluates, and lines it
// refuses because they depend on one it cannot.
func TestImportMegatronControlFlow(t *testing.T) {
	base := "--swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear --attention-dropout 0 --hidden-dropout 0" +
		" --data-path /data/web_text_document --tokenizer-type GPT2BPETokenizer"
	run := func(script string) (*Resolved, Diagnostics) {
		return ImportMegatron("s.sh", []byte(script+"\npython pretrain_gpt.py "+base+" $EXTRA\n"))
	}
	for _, c := range []struct {
		script string
		layers int
	}{
		{"A=x\nif [ \"$A\" = x ]; then EXTRA=\"--num-layers 3\"; fi", 3},
		{"A=x\nif [ \"$A\" = y ]; then EXTRA=\"--num-layers 3\"; else EXTRA=\"--num-layers 9\"; fi", 9},
		{"A=x\nif [ \"$A\" = x ]\nthen\n  EXTRA=\"--num-layers 3\"\nfi", 3}, // then on its own line
		{"if [[ -n \"$UNSET\" ]]; then\n EXTRA=\"--num-layers 5\"\nelse\n EXTRA=\"--num-layers 6\"\nfi", 6},
		{"A=1\nif [[ $A != 1 ]] || [[ ! -z $A ]]; then\n EXTRA='--num-layers 7'\nfi", 7},
		{"EXTRA=--num-layers\nEXTRA+=' 8'", 8},
	} {
		res, diags := run(c.script)
		require.False(t, diags.HasErrors(), "%q: %v", c.script, diags)
		require.Equal(t, c.layers, res.Recipe.Model.Layers, c.script)
	}
	_, diags := run("for n in 1 2; do\n  EXTRA=\"--num-layers $n\"\ndone")
	require.Len(t, diags, 1)
	require.Equal(t, "s.sh:2:1", diags[0].Location())
	require.Contains(t, diags[0].Message, "line 2 depends on `for n in 1 2; do` (line 1), which the import cannot evaluate")
	_, diags = run("if [ -f /etc/passwd ]; then\n  EXTRA=\"--num-layers 2\"\nfi")
	require.Contains(t, diags[0].Message, "depends on `[ -f /etc/passwd ]` (line 1)")
	_, diags = run("if [ -f /etc/passwd ]; then\n  echo found\nfi") // nothing that matters inside
	require.False(t, diags.HasErrors(), "%v", diags)
}

// --tensorboard-dir turns logging.tensorboard on whatever directory it names,
// one the import cannot know included ($TB_DIR from the environment), with a
// note that the run directory holds the events; over a recipe (lint's
// Megatron flags) it does the same.
func TestMegatronTensorboardDir(t *testing.T) {
	base := "--swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear --attention-dropout 0 --hidden-dropout 0 --data-path /d/a --tokenizer-type GPT2BPETokenizer"
	res, diags := ImportMegatron("s.sh", []byte("python pretrain_gpt.py "+base+" --tensorboard-dir $TB_DIR\n"))
	require.False(t, diags.HasErrors(), "%v", diags)
	require.True(t, res.Recipe.Logging.Tensorboard)

	res, diags = LoadBytes("r.toml", []byte("[logging]\ntensorboard = false\n"), Options{Flags: []FlagValue{{Name: "tensorboard-dir", Value: "/logs/tb"}}})
	require.False(t, diags.HasErrors(), "%v", diags)
	require.True(t, res.Recipe.Logging.Tensorboard)
	require.Equal(t, "flag --tensorboard-dir=/logs/tb", res.Origin("logging.tensorboard").Describe())
	var notes []string
	for _, d := range diags {
		notes = append(notes, d.Message)
	}
	require.Contains(t, strings.Join(notes, "\n"), "--tensorboard-dir /logs/tb: logging.tensorboard = true; shardline writes the event files into the run directory (run.output_dir/run.name, beside metrics.jsonl), not into /logs/tb")
}

// TestMegatronRopeScaling: Megatron-Core's --use-rope-scaling is Llama 3.1's
// scaling with --rope-scaling-factor and low and high frequency factors 1 and 4
// over 8192 positions fixed (RotaryEmbedding._apply_scaling), the recipe's
// defaults; --rotary-scaling-factor is YaRN's factor, not this one, and is
// refused unless it is its default 1. A recipe with other numbers (Llama 4's)
// exports them as keys no argument carries, and loads back to itself.
func TestMegatronRopeScaling(t *testing.T) {
	res, diags := LoadBytes("x.toml", nil, Options{Flags: []FlagValue{{Name: "use-rope-scaling", Value: "true"}, {Name: "rope-scaling-factor", Value: "32"}}})
	requireNoErrors(t, diags)
	m := res.Recipe.Model
	require.Equal(t, []any{"llama3", 32.0, 1.0, 4.0, 8192}, []any{m.RopeScaling, m.RopeScalingFactor, m.RopeScalingLowFreqFactor, m.RopeScalingHighFreqFactor, m.RopeScalingOriginalMaxPositionEmbeddings})
	require.Equal(t, "flag --rope-scaling-factor=32", res.Origin("model.rope_scaling_factor").Describe())

	_, diags = LoadBytes("x.toml", nil, Options{Flags: []FlagValue{{Name: "use-rope-scaling", Value: "true"}, {Name: "rotary-scaling-factor", Value: "8"}}})
	require.True(t, diags.HasErrors())
	require.ErrorContains(t, diags.Err(), "Llama 3.1's scaling factor is --rope-scaling-factor")
	_, diags = LoadBytes("x.toml", nil, Options{Flags: []FlagValue{{Name: "rotary-scaling-factor", Value: "1.0"}}})
	requireNoErrors(t, diags)

	r := Default()
	r.Model.RopeScaling, r.Model.RopeScalingFactor, r.Model.RopeScalingHighFreqFactor = "llama3", 16, 1
	e := ExportMegatron(&r)
	require.Contains(t, e.Args, "--use-rope-scaling")
	require.Contains(t, strings.Join(e.Args, " "), "--rope-scaling-factor 16")
	require.Subset(t, e.Unexpressed, []string{"model.rope_scaling_high_freq_factor = 1.0"})
	require.NotContains(t, strings.Join(e.Unexpressed, " "), "low_freq_factor", "a default is not listed")
}
