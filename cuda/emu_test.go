package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestKernelsOnTheEmulator builds kernels/emu/engine_test.cc, the engine's
// device kernels compiled for the host under the fiber emulator (emu/emu.h)
// and checked against plain loops, with g++, and runs it. Runs without a GPU;
// needs g++ (make test installs it, and sets SHARDLINE_REQUIRE_EMU so that CI
// fails rather than skips without it).
func TestKernelsOnTheEmulator(t *testing.T) {
	gxx, err := exec.LookPath("g++")
	if err != nil {
		if os.Getenv("SHARDLINE_REQUIRE_EMU") != "" {
			t.Fatal("g++ is needed to run the kernels on the host emulator: apt-get install g++ (make emu-deps)")
		}
		t.Skip("g++ not found: the device kernels' host emulation is not run (apt-get install g++; make test installs it)")
	}
	bin := filepath.Join(t.TempDir(), "engine_test")
	build := exec.Command(gxx, "-std=c++17", "-O1", "-DSHARDLINE_EMU", "-Ikernels", "-Ikernels/emu", "-w", "-o", bin, "kernels/emu/engine_test.cc")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the emulated kernels: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("the emulated kernels: %v", err)
	}
}

// TestLaunchedKernelsExist: every kernel the Go code launches by name (with
// its _f32/_bf16 suffix, or an optimizer's none/_bf16, where the name is
// completed at run time) is an entry
// of the committed PTX, so a misspelt name fails here, not on a GPU.
func TestLaunchedKernelsExist(t *testing.T) {
	ptx, err := os.ReadFile("kernels/kernels.ptx")
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string]bool{}
	for _, m := range regexp.MustCompile(`\.entry (\w+)\(`).FindAllStringSubmatch(string(ptx), -1) {
		entries[m[1]] = true
	}
	files, _ := filepath.Glob("*.go")
	// A suffix by call or by variable (_f32 or _bf16), or gradSuffix's (none or
	// _bf16: an optimizer's gradients).
	launch := regexp.MustCompile(`launch\("(\w+)"(\+(?:suffix\(|s\b|sfx\b|gradSuffix\())?`)
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range launch.FindAllStringSubmatch(string(src), -1) {
			names := []string{m[1]}
			switch {
			case m[2] == "+gradSuffix(":
				names = []string{m[1], m[1] + "_bf16"}
			case m[2] != "":
				names = []string{m[1] + "_f32", m[1] + "_bf16"}
			}
			for _, name := range names {
				n++
				if !entries[name] {
					t.Errorf("%s launches %q, which kernels.ptx has no entry for", f, name)
				}
			}
		}
	}
	if n < 40 {
		t.Errorf("found %d launches by name; the pattern no longer matches the code", n)
	}
	t.Logf("%d kernel names launched", n)
}

// TestEmulatorSources: the host emulator's kernel table lists every kernel of
// the PTX but the tensor-core ones, and cuda/emu.cc records the digest of the
// C++ sources it compiles (kernels.cu, emu.h, the table): cgo's build cache
// keys on the package directory's files only, so a stale digest would leave
// the cudaemu tests running old kernels. make emu-sources writes both.
func TestEmulatorSources(t *testing.T) {
	ptx, err := os.ReadFile("kernels/kernels.ptx")
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	want.WriteString("// The kernels the host emulator runs: every entry of kernels.ptx but the\n// tensor-core ones (TestEmulatorSources checks it; make emu-sources writes it).\n")
	for _, m := range regexp.MustCompile(`\.entry (\w+)\(`).FindAllStringSubmatch(string(ptx), -1) {
		if !strings.Contains(m[1], "_tc_") {
			want.WriteString("K(" + m[1] + ")\n")
		}
	}
	table, err := os.ReadFile("kernels/emu/table.inc")
	if err != nil {
		t.Fatal(err)
	}
	if string(table) != want.String() {
		t.Errorf("kernels/emu/table.inc does not list the PTX's kernels: run make emu-sources")
	}
	h := sha256.New()
	for _, f := range []string{"kernels/kernels.cu", "kernels/emu/emu.h", "kernels/emu/table.inc"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		h.Write(b)
	}
	cc, err := os.ReadFile("emu.cc")
	if err != nil {
		t.Fatal(err)
	}
	if line := "// sources: " + hex.EncodeToString(h.Sum(nil)) + "\n"; !strings.Contains(string(cc), line) {
		t.Errorf("cuda/emu.cc does not record the digest of the emulator's sources: run make emu-sources")
	}
}
