package cpu

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestGeneratedAssembly: the committed micro-kernels are their generators'
// output (gen_kernel.py, gen_dot.py, gen_avx2.py), and the AVX2 twins of the
// AVX-512 element-wise kernels are gen_twin.py's transform of them, so an edit
// made to the assembly by hand, to a generator without regenerating, or to an
// AVX-512 kernel without its twin, is caught.
func TestGeneratedAssembly(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed: the generators cannot run here")
	}
	// Each: the generator and its arguments, then the file it writes.
	for _, g := range [][]string{
		{"gen_kernel.py", "gemm_amd64.s"},
		{"gen_dot.py", "gemmdot_amd64.s"},
		{"gen_avx2.py", "gemm_avx2_amd64.s"},
		{"gen_twin.py", "rows", "rows_avx2_amd64.s"},
		{"gen_twin.py", "adamw", "adamw_avx2_amd64.s"},
	} {
		cmd, out := g[:len(g)-1], g[len(g)-1]
		got, err := exec.Command(py, cmd...).Output()
		if err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
		want, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from %v's output: run python3 %s > %s in tensor/cpu", out, cmd, strings.Join(cmd, " "), out)
		}
	}
}
