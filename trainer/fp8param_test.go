package trainer

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFP8ParamGatherExplore(t *testing.T) {
	base := []string{"train.steps=8", "train.micro_batch_size=1", "train.global_batch_size=8", "train.eval_interval=0", "train.warmup_steps=2", "logging.sample_tokens=0"}
	base = append(base, fp8Sets...)
	ref, _ := tinyRun(t, append(base, "parallel.world_size=1")...)
	refLoss, _ := trained(t, ref)
	for _, n := range []int{1, 2, 4} {
		for _, strat := range []string{"optim", "optim_grads", "optim_grads_params"} {
			res, _ := tinyRun(t, append(base, fmt.Sprintf("parallel.world_size=%d", n), "fsdp.data_parallel_sharding_strategy="+strat, "precision.fp8.param_gather=true")...)
			l, _ := trained(t, res)
			require.Len(t, l, 8)
			t.Logf("n=%d %s: %.3g rel vs fp8 without param_gather; %v", n, strat, maxRelDiff(refLoss, l), l[7])
		}
	}
	t.Logf("ref %v", refLoss)
}
