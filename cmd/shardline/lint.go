package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/shardline/shardline/config"
	"github.com/spf13/cobra"
)

func (a *app) lintCmd() *cobra.Command {
	var (
		format  string
		strict  bool
		explain string
	)
	cmd := &cobra.Command{
		Use:   "lint [flags] PATH...",
		Short: "Check recipes against shardline's rules",
		Long: `Lint loads each recipe (files, or directories searched for *.toml), applies the
overrides, and reports every problem at once, sorted by position, with the rule's
code, the fix, and the source line.

Exit status: 0 no errors, 1 errors found (or warnings, with --strict), 2 lint could
not run (bad flags, an unreadable path).`,
		Example: `  shardline lint recipes/
  shardline lint --format sarif recipes/ > lint.sarif
  shardline lint --explain fsdp.fsdp_double_buffer recipes/tiny.toml --use-nccl-ub
  SHARDLINE_MODEL_LAYERS=8 shardline lint recipes/tiny.toml --num-layers 12`,
		Args: cobra.MinimumNArgs(1),
	}
	rf := addRecipeFlags(cmd)
	cmd.Flags().StringVar(&format, "format", "text", "output format: text, json (one object per line) or sarif (SARIF 2.1.0)")
	cmd.Flags().BoolVar(&strict, "strict", false, "exit 1 on warnings too")
	cmd.Flags().StringVar(&explain, "explain", "", "print KEY's resolved value and where it came from (one recipe)")
	_ = cmd.RegisterFlagCompletionFunc("format", cobra.FixedCompletions([]string{"text", "json", "sarif"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("explain", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		var keys []string
		for _, f := range config.RecipeSchema().Fields {
			keys = append(keys, f.Key)
		}
		return keys, cobra.ShellCompDirectiveNoFileComp
	})
	cmd.ValidArgsFunction = func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return []string{"toml"}, cobra.ShellCompDirectiveFilterFileExt
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		switch format {
		case "text", "json", "sarif":
		default:
			return usageErr("--format %q is not one of text, json, sarif", format)
		}
		if explain != "" {
			if len(args) != 1 {
				return usageErr("--explain takes exactly one recipe file, got %d paths", len(args))
			}
			return a.explain(explain, args[0], rf)
		}
		files, err := recipeFiles(args)
		if err != nil {
			return err
		}
		var all config.Diagnostics
		sources := map[string][]byte{}
		for _, f := range files {
			res, diags, err := a.loadRecipe(f, rf)
			if err != nil {
				return err
			}
			for k, v := range sourcesOf(res) {
				sources[k] = v
			}
			all = append(all, diags...)
		}
		all = dedupe(all)
		all.Sort()
		if err := a.render(format, all, sources); err != nil {
			return err
		}
		if all.HasErrors() || (strict && all.Count(config.SevWarning) > 0) {
			return &exitError{code: exitFindings}
		}
		return nil
	}
	return cmd
}

func (a *app) render(format string, ds config.Diagnostics, sources map[string][]byte) error {
	switch format {
	case "json":
		return config.RenderJSON(a.stdout, ds)
	case "sarif":
		return config.RenderSARIF(a.stdout, ds, version)
	}
	if len(ds) == 0 {
		_, err := fmt.Fprintln(a.stdout, "no problems found")
		return err
	}
	return config.RenderText(a.stdout, ds, sources)
}

// dedupe drops findings reported twice, as happens when two linted recipes extend
// the same base file or share a bad override.
func dedupe(ds config.Diagnostics) config.Diagnostics {
	seen := map[string]bool{}
	out := ds[:0]
	for _, d := range ds {
		k := d.Location() + "\x00" + d.Code + "\x00" + d.Message
		if !seen[k] {
			seen[k] = true
			out = append(out, d)
		}
	}
	return out
}

// recipeFiles expands directories into the *.toml files under them, sorted.
func recipeFiles(args []string) ([]string, error) {
	var files []string
	for _, arg := range args {
		if config.IsShipped(arg) { // loadRecipe checks the name
			files = append(files, arg)
			continue
		}
		st, err := statPath(arg)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, arg)
			continue
		}
		var found []string
		err = filepath.WalkDir(arg, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && p != arg && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			if !d.IsDir() && strings.HasSuffix(p, ".toml") {
				found = append(found, p)
			}
			return nil
		})
		if err != nil {
			return nil, usageErr("cannot read directory %s: %v", arg, unwrap(err))
		}
		if len(found) == 0 {
			return nil, usageErr("directory %s holds no .toml recipes", arg)
		}
		sort.Strings(found)
		files = append(files, found...)
	}
	return files, nil
}

func statPath(p string) (fs.FileInfo, error) {
	st, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, usageErr("%s does not exist (check the path)", p)
		}
		return nil, usageErr("cannot read %s: %v", p, unwrap(err))
	}
	return st, nil
}

// explain prints a key's resolved value and every layer that set it.
func (a *app) explain(key, path string, rf *recipeFlags) error {
	s := config.RecipeSchema()
	f, ok := s.Lookup(key)
	if !ok {
		return usageErr("--explain %q: %s", key, keyHint(key))
	}
	res, diags, err := a.loadRecipe(path, rf)
	if err != nil {
		return err
	}
	if res == nil {
		_ = config.RenderText(a.stderr, diags, nil)
		return &exitError{code: exitFindings, err: fmt.Errorf("%s could not be loaded", path)}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s = %s\n", f.Key, config.FormatValue(f.Get(&res.Recipe)))
	fmt.Fprintf(&b, "  from %s\n", res.Origin(key).Describe())
	if h := res.History(key); len(h) > 1 {
		b.WriteString("  overrides, oldest first:\n")
		for _, o := range h[:len(h)-1] {
			fmt.Fprintf(&b, "    %s (%s)\n", o.Describe(), o.Raw)
		}
	}
	fmt.Fprintf(&b, "  default %s; environment %s", config.FormatValue(f.Get(ptr(config.Default()))), f.EnvVar())
	if f.Flag != "" {
		fmt.Fprintf(&b, "; flag --%s", f.Flag)
	}
	b.WriteString("\n")
	if ref, err := config.Reference(); err == nil {
		for _, sd := range ref {
			for _, fd := range sd.Fields {
				if fd.Field == f {
					fmt.Fprintf(&b, "  %s\n", fd.Doc)
				}
			}
		}
	}
	if _, err := fmt.Fprint(a.stdout, b.String()); err != nil {
		return err
	}
	if diags.HasErrors() {
		_ = config.RenderText(a.stderr, diags, res.Sources)
		return &exitError{code: exitFindings}
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// keyHint explains an unknown key with the closest one.
func keyHint(key string) string {
	var keys []string
	for _, f := range config.RecipeSchema().Fields {
		keys = append(keys, f.Key)
	}
	if m := config.Suggest(key, keys); m != "" {
		return fmt.Sprintf("no such recipe key; did you mean %s?", m)
	}
	return "no such recipe key; `shardline recipe docs` lists them"
}
