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
	cmd.AddCommand(a.resolveCmd(), a.docsCmd())
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
