package trainer

import (
	"context"
	"sync"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStepReadsNothingBack: a training step (micro-batches forward and backward,
// gradient reduction, norm, clipping, optimizer) reads no buffer of the
// backend's back to the host, under every sharding strategy and bf16, tensor,
// context and expert parallelism, in process and over TCP: the loss and token
// sums, the norm, the clip factor and whether the update applies stay in the
// backend's statistics buffer, counted through the backend's memory
// (tensor.Memory.Readbacks). MoE layers route on the backend too: the kept
// copies, the experts' segments, the aux loss and the dropped copies never come
// back, with or without a capacity factor. The one exception is declared and
// counted: dropless expert parallelism's all-to-all takes its split sizes from
// the host, one synchronisation per MoE layer and forward (twice under full
// recompute, which runs the layer's forward again); with a capacity factor the
// segments are padded and the splits static, so there is none.
func TestStepReadsNothingBack(t *testing.T) {
	base := []string{"train.micro_batch_size=2", "train.global_batch_size=8", "parallel.world_size=2"}
	moe := []string{"model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.expert_ffn_hidden=32"}
	cases := []struct {
		name    string
		sets    []string
		overTCP bool
		syncs   int // per step and rank: MoE layers × micro-batches × forwards
	}{
		{"optim_grads_params", []string{"fsdp.data_parallel_sharding_strategy=optim_grads_params"}, false, 0},
		{"optim_grads", []string{"fsdp.data_parallel_sharding_strategy=optim_grads"}, false, 0},
		{"optim", []string{"fsdp.data_parallel_sharding_strategy=optim"}, false, 0},
		{"no_shard", []string{"fsdp.data_parallel_sharding_strategy=no_shard"}, false, 0},
		{"bf16", []string{"precision.bf16=true", "fsdp.grad_reduce_in_bf16=true"}, false, 0},
		{"tp2", []string{"parallel.tensor_parallel=2"}, false, 0},
		{"cp2", []string{"parallel.context_parallel=2"}, false, 0},
		{"tcp no_shard", []string{"fsdp.data_parallel_sharding_strategy=no_shard"}, true, 0},
		// FP8: current scaling's amaxes and scales, and delayed scaling's step
		// (the ranks' amaxes gathered, the scales made) stay on the backend.
		{"fp8", fp8Sets, false, 0},
		{"fp8 delayed over tcp", fp8DelayedSets, true, 0},
		// 2 MoE layers; 8 sequences over 2 ranks of 2 per micro-batch: 2 micro-batches.
		{"moe-ep2", append([]string{"parallel.expert_parallel=2"}, moe...), false, 2 * 2},
		{"moe-ep2 full recompute", append([]string{"parallel.expert_parallel=2", "activation_checkpoint.mode=full"}, moe...), false, 2 * 2 * 2},
		{"moe one rank", append([]string{"parallel.world_size=1", "train.global_batch_size=4"}, moe...), false, 0},
		{"moe capacity", append([]string{"model.moe.capacity_factor=1.0"}, moe...), false, 0},
		// A capacity factor pads the experts' segments: the exchange's splits are
		// static, and expert parallelism reads nothing back either.
		{"moe-ep2 capacity", append([]string{"parallel.expert_parallel=2", "model.moe.capacity_factor=1.25"}, moe...), false, 0},
		{"tcp moe-ep2 capacity full recompute", append([]string{"parallel.expert_parallel=2", "model.moe.capacity_factor=1.0",
			"activation_checkpoint.mode=full"}, moe...), true, 0},
		{"moe tp2 cp2 full recompute", append([]string{"parallel.world_size=4", "train.global_batch_size=4", "parallel.tensor_parallel=2",
			"parallel.context_parallel=2", "activation_checkpoint.mode=full"}, moe...), false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, dir := tinyRun(t, append(append([]string{}, base...), c.sets...)...)
			step, runs := rankSteps(t, res, dir, c.overTCP)
			step() // the first step may set things up
			before := make([]int64, len(runs))
			for i, r := range runs {
				before[i] = r.st.mem.Readbacks()
			}
			const steps = 3
			for range steps {
				step()
			}
			for i, r := range runs {
				assert.Equal(t, int64(steps*c.syncs), r.st.mem.Readbacks()-before[i], "rank %d: read-backs in %d steps", i, steps)
			}
		})
	}
}

// countingBackend is the CPU backend, keeping every memory it makes so that a
// test can count their read-backs.
type countingBackend struct {
	cpu.Backend
	mu   sync.Mutex
	mems []tensor.Memory
}

func (b *countingBackend) NewMemory() tensor.Memory {
	m := b.Backend.NewMemory()
	b.mu.Lock()
	b.mems = append(b.mems, m)
	b.mu.Unlock()
	return m
}

// TestRunReadsBackOncePerLoggingInterval: a whole run reads the step statistics
// back once per logging interval (and at the last step), plus once per
// evaluation, and records every step's loss all the same; on two ranks each rank
// reads back as often.
func TestRunReadsBackOncePerLoggingInterval(t *testing.T) {
	for _, c := range []struct {
		name               string
		sets               []string
		readbacks, records int
	}{
		// 10 steps at interval 4: steps 4, 8 and 10; the final evaluation.
		{"interval 4", []string{"logging.interval=4", "train.steps=10", "train.eval_interval=0"}, 3 + 1, 10},
		// interval 5 and evaluation at step 5: steps 5 and 10 (which is evaluated too),
		// and two evaluations.
		{"interval 5 eval 5", []string{"logging.interval=5", "train.steps=10", "train.eval_interval=5"}, 2 + 2, 10},
		{"interval 1", []string{"logging.interval=1", "train.steps=6", "train.eval_interval=0"}, 6 + 1, 6},
		{"two ranks", []string{"logging.interval=4", "train.steps=10", "train.eval_interval=0", "parallel.world_size=2"}, 3 + 1, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, _ := tinyRun(t, c.sets...)
			be := &countingBackend{}
			o := opts()
			o.Backend = be
			out, err := Run(context.Background(), res, o)
			require.NoError(t, err)
			require.Equal(t, c.records, out.Steps)
			// The ranks' memories come first (made as each rank opens its state).
			world := res.Recipe.Parallel.WorldSize
			require.GreaterOrEqual(t, len(be.mems), world)
			for i, m := range be.mems[:world] {
				assert.Equal(t, int64(c.readbacks), m.Readbacks(), "rank %d", i)
			}
		})
	}
}

// TestStateLivesInBackendMemory: a rank's weights, main weights, gradients,
// optimizer state, the FSDP runtime's unit-buffer arenas, the gradient
// reduction's staging and the model's
// activations, logits, scratch and dispatch buffers are allocated in its
// backend memory before the first step, and nothing else is, beside the step
// statistics and the MoE sums: the memory's held bytes equal those components
// (what run.json reports and the plan predicts) plus those small buffers,
// under every sharding strategy, in fp32 and bf16, with expert parallelism;
// and training steps allocate nothing more there (dropless expert parallelism
// may grow its exchange buffers, replacing them: the sum still holds).
func TestStateLivesInBackendMemory(t *testing.T) {
	base := []string{"train.micro_batch_size=2", "train.global_batch_size=8", "parallel.world_size=2", "logging.interval=7"}
	moe := []string{"model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.expert_ffn_hidden=32"}
	for name, sets := range map[string][]string{
		"optim_grads_params":      {"fsdp.data_parallel_sharding_strategy=optim_grads_params"},
		"optim_grads":             {"fsdp.data_parallel_sharding_strategy=optim_grads"},
		"optim":                   {"fsdp.data_parallel_sharding_strategy=optim"},
		"no_shard":                {"fsdp.data_parallel_sharding_strategy=no_shard"},
		"bf16 optim_grads_params": {"precision.bf16=true", "fsdp.data_parallel_sharding_strategy=optim_grads_params"},
		"bf16 optim":              {"precision.bf16=true", "fsdp.data_parallel_sharding_strategy=optim"},
		"bf16 reduce":             {"precision.bf16=true", "fsdp.grad_reduce_in_bf16=true"},
		"bf16 reduce no_shard":    {"precision.bf16=true", "fsdp.grad_reduce_in_bf16=true", "fsdp.data_parallel_sharding_strategy=no_shard"},
		"fp8":                     fp8Sets,
		"fp8 delayed":             fp8DelayedSets,
		"moe-ep2":                 append([]string{"parallel.expert_parallel=2"}, moe...),
		"moe-ep2 capacity":        append([]string{"parallel.expert_parallel=2", "model.moe.capacity_factor=1.0"}, moe...),
	} {
		t.Run(name, func(t *testing.T) {
			res, dir := tinyRun(t, append(append([]string{}, base...), sets...)...)
			step, runs := rankSteps(t, res, dir, false)
			step()
			dropless := res.Recipe.Parallel.ExpertParallel > 1 && res.Recipe.Model.MoE.CapacityFactor == 0
			for i, r := range runs {
				components := func() int64 {
					w, main, g, o := r.st.bytes()
					w += r.st.stageBytes() // the gradient reduction's staging
					if r.rt != nil {       // the unit runtime's arenas (no buffer was made apart here)
						gathered, reduce := r.rt.memory()
						w += gathered + reduce
					}
					act, logits := r.m.ActivationBytes()
					return w + main + g + o + act + logits + r.m.ScratchBytes() + r.m.DispatchBytes()
				}
				small := smallBuffers(r.r)
				mem := r.st.mem.(*cpu.Memory)
				held := mem.Held()
				assert.Equal(t, components()+small, held, "rank %d", i)
				step()
				assert.Equal(t, components()+small, mem.Held(), "rank %d after a step", i)
				if !dropless {
					assert.Equal(t, held, mem.Held(), "rank %d: a step allocated backend memory", i)
				}
			}
		})
	}
}

// TestScratchFollowsThePlan: the CPU engine's scratch (backward's work buffers,
// tensor and context parallelism's gather and ring buffers, the MoE gradients'
// buffers, the RoPE tables), which both the plan and run.json once left out
// (17 MiB beside tiny's 88 MiB), is what the plan predicts, to the byte: dense,
// GQA, tp, cp, tp×cp, MoE dropless and with a capacity factor (padded under
// expert parallelism), shared experts, bf16 and full recompute.
func TestScratchFollowsThePlan(t *testing.T) {
	base := []string{"train.steps=1", "train.eval_interval=0", "train.micro_batch_size=2", "train.global_batch_size=8"}
	moe := []string{"model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.expert_ffn_hidden=32"}
	for name, sets := range map[string][]string{
		"dense":               nil,
		"gqa":                 {"model.heads=4", "model.kv_heads=2"},
		"tp2":                 {"parallel.world_size=2", "parallel.tensor_parallel=2"},
		"cp2":                 {"parallel.world_size=2", "parallel.context_parallel=2"},
		"tp2 cp2":             {"parallel.world_size=4", "parallel.tensor_parallel=2", "parallel.context_parallel=2", "train.global_batch_size=4"},
		"bf16 full recompute": {"precision.bf16=true", "activation_checkpoint.mode=full"},
		"moe":                 moe,
		"moe capacity":        append([]string{"model.moe.capacity_factor=1.25"}, moe...),
		"moe shared tp2":      append([]string{"model.moe.shared_experts=1", "parallel.world_size=2", "parallel.tensor_parallel=2"}, moe...),
		"moe ep2 capacity":    append([]string{"parallel.world_size=2", "parallel.expert_parallel=2", "model.moe.capacity_factor=1.0"}, moe...),
		"moe ep2 cp2":         append([]string{"parallel.world_size=2", "parallel.expert_parallel=2", "parallel.context_parallel=2", "model.moe.capacity_factor=1.0", "train.global_batch_size=4"}, moe...),
		// QK-norm, NoPE, an expert bias and the token scaled before its expert
		// (the biases' loads, the bias read in F, the unit gates, QK-norm's
		// input gradient and, under tp, its gains' gradient).
		"router":                      append([]string{"model.qk_norm=true", "model.nope_interval=2", "model.moe.expert_bias=true", "model.moe.score_before_expert=true", "model.moe.score_function=sigmoid"}, moe...),
		"router tp2":                  append([]string{"model.qk_norm=true", "model.moe.expert_bias=true", "model.moe.score_before_expert=true", "parallel.world_size=2", "parallel.tensor_parallel=2"}, moe...),
		"qk-norm bf16 full recompute": {"model.qk_norm=true", "precision.bf16=true", "activation_checkpoint.mode=full"},
		// FP8: the shared input, weight and gradient copies with their
		// scales; MoE layers' attention alone, the first layer in bf16.
		"fp8 hybrid": fp8Sets,
		// Delayed scaling's state: each tensor's step amax, scale and
		// history, and the ranks' gathered amaxes.
		"fp8 delayed 2 ranks": append([]string{"parallel.world_size=2"}, fp8DelayedSets...),
		// bf16 weight gradients: nothing more held (they read the stores).
		"fp8 bf16 wgrad full recompute": append([]string{"activation_checkpoint.mode=full", "precision.fp8.wgrad=false"}, fp8Sets...),
		// The MoE router in FP8: its weight and logits' gradient copies
		// (128 experts: the widest FP8 weight and gradient in this model).
		"fp8 router moe": append([]string{"precision.bf16=true", "precision.fp8.format=hybrid", "precision.fp8.recipe=tensorwise", "precision.fp8.experts=false",
			"precision.fp8.router_bf16=false", "model.moe.num_experts=128"}, moe[1:]...),
		"fp8 delayed moe": append([]string{"precision.bf16=true", "precision.fp8.format=e4m3", "precision.fp8.recipe=delayed", "precision.fp8.amax_history_len=16",
			"precision.fp8.experts=false", "precision.fp8.router_bf16=false"}, moe...),
		"fp8 e4m3 moe full recompute": append([]string{"precision.bf16=true", "precision.fp8.format=e4m3", "precision.fp8.recipe=tensorwise",
			"precision.fp8.experts=false", "precision.fp8.first_last_layers_bf16=true", "precision.fp8.layers_at_end_in_bf16=0",
			"activation_checkpoint.mode=full"}, moe...),
		// FP8 experts: the copies sized for the permuted rows and every
		// local expert's weight, one weight scale inverse per expert;
		// packed with copies dropped past capacity (one rank), padded
		// under expert parallelism, with a shared expert.
		"fp8 moe experts shared capacity": append([]string{"model.moe.shared_experts=1", "model.moe.capacity_factor=1.0"}, append(moe, fp8Sets...)...),
		"fp8 moe experts ep2 capacity":    append([]string{"parallel.world_size=2", "parallel.expert_parallel=2", "model.moe.capacity_factor=1.0"}, append(moe, fp8Sets...)...),
	} {
		t.Run(name, func(t *testing.T) {
			res, _ := tinyRun(t, append(append([]string{}, base...), sets...)...)
			out, err := Run(context.Background(), res, opts())
			require.NoError(t, err)
			require.Positive(t, out.Predicted.Scratch)
			assert.Equal(t, out.Predicted.Scratch, out.Held.Scratch, "scratch: plan %d, held %d", out.Predicted.Scratch, out.Held.Scratch)
			assert.Equal(t, out.Predicted.Total, out.Held.Total-out.Held.Activations+out.Predicted.Activations-out.Held.GatheredUnits+out.Predicted.GatheredUnits-
				out.Held.GradReduceBuffers+out.Predicted.GradReduceBuffers-out.Held.MoEDispatch+out.Predicted.MoEDispatch, "the totals differ only where the components do")
		})
	}
}

// smallBuffers is what a rank's backend memory holds beside the plan's
// components: the step statistics and their f32 wire, the tp-discard and
// evaluation loss sums, the statistics of a logging interval, and an MoE
// model's sums and router statistics.
func smallBuffers(r *config.Recipe) int64 {
	small := int64(tensor.NumStats*8+4*4) + // the step statistics and their f32 wire
		2*8 + // the tp-discard and evaluation loss sums
		int64(historyRows(r)*tensor.NumStats*8) // the statistics of a logging interval
	if mo := r.Model; mo.MoE.NumExperts > 0 {
		small += 2 * 8 // the model's MoE sums
		// each MoE layer's router statistics (RouterStats: 2E values, f32)
		small += int64(mo.Layers * 2 * mo.MoE.NumExperts * 4)
	}
	return small
}
