package config

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOutOfRangeIntegersAreOutOfRange: a whole number beyond 64 bits was "not
// an integer" from --set, a flag or a variable, and "got string" from a file. It
// is an integer too large for the key: SL008, naming the key's bound.
func TestOutOfRangeIntegersAreOutOfRange(t *testing.T) {
	const huge = "99999999999999999999"
	for _, c := range []struct {
		name string
		opts Options
		src  string
		loc  string
	}{
		{"file", Options{}, "[model]\nlayers = " + huge + "\n", "r.toml:2:10"},
		{"--set", Options{Sets: []string{"model.layers=" + huge}}, "", "flag --set model.layers"},
		{"flag", Options{Flags: []FlagValue{{Name: "num-layers", Value: huge}}}, "", "flag --num-layers"},
		{"environment", Options{Env: []string{"SHARDLINE_MODEL_LAYERS=" + huge}}, "", "env SHARDLINE_MODEL_LAYERS"},
	} {
		_, diags := LoadBytes("r.toml", []byte(c.src), c.opts)
		require.Len(t, diags, 1, c.name)
		d := diags[0]
		require.Equal(t, "SL008", d.Code, c.name)
		require.Equal(t, c.loc, d.Location(), c.name)
		require.Equal(t, "model.layers ("+huge+") is out of range: it must be ≤ 4096", d.Message, c.name)
		require.NotContains(t, d.Message, "not an integer")
		require.Equal(t, "set model.layers to a value ≤ 4096", d.Help)
	}
	_, diags := LoadBytes("r.toml", []byte("[model]\nlayers = -"+huge+"\n"), Options{})
	require.Contains(t, diags[0].Message, "is out of range: it must be ≥ 1")
}

// TestPositiveFloatsAreNonZeroInFloat32: norm_eps = 5e-324 is positive as a
// float64 and passed lint, but the model computes in float32, where it is 0 (the
// norm then divides by zero on a zero row).
func TestPositiveFloatsAreNonZeroInFloat32(t *testing.T) {
	for _, v := range []string{"5e-324", "1e-40", "1e-39"} {
		_, diags := LoadBytes("r.toml", []byte("[model]\nnorm_eps = "+v+"\n"), Options{})
		require.Len(t, diags, 1, v)
		require.Equal(t, "SL008", diags[0].Code)
		require.Equal(t, "r.toml:2:12", diags[0].Location())
		require.Contains(t, diags[0].Message, "model.norm_eps ("+v+") must be > 0 in float32")
	}
	_, diags := LoadBytes("r.toml", []byte("[model]\nnorm_eps = 1e-30\n"), Options{})
	require.False(t, diags.HasErrors(), "%v", diags)
}

// TestSetSectionIsNotARename: --set model.moe=3 said "unknown key moe in [model];
// did you mean moe?" and "rename it to moe". moe is a section: the finding says
// so and names its keys.
func TestSetSectionIsNotARename(t *testing.T) {
	_, diags := LoadBytes("r.toml", nil, Options{Sets: []string{"model.moe=3"}})
	require.Len(t, diags, 1)
	d := diags[0]
	require.Equal(t, "SL007", d.Code)
	require.Equal(t, "flag --set model.moe", d.Location())
	require.Equal(t, "--set model.moe=3: model.moe is a section, not a value", d.Message)
	require.Contains(t, d.Help, "--set model.moe.num_experts=...")
	require.NotContains(t, d.Help, "rename")
}

// TestSettingVariablesAreNotTypos: the documented SHARDLINE_DATA_ROOT drew
// "names no recipe key and is ignored; did you mean SHARDLINE_DATA_PATH?", a
// warning that failed lint --strict. The CLI's setting variables are known; a
// misspelt one is still a warning, with the setting as the suggestion.
func TestSettingVariablesAreNotTypos(t *testing.T) {
	opts := Options{Env: []string{"SHARDLINE_DATA_ROOT=/data"}, SettingVars: []string{"SHARDLINE_DATA_ROOT", "SHARDLINE_RUNS_DIR"}}
	_, diags := LoadBytes("r.toml", nil, opts)
	require.Empty(t, diags)
	opts.Env = []string{"SHARDLINE_DATA_ROOTS=/data"}
	_, diags = LoadBytes("r.toml", nil, opts)
	require.Len(t, diags, 1)
	require.Contains(t, diags[0].Message, "did you mean SHARDLINE_DATA_ROOT?")
}

// TestSettingDefaultFromVariableIsLocated: a setting given by a variable
// (SHARDLINE_DEVICE_PROFILE=nope) was reported at "-:"; it names the variable.
func TestSettingDefaultFromVariableIsLocated(t *testing.T) {
	_, diags := LoadBytes("r.toml", nil, Options{Defaults: []SettingDefault{{Key: "parallel.device_profile", Value: "nope", From: "SHARDLINE_DEVICE_PROFILE"}}})
	require.Len(t, diags, 1)
	require.Equal(t, "env SHARDLINE_DEVICE_PROFILE", diags[0].Location())
	require.Equal(t, "SL004", diags[0].Code)
	_, diags = LoadBytes("r.toml", nil, Options{Defaults: []SettingDefault{{Key: "parallel.device_memory_gib", Value: "abc", From: "device_memory_gib in s.toml", Pos: Pos{File: "s.toml", Line: 3, Col: 1}}}})
	require.Equal(t, "s.toml:3:1", diags[0].Location())
}

// TestTorchtitanCheckpointIntervalMustBePositive: [checkpoint] interval = -5
// was dropped silently (the recipe saved no checkpoints at all); and so was a
// negative keep_latest_k.
func TestTorchtitanCheckpointIntervalMustBePositive(t *testing.T) {
	job := "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n[training]\nsteps = 100\n[lr_scheduler]\nwarmup_steps = 10\n[checkpoint]\nenable = true\n"
	for _, c := range []struct{ set, loc, msg string }{
		{"interval = -5", "job.toml:10:1", "[checkpoint] interval = -5: torchtitan saves every interval steps, a positive number"},
		{"interval = 0", "job.toml:10:1", "[checkpoint] interval = 0: torchtitan saves every interval steps"},
		{"keep_latest_k = -1", "job.toml:10:1", "[checkpoint] keep_latest_k = -1: the number of checkpoints to keep is 0 (all) or more"},
	} {
		_, diags := importTTClean(t, "job.toml", []byte(job+c.set+"\n"), 0)
		require.True(t, diags.HasErrors(), c.set)
		var errs Diagnostics
		for _, d := range diags {
			if d.Severity == SevError {
				errs = append(errs, d)
			}
		}
		require.Len(t, errs, 1, "%s: %v", c.set, diags)
		require.Equal(t, "SL008", errs[0].Code)
		require.Equal(t, c.loc, errs[0].Location())
		require.Contains(t, errs[0].Message, c.msg)
	}
	res, diags := importTTClean(t, "job.toml", []byte(job+"interval = 20\n"), 0)
	require.False(t, diags.HasErrors(), "%v", diags)
	require.Equal(t, 20, res.Recipe.Checkpoint.Interval)
}

// TestRunNameRefusesBidiControls: U+202E (right-to-left override) passed the
// run.name check; the name is printed on terminals and in logs, where it
// reorders what follows it.
func TestRunNameRefusesBidiControls(t *testing.T) {
	for _, r := range []rune{0x202e, 0x202a, 0x2066, 0x2069, 0x200f, 0x061c} {
		name := fmt.Sprintf("run-%cgpj.exe", r)
		err := CheckRunName(name)
		require.Error(t, err, "%U", r)
		require.Contains(t, err.Error(), fmt.Sprintf("bidirectional control %U", r))
	}
	require.NoError(t, CheckRunName("تجربة-١")) // right-to-left letters are fine
	var b strings.Builder
	require.NoError(t, RenderText(&b, Diagnostics{{Severity: SevError, Code: "SL009", Message: "run.name (\"a\u202eb\")", Help: "x"}}, nil))
	require.NotContains(t, b.String(), "\u202e")
	require.Contains(t, b.String(), `a\u202eb`)
}

// TestTorchtitanDefaultStepsAreNoRefusal: torchtitan's debug job without its
// [training] steps (given on torchtitan's command line) was refused with SL010,
// "shardline's schedule decays right after warmup", computed from torchtitan's
// default of 10000 steps. The finding says the file lacks the step count.
func TestTorchtitanDefaultStepsAreNoRefusal(t *testing.T) {
	src, err := os.ReadFile("testdata/torchtitan/llama3_debug.toml")
	require.NoError(t, err)
	var kept []string
	for _, line := range strings.Split(string(src), "\n") {
		if !strings.HasPrefix(line, "steps = ") {
			kept = append(kept, line)
		}
	}
	_, diags := importTTClean(t, "debug.toml", []byte(strings.Join(kept, "\n")), 0)
	var errs Diagnostics
	for _, d := range diags {
		if d.Severity == SevError {
			errs = append(errs, d)
		}
	}
	require.Len(t, errs, 1, "%v", diags)
	require.Equal(t, "SL007", errs[0].Code)
	require.Equal(t, "debug.toml:27:1", errs[0].Location())
	require.Contains(t, errs[0].Message, "the file sets no [training] steps, and with torchtitan's default of 10000")
	require.Contains(t, errs[0].Help, "set [training] steps in the job file")
	// With the steps in the file, the schedule is torchtitan's and imports.
	res, diags := importTTClean(t, "debug.toml", src, 0)
	requireNoErrors(t, diags)
	require.Equal(t, 10, res.Recipe.Train.Steps)
}
