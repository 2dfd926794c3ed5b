//go:build cudaemu

package trainer

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/cuda"
	"github.com/shardline/shardline/tensor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPlanEqualsHeldOnGPU: every rank of a cuda run holds on its GPU what the
// plan says, component by component and to the byte, on the host emulator:
// at world sizes 1, 2 and 4, under every sharding strategy, dense and MoE (ep
// 2, with a capacity factor), tp 2, cp 2, selective and full recomputation,
// fp32, bf16 and FP8 (with FP8 compute weights too). Each rank opens a device
// of its own (as shardline-cuda's ranks do); the emulator's devices are host
// memory, so the ranks' collectives are staged through the host. The steps
// are dry runs (cuda.Device.SetDryRun): the buffers are allocated and the
// kernels counted, not run, since what a rank holds depends on the shapes
// alone (the capacity factor makes the expert exchange's sizes static too).
func TestPlanEqualsHeldOnGPU(t *testing.T) {
	base := []string{"parallel.device=cuda", "train.micro_batch_size=2", "train.eval_interval=0", "model.seq_len=32"}
	// A capacity factor bounds the expert exchange, whose buffers otherwise
	// grow with the routing (the plan counts the worst routing apart).
	moe := []string{"model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.expert_ffn_hidden=32", "model.moe.capacity_factor=1.0"}
	type tc struct {
		name string
		sets []string
	}
	var cases []tc
	for _, bf16 := range []bool{false, true} {
		prec := []string{fmt.Sprintf("precision.bf16=%v", bf16)}
		if bf16 {
			prec = append(prec, "fsdp.grad_reduce_in_bf16=true")
		}
		for _, n := range []int{1, 2, 4} {
			for _, strat := range []string{"no_shard", "optim", "optim_grads", "optim_grads_params"} {
				cases = append(cases, tc{fmt.Sprintf("bf16=%v/%d/%s", bf16, n, strat), append([]string{fmt.Sprintf("parallel.world_size=%d", n),
					fmt.Sprintf("train.global_batch_size=%d", 2*n), "fsdp.data_parallel_sharding_strategy=" + strat}, prec...)})
			}
		}
		for _, c := range []tc{
			{"full", []string{"parallel.world_size=1", "train.global_batch_size=2", "activation_checkpoint.mode=full"}},
			{"selective", []string{"parallel.world_size=1", "train.global_batch_size=2", "activation_checkpoint.mode=selective"}},
			{"moe ep2 selective", append([]string{"parallel.world_size=2", "train.global_batch_size=4", "parallel.expert_parallel=2", "activation_checkpoint.mode=selective"}, moe...)},
			{"tp2 selective", []string{"parallel.world_size=2", "train.global_batch_size=2", "parallel.tensor_parallel=2", "activation_checkpoint.mode=selective"}},
			{"moe", append([]string{"parallel.world_size=1", "train.global_batch_size=2"}, moe...)},
			{"moe ep2", append([]string{"parallel.world_size=2", "train.global_batch_size=4", "parallel.expert_parallel=2"}, moe...)},
			{"moe ep2 full", append([]string{"parallel.world_size=2", "train.global_batch_size=4", "parallel.expert_parallel=2", "activation_checkpoint.mode=full"}, moe...)},
			{"tp2", []string{"parallel.world_size=2", "train.global_batch_size=2", "parallel.tensor_parallel=2"}},
			{"cp2", []string{"parallel.world_size=2", "train.global_batch_size=2", "parallel.context_parallel=2"}},
			{"cp2 full", []string{"parallel.world_size=2", "train.global_batch_size=2", "parallel.context_parallel=2", "activation_checkpoint.mode=full"}},
		} {
			cases = append(cases, tc{fmt.Sprintf("bf16=%v/%s", bf16, c.name), append(c.sets, prec...)})
		}
	}
	// FP8 compute (its input, weight and gradient copies and their scales,
	// in scratch): a bf16-native dense run, one under full recompute, an
	// MoE run's attention in FP8 beside bf16 experts (the fp32 work set and
	// bf16 stores), tensor and context parallelism (each rank's shares), MoE
	// runs with the experts in FP8, FP8 compute weights, the router in FP8,
	// bf16 weight gradients and delayed scaling over two ranks.
	fp8 := []string{"precision.bf16=true", "fsdp.grad_reduce_in_bf16=true", "precision.fp8.format=hybrid", "precision.fp8.recipe=tensorwise"}
	for _, c := range []tc{
		{"2/optim_grads_params", []string{"parallel.world_size=2", "train.global_batch_size=4", "fsdp.data_parallel_sharding_strategy=optim_grads_params"}},
		{"e4m3 full", []string{"parallel.world_size=1", "train.global_batch_size=2", "activation_checkpoint.mode=full", "precision.fp8.format=e4m3"}},
		{"moe ep2", append([]string{"parallel.world_size=2", "train.global_batch_size=4", "parallel.expert_parallel=2", "precision.fp8.experts=false"}, moe...)},
		{"tp2 cp2", []string{"parallel.world_size=4", "train.global_batch_size=4", "parallel.tensor_parallel=2", "parallel.context_parallel=2"}},
		// The experts in FP8 too: the copies sized for the permuted (or
		// received) rows and every local expert's weight, a weight scale
		// inverse per expert; a shared expert on one rank.
		{"moe experts shared", append([]string{"parallel.world_size=1", "train.global_batch_size=2", "model.moe.shared_experts=1"}, moe...)},
		{"moe ep2 experts", append([]string{"parallel.world_size=2", "train.global_batch_size=4", "parallel.expert_parallel=2"}, moe...)},
		// FP8 compute weights (param_gather): the FP8 shards and their
		// scales in weights, the gathered codes in their own arena.
		{"param_gather 2/optim_grads_params", []string{"parallel.world_size=2", "train.global_batch_size=4", "fsdp.data_parallel_sharding_strategy=optim_grads_params", "precision.fp8.param_gather=true"}},
		{"param_gather 4/optim_grads_params", []string{"parallel.world_size=4", "train.global_batch_size=8", "fsdp.data_parallel_sharding_strategy=optim_grads_params", "precision.fp8.param_gather=true"}},
		{"param_gather 2/optim", []string{"parallel.world_size=2", "train.global_batch_size=4", "fsdp.data_parallel_sharding_strategy=optim", "precision.fp8.param_gather=true"}},
		// Delayed scaling: each tensor's amaxes, scale and history, and the
		// two ranks' gathered amaxes.
		{"moe router", append([]string{"parallel.world_size=1", "train.global_batch_size=2", "precision.fp8.experts=false", "precision.fp8.router_bf16=false",
			"precision.fp8.recipe=delayed"}, moe...)},
		{"bf16 wgrad", []string{"parallel.world_size=1", "train.global_batch_size=2", "precision.fp8.wgrad=false"}},
		{"delayed 2", []string{"parallel.world_size=2", "train.global_batch_size=4", "precision.fp8.recipe=delayed", "precision.fp8.amax_history_len=8", "precision.fp8.amax_compute_algo=max"}},
	} {
		cases = append(cases, tc{"fp8/" + c.name, append(append([]string{}, fp8...), c.sets...)})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, diags := config.Load(filepath.Join("..", "recipes", "tiny.toml"), config.Options{Sets: append(append([]string{
				"run.output_dir=" + t.TempDir()}, base...), c.sets...)})
			require.False(t, diags.HasErrors(), "%v", diags)
			var devs []*cuda.Device
			o := Options{Backend: tensor.Backend(nil), Version: "test", RankBackend: func(rank int) (tensor.Backend, func(), error) {
				d, err := cuda.Open(0)
				if err != nil {
					return nil, nil, err
				}
				if err := d.SetDryRun(true); err != nil {
					d.Close()
					return nil, nil, err
				}
				devs = append(devs, d)
				return d.Kernels(), d.Close, nil
			}}
			step, runs := rankStepsWith(t, res, t.TempDir(), false, o)
			step()
			step()
			for _, d := range devs {
				require.NoError(t, d.Err())
			}
			for rank, r := range runs {
				held, plan := r.held(), r.plan.Memory
				for _, pc := range plan.Components() {
					assert.Equal(t, pc.Bytes, componentOf(held, pc.Name), "rank %d: %s", rank, pc.Name)
				}
			}
		})
	}
}

// componentOf is the trainer's Memory component the plan names name.
func componentOf(m Memory, name string) int64 {
	return map[string]int64{"weights": m.Weights, "main_weights": m.MainWeights, "grads": m.Grads, "optimizer_state": m.OptimizerState,
		"gathered_units": m.GatheredUnits, "grad_reduce_buffers": m.GradReduceBuffers, "activations": m.Activations, "scratch": m.Scratch,
		"moe_dispatch": m.MoEDispatch, "logits": m.Logits}[name]
}
