package main

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/spf13/cobra"
)

func (a *app) planCmd() *cobra.Command {
	var (
		nodes, rank    int
		device, format string
		sweep          string
		against        string
		hostProbe      bool
	)
	cmd := &cobra.Command{
		Use:   "plan [flags] RECIPE",
		Short: "Show how a recipe is laid out over ranks: mesh, FSDP units, memory, communication, step time",
		Long: `Plan lints the recipe, compiles it for a topology, and prints the device mesh, the
FSDP units and their sharded buffers, memory per rank by component against the
device, the collectives of one step by group, and the step-time estimate with
tokens/s per device and MFU. Nothing touches a device.

--sweep KEY=V1,V2,... compiles one plan per value (at most 64) and prints them
side by side.

--against RUN_DIR plans a finished run from its resolved recipe and prints, beside
each prediction, what the run measured (run.json): memory per component, the
median step time and tokens/s, with the ratio measured/planned.

--host-probe (with --against, on the CPU) reruns the calibration's own
in-step passes on this host (about a second) and reports how much slower or
faster the host is now than when the calibration was measured, with the step
ratio divided by that: on a host whose speed drifts, it separates the plan's
error from the host's. Run it right after the run, on the run's host.`,
		Example: `  shardline plan recipes/tiny.toml --world-size 4
  shardline plan recipes/llama4-3bx128e.toml --sweep parallel.expert_parallel=1,2,4,8
  shardline plan recipes/llama-1b.toml --nodes 2 --gpus-per-node 8 --device h200-141gb --format json --rank 9
  shardline plan --against runs/tiny`,
		Args: cobra.MaximumNArgs(1),
	}
	rf := addRecipeFlags(cmd)
	fs := cmd.Flags()
	fs.IntVar(&nodes, "nodes", 0, "nodes: sets the world size to nodes × gpus_per_node (see --gpus-per-node)")
	fs.StringVar(&device, "device", "", "device profile: "+strings.Join(parallel.ProfileNames(), ", ")+" (overrides parallel.device_profile)")
	fs.IntVar(&rank, "rank", -1, "also show this rank's coordinates and groups")
	fs.StringVar(&format, "format", "table", "table or json")
	fs.StringVar(&sweep, "sweep", "", "compare variants: KEY=V1,V2,... (any recipe key)")
	fs.StringVar(&against, "against", "", "compare the plan of a finished run (RUN_DIR, planned from its resolved.toml) with what it measured")
	fs.BoolVar(&hostProbe, "host-probe", false, "with --against on the CPU: time the calibration's own passes on this host now and adjust the step ratio for the host's drift since calibration")
	_ = cmd.RegisterFlagCompletionFunc("device", cobra.FixedCompletions(parallel.ProfileNames(), cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("format", cobra.FixedCompletions([]string{"table", "json"}, cobra.ShellCompDirectiveNoFileComp))
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if format != "table" && format != "json" {
			return usageErr("--format %q is not one of table, json", format)
		}
		switch {
		case against != "" && len(args) == 1:
			return usageErr("--against %s plans the run's own resolved.toml: give no RECIPE", against)
		case against == "" && len(args) == 0:
			return usageErr("plan needs a RECIPE (or --against RUN_DIR)")
		case against != "":
			if sweep != "" || rank >= 0 {
				return usageErr("--against compares one plan with one run: not with --sweep or --rank")
			}
			return a.planAgainst(against, rf, format, hostProbe)
		}
		if hostProbe {
			return usageErr("--host-probe adjusts a comparison with a finished run: give --against RUN_DIR")
		}
		if nodes < 0 {
			return usageErr("--nodes %d must be positive", nodes)
		}
		if nodes > 0 && cmd.Flags().Changed("world-size") {
			return usageErr("give --world-size or --nodes, not both")
		}
		// Topology flags become overrides, so lint and provenance see them as flags.
		if device != "" {
			rf.extra = append(rf.extra, config.FlagValue{Name: "device-profile", Value: device})
		}
		if nodes > 0 {
			res, diags, err := a.loadRecipe(args[0], rf)
			if err != nil {
				return err
			}
			if res == nil {
				_ = config.RenderText(a.stderr, diags, nil)
				return &exitError{code: exitFindings}
			}
			g := res.Recipe.Parallel.GPUsPerNode
			if g == 0 {
				return usageErr("--nodes needs parallel.gpus_per_node > 0 (or --gpus-per-node)")
			}
			rf.extra = append(rf.extra, config.FlagValue{Name: "world-size", Value: strconv.Itoa(nodes * g)})
		}
		if sweep != "" {
			return a.sweep(args[0], sweep, rf)
		}
		res, err := a.loadClean(args[0], rf)
		if err != nil {
			return err
		}
		if res.Recipe.Parallel.Device == "cpu" {
			a.probeCPU(false)
		}
		p, _ := parallel.Check(res, a.cals) // the check's findings are already in diags
		if p == nil {
			return &exitError{code: exitFindings, err: fmt.Errorf("the plan could not be compiled")}
		}
		if rank >= p.Mesh.World {
			return usageErr("--rank %d is outside the world of %d ranks (0..%d)", rank, p.Mesh.World, p.Mesh.World-1)
		}
		a.noteCalibration(p, a.host, "this machine")
		if format == "json" {
			return p.WriteJSON(a.stdout, rank)
		}
		if err := p.WriteTable(a.stdout); err != nil {
			return err
		}
		if rank >= 0 {
			return writeRank(a, p, rank)
		}
		return nil
	}
	return cmd
}

func writeRank(a *app, p *parallel.Plan, rank int) error {
	m := p.Mesh
	c := m.Coords(rank)
	var b strings.Builder
	fmt.Fprintf(&b, "\nrank %d: tp %d, cp %d, dp %d, pp %d; etp %d, ep %d, edp %d\n", rank, c.TP, c.CP, c.DP, c.PP, c.ETP, c.EP, c.EDP)
	for _, ax := range parallel.GroupAxes {
		g := m.Group(ax, rank)
		s := fmt.Sprint(g)
		if len(g) > 16 {
			s = fmt.Sprintf("%v … %v (%d ranks)", g[:8], g[len(g)-4:], len(g))
		}
		fmt.Fprintf(&b, "  %-6s %s\n", ax, s)
	}
	_, err := fmt.Fprint(a.stdout, b.String())
	return err
}

// maxSweepValues is the most values one --sweep compares: a table wider than
// any terminal, and a bound on the plans compiled for one command.
const maxSweepValues = 64

// sweep compiles one plan per value of a key and prints them side by side.
func (a *app) sweep(path, spec string, rf *recipeFlags) error {
	key, vals, ok := strings.Cut(spec, "=")
	if !ok || vals == "" {
		return usageErr("--sweep %q is not of the form KEY=V1,V2,...", spec)
	}
	if _, known := config.RecipeSchema().Lookup(key); !known {
		return usageErr("--sweep %q: %s", key, keyHint(key))
	}
	// Each value compiles a plan: the count is checked before any is.
	if n := strings.Count(vals, ",") + 1; n > maxSweepValues {
		return usageErr("--sweep %s: %d values, over the %d a sweep compares; split it into several sweeps", key, n, maxSweepValues)
	}
	values := strings.Split(vals, ",")
	for _, v := range values {
		if strings.TrimSpace(v) == "" {
			return usageErr("--sweep %q: an empty value; write KEY=V1,V2,... with a value between every two commas", spec)
		}
	}
	var plans []*parallel.Plan
	base := rf.sets
	defer func() { rf.sets = base }()
	for _, v := range values {
		rf.sets = append(append([]string(nil), base...), key+"="+strings.TrimSpace(v))
		res, diags, err := a.loadRecipe(path, rf)
		if err != nil {
			return err
		}
		p, pd := (*parallel.Plan)(nil), config.Diagnostics(nil)
		if !hasLoadErrors(diags) {
			if res.Recipe.Parallel.Device == "cpu" {
				a.probeCPU(false)
			}
			p, pd = parallel.Check(res, a.cals)
		}
		if p == nil {
			fmt.Fprintf(a.stderr, "%s = %s:\n", key, v)
			_ = config.RenderText(a.stderr, append(diags, pd...), sourcesOf(res))
			return &exitError{code: exitFindings}
		}
		plans = append(plans, p)
	}
	a.noteCalibration(plans[0], a.host, "this machine")
	return writeSweep(a, key, values, plans)
}

// hasLoadErrors reports errors other than the plan's own (SL5xx): a sweep still
// shows plans that do not fit, since that is often what it is for.
func hasLoadErrors(ds config.Diagnostics) bool {
	for _, d := range ds {
		if d.Severity == config.SevError && !strings.HasPrefix(d.Code, "SL5") {
			return true
		}
	}
	return false
}

func writeSweep(a *app, key string, values []string, plans []*parallel.Plan) error {
	var b strings.Builder
	fmt.Fprintf(&b, "sweep of %s over %s (%s)\n\n", key, plans[0].Name, plans[0].Topology.Device.Name)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, f func(p *parallel.Plan) string) {
		fmt.Fprintf(tw, "%s\t", name)
		for _, p := range plans {
			fmt.Fprintf(tw, "%s\t", f(p))
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprintf(tw, "%s\t", key)
	for _, v := range values {
		fmt.Fprintf(tw, "%s\t", strings.TrimSpace(v))
	}
	fmt.Fprintln(tw)
	row("mesh (tp·cp·dp | etp·ep·edp)", func(p *parallel.Plan) string {
		m := p.Mesh
		return fmt.Sprintf("%d·%d·%d | %d·%d·%d", m.TP, m.CP, m.DP, m.ETP, m.EP, m.EDP)
	})
	for i, c := range plans[0].Memory.Components() {
		i := i
		row("memory: "+c.Name, func(p *parallel.Plan) string { return parallel.FormatBytes(p.Memory.Components()[i].Bytes) })
	}
	row("memory: static", func(p *parallel.Plan) string { return parallel.FormatBytes(p.Memory.Static()) })
	row("memory: total", func(p *parallel.Plan) string { return parallel.FormatBytes(p.Memory.Total) })
	row("fits device", func(p *parallel.Plan) string { return strconv.FormatBool(p.Fits()) })
	row("padding (elements)", func(p *parallel.Plan) string { return strconv.FormatInt(p.Padding, 10) })
	for _, ax := range parallel.GroupAxes {
		found := false
		for _, p := range plans {
			for _, c := range p.Comm {
				found = found || c.Axis == ax
			}
		}
		if !found {
			continue
		}
		row("comm "+string(ax)+": sent/rank", func(p *parallel.Plan) string {
			for _, c := range p.Comm {
				if c.Axis == ax {
					return parallel.FormatBytes(c.RankBytes)
				}
			}
			return "-"
		})
		row("comm "+string(ax)+": time", func(p *parallel.Plan) string {
			for _, c := range p.Comm {
				if c.Axis == ax {
					return fmt.Sprintf("%.1f ms", c.TimeS*1e3)
				}
			}
			return "-"
		})
	}
	row("compute", func(p *parallel.Plan) string { return fmt.Sprintf("%.1f ms", p.ComputeS*1e3) })
	row("optimizer step", func(p *parallel.Plan) string { return fmt.Sprintf("%.1f ms", p.OptimizerS*1e3) })
	row("exposed comm", func(p *parallel.Plan) string { return fmt.Sprintf("%.1f ms", p.ExposedCommS*1e3) })
	row("step time", func(p *parallel.Plan) string { return fmt.Sprintf("%.1f ms", p.StepTimeS*1e3) })
	row("tokens/s per device", func(p *parallel.Plan) string { return fmt.Sprintf("%.0f", p.TokensPerSPerDevice) })
	row("MFU", func(p *parallel.Plan) string { return fmt.Sprintf("%.1f%%", 100*p.MFU) })
	tw.Flush()
	_, err := fmt.Fprint(a.stdout, b.String())
	return err
}
