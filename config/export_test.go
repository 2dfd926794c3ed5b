package config

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestExportMegatronRoundTrip: every shipped recipe, exported as Megatron
// arguments (plus the keys no argument carries, as --set), loads back onto
// shardline's defaults to the same fingerprint.
func TestExportMegatronRoundTrip(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "recipes", "*.toml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		res, diags := Load(f, Options{})
		require.False(t, diags.HasErrors(), "%s: %v", f, diags)
		want, err := Fingerprint(&res.Recipe)
		require.NoError(t, err)
		e := ExportMegatron(&res.Recipe)
		var flags []FlagValue
		for i := 0; i < len(e.Args); i++ {
			name := strings.TrimPrefix(e.Args[i], "--")
			value := "true"
			if i+1 < len(e.Args) && !strings.HasPrefix(e.Args[i+1], "--") {
				i++
				value = e.Args[i]
			}
			flags = append(flags, FlagValue{Name: name, Value: value})
		}
		back, diags := LoadBytes("exported.toml", nil, Options{Flags: flags, Sets: e.Unexpressed})
		for _, d := range diags {
			require.NotEqual(t, SevError, d.Severity, "%s: %v", f, d)
		}
		got, err := Fingerprint(&back.Recipe)
		require.NoError(t, err)
		require.Equal(t, want, got, "%s: exported as %v, unexpressed %v", f, e.Args, e.Unexpressed)
		script := e.Script(f, want)
		require.Contains(t, script, "SHARDLINE_ARGS=(\n    --swiglu\n")
	}
}
