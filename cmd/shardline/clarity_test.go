package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTerminalWriterNamesBidiControls: U+202E (and the other bidirectional
// controls) passed the terminal filter, so a name or a sample holding one
// printed reordered ("run-\u202egpj.exe" shows as "run-exe.jpg"). They are
// named instead, however the bytes are split into writes.
func TestTerminalWriterNamesBidiControls(t *testing.T) {
	in := "run-\u202egpj.exe \u2066x\u2069 \u200f"
	want := "run-<U+202E>gpj.exe <U+2066>x<U+2069> <U+200F>"
	for split := 0; split <= len(in); split++ {
		var b bytes.Buffer
		w := &terminalWriter{w: &b}
		for _, part := range []string{in[:split], in[split:]} {
			_, err := w.Write([]byte(part))
			require.NoError(t, err)
		}
		require.NoError(t, w.Flush())
		assert.Equal(t, want, b.String(), "split at byte %d", split)
	}
	assert.Equal(t, "run <U+202E>gpj.exe failed", shown(errors.New("run \u202egpj.exe failed")), "the error line on standard error too")
}

// TestRunNameBidiIsRefused: run.name = "run-\u202egpj.exe" linted clean.
func TestRunNameBidiIsRefused(t *testing.T) {
	r := writeRecipe(t, "extends = \""+filepath.Join(mustAbs(t, recipesDir), "tiny.toml")+"\"\n[run]\nname = \"run-\\u202egpj.exe\"\n")
	code, out, _ := shardline(t, nil, "lint", r)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, `error[SL009]: run.name ("run-\u202egpj.exe") must be one directory name: it holds the bidirectional control U+202E`)
	require.NotContains(t, out, "\u202e")
}

// TestSettingsErrorsAreLocated: a setting given by a variable was reported at
// "-:"; the finding names the variable.
func TestSettingsErrorsAreLocated(t *testing.T) {
	tiny := filepath.Join(recipesDir, "tiny.toml")
	code, out, _ := shardline(t, []string{"SHARDLINE_DEVICE_PROFILE=nope"}, "lint", tiny)
	require.Equal(t, 1, code)
	require.Contains(t, out, "env SHARDLINE_DEVICE_PROFILE: error[SL004]: parallel.device_profile (\"nope\") must be one of")
	require.NotContains(t, out, "-: error")
	code, out, _ = shardline(t, []string{"SHARDLINE_DEVICE_MEMORY_GIB=abc"}, "lint", "--format", "json", tiny)
	require.Equal(t, 1, code)
	require.Contains(t, out, `"location":"env SHARDLINE_DEVICE_MEMORY_GIB"`)
}

// TestDataRootVariableIsNoTypo: SHARDLINE_DATA_ROOT, a documented setting, drew
// "names no recipe key and is ignored", a warning that made lint --strict fail.
func TestDataRootVariableIsNoTypo(t *testing.T) {
	tiny := filepath.Join(recipesDir, "tiny.toml")
	root := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(root, "notes.txt"), []byte("some text"), 0o644))
	code, out, errs := shardline(t, []string{"SHARDLINE_DATA_ROOT=" + root}, "lint", "--strict", tiny, "--set", "data.path=notes.txt")
	require.Equal(t, 0, code, "%s%s", out, errs)
	require.Equal(t, "no problems found\n", out)
}

// TestSettingsFileErrorsArePositioned: a syntax error or a key given twice in
// shardline.toml was reported at the file (no line, viper's message); an
// unknown key under a table at the file too. Each is named at its line and
// column.
func TestSettingsFileErrorsArePositioned(t *testing.T) {
	tiny := mustAbs(t, filepath.Join(recipesDir, "tiny.toml"))
	for body, want := range map[string]string{
		"runs_dir = \n":                          "shardline.toml:1:12: TOML syntax error",
		"runs_dir = \"x\"\nruns_dir = \"y\"\n":   "shardline.toml:2:1: runs_dir is defined twice",
		"# settings\n[device]\nmemory = 3\n":     "shardline.toml:3:1: unknown setting device.memory",
		"runs_dir = \"r\"\n  grace = \"soon\"\n": "shardline.toml:2:3: setting grace (\"soon\")",
	} {
		cfg := filepath.Join(t.TempDir(), "shardline.toml")
		require.NoError(t, os.WriteFile(cfg, []byte(body), 0o644))
		code, _, errs := shardline(t, nil, "lint", "--config", cfg, tiny)
		require.Equal(t, 2, code, body)
		require.Contains(t, errs, want, body)
	}
}
