package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/shardline/shardline/trainer"
)

// runRecord is what plan --against reads from a run directory's run.json.
type runRecord struct {
	Backend string `json:"backend"`
	Machine struct {
		CPUs int    `json:"cpus"`
		CPU  string `json:"cpu"`
	} `json:"machine"`
	Failure string `json:"failure"`
	Result  *struct {
		Steps      int     `json:"steps"`
		TokensPerS float64 `json:"tokens_per_s_median"`
		// Probe is the probe that scaled the run's plan to its machine.
		Probe *parallel.Probe `json:"probe"`
	} `json:"result"`
	Memory *struct {
		Held map[string]int64 `json:"held"`
	} `json:"memory"`
}

// comparison is one row of plan --against: the plan's figure, the run's, and
// measured/planned (absent where the plan predicts 0).
type comparison struct {
	What     string   `json:"what"`
	Unit     string   `json:"unit"`
	Planned  float64  `json:"planned"`
	Measured float64  `json:"measured"`
	Ratio    *float64 `json:"ratio,omitempty"`
}

// MarshalJSON writes a figure the run did not measure (NaN: no throughput) as
// null, with no ratio, where encoding/json would refuse the NaN.
func (c comparison) MarshalJSON() ([]byte, error) {
	type plain comparison
	out := struct {
		plain
		Measured *float64 `json:"measured"`
	}{plain: plain(c)}
	if !math.IsNaN(c.Measured) && !math.IsInf(c.Measured, 0) {
		m := c.Measured
		out.Measured = &m
	}
	if r := c.Ratio; r != nil && (math.IsNaN(*r) || math.IsInf(*r, 0)) {
		out.plain.Ratio = nil
	}
	return json.Marshal(out)
}

// hostProbe is what --host-probe measured: the calibration's passes now over
// then on this host, how many, and the step ratio divided by it.
type hostProbe struct {
	Slowdown      float64 `json:"slowdown"`
	Passes        int     `json:"passes"`
	StepRatioHost float64 `json:"step_ratio_adjusted"`
}

// planAgainst compiles the plan of a finished run from its resolved.toml (flags
// such as --device still apply) and compares it with the run's run.json; with
// probe, it also times the calibration's own passes on this host (HostSpeed).
func (a *app) planAgainst(dir string, rf *recipeFlags, format string, probe bool) error {
	recipe := filepath.Join(dir, "resolved.toml")
	if !fileExists(recipe) {
		return usageErr("--against %s: no resolved.toml there; give a run directory (shardline run writes one under run.output_dir)", dir)
	}
	raw, err := fileio.ReadRegular(filepath.Join(dir, "run.json"), 1<<20)
	if err != nil {
		return usageErr("--against %s: %v; give a finished run's directory", dir, unwrap(err))
	}
	var rec runRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return &exitError{code: exitFindings, err: fmt.Errorf("%s: %v", filepath.Join(dir, "run.json"), err)}
	}
	if rec.Result == nil {
		why := "it has not finished"
		if rec.Failure != "" {
			why = "it failed: " + rec.Failure
		}
		return &exitError{code: exitFindings, err: fmt.Errorf("--against %s: the run has no result to compare (%s)", dir, why)}
	}
	res, err := a.loadClean(recipe, rf)
	if err != nil {
		return err
	}
	runHost := trainer.CalibrationHostOf(rec.Machine.CPU, rec.Machine.CPUs, rec.Backend)
	if res.Recipe.Parallel.Device == "cpu" && !probe { // --host-probe adjusts the unscaled table's ratio its own way
		a.probeRun(rec.Result.Probe, runHost)
	}
	p, _ := parallel.Check(res, a.cals)
	if p == nil {
		return &exitError{code: exitFindings, err: fmt.Errorf("the plan of %s could not be compiled", recipe)}
	}
	a.noteCalibration(p, runHost, "the run's machine")
	r := &res.Recipe
	tokens := float64(r.Train.GlobalBatchSize * r.Model.SeqLen)
	var rows []comparison
	add := func(what, unit string, planned, measured float64) {
		c := comparison{What: what, Unit: unit, Planned: planned, Measured: measured}
		if planned != 0 {
			x := measured / planned
			c.Ratio = &x
		}
		rows = append(rows, c)
	}
	if rec.Memory != nil {
		held := rec.Memory.Held
		for _, c := range p.Memory.Components() {
			add(c.Name, "bytes", float64(c.Bytes), float64(held[c.Name]))
		}
		add("total", "bytes", float64(p.Memory.Total), float64(held["total"]))
	}
	measuredTPS := rec.Result.TokensPerS
	measuredStep := math.NaN()
	if measuredTPS > 0 {
		measuredStep = tokens / measuredTPS
	}
	add("step time", "s", p.StepTimeS, measuredStep)
	add("tokens/s", "tokens/s", p.TokensPerSPerDevice*float64(p.Mesh.World), measuredTPS)
	var hp *hostProbe
	if probe {
		c := p.Topology.Calibration
		if c == nil || r.Parallel.Device != "cpu" {
			return usageErr("--host-probe: the plan of %s is not timed from a CPU calibration; it probes CPU runs only", dir)
		}
		slow, n, err := trainer.HostSpeed(cpu.Backend{}, c, r.Precision.BF16, 200*time.Millisecond)
		if err != nil {
			return &exitError{code: exitFindings, err: err}
		}
		hp = &hostProbe{Slowdown: slow, Passes: n, StepRatioHost: measuredStep / p.StepTimeS / slow}
	}
	if format == "json" {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		out := map[string]any{"run": dir, "backend": rec.Backend, "steps": rec.Result.Steps, "device_profile": p.Topology.Device.Name,
			"comparison": slices.Clip(rows)}
		if hp != nil {
			out["host_probe"] = hp
		}
		return enc.Encode(out)
	}
	w := bufio.NewWriter(a.stdout)
	fmt.Fprintf(w, "plan of %s (device profile %s) against what the run measured (%s, %d steps)\n\n", recipe, p.Topology.Device.Name, rec.Backend, rec.Result.Steps)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tplanned\tmeasured\tmeasured/planned\t")
	for _, c := range rows {
		ratio := "-"
		if c.Ratio != nil && !math.IsNaN(*c.Ratio) {
			ratio = fmt.Sprintf("%.3f", *c.Ratio)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", c.What, human(c.Planned, c.Unit), human(c.Measured, c.Unit), ratio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if rec.Memory == nil {
		fmt.Fprintln(w, "\n(run.json has no memory figures: the run ended before writing them)")
	}
	if hp != nil {
		c := p.Topology.Calibration
		fmt.Fprintf(w, "\nhost now: the calibration's %d passes take %.3f× as long as when it was measured (%s, %s);\n"+
			"step time measured/planned adjusted for that: %.3f\n", hp.Passes, hp.Slowdown, c.Host, c.Date, hp.StepRatioHost)
	}
	return w.Flush()
}

// human formats a figure with its unit: bytes in binary units, seconds and
// tokens/s with a few significant digits.
func human(x float64, unit string) string {
	if math.IsNaN(x) {
		return "-"
	}
	switch unit {
	case "bytes":
		for i, u := range []string{"B", "KiB", "MiB", "GiB", "TiB"} {
			if math.Abs(x) < 1024 || i == 4 {
				if i == 0 {
					return fmt.Sprintf("%.0f B", x)
				}
				return fmt.Sprintf("%.2f %s", x, u)
			}
			x /= 1024
		}
	case "s":
		return fmt.Sprintf("%.4g s", x)
	}
	return fmt.Sprintf("%.4g", x)
}

// probeRun scales the "cpu" table to the machine a run ran on, for plan
// --against: by the probe the run recorded (run.json's result.probe), which
// its own plan was timed with, where it was taken against this table; else,
// for a run of this kind of machine, by a probe of this machine
// (probeCPU); else the table stays, and noteCalibration says so.
func (a *app) probeRun(recorded *parallel.Probe, runHost string) {
	c := a.cals.For("cpu")
	if c == nil {
		return
	}
	if recorded != nil {
		scaled, err := c.Scaled(*recorded)
		if err == nil {
			a.cals, a.cpu = a.cals.With(scaled), cpuTable{how: "run", table: c}
			return
		}
		fmt.Fprintf(a.stderr, "note: run.json's probe does not apply to this calibration (%v)\n", err)
	}
	if runHost == a.host {
		a.probeCPU(false)
	}
}
