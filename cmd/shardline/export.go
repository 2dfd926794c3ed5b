package main

import (
	"fmt"

	"github.com/shardline/shardline/trainer"
	"github.com/spf13/cobra"
)

func (a *app) ckptExportCmd() *cobra.Command {
	var (
		format, out string
		shardMB     int64
		overwrite   bool
	)
	cmd := &cobra.Command{
		Use:   "export RUN_DIR --format safetensors -o OUT_DIR",
		Short: "Write a finished run's weights as a Hugging Face model directory",
		Long: `Export writes RUN_DIR's final weights as OUT_DIR/config.json and
OUT_DIR/model.safetensors (split into model-0000i-of-0000n.safetensors with an index
above --shard-size), named as Hugging Face's LlamaForCausalLM for dense models,
MixtralForCausalLM for MoE models whose every layer is MoE without shared experts
and with renormalised gates, and Qwen2MoeForCausalLM otherwise; with model.qk_norm
Qwen3ForCausalLM or Qwen3MoeForCausalLM; Llama4ForCausalLM for Llama 4's router
(the token scaled before its expert), NoPE layers or chunked attention (without
QK-norm or nonzero expert biases, which transformers' Llama 4 does not compute).
DeepSeek-V3's router (sigmoid scores, expert biases, groups, scale, shared
experts) over standard attention exports as Glm4MoeForCausalLM (GLM-4.5's
class, with partial_rotary_factor 1, no attention bias, use_qk_norm as
model.qk_norm; docs/checkpoints.md says why). transformers' from_pretrained
loads it, and shardline run --init-from reads it back.

Beside the weights go the run's tokenizer as Hugging Face files that encode text
to the run's ids, generation_config.json, and bos_token_id and eos_token_id in
config.json (null where the tokenizer has none); export's output names them:
  tokenizer.json, SentencePiece  the file unchanged, with its tokenizer_config.json
    tokenizer.model              (or one naming BOS, EOS and the class:
                                 PreTrainedTokenizerFast, LlamaTokenizer)
  tiktoken rank file             the file (tokenizer.model) and a tokenizer.json
                                 converted from its ranks (byte-level BPE, Llama
                                 3's pattern, its special tokens, BOS prepended),
                                 which transformers reads; PreTrainedTokenizerFast
  gpt2                           GPT-2's tokenizer.json, vocab.json and merges.txt
                                 (as on the Hub; EOS 50256); GPT2Tokenizer. There
                                 <|endoftext|> written in text is the special token,
                                 which shardline's gpt2 reads as text
  byte                           tokenizer.json: a byte-level BPE of the 256 bytes
  char                           tokenizer.json: the run's characters, a BPE
                                 without merges (others are dropped)
run --init-from HF_DIR takes these back: the built-in tokenizer whose export
HF_DIR holds, or HF_DIR's file.

OUT_DIR must be new, empty, or an earlier export's: export records the files it
writes in OUT_DIR/.shardline-outputs.json, replaces those, and removes the ones it
no longer writes (an older export's index and shards, which a loader would read
instead). A directory holding other files is refused, unless --overwrite, which
replaces the files export writes and removes any other safetensors weights file
or index there; whatever else the directory holds stays. A symbolic link where
an output goes is always refused.`,
		Example: `  shardline ckpt export runs/tiny --format safetensors -o hf/tiny`,
		Args:    cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if format != "safetensors" {
				return usageErr("--format %q: the export format is safetensors", format)
			}
			if out == "" {
				return usageErr("-o OUT_DIR is required")
			}
			if shardMB < 1 {
				return usageErr("--shard-size %d must be at least 1 (MB)", shardMB)
			}
			note, err := trainer.ExportHF(args[0], out, shardMB<<20, overwrite)
			if err != nil {
				return &exitError{code: exitFindings, err: err}
			}
			_, err = fmt.Fprintf(a.stdout, "%s: Hugging Face model directory written; tokenizer: %s\n", out, note)
			return err
		},
	}
	cmd.Flags().StringVar(&format, "format", "safetensors", "export format (safetensors)")
	cmd.Flags().StringVarP(&out, "output", "o", "", "output directory")
	cmd.Flags().BoolVar(&overwrite, "overwrite", false, "write into a non-empty OUT_DIR that no export made: replace the files export writes and remove other safetensors weights files and indexes there")
	cmd.Flags().Int64Var(&shardMB, "shard-size", 5000, "largest safetensors file, in MB, before the weights are split with an index")
	return cmd
}

// ckptImportCmd starts a run from a Hugging Face model directory: `run
// --init-from` under the name the checkpoint commands use.
func (a *app) ckptImportCmd() *cobra.Command {
	run := a.runCmd()
	run.Use = "import HF_DIR [RECIPE | RUN_DIR] [run flags]"
	run.Short = "Start a run (fine-tuning) from a Hugging Face model directory"
	run.Long = `Import starts a run whose weights come from HF_DIR (config.json and safetensors,
as shardline ckpt export writes them, with Llama, Mixtral, Qwen2-MoE, Qwen3,
Qwen3-MoE or Glm4Moe names; DeepSeek-V2's and V3's own, whose attention is
multi-head latent attention, are refused naming it)
instead of the initialisation: shardline run --init-from HF_DIR, with every flag of
run. config.json must describe the recipe's model: every key that differs (the
architecture, a size, the activation, the RoPE base or scaling, the norm epsilon,
tied embeddings, the MoE routing) is refused, naming the Hugging Face key and
value, the recipe key and value, and the fix; a key it leaves out takes
transformers' default, and a missing config.json is refused. A tensor the
recipe's model lacks, misses or shapes differently is refused, named. When
HF_DIR holds a tokenizer (tokenizer.json or tokenizer.model), the recipe must
tokenize with it: --set data.tokenizer=HF_DIR (the directory itself names it),
or, where it is ckpt export's tokenizer.json for byte, gpt2 or char, with that
built-in tokenizer (char: on data with the same characters).`
	run.Example = `  shardline ckpt import hf/tiny recipes/tiny.toml --train-iters 200 --lr 1e-4
  shardline ckpt import hf/llama recipes/llama-1b.toml --set data.tokenizer=hf/llama --set data.path=data/llama3`
	run.Args = cobra.RangeArgs(1, 2)
	inner := run.RunE
	run.RunE = func(cmd *cobra.Command, args []string) error {
		if err := cmd.Flags().Set("init-from", args[0]); err != nil {
			return err
		}
		return inner(cmd, args[1:])
	}
	return run
}
