package shardline

import (
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const module = "github.com/shardline/shardline"

// allowedImports lists, for every package, the shardline packages it may import.
// Imports point down: cmd at the top, config and the leaf packages at the bottom.
// A new package must be added here, which is the moment to decide its place.
var allowedImports = map[string][]string{
	".":                   {},
	"config":              {"fileio", "trainer/tokenizer"}, // lint reads a tokenizer file's vocabulary
	"fileio":              {},
	"recipes":             {},
	"parallel":            {"config"},
	"parallel/comm":       {},
	"parallel/collective": {"parallel/comm", "tensor"},
	"tensor":              {},
	"internal/allocs":     {},
	"tensor/cpu":          {"tensor"},
	"tensor/memtest":      {"tensor"},
	"tensor/kerneltest":   {"tensor", "tensor/cpu"},
	"trainer/model":       {"config", "parallel", "tensor"},
	"trainer/tokenizer":   {"fileio"},
	"trainer/data":        {"fileio", "trainer/tokenizer"},
	"trainer/optim":       {},
	"trainer/ckpt":        {"fileio"},
	"trainer/hf":          {"config", "fileio"},
	"trainer/tensorboard": {},
	"cuda":                {"parallel/collective", "parallel/comm", "tensor"}, // the collectives are leaves: NCCL takes their place
	"trainer":             {"config", "fileio", "trainer/ckpt", "trainer/hf", "parallel", "parallel/collective", "parallel/comm", "tensor", "trainer/data", "trainer/model", "trainer/optim", "trainer/tensorboard", "trainer/tokenizer"},
	"cmd/shardline":       {"*"},
	"scripts/gpt2vocab":   {},
}

// walkPackageDirs calls fn for every directory of the module that may hold a
// package (hidden directories, testdata and bin are skipped).
func walkPackageDirs(t *testing.T, fn func(path string) error) {
	t.Helper()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		return fn(path)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestImportsPointDown(t *testing.T) {
	walkPackageDirs(t, func(path string) error {
		// With the cuda tag, so the GPU backend's files are held to the same rule.
		ctx := build.Default
		ctx.BuildTags = append(ctx.BuildTags, "cuda")
		pkg, err := ctx.ImportDir(path, 0)
		if err != nil {
			if _, ok := err.(*build.NoGoError); ok {
				return nil
			}
			t.Errorf("%s: %v", path, err)
			return nil
		}
		rel := filepath.ToSlash(path)
		allowed, known := allowedImports[rel]
		if !known {
			t.Errorf("package %s is not in allowedImports: add it with the shardline packages it may import", rel)
			return nil
		}
		for _, imp := range pkg.Imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			target := strings.TrimPrefix(imp, module+"/")
			ok := false
			for _, a := range allowed {
				ok = ok || a == "*" || a == target
			}
			if !ok {
				t.Errorf("%s imports %s, which points up or sideways; allowed: %v", rel, target, allowed)
			}
		}
		if _, err := os.Stat(filepath.Join(path, "doc.go")); err != nil {
			t.Errorf("package %s has no doc.go saying what it owns and must not import", rel)
		}
		return nil
	})
}

// TestNoGPULibraryWithoutTag: gorgonia.org/cu exits the process at start-up where
// there is no GPU, so no package may import it without the cuda build tag (the
// shardline binary that lints, plans and launches must start anywhere).
func TestNoGPULibraryWithoutTag(t *testing.T) {
	walkPackageDirs(t, func(path string) error {
		pkg, err := build.ImportDir(path, 0)
		if err != nil {
			return nil
		}
		for _, imp := range append(pkg.Imports, pkg.TestImports...) {
			if strings.HasPrefix(imp, "gorgonia.org/cu") {
				t.Errorf("%s imports %s without the cuda build tag: put the file behind //go:build cuda", path, imp)
			}
		}
		return nil
	})
}

// TestMakefileFuzzesEveryTarget: every fuzz target in the module is in the
// Makefile's FUZZ_TARGETS, so `make fuzz` and CI run it.
func TestMakefileFuzzesEveryTarget(t *testing.T) {
	mk, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	fuzz := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(`)
	found := 0
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range fuzz.FindAllSubmatch(src, -1) {
			found++
			want := "./" + filepath.ToSlash(filepath.Dir(path)) + ":" + string(m[1])
			if !strings.Contains(string(mk), want) {
				t.Errorf("%s defines %s, which FUZZ_TARGETS in the Makefile lacks: add %s", path, m[1], want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Fatal("no fuzz targets found")
	}
}
