package config

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite golden files")

// golden compares got with the file, or rewrites it under -update.
func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file; run go test ./config -update")
	require.Equal(t, string(want), string(got), "golden %s differs; if the change is intended run go test ./config -update", path)
}

// TestGoldenDiagnostics renders the diagnostics of every recipe under testdata/bad
// and compares them with the .golden file beside it.
func TestGoldenDiagnostics(t *testing.T) {
	files, err := filepath.Glob("testdata/bad/*.toml")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			res, diags := Load(f, Options{})
			if res != nil && !diags.HasErrors() {
				diags = append(diags, Lint(res, nil)...)
				diags.Sort()
			}
			require.True(t, diags.HasErrors(), "a bad recipe must have errors")
			for _, d := range diags {
				require.True(t, d.Origin.Pos.File != "" || d.Origin.Kind != FromFile, "every finding is positioned: %v", d)
			}
			var b bytes.Buffer
			var srcs map[string][]byte
			if res != nil {
				srcs = res.Sources
			} else {
				src, _ := os.ReadFile(f)
				srcs = map[string][]byte{f: src}
			}
			require.NoError(t, RenderText(&b, diags, srcs))
			golden(t, strings.TrimSuffix(f, ".toml")+".golden", b.Bytes())
		})
	}
}
