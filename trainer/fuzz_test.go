package trainer

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
)

// FuzzLoadWeights: any bytes as weights.bin for a small model are loaded or
// refused, never a panic; what loads is finite.
func FuzzLoadWeights(f *testing.F) {
	res, diags := config.LoadBytes("r.toml", nil, config.Options{Sets: []string{"model.layers=1", "model.hidden=16", "model.heads=2", "model.ffn_hidden=32", "model.vocab_size=8"}})
	if diags.HasErrors() {
		f.Fatal(diags.Err())
	}
	table, err := parallel.ParamTable(res.Recipe.Model, 1, 1)
	if err != nil {
		f.Fatal(err)
	}
	fresh := func() [][]float32 {
		views := make([][]float32, len(table))
		for i := range table {
			views[i] = make([]float32, table[i].LocalNumel())
		}
		return views
	}
	p := filepath.Join(f.TempDir(), "weights.bin")
	views := fresh()
	views[0][0] = 1.5
	if err := saveWeights(p, table, views); err != nil {
		f.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	f.Add(b)
	f.Add(b[:len(b)/2])
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(t.TempDir(), "weights.bin")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		views := fresh()
		if err := loadWeights(p, table, views); err != nil {
			return
		}
		for i, v := range views {
			if j := firstNonFinite(v); j >= 0 {
				t.Fatalf("loaded a non-finite %s[%d]", table[i].Name, j)
			}
		}
	})
}
