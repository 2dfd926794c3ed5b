package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"testing"
)

// TestPTXMatchesSource: the committed PTX was made from the committed kernels.cu
// (`make ptx` records the source's digest beside it). Runs without a GPU.
func TestPTXMatchesSource(t *testing.T) {
	src, err := os.ReadFile("kernels/kernels.cu")
	if err != nil {
		t.Fatal(err)
	}
	rec, err := os.ReadFile("kernels/kernels.cu.sha256")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(src)
	if got := strings.Fields(string(rec)); len(got) == 0 || got[0] != hex.EncodeToString(sum[:]) {
		t.Fatalf("cuda/kernels/kernels.cu changed since its PTX was made: run `make ptx` and commit kernels.ptx and kernels.cu.sha256")
	}
	ptx, err := os.ReadFile("kernels/kernels.ptx")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{".target sm_80", ".entry flash_fwd_tc_64", ".entry flash_bwd_dkdv_tc_128", ".entry adamw"} {
		if !strings.Contains(string(ptx), want) {
			t.Errorf("kernels.ptx lacks %q", want)
		}
	}
}
