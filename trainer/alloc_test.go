package trainer

import (
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/internal/allocs"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/stretchr/testify/require"
)

// TestMultiRankStepAllocatesNothing: whole training steps on in-process ranks
// (micro-batches forward and backward through the FSDP runtime, the gradient
// reduction, the norm, clipping and AdamW) allocate nothing in the steady state,
// under every sharding strategy, with and without overlap and the double buffer,
// in bf16 with bf16 reduction, and under expert, tensor and context parallelism.
// Recording a step's metrics (rank 0's JSON line) is outside the step.
func TestMultiRankStepAllocatesNothing(t *testing.T) {
	base := []string{"train.micro_batch_size=2", "train.global_batch_size=8", "parallel.world_size=2"}
	moe := []string{"model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.expert_ffn_hidden=32"}
	cases := map[string][]string{
		"optim_grads_params":         {"fsdp.data_parallel_sharding_strategy=optim_grads_params"},
		"optim_grads_params-nolap":   {"fsdp.data_parallel_sharding_strategy=optim_grads_params", "fsdp.overlap_grad_reduce=false", "fsdp.overlap_param_gather=false"},
		"optim_grads_params-double":  {"fsdp.data_parallel_sharding_strategy=optim_grads_params", "fsdp.fsdp_double_buffer=true"},
		"optim_grads":                {"fsdp.data_parallel_sharding_strategy=optim_grads"},
		"optim":                      {"fsdp.data_parallel_sharding_strategy=optim"},
		"no_shard":                   {"fsdp.data_parallel_sharding_strategy=no_shard"},
		"bf16":                       {"precision.bf16=true", "fsdp.grad_reduce_in_bf16=true"},
		"moe-ep2":                    append([]string{"parallel.expert_parallel=2"}, moe...),
		"tp2":                        {"parallel.tensor_parallel=2"},
		"cp2":                        {"parallel.context_parallel=2"},
		"optim_grads_params-4-ranks": {"parallel.world_size=4", "train.global_batch_size=16"},
	}
	for name, sets := range cases {
		t.Run(name, func(t *testing.T) {
			res, dir := tinyRun(t, append(append([]string{}, base...), sets...)...)
			allocs.AssertSteady(t, rankSteps(t, res, dir))
		})
	}
}

// rankSteps sets up every rank of res's plan in process, each a goroutine that
// lives through the test, and returns a function that runs one training step on
// all of them (gradStep and update, as the training loop does).
func rankSteps(t *testing.T, res *config.Resolved, dir string) func() {
	t.Helper()
	r := &res.Recipe
	topo, err := parallel.TopologyOf(r.Parallel)
	require.NoError(t, err)
	plan, err := parallel.Compile(r, topo)
	require.NoError(t, err)
	ds, err := openData(r, opts())
	require.NoError(t, err)
	n := plan.Mesh.World
	world := comm.NewWorld(n, time.Minute)
	groups := inProcessGroups(world, plan)
	start, done := make([]chan int, n), make(chan error, n)
	var ready sync.WaitGroup
	ready.Add(n)
	setupErr := make([]error, n)
	for rank := range n {
		start[rank] = make(chan int)
		go func() {
			tr := &run{r: r, res: res, opts: opts(), plan: plan, ds: ds, dir: dir, log: zerolog.Nop(), rank: rank}
			_, _, err := tr.openState(world.Rank(rank), groups)
			if err == nil {
				err = tr.openModel(0)
			}
			setupErr[rank] = err
			ready.Done()
			defer tr.closeModel()
			for step := range start[rank] {
				_, _, _, norm, err := tr.gradStep(step)
				if err == nil {
					err = tr.update(norm, r.Train.LR, step+1)
				}
				done <- err
			}
		}()
	}
	ready.Wait()
	t.Cleanup(func() {
		for _, c := range start {
			close(c)
		}
	})
	for _, err := range setupErr {
		require.NoError(t, err)
	}
	step := 0
	return func() {
		for _, c := range start {
			c <- step
		}
		for range n {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		step++
	}
}
