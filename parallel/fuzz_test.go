package parallel

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardline/shardline/config"
)

// FuzzLoadLintPlan feeds arbitrary recipes through everything `shardline lint`
// and `shardline plan` run: load, lint, and plan compilation. Nothing may panic or
// hang, every finding is positioned, and a recipe that lints clean compiles or is
// refused with a finding. The seeds are the shipped recipes; `make fuzz` runs it
// longer, CI briefly.
func FuzzLoadLintPlan(f *testing.F) {
	for _, glob := range []string{"../recipes/*.toml", "testdata/*.toml"} {
		files, _ := filepath.Glob(glob)
		for _, p := range files {
			if b, err := os.ReadFile(p); err == nil {
				f.Add(b)
			}
		}
	}
	f.Add([]byte("[model]\nhidden = 262144\nvocab_size = 16777216\nheads = 4\nseq_len = 16777216\n"))
	f.Add([]byte("[model]\nlayers = 4096\n[model.moe]\nnum_experts = 4096\ntop_k = 1\n"))
	f.Add([]byte("[parallel]\nworld_size = 1048576\nexpert_parallel = 1048576\n"))
	f.Fuzz(func(t *testing.T, src []byte) {
		defer hangGuard(5*time.Second, func() string { return fmt.Sprintf("on %q", src) })()
		path := filepath.Join(t.TempDir(), "fuzz.toml")
		res, diags := config.LoadBytes(path, src, config.Options{})
		if res == nil || diags.HasErrors() {
			return
		}
		diags = append(diags, config.Lint(res, nil)...)
		if diags.HasErrors() {
			return
		}
		p, pd := Check(res, nil)
		for _, d := range pd {
			if d.Message == "" || d.Help == "" || d.Location() == "" {
				t.Fatalf("plan finding without message, help or position: %#v", d)
			}
		}
		if p == nil && !pd.HasErrors() {
			t.Fatalf("no plan and no error")
		}
		if p != nil && (p.Memory.Total < 0 || p.ParamsTotal < 0) {
			t.Fatalf("negative sizes (an overflow): memory %d, parameters %d", p.Memory.Total, p.ParamsTotal)
		}
	})
}

// FuzzParseCalibration: any bytes given as a calibration file (the calibration
// setting, SHARDLINE_CALIBRATION) are refused with an error, or plan a dense, an
// MoE, a bf16 and a context-parallel recipe with a finite, non-negative step time:
// never a panic, a hang, NaN or a negative time. Seeds: the shipped tables and a
// minimal one.
func FuzzParseCalibration(f *testing.F) {
	files, _ := filepath.Glob("calibration/*.json")
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	// The smallest table ParseCalibration takes: one point of each grid.
	if c := Calibrations(nil).For("cpu"); c != nil {
		small := Calibration{Profile: c.Profile, Date: c.Date, Source: c.Source, GEMM: c.GEMM[:1], Stream: c.Stream,
			Attention: []AttentionPoint{{Flash: true, T: 16, HD: 16, Fwd: 1e-6, Bwd: 2e-6}}}
		if b, err := json.Marshal(&small); err == nil {
			if _, err := ParseCalibration(b); err != nil {
				f.Fatalf("the minimal seed is refused: %v", err)
			}
			f.Add(b)
		}
	}
	recipes := []*config.Recipe{
		&load(f, "../recipes/tiny.toml").Recipe,
		&load(f, "../recipes/moe-tiny.toml", "parallel.world_size=2", "parallel.expert_parallel=2", "train.global_batch_size=32").Recipe,
		&load(f, "../recipes/tiny.toml", "precision.bf16=true", "parallel.world_size=2", "parallel.context_parallel=2").Recipe,
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		defer hangGuard(5*time.Second, func() string { return "planning with a fuzzed calibration" })()
		c, err := ParseCalibration(b)
		if err != nil {
			return
		}
		for _, r := range recipes {
			topo, err := TopologyOf(r.Parallel, nil)
			if err != nil {
				t.Fatal(err)
			}
			topo.Calibration = c
			p, err := Compile(r, topo)
			if err != nil {
				continue
			}
			for name, v := range map[string]float64{"compute": p.ComputeS, "optimizer": p.OptimizerS, "communication": p.ExposedCommS, "step": p.StepTimeS} {
				if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
					t.Fatalf("%s time %v planning %s with a calibration ParseCalibration accepted", name, v, r.Run.Name)
				}
			}
		}
	})
}

// hangGuard panics ("HANG " and what()) if the fuzz input is still running after
// limit; the returned function, deferred, stops the guard.
func hangGuard(limit time.Duration, what func() string) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
		case <-time.After(limit):
			panic("HANG " + what())
		}
	}()
	return func() { close(done) }
}
