package config

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/shardline/shardline/trainer/tokenizer"
)

// ExpandPath expands ${VAR} and $VAR in a recipe path from env (a map of the
// environment). GOROOT, when not set, falls back to the Go installation that built
// shardline, then to `go env GOROOT`, so the default recipe finds Newton's Opticks
// under any Go installation. An unset variable is an error that names it.
func ExpandPath(path string, env map[string]string) (string, error) {
	var missing []string
	out := os.Expand(path, func(name string) string {
		if v, ok := env[name]; ok && v != "" {
			return v
		}
		if name == "GOROOT" {
			if g := goroot(); g != "" {
				return g
			}
		}
		missing = append(missing, name)
		return ""
	})
	if len(missing) > 0 {
		if missing[0] == "GOROOT" {
			return "", fmt.Errorf("${GOROOT} is not set and no Go installation was found (`go env GOROOT` failed)")
		}
		return "", fmt.Errorf("environment variable %s is not set", strings.Join(missing, ", "))
	}
	return out, nil
}

// TokenizerPath is the file a data.tokenizer value names, as the trainer reads
// it: ${VAR} expanded from env, a relative path under dataRoot (when set), as
// for data.path. A built-in tokenizer's name comes back unchanged.
func TokenizerPath(spec string, env map[string]string, dataRoot string) (string, error) {
	if !tokenizer.IsFileSpec(spec) {
		return spec, nil
	}
	path, err := ExpandPath(spec, env)
	if err != nil {
		return "", err
	}
	if dataRoot != "" && !filepath.IsAbs(path) {
		path = filepath.Join(dataRoot, path)
	}
	return path, nil
}

var (
	gorootOnce sync.Once
	gorootDir  string
)

func goroot() string {
	gorootOnce.Do(func() {
		//lint:ignore SA1019 the build-time GOROOT is the cheap first guess; `go env` is the fallback.
		if g := runtime.GOROOT(); g != "" {
			if _, err := os.Stat(g); err == nil {
				gorootDir = g
				return
			}
		}
		if out, err := exec.Command("go", "env", "GOROOT").Output(); err == nil {
			gorootDir = strings.TrimSpace(string(out))
		}
	})
	return gorootDir
}

// CheckRunName says why name cannot name a run directory under output_dir, or
// returns nil: it must be one path element, so that no run writes outside its
// output directory ("../x", "a/b", "/etc" and "." are refused); valid UTF-8
// without control characters or bidirectional controls (U+202E), since the
// name is printed on terminals and in logs; and at most maxRunName bytes, the longest file name Linux and macOS
// file systems take.
func CheckRunName(name string) error {
	switch {
	case name == "":
		return errors.New("it is empty")
	case name == "." || name == "..":
		return fmt.Errorf("%q names a directory, not a run", name)
	case strings.ContainsAny(name, `/\`):
		return errors.New("it holds a path separator")
	case !utf8.ValidString(name):
		return errors.New("it is not valid UTF-8")
	case len(name) > maxRunName:
		return fmt.Errorf("it is %d bytes long, over the %d a file name can have", len(name), maxRunName)
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return fmt.Errorf("it holds the control character %U", r)
		}
		if IsBidiControl(r) {
			return fmt.Errorf("it holds the bidirectional control %U, which reorders the text printed around it", r)
		}
	}
	return nil
}

// maxRunName is NAME_MAX: the most bytes one path element can have on ext4,
// xfs, btrfs and APFS.
const maxRunName = 255

// PathVars lists the variables a recipe path refers to (${NAME} or $NAME), in
// order, each once.
func PathVars(path string) []string {
	var names []string
	os.Expand(path, func(name string) string {
		if name != "" && !slices.Contains(names, name) {
			names = append(names, name)
		}
		return ""
	})
	return names
}

// RedactVars returns text with the value of every variable that path refers to
// written back as ${NAME}: what a message about an expanded path may show. The
// written path is what diagnostics quote; this catches the expansion where it
// reaches a message through another layer (an error from opening the file). A
// value of fewer than minSecret bytes is left: it cannot hide a secret, and
// replacing it would garble the text.
func RedactVars(text, path string, env map[string]string) string {
	for _, name := range PathVars(path) {
		if v := env[name]; len(v) >= minSecret {
			text = strings.ReplaceAll(text, v, "${"+name+"}")
		}
	}
	return text
}

const minSecret = 4
