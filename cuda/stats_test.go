package cuda

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/shardline/shardline/tensor"
)

// TestStatLayout: the statistics layout kernels.cu's STAT_ constants spell out
// is tensor's (the Stat constants), so the device's step kernels read and write
// the slots the trainer reads back. Runs without a GPU.
func TestStatLayout(t *testing.T) {
	src, err := os.ReadFile("kernels/kernels.cu")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{"STAT_LOSS": tensor.StatLoss, "STAT_TOKENS": tensor.StatTokens, "STAT_SUMSQ": tensor.StatSumSq,
		"STAT_EXPERT_SUMSQ": tensor.StatExpertSumSq, "STAT_NORM": tensor.StatNorm, "STAT_CLIP": tensor.StatClip,
		"STAT_APPLIED": tensor.StatApplied, "STAT_OPT_STEPS": tensor.StatOptSteps} {
		if line := fmt.Sprintf("#define %s %d\n", name, want); !strings.Contains(string(src), line) {
			t.Errorf("kernels.cu does not define %s as %d (tensor's layout)", name, want)
		}
	}
}
