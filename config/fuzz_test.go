package config

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// panicIfHung panics, naming the input, if the returned stop is not called within
// 3 s: a fuzz input that hangs the loader is a failure the fuzzer reports, not a
// stalled worker.
func panicIfHung(src []byte) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			panic(fmt.Sprintf("HANG on %q", src))
		}
	}()
	return func() { close(done) }
}

// FuzzLoadLint feeds arbitrary bytes to the loader and linter: nothing may panic,
// and every finding must be positioned (a file position, a flag or a variable) with
// a registered code and a fix. The seed corpus is every recipe shipped and every bad
// recipe in testdata; `make fuzz` runs it for longer.
func FuzzLoadLint(f *testing.F) {
	for _, glob := range []string{"../recipes/*.toml", "../recipes/base/*.toml", "testdata/bad/*.toml"} {
		files, _ := filepath.Glob(glob)
		for _, p := range files {
			if b, err := os.ReadFile(p); err == nil {
				f.Add(b)
			}
		}
	}
	f.Add([]byte("[model]\nmoe = { num_experts = 4, top_k = { a = 1 } }\n"))
	f.Add([]byte("a.b.c = [1, [2, \"x\"], {y = 1}]\n[[x]]\n"))
	f.Add([]byte("[model]\nlayers = 99999999999999999999\n"))
	f.Fuzz(func(t *testing.T, src []byte) {
		defer panicIfHung(src)()
		// A path in a fresh directory: extends may point anywhere, and must not find
		// this recipe's neighbours.
		path := filepath.Join(t.TempDir(), "fuzz.toml")
		res, diags := LoadBytes(path, src, Options{})
		if res != nil && !diags.HasErrors() {
			diags = append(diags, Lint(res, nil)...)
			if _, _, err := ResolvedTOML(&res.Recipe); err != nil {
				t.Fatalf("resolve: %v", err)
			}
		}
		for _, d := range diags {
			if _, ok := RuleFor(d.Code); !ok {
				t.Fatalf("unregistered code %q: %v", d.Code, d)
			}
			if d.Help == "" || d.Message == "" {
				t.Fatalf("finding without message or help: %#v", d)
			}
			if d.Location() == "-" || d.Location() == "" {
				t.Fatalf("finding without a position: %#v", d)
			}
			if d.Origin.Kind == FromFile && d.Origin.Pos.File == path && !d.Origin.Pos.IsValid() {
				t.Fatalf("file finding without line: %#v", d)
			}
		}
	})
}

// FuzzImport feeds arbitrary bytes to both importers (a Megatron-LM launch script
// and a torchtitan job file): nothing may panic or hang, every finding carries a
// registered code, a message and a fix, and a recipe imported without errors
// writes canonical TOML that loads back to itself.
func FuzzImport(f *testing.F) {
	for _, glob := range []string{"testdata/torchtitan/*.toml", "testdata/megatron/*.sh"} {
		files, _ := filepath.Glob(glob)
		for _, p := range files {
			if b, err := os.ReadFile(p); err == nil {
				f.Add(b, strings.HasSuffix(p, ".sh"))
			}
		}
	}
	f.Add([]byte("A=( --num-layers 2 )\npython pretrain_gpt.py \"${A[@]}\" --swiglu ${X:-\"a b\"} \\\n --lr 1e-3\n"), true)
	f.Add([]byte("[parallelism]\ndata_parallel_shard_degree = -1\ntensor_parallel_degree = 9223372036854775807\n"), false)
	f.Fuzz(func(t *testing.T, src []byte, megatron bool) {
		defer panicIfHung(src)()
		var res *Resolved
		var diags Diagnostics
		if megatron {
			res, diags = ImportMegatron("job.sh", src)
		} else {
			res, diags = ImportTorchtitan("job.toml", src, 64)
		}
		for _, d := range diags {
			if _, ok := RuleFor(d.Code); !ok {
				t.Fatalf("unregistered code %q: %v", d.Code, d)
			}
			if d.Help == "" || d.Message == "" {
				t.Fatalf("finding without message or help: %#v", d)
			}
		}
		if res == nil || diags.HasErrors() {
			return
		}
		body, err := AnnotatedTOML(res)
		if err != nil {
			t.Fatalf("annotated TOML: %v", err)
		}
		back, bd := LoadBytes("recipe.toml", body, Options{})
		if bd.HasErrors() || !reflect.DeepEqual(back.Recipe, res.Recipe) {
			t.Fatalf("the written recipe does not load back: %v\n%s", bd, body)
		}
	})
}
