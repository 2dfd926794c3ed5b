package config

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
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

// TestRenderTextShowsControlCharacters: a message, help or source line quoting
// a file's bytes cannot act on the terminal or CI log the text goes to; its
// control characters and non-UTF-8 bytes are written as Go escapes, and the
// caret still stands under the column it names.
func TestRenderTextShowsControlCharacters(t *testing.T) {
	line := "k = \"\x1b]0;t\x07\" x"
	col := strings.Index(line, "x") + 1
	d := Diagnostic{Severity: SevError, Code: "SL001", Message: "bad \x1b[31mred\xff \u009b end", Help: "fix\r it",
		Origin: Origin{Kind: FromFile, Pos: Pos{File: "e.toml", Line: 1, Col: col}}}
	var b strings.Builder
	require.NoError(t, RenderText(&b, Diagnostics{d}, map[string][]byte{"e.toml": []byte(line + "\n")}))
	want := "e.toml:1:" + strconv.Itoa(col) + ": error[SL001]: bad \\x1b[31mred\\xff \\u009b end\n" +
		"   |\n" +
		" 1 | k = \"\\x1b]0;t\\x07\" x\n" +
		"   |                    ^\n" +
		"  = help: fix\\x0d it\n" +
		"1 error, 0 warnings\n"
	assert.Equal(t, want, b.String())
	assert.Equal(t, "plain\ttext ✓", visible("plain\ttext ✓"), "tabs and printable UTF-8 pass unchanged")
}
