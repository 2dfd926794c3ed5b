package recipes

import (
	"embed"
	"io/fs"
	"sort"
)

// FS holds the shipped recipes as this binary was built with them: every
// .toml file of this directory and of base/, under the same slash paths
// (tiny.toml, base/gpu-node.toml). The files here are their readable copies;
// TestEmbeddedEqualsFiles keeps the two the same. The CLI names one
// shipped:PATH (config.ShippedPrefix).
//
//go:embed *.toml base/*.toml
var FS embed.FS

// Default is the recipe `shardline run` trains when given none.
const Default = "tiny.toml"

// Names lists the shipped recipes' paths in FS, sorted.
func Names() []string {
	var out []string
	_ = fs.WalkDir(FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, p)
		}
		return err
	})
	sort.Strings(out)
	return out
}
