package trainer

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/shardline/shardline/trainer/ckpt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// deviceLike is the CPU backend with a memory that is not host memory: only
// tensor.Memory's methods, as a GPU's memory offers, so the trainer takes the
// path it takes on a device (collectives staged through the host, weights
// uploaded after initialisation and read back for the outputs).
type deviceLike struct{ cpu.Backend }

// opaqueMemory hides the CPU memory's host views.
type opaqueMemory struct{ tensor.Memory }

func (deviceLike) NewMemory() tensor.Memory { return opaqueMemory{cpu.NewMemory()} }
func (deviceLike) Name() string             { return "cpu behind an opaque memory" }

// TestDeviceMemoryPath: the FSDP runtime on a memory that is not host memory
// (collective.Staged for every group, the main weights uploaded from the host
// where they are initialised, the compute weights read back for the outputs)
// trains the same bits as on host memory, for every strategy, with bf16
// weights and reduction, for MoE with expert parallelism and for tensor and
// context parallelism: the path ranks that share a GPU take, checked where
// every difference is visible (exact equality, since the staged collectives
// sum in the same order as the in-place ones).
func TestDeviceMemoryPath(t *testing.T) {
	base := []string{"train.steps=4", "train.micro_batch_size=1", "train.global_batch_size=4", "train.eval_interval=2", "train.warmup_steps=1"}
	moe := []string{"model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.expert_ffn_hidden=32"}
	cases := map[string][]string{"one rank": {"parallel.world_size=1"}}
	for _, strat := range []string{"no_shard", "optim", "optim_grads", "optim_grads_params"} {
		cases[strat] = []string{"parallel.world_size=2", "fsdp.data_parallel_sharding_strategy=" + strat}
		cases[strat+" bf16"] = []string{"parallel.world_size=2", "fsdp.data_parallel_sharding_strategy=" + strat, "precision.bf16=true",
			"fsdp.grad_reduce_in_bf16=true"}
	}
	cases["moe ep2"] = append([]string{"parallel.world_size=2", "parallel.expert_parallel=2", "fsdp.data_parallel_sharding_strategy=optim_grads_params"}, moe...)
	cases["tp2"] = []string{"parallel.world_size=2", "parallel.tensor_parallel=2"}
	cases["cp2"] = []string{"parallel.world_size=2", "parallel.context_parallel=2"}
	for name, sets := range cases {
		t.Run(name, func(t *testing.T) {
			res, _ := tinyRun(t, append(append([]string{}, base...), sets...)...)
			hostOut, hostLoss, hostW := trainedWith(t, res, opts())
			o := opts()
			o.Backend = deviceLike{}
			out, l, w := trainedWith(t, res, o)
			assert.Equal(t, hostLoss, l, "losses")
			assert.Equal(t, hostW, w, "final weights")
			require.NotNil(t, out.FinalValLoss)
			assert.Equal(t, *hostOut.FinalValLoss, *out.FinalValLoss, "validation loss")
			hm, dm := finalMetrics(t, hostOut.Dir), finalMetrics(t, out.Dir)
			assert.Equal(t, hm.MemHeld, dm.MemHeld, "memory held")
			assert.Equal(t, hm.MemPlan, dm.MemPlan, "memory planned")
		})
	}
}

// TestDeviceMemoryResume: a run on a memory that is not host memory saves
// checkpoints (read back piece by piece) and resumes from them (written back)
// along the curve, to the final weights, of the host-memory run that was
// never stopped.
func TestDeviceMemoryResume(t *testing.T) {
	sets := []string{"train.steps=6", "train.eval_interval=3", "checkpoint.interval=3", "parallel.world_size=2",
		"fsdp.data_parallel_sharding_strategy=optim_grads_params", "precision.bf16=true"}
	whole, _ := tinyRun(t, sets...)
	ref, err := Run(context.Background(), whole, opts())
	require.NoError(t, err)
	stopped, _ := tinyRun(t, sets...)
	o := opts()
	o.Backend, o.StopAfter = deviceLike{}, 4
	first, err := Run(context.Background(), stopped, o)
	require.NoError(t, err)
	require.True(t, first.Interrupted)
	entries, err := ckpt.List(filepath.Join(first.Dir, "checkpoints"))
	require.NoError(t, err)
	require.NotEmpty(t, entries)
	o = opts()
	o.Backend, o.Resume = deviceLike{}, entries[len(entries)-1].Dir
	again, err := Run(context.Background(), stopped, o)
	require.NoError(t, err)
	assert.Equal(t, curveOf(t, ref.Dir), curveOf(t, again.Dir))
	assert.True(t, bytes.Equal(must(os.ReadFile(filepath.Join(ref.Dir, "weights.bin"))), must(os.ReadFile(filepath.Join(again.Dir, "weights.bin")))), "final weights differ")
}

// finalMetrics is the last line of a run's metrics.jsonl.
func finalMetrics(t *testing.T, dir string) Metrics {
	t.Helper()
	var m Metrics
	lines := bytes.Split(bytes.TrimSpace(must(os.ReadFile(filepath.Join(dir, "metrics.jsonl")))), []byte("\n"))
	require.NoError(t, json.Unmarshal(lines[len(lines)-1], &m))
	return m
}
