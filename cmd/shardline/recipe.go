package main

import (
	"fmt"

	"github.com/shardline/shardline/config"
	"github.com/spf13/cobra"
)

func (a *app) recipeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "recipe",
		Short: "Resolve recipes and print the recipe reference",
	}
	cmd.AddCommand(a.resolveCmd(), a.docsCmd(), a.exportRecipeCmd())
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
