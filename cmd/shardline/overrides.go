package main

import (
	"errors"
	"io/fs"
	"os"
	pathpkg "path"
	"slices"
	"strings"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/recipes"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// megatronAnnotation marks the Megatron-style flags so help lists them apart.
const megatronAnnotation = "shardline_megatron"

// recipeFlags are the override flags shared by every command that loads a recipe.
type recipeFlags struct {
	sets     []string
	megatron []*megatronValue
	extra    []config.FlagValue // flags a command adds on its own (plan's --world-size)
}

// megatronValue is one Megatron-style flag; it records the raw value so config can
// check it against the key's type and report the flag by name.
type megatronValue struct {
	name      string
	field     *config.Field // nil for a Megatron argument beyond the schema
	switchArg bool          // such an argument that takes no value
	value     string
	set       bool
}

func (v *megatronValue) String() string { return v.value }
func (v *megatronValue) Set(s string) error {
	v.value, v.set = s, true
	return nil
}
func (v *megatronValue) Type() string {
	if v.field == nil { // a Megatron argument beyond the schema (config.MegatronArgs)
		if v.switchArg {
			return "bool"
		}
		return "string"
	}
	switch v.field.Kind {
	case config.KindBool:
		return "bool"
	case config.KindInt:
		return "int"
	case config.KindFloat:
		return "float"
	case config.KindStrings:
		return "strings"
	}
	return "string"
}

// addRecipeFlags registers --set and the Megatron-style flags on cmd.
func addRecipeFlags(cmd *cobra.Command) *recipeFlags {
	rf := &recipeFlags{}
	fs := cmd.Flags()
	fs.StringArrayVar(&rf.sets, "set", nil, "override a recipe key: --set section.key=value (repeatable; beats the recipe and SHARDLINE_* variables)")
	s := config.RecipeSchema()
	for _, name := range s.Flags() {
		f, positive, _ := s.FlagField(name)
		v := &megatronValue{name: name, field: f}
		usage := "sets " + f.Key
		if !positive {
			usage = "sets " + f.Key + " = false"
		}
		fs.Var(v, name, usage)
		fl := fs.Lookup(name)
		if f.Kind == config.KindBool {
			fl.NoOptDefVal = "true"
		}
		fl.Annotations = map[string][]string{megatronAnnotation: {"true"}}
		rf.megatron = append(rf.megatron, v)
	}
	// Megatron arguments the recipe has no key for: accepted, checked, noted or
	// refused by config (a launch script's argument list lints as far as it can).
	for _, a := range config.MegatronArgs() {
		if fs.Lookup(a.Name) != nil {
			continue
		}
		v := &megatronValue{name: a.Name, switchArg: !a.TakesValue}
		fs.Var(v, a.Name, a.Usage)
		fl := fs.Lookup(a.Name)
		if !a.TakesValue {
			fl.NoOptDefVal = "true"
		}
		fl.Annotations = map[string][]string{megatronAnnotation: {"true"}}
		rf.megatron = append(rf.megatron, v)
	}
	cmd.SetUsageTemplate(strings.Replace(cmd.UsageTemplate(),
		"{{.LocalFlags.FlagUsages | trimTrailingWhitespaces}}",
		"{{localFlagUsages . | trimTrailingWhitespaces}}\n\nMegatron-compatible overrides (applied after --set):\n{{megatronFlagUsages . | trimTrailingWhitespaces}}", 1))
	return rf
}

func init() {
	split := func(cmd *cobra.Command, megatron bool) string {
		fs := pflag.NewFlagSet(cmd.Name(), pflag.ContinueOnError)
		cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if (f.Annotations[megatronAnnotation] != nil) == megatron {
				fs.AddFlag(f)
			}
		})
		return fs.FlagUsages()
	}
	cobra.AddTemplateFunc("localFlagUsages", func(cmd *cobra.Command) string { return split(cmd, false) })
	cobra.AddTemplateFunc("megatronFlagUsages", func(cmd *cobra.Command) string { return split(cmd, true) })
}

// options builds config.Options from the parsed flags and the environment.
func (rf *recipeFlags) options(env []string) config.Options {
	opts := config.Options{Env: env, Sets: rf.sets}
	for _, key := range settingKeys {
		opts.SettingVars = append(opts.SettingVars, "SHARDLINE_"+strings.ToUpper(key))
	}
	for _, v := range rf.megatron {
		if v.set {
			opts.Flags = append(opts.Flags, config.FlagValue{Name: v.name, Value: v.value})
		}
	}
	opts.Flags = append(opts.Flags, rf.extra...)
	return opts
}

// lintOptions are the settings lint judges a recipe by, as run will use them.
func (a *app) lintOptions() config.LintOptions {
	if a.settings == nil {
		return config.LintOptions{}
	}
	return config.LintOptions{DataRoot: a.settings.DataRoot}
}

// loadRecipe loads and lints one recipe file. A file that cannot be read is a
// "could not run" error; everything else comes back as diagnostics.
func (a *app) loadRecipe(path string, rf *recipeFlags) (*config.Resolved, config.Diagnostics, error) {
	if config.IsShipped(path) {
		var err error
		if path, err = shippedRecipe(path); err != nil {
			return nil, nil, err
		}
	} else if err := checkReadable(path, "recipe"); err != nil {
		return nil, nil, err
	}
	opts := rf.options(a.env)
	opts.Shipped = recipes.FS
	if a.settings != nil {
		opts.Defaults = a.settings.recipeDefaults(config.EnvMap(a.env))
	}
	res, diags := config.Load(path, opts)
	if res != nil && !diags.HasErrors() {
		diags = append(diags, config.LintWith(res, a.env, a.lintOptions())...)
	}
	if res != nil && !diags.HasErrors() {
		// Lint compiles the plan too: a recipe that cannot be laid out, or does not
		// fit its device, is a recipe error.
		_, pd := parallel.Check(res, a.cals)
		diags = append(diags, pd...)
	}
	diags.InRecipe(path)
	diags.Sort()
	return res, diags, nil
}

// loadClean loads and lints a recipe for a command that needs it error-free: errors
// are printed to standard error and end the command with exit code 1; warnings and
// notes are printed there too, and the command goes on.
func (a *app) loadClean(path string, rf *recipeFlags) (*config.Resolved, error) {
	res, diags, err := a.loadRecipe(path, rf)
	if err != nil {
		return nil, err
	}
	if len(diags) > 0 && (diags.HasErrors() || !a.quietLint) {
		_ = config.RenderText(a.stderr, diags, sourcesOf(res))
	}
	if diags.HasErrors() {
		return nil, &exitError{code: exitFindings}
	}
	return res, nil
}

func sourcesOf(res *config.Resolved) map[string][]byte {
	if res == nil {
		return nil
	}
	return res.Sources
}

// shippedRecipe checks that shipped:NAME names a recipe shipped in this
// binary (NAME.toml where NAME has no extension), and returns its full name.
func shippedRecipe(path string) (string, error) {
	name := strings.TrimPrefix(path, config.ShippedPrefix)
	if pathpkg.Ext(name) == "" {
		name += ".toml"
	}
	if slices.Contains(recipes.Names(), name) {
		return config.ShippedPrefix + name, nil
	}
	var names []string
	for _, n := range recipes.Names() {
		if !strings.HasPrefix(n, "base/") {
			names = append(names, config.ShippedPrefix+strings.TrimSuffix(n, ".toml"))
		}
	}
	return "", usageErr("recipe %s: this shardline ships no recipe %s; the shipped ones are %s (a path without the shipped: prefix is a file)", path, name, strings.Join(names, ", "))
}

// checkReadable refuses a path that is missing, unreadable or not a regular file;
// what names the file in messages ("recipe", "text file").
func checkReadable(path, what string) error {
	f, _, err := fileio.OpenRegular(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return usageErr("%s %s does not exist (check the path)", what, path)
	case errors.Is(err, fileio.ErrNotRegular):
		return usageErr("%s %s is %v; give a %s file", what, path, unwrap(err), what)
	case err != nil:
		return usageErr("cannot read %s %s: %v", what, path, unwrap(err))
	}
	return f.Close()
}

func unwrap(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
