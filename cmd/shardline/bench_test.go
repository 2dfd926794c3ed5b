package main

import (
	"io"
	"path/filepath"
	"testing"
)

// BenchmarkLint measures what `shardline lint` spends on one recipe: reading it and
// its bases, overrides, every lint rule, and compiling the plan for the fit check
// (everything but process start-up and printing). Budget: well under 50 ms;
// `make bench` prints the ratio.
func BenchmarkLint(b *testing.B) {
	files, _ := filepath.Glob(filepath.Join(recipesDir, "*.toml"))
	if len(files) == 0 {
		b.Fatal("no recipes")
	}
	a := &app{stdout: io.Discard, stderr: io.Discard}
	rf := &recipeFlags{sets: []string{"train.lr=0.001"}}
	for _, f := range files {
		b.Run(filepath.Base(f), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				res, diags, err := a.loadRecipe(f, rf)
				if err != nil || res == nil || diags.HasErrors() {
					b.Fatal(err, diags)
				}
			}
		})
	}
}
