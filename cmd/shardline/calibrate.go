package main

import (
	"encoding/json"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/shardline/shardline/trainer"
)

func (a *app) calibrateCmd() *cobra.Command {
	var out, refit string
	var minTime time.Duration
	cmd := &cobra.Command{
		Use:   "calibrate [-o FILE]",
		Short: "Measure this machine's kernels for the plan's time model",
		Long: `Calibrate times the CPU engine's own kernels on this machine: matmuls forward and
backward over a grid of shapes (fp32, and bf16 weights and inputs; FP8
operands at some of them), flash
attention (causal, and unmasked as ring blocks) by sequence length and head size, the
memory-bound kernels (norms, RoPE, SwiGLU, embedding, cross-entropy, the
optimizer, the bf16 conversions of saved activations, FP8's amax and
quantisation, ...) and the in-process
collectives; then whole training passes of seven small models in fp32 and in
bf16, as a bf16 run keeps them, each followed by the step's gradient norm and
AdamW over its parameter groups (how kernels behave inside a step: the dense
matmuls, the MoE experts' products, attention and the rest apart), in three
interleaved rounds, the fit leaving out a pass that other work slowed (it is
marked "disturbed" in the table), and three of
them trained for a few steps by 1, 2 and 4 in-process ranks (how ranks sharing
the cores divide them) and by context-parallel rings of 2 and 4 (how long ring
steps wait for the slowest rank). It writes them as JSON with the machine, date and
version. The plan's per-operation time model reads them (docs/plan.md):
shardline ships the table measured on the machine that built it; set
calibration = "FILE" in shardline.toml (or SHARDLINE_CALIBRATION) to plan with
your machine's. It takes about four minutes; run it on a quiet machine (it
times a few matmuls again after the in-step passes and warns when the
machine's speed changed meanwhile).

With --refit FILE it measures nothing: it reads a calibration and redoes its
in-step and host-share fits (the factors relating the tables to whole training
passes and to ranks sharing the cores) with the current step model, keeping
every measured time; this brings a table measured by an older shardline up to a
newer time model. (A table measured before 2026-11-27 did not time the MoE
experts' products inside its passes: refitted, it fits the matmuls to its
passes' dense products and plans no experts' stall.)`,
		Example: `  shardline calibrate -o cpu-calibration.json
  shardline calibrate --refit cpu-calibration.json -o cpu-calibration.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if refit != "" {
				b, err := os.ReadFile(refit)
				if err != nil {
					return usageErr("--refit %s: %v; give a calibration file (shardline calibrate -o FILE writes one)", refit, err)
				}
				c, err := parallel.ParseCalibration(b)
				if err != nil {
					return usageErr("--refit %s: %v; give a file shardline calibrate wrote", refit, err)
				}
				if err := trainer.Refit(c); err != nil {
					return usageErr("--refit %s: %v", refit, err)
				}
				c.Source = strings.TrimSuffix(c.Source, refitNote) + refitNote
				b, err = json.MarshalIndent(c, "", " ")
				if err != nil {
					return err
				}
				return a.writeOutput(out, append(b, '\n'))
			}
			if minTime <= 0 || minTime > time.Minute {
				return usageErr("--min-time %s: give a duration in (0, 1m]", minTime)
			}
			c, err := trainer.Calibrate(cpu.Backend{}, trainer.DefaultCalibrationGrid, minTime, a.stderr)
			if err != nil {
				return err
			}
			c.Source = "shardline calibrate " + version
			b, err := json.MarshalIndent(c, "", " ")
			if err != nil {
				return err
			}
			return a.writeOutput(out, append(b, '\n'))
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "write the calibration to this file instead of standard output")
	cmd.Flags().StringVar(&refit, "refit", "", "redo the in-step fit of this calibration file with the current step model (measures nothing)")
	cmd.Flags().DurationVar(&minTime, "min-time", 20*time.Millisecond, "time each shape for at least this long (its median call is kept)")
	return cmd
}

// refitNote marks a calibration whose in-step fit --refit redid.
const refitNote = "; in-step fit redone by shardline calibrate --refit"
