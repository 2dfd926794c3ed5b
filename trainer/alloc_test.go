package trainer

import (
	"net"
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
// in bf16 (bf16 storage gathered in bf16) with and without bf16 reduction, and
// under expert, tensor and context parallelism.
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
		"bf16-optim":                 {"precision.bf16=true", "fsdp.data_parallel_sharding_strategy=optim"},
		"bf16-moe-ep2":               append([]string{"parallel.expert_parallel=2", "precision.bf16=true"}, moe...),
		"moe-ep2":                    append([]string{"parallel.expert_parallel=2"}, moe...),
		"tp2":                        {"parallel.tensor_parallel=2"},
		"cp2":                        {"parallel.context_parallel=2"},
		"optim_grads_params-4-ranks": {"parallel.world_size=4", "train.global_batch_size=16"},
	}
	for name, sets := range cases {
		t.Run(name, func(t *testing.T) {
			res, dir := tinyRun(t, append(append([]string{}, base...), sets...)...)
			step, _ := rankSteps(t, res, dir, false)
			allocs.AssertSteady(t, step)
		})
	}
	// Ranks joined over TCP (loopback), as shardline launch joins processes.
	for name, sets := range map[string][]string{
		"tcp optim_grads_params":      nil,
		"tcp optim_grads_params bf16": {"precision.bf16=true"},
		"tcp no_shard bf16":           {"fsdp.data_parallel_sharding_strategy=no_shard", "precision.bf16=true", "fsdp.grad_reduce_in_bf16=true"},
		"tcp optim_grads ep2 tp2":     append([]string{"fsdp.data_parallel_sharding_strategy=optim_grads", "parallel.world_size=4", "train.global_batch_size=4", "train.micro_batch_size=2", "parallel.tensor_parallel=2"}, append([]string{"parallel.expert_parallel=2"}, moe...)...),
	} {
		t.Run(name, func(t *testing.T) {
			res, dir := tinyRun(t, append(append([]string{}, base...), sets...)...)
			step, _ := rankSteps(t, res, dir, true)
			allocs.AssertSteady(t, step)
		})
	}
}

// rankSteps sets up every rank of res's plan, each a goroutine that lives
// through the test, joined in process or (overTCP) by TCP over loopback, and
// returns a function that runs one training step on all of them (gradStep and
// update, as the training loop does), and the ranks.
func rankSteps(t *testing.T, res *config.Resolved, dir string, overTCP bool) (func(), []*run) {
	t.Helper()
	return rankStepsWith(t, res, dir, overTCP, opts())
}

// rankStepsWith is rankSteps with the ranks' options (their backend).
func rankStepsWith(t testing.TB, res *config.Resolved, dir string, overTCP bool, o Options) (func(), []*run) {
	t.Helper()
	r := &res.Recipe
	topo, err := parallel.TopologyOf(r.Parallel, nil)
	require.NoError(t, err)
	plan, err := parallel.Compile(r, topo)
	require.NoError(t, err)
	ds, err := openData(r, o)
	require.NoError(t, err)
	n := plan.Mesh.World
	world := comm.NewWorld(n, time.Minute)
	groups := inProcessGroups(world, plan)
	worldOf := func(rank int) (comm.Communicator, groupsFor, error) { return world.Rank(rank), groups, nil }
	if overTCP {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		worldOf = func(rank int) (comm.Communicator, groupsFor, error) {
			cfg := comm.TCPConfig{Rank: rank, World: n, MasterAddr: ln.Addr().String(), Token: "alloc-test", Timeout: time.Minute}
			if rank == 0 {
				cfg.Listener = ln
			}
			c, err := comm.DialTCP(cfg)
			if err != nil {
				return nil, nil, err
			}
			t.Cleanup(func() { c.Close() })
			return c, processGroups(plan, c), nil
		}
	}
	start, done, runs := make([]chan int, n), make(chan error, n), make([]*run, n)
	var ready sync.WaitGroup
	ready.Add(n)
	setupErr := make([]error, n)
	for rank := range n {
		start[rank] = make(chan int)
		go func() {
			tr := &run{r: r, res: res, opts: o, plan: plan, ds: ds, dir: dir, log: zerolog.Nop(), rank: rank}
			runs[rank] = tr
			err := tr.rankBackend()
			defer tr.releaseBackend()
			var w comm.Communicator
			var g groupsFor
			if err == nil {
				w, g, err = worldOf(rank)
			}
			if err == nil {
				_, _, err = tr.openState(w, g)
			}
			if err == nil {
				err = tr.openModel(0)
			}
			setupErr[rank] = err
			ready.Done()
			defer tr.closeModel()
			for step := range start[rank] {
				err := tr.gradStep(step)
				if err == nil {
					err = tr.update(r.Train.LR)
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
	}, runs
}
