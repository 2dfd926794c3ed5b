package config

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// llamaArgs are the arguments a Megatron script needs for shardline's model.
const llamaArgs = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 " +
	"--micro-batch-size 1 --global-batch-size 4 --train-iters 10 --lr 1e-3 --swiglu --normalization RMSNorm " +
	"--position-embedding-type rope --disable-bias-linear --attention-dropout 0.0 --hidden-dropout 0.0" +
	" --data-path /data/web_text_document --tokenizer-type GPT2BPETokenizer"

// TestImportMegatronUnknownValues: a value from $(...), backticks, a sourced
// file or the environment was read as empty, so the argument before it became a
// bare switch and the import said `got "true"`. Each is refused naming the
// argument, what the script wrote, why the import cannot know it, and its line.
func TestImportMegatronUnknownValues(t *testing.T) {
	for _, c := range []struct {
		name, script string
		loc          string
		want         []string
	}{
		{"command substitution", "TP=$(cat tp.txt)\ntorchrun --nproc_per_node 2 pretrain_gpt.py " + llamaArgs + " --tensor-model-parallel-size $TP\n",
			"job.sh:1:1", []string{"--tensor-model-parallel-size $(cat tp.txt): the import cannot know its value: $(cat tp.txt) runs a command"}},
		{"backticks", "TP=`cat tp.txt`\npython pretrain_gpt.py " + llamaArgs + " --tensor-model-parallel-size \"$TP\"\n",
			"job.sh:1:1", []string{"--tensor-model-parallel-size `cat tp.txt`", "`cat tp.txt` runs a command"}},
		{"inline substitution", "python pretrain_gpt.py " + llamaArgs + " --num-layers $(( 4 * 2 ))\n",
			"job.sh:1:1", []string{"--num-layers $(( 4 * 2 ))", "is shell arithmetic"}},
		{"environment", "python pretrain_gpt.py " + llamaArgs + " --tensor-model-parallel-size $TP\n",
			"job.sh:1:1", []string{"--tensor-model-parallel-size $TP", "TP is not set by the script, so its value would come from the environment"}},
		{"sourced", "source ./cluster.env\nexport TP\npython pretrain_gpt.py " + llamaArgs + " --tensor-model-parallel-size ${TP:-1}\n",
			"job.sh:3:1", []string{"--tensor-model-parallel-size ${TP:-1}", "`source ./cluster.env` (line 1) may set it"}},
		{"positional", "python pretrain_gpt.py " + llamaArgs + " --save $1\n",
			"job.sh:1:1", []string{"--save $1", "an argument the script is run with"}},
		{"a switch's value", "F=`echo true`\npython pretrain_gpt.py " + llamaArgs + " --use-megatron-fsdp $F\n",
			"job.sh:1:1", []string{"--use-megatron-fsdp `echo true`"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, diags := ImportMegatron("job.sh", []byte(c.script))
			require.Nil(t, res, "%v", diags)
			require.True(t, diags.HasErrors())
			text := fmt.Sprint(diags)
			require.NotContains(t, text, `got "true"`)
			require.Equal(t, "SL007", diags[0].Code, text)
			require.Equal(t, c.loc, diags[0].Location(), text)
			for _, w := range c.want {
				require.Contains(t, diags[0].Message, w)
			}
			require.Contains(t, diags[0].Help, "write the value into the script")
		})
	}
	// What the import can know still imports: a default, a variable the script
	// sets, an unset variable in an if-test, and $EXTRA where arguments start
	// (bash passes nothing for it; a note says so).
	// An argument with no effect here may take any value: --test-data-path $1
	// is a note quoting it.
	res, diags := ImportMegatron("job.sh", []byte("TP=${TP:-2}\nif [ -n \"$WANDB_API_KEY\" ]; then TP=4; fi\npython pretrain_gpt.py "+llamaArgs+" --tensor-model-parallel-size $TP --test-data-path $1 --load $(pwd)/ckpt $EXTRA_ARGS\n"))
	require.False(t, diags.HasErrors(), "%v", diags)
	require.Equal(t, 2, res.Recipe.Parallel.TensorParallel)
	text := fmt.Sprint(diags)
	require.Contains(t, text, "$EXTRA_ARGS (line 3) is read as no arguments")
	require.Contains(t, text, "--load $(pwd)/ckpt: not part of the recipe")
	require.NotContains(t, text, "\x00")
}

// TestImportMegatronUnknownRanks: torchrun --nproc $(nvidia-smi -L|wc -l)
// --nnodes 4 imported silently as world size 1. The ranks are read as torchrun
// reads them (argparse prefixes: --nproc, --nn), and a count the import cannot
// know is an error naming it.
func TestImportMegatronUnknownRanks(t *testing.T) {
	for _, launch := range []string{
		"torchrun --nproc $(nvidia-smi -L|wc -l) --nnodes 4",
		"GPUS=$(nvidia-smi -L | wc -l)\ntorchrun --nproc_per_node $GPUS --nnodes 4",
		"torchrun --nproc-per-node=gpu --nnodes 4",
		"torchrun --nproc-per-node 8 --nnodes 1:4",
		"torchrun --nproc-per-node $GPUS_PER_NODE --nnodes 4",
	} {
		res, diags := ImportMegatron("job.sh", []byte(launch+" pretrain_gpt.py "+llamaArgs+"\n"))
		require.Nil(t, res, launch)
		require.True(t, diags.HasErrors(), launch)
		require.Contains(t, diags[0].Message, "torchrun's ranks are unknown, so is the world size", launch)
		require.Equal(t, "parallel.world_size", diags[0].Key)
		require.Contains(t, diags[0].Help, "torchrun --nproc_per_node 8 --nnodes 4")
	}
	for launch, want := range map[string]int{
		"torchrun --nproc 8 --nnodes 4":                      32,
		"torchrun --nproc_per_node=8 --nn=2":                 16,
		"torchrun --nnodes 4":                                4, // one process per node: torchrun's default
		"torchrun --np 2":                                    2,
		"python -m torch.distributed.run --nproc-per-node 4": 4,
	} {
		res, diags := ImportMegatron("job.sh", []byte(launch+" pretrain_gpt.py "+llamaArgs+"\n"))
		require.False(t, diags.HasErrors(), "%s: %v", launch, diags)
		require.Equal(t, want, res.Recipe.Parallel.WorldSize, launch)
	}
}

// TestImportMegatronReadsItsOwnExport: the output of recipe export megatron did
// not import back, since its torchrun line is a comment (the file is meant to be
// sourced into a launch script). It now imports, unchanged, to the same
// fingerprint for every shipped recipe, world size included.
func TestImportMegatronReadsItsOwnExport(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "recipes", "*.toml"))
	require.NoError(t, err)
	for _, f := range files {
		res, diags := Load(f, Options{})
		require.False(t, diags.HasErrors(), "%s: %v", f, diags)
		want, err := Fingerprint(&res.Recipe)
		require.NoError(t, err)
		script := ExportMegatron(&res.Recipe).Script(f, want)
		require.Contains(t, script, "\n# torchrun ")
		back, diags := ImportMegatron("exported.sh", []byte(script))
		require.False(t, diags.HasErrors(), "%s: %v", f, diags)
		got, err := Fingerprint(&back.Recipe)
		require.NoError(t, err)
		require.Equal(t, want, got, "%s\n%s", f, script)
	}
	// Only the export's own comment counts: another script's commented
	// torchrun line is a comment.
	_, diags := ImportMegatron("other.sh", []byte("ARGS=( "+llamaArgs+" )\n# torchrun --nproc-per-node 8 pretrain_gpt.py \"${ARGS[@]}\"\n"))
	require.True(t, diags.HasErrors())
	require.True(t, strings.Contains(fmt.Sprint(diags), "words that are no --argument") || strings.Contains(fmt.Sprint(diags), "without --swiglu"), "%v", diags)
}

// TestImportMegatronParameterExpansions: ${NAME:+word} (the optional-argument
// idiom), ${NAME:=default} and expansions the import does not evaluate
// (${ARR[0]}, ${#NAME}, ${NAME%x}), which it read as empty.
func TestImportMegatronParameterExpansions(t *testing.T) {
	res, diags := ImportMegatron("job.sh", []byte("TP=2\npython pretrain_gpt.py "+llamaArgs+" ${WANDB_API_KEY:+--wandb-project x} ${TP:+--tensor-model-parallel-size $TP} --seed ${SEED:=7}\n"))
	require.False(t, diags.HasErrors(), "%v", diags)
	require.Equal(t, 2, res.Recipe.Parallel.TensorParallel)
	require.Equal(t, int64(7), int64(res.Recipe.Run.Seed))
	for _, ref := range []string{"${ARR[0]}", "${#TP}", "${TP%0}", "${TP:0:1}"} {
		_, diags := ImportMegatron("job.sh", []byte("TP=20\nARR=(1 2)\npython pretrain_gpt.py "+llamaArgs+" --tensor-model-parallel-size "+ref+"\n"))
		require.True(t, diags.HasErrors(), ref)
		require.Contains(t, diags[0].Message, ref+" is an expansion the import does not evaluate", ref)
	}
}

// TestImportMegatronRouter: DeepSeek-V3's router flags (sigmoid scores, an
// expert bias and its update rate, the top-k scaling factor, group-limited
// routing, QK-norm) and --moe-router-pre-softmax land on the [model.moe] keys.
func TestImportMegatronRouter(t *testing.T) {
	const base = "torchrun pretrain_gpt.py --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear --attention-dropout 0 --hidden-dropout 0 --data-path /d/a --tokenizer-type GPT2BPETokenizer "
	src := []byte(base + "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --num-experts 8 --moe-router-topk 4 " +
		"--moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 1e-3 --moe-router-topk-scaling-factor 2.5 " +
		"--moe-router-num-groups 4 --moe-router-group-topk 2 --qk-layernorm --moe-router-load-balancing-type none\n")
	res, diags := ImportMegatron("ds.sh", src)
	require.False(t, diags.HasErrors(), "%v", diags)
	m := res.Recipe.Model
	require.Equal(t, MoE{NumExperts: 8, TopK: 4, ExpertFFNHidden: m.MoE.ExpertFFNHidden, LayerFreq: 1, ScoreFunction: "sigmoid", NormTopK: true, TopKScale: 2.5,
		ExpertBias: true, BiasUpdateRate: 1e-3, NumGroups: 4, GroupTopK: 2}, m.MoE)
	require.True(t, m.QKNorm)
	res, diags = ImportMegatron("mixtral.sh", []byte(base+"--num-experts 8 --moe-router-pre-softmax\n"))
	require.False(t, diags.HasErrors(), "%v", diags)
	require.False(t, res.Recipe.Model.MoE.NormTopK)
}
