package config

import (
	"path/filepath"
	"testing"
)

// BenchmarkLoadLint measures what `shardline lint` spends on one recipe: reading
// and parsing it with its bases, applying overrides, and every lint rule. The issue's
// budget is well under 50 ms per recipe; `make bench` prints the ratio.
func BenchmarkLoadLint(b *testing.B) {
	files, _ := filepath.Glob("../recipes/*.toml")
	if len(files) == 0 {
		b.Fatal("no recipes")
	}
	for _, f := range files {
		b.Run(filepath.Base(f), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				res, diags := Load(f, Options{Sets: []string{"train.lr=0.001"}, Flags: []FlagValue{{"num-layers", "4"}}})
				if res == nil || diags.HasErrors() {
					b.Fatal(diags)
				}
				if ds := Lint(res, nil); ds.HasErrors() {
					b.Fatal(ds)
				}
			}
		})
	}
}
