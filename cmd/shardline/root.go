package main

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/shardline/shardline/trainer"
	"github.com/spf13/cobra"
)

// version is set at link time (-ldflags "-X main.version=v1.2.3").
var version = "dev"

// Exit codes.
const (
	exitOK       = 0
	exitFindings = 1
	exitUsage    = 2
	// exitLostRank: a rank of a job stopped because another rank was lost or
	// never came; that rank's own failure is the cause.
	exitLostRank = 3
)

// exitError carries an exit code out of a command.
type exitError struct {
	code int
	err  error
}

// Unwrap is the error carried.
func (e *exitError) Unwrap() error { return e.err }

func (e *exitError) Error() string {
	if e.err == nil {
		return ""
	}
	return e.err.Error()
}

// usageErr is a "could not run" error (exit 2).
func usageErr(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// app carries what every command needs: streams and the environment.
type app struct {
	stdout, stderr io.Writer
	args           []string // the command line, without the program name
	env            []string
	configPath     string    // --config
	settings       *settings // loaded before a command runs
	host           string    // this machine as a calibration names it, found before a command runs
	// cals are the calibration tables this command's plans time the CPU with:
	// the shipped ones (this machine's kind of CPU preferred) or the user's
	// (the calibration setting), made before a command runs.
	cals parallel.Calibrations
	// cpu says whether the "cpu" table of cals describes this machine or was
	// scaled to it by a probe (probeCPU, which plan and run call).
	cpu cpuTable
	// preflight, when set, makes run check its command line and recipe as a
	// rank of a job would and stop before training (launch, before it starts
	// the ranks).
	preflight *preflight
	// quietLint keeps run from printing a recipe's warnings: a rank started by
	// launch, which printed them once already (errors are still printed).
	quietLint bool
}

// Main runs the CLI with args (without the program name) and returns the exit code.
func Main(args []string, stdout, stderr io.Writer, env []string) int {
	a := &app{stdout: stdout, stderr: stderr, args: args, env: env}
	root := a.rootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(stderr, "shardline:", shown(ee.err))
		}
		return ee.code
	}
	// Cobra's own errors: unknown commands and flags, wrong argument counts.
	fmt.Fprintln(stderr, "shardline:", shown(err))
	fmt.Fprintln(stderr, "Run 'shardline --help' for usage.")
	return exitUsage
}

// shown is err's text as terminalWriter would show it: an error quoting a
// file's bytes or an argument cannot act on the terminal it is printed on.
func shown(err error) string {
	text, _ := showControls(nil, []byte(err.Error()), true)
	return string(text)
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "shardline",
		Short: "Train Llama-style language models from declarative TOML recipes",
		Long: `shardline trains decoder-only language models (dense and mixture-of-experts) from
TOML recipes, with Megatron-FSDP-style fully sharded data parallelism.

A recipe is linted, then compiled into a parallelism plan, then trained. Lint and
plan never touch a device: they run anywhere, in milliseconds.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			s, err := loadSettings(a.configPath, config.EnvMap(a.env))
			a.settings = s
			if err != nil {
				return err
			}
			a.host = trainer.CalibrationHost(cpu.Backend{})
			a.cals, err = s.calibrations(a.host, config.EnvMap(a.env))
			return err
		},
	}
	root.PersistentFlags().StringVar(&a.configPath, "config", "", "CLI settings file (default: shardline.toml in the working directory or its nearest parent that has one): runs_dir, data_root, cache_dir, device_profile, comm_timeout, grace, calibration; SHARDLINE_<SETTING> variables override it, flags override both")
	root.AddCommand(a.runCmd(), a.launchCmd(), a.sampleCmd(), a.dataCmd(), a.lintCmd(), a.planCmd(), a.recipeCmd(), a.ckptCmd(), a.diffCmd(), a.calibrateCmd(), a.versionCmd())
	for _, c := range root.Commands() {
		refuseUnknownSubcommands(c)
	}
	return root
}

// refuseUnknownSubcommands makes every command under c that only groups
// others (ckpt, data, recipe) refuse a word that names none of them, with
// cobra's suggestions, where cobra would print the help and exit 0: a script
// calling `shardline ckpt list` must fail. With no word, the help is printed.
func refuseUnknownSubcommands(c *cobra.Command) {
	if !c.HasSubCommands() {
		return
	}
	if !c.Runnable() {
		c.SuggestionsMinimumDistance = 2 // cobra's own default, which SuggestionsFor does not apply
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return usageErr("%s (run '%s --help' for its commands)", msg, cmd.CommandPath())
		}
	}
	for _, sub := range c.Commands() {
		refuseUnknownSubcommands(sub)
	}
}

func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print shardline's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rev := "unknown"
			if bi, ok := debug.ReadBuildInfo(); ok {
				for _, s := range bi.Settings {
					if s.Key == "vcs.revision" {
						rev = s.Value
					}
				}
			}
			fmt.Fprintf(a.stdout, "shardline %s (commit %s, %s %s/%s)\n", version, rev, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}
}
