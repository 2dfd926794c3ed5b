package parallel

import (
	"fmt"
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
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				panic(fmt.Sprintf("HANG on %q", src))
			}
		}()
		path := filepath.Join(t.TempDir(), "fuzz.toml")
		res, diags := config.LoadBytes(path, src, config.Options{})
		if res == nil || diags.HasErrors() {
			return
		}
		diags = append(diags, config.Lint(res, nil)...)
		if diags.HasErrors() {
			return
		}
		p, pd := Check(res)
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
