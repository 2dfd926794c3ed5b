package main

import (
	"fmt"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/fileio"
	"github.com/spf13/cobra"
)

func (a *app) recipeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "recipe",
		Short: "Resolve recipes and print the recipe reference",
	}
	cmd.AddCommand(a.resolveCmd(), a.docsCmd(), a.exportRecipeCmd(), a.importRecipeCmd())
	return cmd
}

func (a *app) exportRecipeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "export megatron [flags] RECIPE",
		Short: "Print a recipe as Megatron-LM arguments (a bash array for a launch script)",
		Long: `Export resolves the recipe (overrides apply as everywhere) and prints it as the
arguments of Megatron-LM's pretrain_gpt.py, as a bash array to spread in a launch
script: every key with a Megatron argument, the arguments that describe the model
shardline trains (SwiGLU, RMSNorm, RoPE, no bias, no dropout), and the computed
ones (--min-lr, --max-position-embeddings, --group-query-attention,
--untie-embeddings-and-output-weights, --use-rope-scaling). Keys no Megatron
argument carries (the data, the run's name, shardline's device and topology
settings) are listed as comments above the array.

These arguments, with the listed keys as --set, load back onto shardline's
defaults to the same recipe fingerprint (a test checks every shipped recipe).`,
		Example: `  shardline recipe export megatron recipes/llama-1b.toml > llama-1b.args.sh
  shardline recipe export megatron recipes/tiny.toml --num-layers 8`,
		Args: cobra.ExactArgs(2),
	}
	rf := addRecipeFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if args[0] != "megatron" {
			return usageErr("recipe export %q: the one format is megatron (Megatron-LM arguments)", args[0])
		}
		res, err := a.loadClean(args[1], rf)
		if err != nil {
			return err
		}
		fp, err := config.Fingerprint(&res.Recipe)
		if err != nil {
			return err
		}
		_, err = fmt.Fprint(a.stdout, config.ExportMegatron(&res.Recipe).Script(args[1], fp))
		return err
	}
	return cmd
}

func (a *app) resolveCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "resolve [flags] RECIPE",
		Short: "Print the fully resolved recipe as canonical TOML, with its fingerprint",
		Long: `Resolve applies extends, SHARDLINE_* variables, --set and Megatron-style flags,
lints the result, and prints every key explicitly as canonical TOML. The header
names the fingerprint (sha256 of the canonical TOML). The same input always gives
the same bytes, and resolving the output again gives it back unchanged.

Errors go to standard error and nothing is printed (exit 1).`,
		Example: `  shardline recipe resolve recipes/moe-tiny.toml
  shardline recipe resolve recipes/tiny.toml --num-layers 8 > resolved.toml`,
		Args: cobra.ExactArgs(1),
	}
	rf := addRecipeFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		res, err := a.loadClean(args[0], rf)
		if err != nil {
			return err
		}
		out, _, err := config.ResolvedTOML(&res.Recipe)
		if err != nil {
			return err
		}
		_, err = a.stdout.Write(out)
		return err
	}
	return cmd
}

func (a *app) docsCmd() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "docs",
		Short: "Print the recipe reference: every key, its meaning, type, default and constraint",
		Long: `Docs prints the reference generated from the schema's doc comments. docs/recipes.md
is this command's Markdown output, kept current by a test.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "text" && format != "markdown" {
				return usageErr("--format %q is not one of text, markdown", format)
			}
			if err := config.WriteReference(a.stdout, format); err != nil {
				return fmt.Errorf("writing the reference: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&format, "format", "text", "text or markdown")
	return cmd
}

func (a *app) importRecipeCmd() *cobra.Command {
	var out string
	var worldSize int
	cmd := &cobra.Command{
		Use:   "import (megatron|torchtitan) [flags] FILE",
		Short: "Turn a Megatron-LM launch script or a torchtitan job file into a shardline recipe",
		Long: `Import translates another trainer's job into a shardline recipe, printed as
canonical TOML with each key that the job set commented with the argument or
setting it came from. What shardline does not do is refused by name (SL010, an
error: nothing is printed and the exit status is 1, since the recipe would not be
the model the job trains); what has no effect here is a note (SL011). The recipe
is then linted, so what lint would say about it is reported too.

megatron FILE reads a Megatron-LM launch script as bash would run it, as far as
that goes: comments, continuations, quotes, variables and positional defaults
(${1:-x}, ${VAR:-default}), arrays (=, +=) spread with "${ARR[@]}" or split
unquoted, if/elif/else on string tests of the script's own variables, and
torchrun (its --nproc_per_node × --nnodes give the world size), python or srun
in front of pretrain_gpt.py. A line that sets a variable inside a loop or a
condition it cannot evaluate (a file test, a command) is refused with both line
numbers. An argument whose value comes from a command ($(...), backticks), a
sourced file or the environment is refused naming it (docs/import.md), and so is
a torchrun rank count the import cannot know. A plain file of arguments works too. Megatron's own defaults apply where
an argument is absent: embeddings tied, no Megatron-FSDP, no distributed
optimizer, linear decay without warmup, weight decay 0.01, beta2 0.999, experts as
wide as the dense MLP, GPUs; a GeLU MLP, LayerNorm, learned positions, biases and
10% dropout are refused, each naming the argument that says otherwise. The
--fp8-* arguments set [precision.fp8] (run computes in FP8 under
--fp8-recipe tensorwise or delayed, --no-fp8-wgrad, and --fp8-param-gather under
tensorwise included). A script
written by recipe export megatron imports back to the same fingerprint.

torchtitan FILE reads a torchtitan job file (TOML, as torchtitan used until its
2026 move to Python configs; 2024's layout too): [model] name and flavor from
torchtitan's llama3 and llama4 tables (docs/import.md lists them with their
source), [training], [optimizer], [lr_scheduler], [parallelism],
[activation_checkpoint], [checkpoint], [validation], [metrics], with torchtitan's
default wherever the file is silent. data_parallel_shard_degree = -1 takes the
ranks --world-size leaves over. llama4's router (sigmoid scores, the token scaled
before its expert, expert biases) imports onto [model.moe]. A flavour no table
has (a job's own model code) is given as recipe keys with --set: model.layers,
hidden, heads, kv_heads, vocab_size, ffn_hidden and rope_theta (llama4 also
model.moe.num_experts, expert_ffn_hidden and layer_freq); --set also overrides
any key the file gives. The float8 converter and its settings become
[precision.fp8] (tensorwise FP8, which run computes in; run refuses the FP8
all-gather). MX
converters, HSDP and a warmup-stable-decay schedule with a stable phase are
refused; the _irope flavours import (docs/import.md).`,
		Example: `  shardline recipe import megatron examples/llama/train_llama3_8b.sh > llama3-8b.toml
  shardline recipe import megatron args.txt -o recipe.toml
  shardline recipe import torchtitan llama3_8b.toml --world-size 64 -o llama3-8b.toml
  shardline recipe import torchtitan job.toml --world-size 8 --set model.layers=48 --set model.hidden=2048 ...`,
		Args: cobra.ExactArgs(2),
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "write the recipe to this file instead of standard output")
	var sets []string
	cmd.Flags().StringArrayVar(&sets, "set", nil, "torchtitan: a recipe key over what the job file gives, section.key=value (repeatable): a flavour no table has is given this way")
	cmd.Flags().IntVar(&worldSize, "world-size", 0, "torchtitan: the number of ranks torchrun starts (0: the product of the job file's degrees, a shard degree of -1 counting as 1)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		format, file := args[0], args[1]
		if format != "megatron" && format != "torchtitan" {
			return usageErr("recipe import %q: the formats are megatron (a Megatron-LM launch script or argument file) and torchtitan (a torchtitan job TOML)", format)
		}
		if worldSize < 0 || worldSize > 1<<20 {
			return usageErr("--world-size %d: the number of ranks is 1 to %d (0 takes it from the job file)", worldSize, 1<<20)
		}
		if format == "megatron" && cmd.Flags().Changed("world-size") {
			return usageErr("--world-size is for torchtitan job files; a Megatron script gives --world-size among its arguments")
		}
		if format == "megatron" && len(sets) > 0 {
			return usageErr("--set is for torchtitan job files; a Megatron script gives its arguments itself (add them to the script)")
		}
		what := map[string]string{"megatron": "launch script", "torchtitan": "job file"}[format]
		if err := checkReadable(file, what); err != nil {
			return err
		}
		src, err := config.ReadRecipeFile(file)
		if err != nil {
			return usageErr("%s: %v", file, unwrap(err))
		}
		var res *config.Resolved
		var diags config.Diagnostics
		if format == "megatron" {
			res, diags = config.ImportMegatron(file, src)
		} else {
			res, diags = config.ImportTorchtitanWith(file, src, worldSize, sets)
		}
		if res != nil && !diags.HasErrors() {
			diags = append(diags, config.LintWith(res, a.env, a.lintOptions())...)
		}
		diags.Sort()
		if len(diags) > 0 {
			_ = config.RenderText(a.stderr, diags, map[string][]byte{file: src})
		}
		if diags.HasErrors() {
			return &exitError{code: exitFindings}
		}
		body, err := config.AnnotatedTOML(res)
		if err != nil {
			return err
		}
		return a.writeOutput(out, body)
	}
	return cmd
}

// writeOutput writes a command's result to standard output, or with -o FILE to
// that file (atomically), saying so on standard error.
func (a *app) writeOutput(out string, body []byte) error {
	if out == "" {
		_, err := a.stdout.Write(body)
		return err
	}
	if err := fileio.WriteAtomic(out, body); err != nil {
		return usageErr("-o %s: %v", out, unwrap(err))
	}
	fmt.Fprintf(a.stderr, "wrote %s\n", out)
	return nil
}
