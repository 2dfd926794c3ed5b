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
	)
	cmd := &cobra.Command{
		Use:   "export RUN_DIR --format safetensors -o OUT_DIR",
		Short: "Write a finished run's weights as a Hugging Face model directory",
		Long: `Export writes RUN_DIR's final weights as OUT_DIR/config.json and
OUT_DIR/model.safetensors (split into model-0000i-of-0000n.safetensors with an index
above --shard-size), named as Hugging Face's LlamaForCausalLM for dense models,
MixtralForCausalLM for MoE models whose every layer is MoE without shared experts,
and Qwen2MoeForCausalLM otherwise. transformers' from_pretrained loads it, and
shardline run --init-from reads it back.`,
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
			if err := trainer.ExportHF(args[0], out, shardMB<<20); err != nil {
				return &exitError{code: exitFindings, err: err}
			}
			_, err := fmt.Fprintf(a.stdout, "%s: Hugging Face model directory written\n", out)
			return err
		},
	}
	cmd.Flags().StringVar(&format, "format", "safetensors", "export format (safetensors)")
	cmd.Flags().StringVarP(&out, "output", "o", "", "output directory")
	cmd.Flags().Int64Var(&shardMB, "shard-size", 5000, "largest safetensors file, in MB, before the weights are split with an index")
	return cmd
}
