package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/parallel"
	"github.com/spf13/viper"
)

// settings are the CLI's own settings: what describes the machine and the user's
// habits rather than an experiment. They come, lowest first, from built-in
// defaults, shardline.toml (found in the working directory or the nearest parent
// that has one: an experiment repository's root; or --config FILE), SHARDLINE_<KEY>
// variables, and the command's flags. viper layers them; recipes keep their own
// loader, since every recipe value must remember its origin.
type settings struct {
	file string // the settings file read, "" when none
	// RunsDir is the default of run.output_dir (a recipe that sets it wins).
	RunsDir string
	// DataRoot is the directory a relative data.path is read from.
	DataRoot string
	// CacheDir holds tokenized text ("" means the user cache directory).
	CacheDir string
	// DeviceProfile is the default of parallel.device_profile; Device holds the
	// defaults of the parallel.device_* figures (a custom device, or overrides of
	// the profile's), by setting name, as written.
	DeviceProfile string
	Device        map[string]string
	// CommTimeout and Grace are the defaults of --comm-timeout and --grace.
	CommTimeout, Grace time.Duration
	// Calibration is a file written by shardline calibrate: the plan times steps
	// on the CPU from it instead of the table shardline ships.
	Calibration string
	pos         map[string]config.Pos // where each key stands in the file
}

// settingKeys are the keys of shardline.toml, and of SHARDLINE_<KEY>.
var settingKeys = append([]string{"runs_dir", "data_root", "cache_dir", "device_profile", "comm_timeout", "grace", "calibration"}, deviceSettings...)

// deviceSettings describe the machine's device (parallel.device_* in a recipe,
// which wins): the figures of a custom device_profile, or overrides of a named one.
var deviceSettings = []string{"device_memory_gib", "device_peak_tflops", "device_memory_gbps", "device_intra_node_gbps", "device_inter_node_gbps"}

// settingsFile is the name looked for in the working directory and its parents.
const settingsFile = "shardline.toml"

// findSettings returns the nearest shardline.toml from dir upwards, or "".
func findSettings(dir string) string {
	for {
		p := filepath.Join(dir, settingsFile)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// loadSettings reads the settings from path (or the nearest shardline.toml when
// path is empty) and env, checking every key and value.
func loadSettings(path string, env map[string]string) (*settings, error) {
	v := viper.New()
	v.SetConfigType("toml")
	s := &settings{pos: map[string]config.Pos{}}
	explicit := path != ""
	if !explicit {
		if wd, err := os.Getwd(); err == nil {
			path = findSettings(wd)
		}
	}
	if path != "" {
		src, err := readSettingsFile(path)
		if err != nil {
			if explicit {
				return nil, usageErr("--config %s: %v", path, err)
			}
			return nil, usageErr("settings file %s (the nearest %s above the working directory): %v; fix or remove it, or name another with --config", path, settingsFile, err)
		}
		s.file = path
		// Parsed first for positions: a syntax error, a key given twice and an
		// unknown setting are named at their line and column.
		positions, d := config.KeyPositions(path, src)
		if d != nil {
			return nil, usageErr("%s: %s; fix the settings file (https://toml.io/en/v1.0.0)", d.Location(), d.Message)
		}
		if err := v.ReadConfig(strings.NewReader(string(src))); err != nil {
			return nil, usageErr("%s: not valid TOML: %v; fix the syntax (https://toml.io/en/v1.0.0)", path, err)
		}
		for _, key := range v.AllKeys() {
			s.pos[key] = config.Pos{File: path}
			for k, p := range positions {
				if strings.EqualFold(k, key) {
					s.pos[key] = p
				}
			}
			if !slices.Contains(settingKeys, key) {
				msg := fmt.Sprintf("%s: unknown setting %s", s.pos[key], key)
				if m := config.Suggest(key, settingKeys); m != "" {
					msg += fmt.Sprintf("; did you mean %s?", m)
				}
				return nil, usageErr("%s; settings are %s (recipe keys belong in recipes)", msg, strings.Join(settingKeys, ", "))
			}
		}
	}
	// SHARDLINE_<KEY> variables beat the file: merged over its values.
	fromEnv := map[string]any{}
	for _, key := range settingKeys {
		if val, ok := env["SHARDLINE_"+strings.ToUpper(key)]; ok {
			fromEnv[key] = val
		}
	}
	if err := v.MergeConfigMap(fromEnv); err != nil {
		return nil, err
	}
	s.RunsDir, s.DataRoot, s.CacheDir, s.DeviceProfile = v.GetString("runs_dir"), v.GetString("data_root"), v.GetString("cache_dir"), v.GetString("device_profile")
	s.Calibration = v.GetString("calibration")
	s.Device = map[string]string{}
	for _, key := range deviceSettings {
		if v.IsSet(key) {
			s.Device[key] = v.GetString(key)
		}
	}
	// Relative directories in the file are relative to the file (an experiment
	// repository's root), wherever the command runs; from a variable, to the
	// working directory.
	for key, dst := range map[string]*string{"runs_dir": &s.RunsDir, "data_root": &s.DataRoot, "cache_dir": &s.CacheDir, "calibration": &s.Calibration} {
		if _, env := fromEnv[key]; !env && *dst != "" && !filepath.IsAbs(*dst) && s.file != "" {
			*dst = filepath.Join(filepath.Dir(s.file), *dst)
		}
	}
	for key, dst := range map[string]*time.Duration{"comm_timeout": &s.CommTimeout, "grace": &s.Grace} {
		raw := v.GetString(key)
		if raw == "" {
			continue
		}
		d, err := time.ParseDuration(raw)
		if err != nil || d < 0 || (key == "comm_timeout" && d == 0) {
			return nil, usageErr("%s (%q): want a positive duration such as \"5m\" or \"30s\"", s.where(key, fromEnv), raw)
		}
		*dst = d
	}
	return s, nil
}

// calibrations are the tables this command's plans time the CPU with: the
// calibration setting's file for its profile, over shardline's own tables
// (a shipped one measured on host's kind of CPU preferred).
func (s *settings) calibrations(host string, env map[string]string) (parallel.Calibrations, error) {
	cals := parallel.ShippedCalibrations(host)
	if s == nil || s.Calibration == "" {
		return cals, nil
	}
	b, err := fileio.ReadRegular(s.Calibration, 16<<20)
	if err == nil {
		var c *parallel.Calibration
		if c, err = parallel.ParseCalibration(b); err == nil {
			return cals.With(c), nil
		}
	}
	where := "setting calibration"
	if _, ok := env["SHARDLINE_CALIBRATION"]; ok {
		where = "SHARDLINE_CALIBRATION"
	} else if p, ok := s.pos["calibration"]; ok {
		where = p.String() + ": setting calibration"
	}
	return nil, usageErr("%s (%q): %v; write one with shardline calibrate -o FILE", where, s.Calibration, unwrap(err))
}

// where names a setting's source for messages: its variable, or its file position.
func (s *settings) where(key string, fromEnv map[string]any) string {
	if _, ok := fromEnv[key]; ok {
		return "SHARDLINE_" + strings.ToUpper(key)
	}
	return fmt.Sprintf("%s: setting %s", s.pos[key], key)
}

// readSettingsFile reads a settings file: a regular file of at most 1 MiB.
func readSettingsFile(path string) ([]byte, error) {
	b, err := config.ReadRecipeFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no such file")
	}
	return b, err
}

// recipeDefaults are the settings that stand in for recipe defaults.
func (s *settings) recipeDefaults(env map[string]string) []config.SettingDefault {
	var out []config.SettingDefault
	defaults := []struct{ setting, key, value string }{
		{"runs_dir", "run.output_dir", s.RunsDir}, {"device_profile", "parallel.device_profile", s.DeviceProfile},
	}
	for _, k := range deviceSettings {
		defaults = append(defaults, struct{ setting, key, value string }{k, "parallel." + k, s.Device[k]})
	}
	for _, d := range defaults {
		if d.value == "" {
			continue
		}
		from, pos := "SHARDLINE_"+strings.ToUpper(d.setting), config.Pos{}
		if _, ok := env[from]; !ok {
			from, pos = d.setting+" in "+s.file, s.pos[d.setting]
		}
		out = append(out, config.SettingDefault{Key: d.key, Value: d.value, From: from, Pos: pos})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}
