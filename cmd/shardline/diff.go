package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"text/tabwriter"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/trainer"
	"github.com/spf13/cobra"
)

// runSummary is what diff reads of a run directory.
type runSummary struct {
	dir    string
	recipe *config.Resolved
	from   map[string]string // key -> where an override came from (run.json)
	info   struct {
		RecipeFingerprint string `json:"recipe_fingerprint"`
		DataFingerprint   string `json:"data_fingerprint"`
		Revision          string `json:"vcs_revision"`
		Failure           string `json:"failure"`
		Overrides         []struct {
			Key, From string
		} `json:"overrides"`
		Result *struct {
			Steps        int      `json:"steps"`
			FinalLoss    float64  `json:"final_loss"`
			FinalValLoss *float64 `json:"final_val_loss"`
			TokensPerS   float64  `json:"tokens_per_s_median"`
		} `json:"result"`
	}
}

func readRun(dir string) (*runSummary, error) {
	s := &runSummary{dir: dir, from: map[string]string{}}
	res, diags := config.Load(filepath.Join(dir, "resolved.toml"), config.Options{})
	if res == nil || diags.HasErrors() {
		return nil, trainer.NotRunDir(dir, diags.Err())
	}
	s.recipe = res
	b, err := fileio.ReadRegular(filepath.Join(dir, "run.json"), 1<<20)
	if err != nil {
		return nil, trainer.NotRunDir(dir, err)
	}
	if err := json.Unmarshal(b, &s.info); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "run.json"), err)
	}
	for _, o := range s.info.Overrides {
		s.from[o.Key] = o.From
	}
	return s, nil
}

// origin says where a run's value of key came from: an override it recorded, or
// its recipe.
func (s *runSummary) origin(key string) string {
	if f, ok := s.from[key]; ok {
		return f
	}
	return "recipe"
}

func (a *app) diffCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "diff RUN_A RUN_B",
		Short: "Show the recipe keys two runs differ in, and their results side by side",
		Long: `Diff compares two run directories: every recipe key whose resolved value differs,
with where each run's value came from (its recipe, or the flag or variable run.json
recorded), then the fingerprints and the results side by side.`,
		Example: `  shardline diff runs/tiny runs/tiny-2`,
		Args:    cobra.ExactArgs(2),
		RunE: func(_ *cobra.Command, args []string) error {
			ra, err := readRun(args[0])
			if err != nil {
				return usageErr("%v", err)
			}
			rb, err := readRun(args[1])
			if err != nil {
				return usageErr("%v", err)
			}
			w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "KEY\t%s\t\t%s\t\n", ra.dir, rb.dir)
			n := 0
			for _, f := range config.RecipeSchema().Fields {
				va, vb := config.FormatValue(f.Get(&ra.recipe.Recipe)), config.FormatValue(f.Get(&rb.recipe.Recipe))
				if va != vb {
					n++
					fmt.Fprintf(w, "%s\t%s\t(%s)\t%s\t(%s)\n", f.Key, va, ra.origin(f.Key), vb, rb.origin(f.Key))
				}
			}
			if n == 0 {
				fmt.Fprintln(w, "(the resolved recipes are the same)\t\t\t\t")
			}
			fmt.Fprintln(w, "\t\t\t\t")
			row := func(name, x, y string) { fmt.Fprintf(w, "%s\t%s\t\t%s\t\n", name, x, y) }
			row("recipe fingerprint", ra.info.RecipeFingerprint, rb.info.RecipeFingerprint)
			row("data fingerprint", ra.info.DataFingerprint, rb.info.DataFingerprint)
			row("shardline revision", orDash(ra.info.Revision), orDash(rb.info.Revision))
			res := func(s *runSummary, f func() string) string {
				if s.info.Result == nil {
					if s.info.Failure != "" {
						return "failed"
					}
					return "-"
				}
				return f()
			}
			row("steps", res(ra, func() string { return fmt.Sprint(ra.info.Result.Steps) }), res(rb, func() string { return fmt.Sprint(rb.info.Result.Steps) }))
			row("final loss", res(ra, func() string { return fmt.Sprintf("%.4f", ra.info.Result.FinalLoss) }), res(rb, func() string { return fmt.Sprintf("%.4f", rb.info.Result.FinalLoss) }))
			val := func(s *runSummary) string {
				return res(s, func() string {
					if v := s.info.Result.FinalValLoss; v != nil {
						return fmt.Sprintf("%.4f", *v)
					}
					return "-"
				})
			}
			row("final validation loss", val(ra), val(rb))
			row("tokens/s (median)", res(ra, func() string { return fmt.Sprintf("%.0f", ra.info.Result.TokensPerS) }), res(rb, func() string { return fmt.Sprintf("%.0f", rb.info.Result.TokensPerS) }))
			return w.Flush()
		},
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
