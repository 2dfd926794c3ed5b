package cpu

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// TestGeneratedAssembly: the committed micro-kernels are their generators'
// output (gen_kernel.py, gen_dot.py, gen_avx2.py), so an edit made to the
// assembly by hand, or to a generator without regenerating, is caught.
func TestGeneratedAssembly(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed: the generators cannot run here")
	}
	for gen, out := range map[string]string{"gen_kernel.py": "gemm_amd64.s", "gen_dot.py": "gemmdot_amd64.s", "gen_avx2.py": "gemm_avx2_amd64.s"} {
		got, err := exec.Command(py, gen).Output()
		if err != nil {
			t.Fatalf("%s: %v", gen, err)
		}
		want, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from %s's output: run python3 %s > %s in tensor/cpu", out, gen, gen, out)
		}
	}
}
