package config

import (
	"fmt"
	"slices"
)

// Unexecuted is a setting that lint and plan accept (the plan lays it out, or it
// is a valid Megatron option) but that `shardline run` does not carry out yet. The
// trainer refuses a recipe that sets one rather than accept it and do nothing;
// lint notes each (SL114), so an experiment repository's CI sees it before a run.
type Unexecuted struct {
	Key, Why, Fix string
}

// NotExecuted lists the settings of r that the trainer cannot carry out yet, in a
// fixed order. This table is the one place that says what the trainer lacks.
func NotExecuted(r *Recipe) []Unexecuted {
	var out []Unexecuted
	add := func(set bool, key, why, fix string) {
		if set {
			out = append(out, Unexecuted{Key: key, Why: why, Fix: fix})
		}
	}
	p, c := r.Parallel, r.Checkpoint
	// parallel.device = "cuda" runs in shardline-cuda (docs/cuda.md): the
	// engine the CPU runs (trainer/model and the FSDP runtime) over each rank's
	// GPU, one per GPU (NCCL) or sharing them (staged through the host), which
	// recomputes as on the CPU (full), and whose memory the plan counts.
	gpu := p.Device == "cuda"
	add(gpu && r.Model.Heads > 0 && !slices.Contains([]int{32, 64, 128}, r.Model.HeadSize()), "model.heads", "the GPU attention kernels take head sizes (head_dim, or hidden/heads) of 32, 64 or 128", "choose heads (or head_dim) so that the head size is 32, 64 or 128")
	add(p.ExpertTensorParallel != 1, "parallel.expert_tensor_parallel", "the trainer splits experts over ranks, not within an expert", "set it to 1 and raise parallel.expert_parallel instead")
	add(c.CkptFormat != "fsdp_dtensor" && c.Saves(), "checkpoint.ckpt_format", "shardline writes sharded checkpoints laid out as fsdp_dtensor's (each tensor's pieces at their global offsets); torch_dist and torch files are not written", `set ckpt_format = "fsdp_dtensor"`)
	add(c.KeepLast != 0 && !c.Saves(), "checkpoint.keep_last", "no checkpoints are written (checkpoint.interval and interval_minutes are 0 and checkpoint.dir empty), so there are none to keep", "set checkpoint.interval, or remove keep_last")
	add(r.Train.LRDecaySteps != 0 && r.Train.LRSchedule == "constant", "train.lr_decay_steps", "a constant schedule has no decay to time", `remove lr_decay_steps, or set lr_schedule = "cosine" or "linear"`)
	// FP8 (docs/engine.md, "FP8"): the engine computes the dense layers'
	// linear products in FP8 under per-tensor current scaling (tensorwise)
	// or delayed scaling (delayed), with FP8 weight gradients or bf16 ones
	// (wgrad = false), bf16 compute weights or FP8 ones (param_gather), the
	// MoE experts' products in FP8 or bf16 (experts), the router in bf16 or
	// FP8 (router_bf16), and the head in bf16, beside tensor and context
	// parallelism (each rank scaling what it holds). The rest is refused
	// here.
	f8 := r.Precision.FP8
	fp8 := r.Precision.FP8On()
	add(fp8 && f8.ParamGather && f8.Recipe == "delayed", "precision.fp8.param_gather", "FP8 compute weights (quantised from the main weights after each optimizer step, with each tensor's scale from its whole amax: tensorwise current scaling) are built for recipe \"tensorwise\"; with delayed scaling their scales would come from the weights' amax histories, which are not kept", `set recipe = "tensorwise", or param_gather = false under [precision.fp8]`)
	add(fp8 && !f8.HeadBF16, "precision.fp8.head_bf16", "the output head (its product fused with the loss, a chunk of rows at a time) computes in bf16 only: its output gradient never exists whole, so it has no per-tensor scale", "set head_bf16 = true under [precision.fp8]")
	moe := r.Model.MoE.NumExperts > 0
	add(fp8 && moe && f8.Experts && f8.Recipe == "delayed", "precision.fp8.experts", "the MoE experts' FP8 products scale each expert's weight by its own amax as it is cast (tensorwise current scaling); their delayed scales and amax histories are not kept", `set recipe = "tensorwise", or experts = false under [precision.fp8] (the attention products of MoE layers then compute in FP8 under delayed scaling)`)
	add(r.Precision.MainParamsDtype != "fp32", "precision.main_params_dtype", "the trainer keeps fp32 main weights", `set main_params_dtype = "fp32"`)
	add(r.FSDP.UseNCCLUB && p.Device == "cpu", "fsdp.use_nccl_ub", "NCCL user buffers exist on GPUs only; the CPU trainer has no NCCL", "set use_nccl_ub = false")
	units := r.FSDP.DataParallelShardingStrategy == "optim_grads" || r.FSDP.DataParallelShardingStrategy == "optim_grads_params"
	add(r.FSDP.UseNCCLUB && gpu && (p.WorldSize == 1 || !units), "fsdp.use_nccl_ub",
		"NCCL user buffers hold the FSDP units' gather and gradient arenas, which only optim_grads and optim_grads_params runs of several ranks have (one GPU has no NCCL)",
		`set use_nccl_ub = false, or data_parallel_sharding_strategy = "optim_grads_params" with world_size above 1`)
	add(p.CUDAExpandableSegments && p.Device == "cpu", "parallel.cuda_expandable_segments", "the CUDA allocator setting has no effect on the CPU", "set cuda_expandable_segments = false")
	add(p.CUDAExpandableSegments && gpu, "parallel.cuda_expandable_segments", "shardline's GPU runs allocate every buffer once, before the first step, with no caching allocator whose segments could expand: the setting would change nothing", "set cuda_expandable_segments = false")
	return out
}

// Saves says whether the recipe asks for checkpoints: an interval of steps or
// of minutes, or a directory (Megatron's --save).
func (c Checkpoint) Saves() bool { return c.Interval > 0 || c.IntervalMinutes > 0 || c.Dir != "" }

// unexecuted notes every setting the trainer would refuse.
func (c *checker) unexecuted() {
	hasError := map[string]bool{} // an error on the key already says more
	for _, d := range c.diags {
		hasError[d.Key] = hasError[d.Key] || d.Severity == SevError
	}
	for _, u := range NotExecuted(c.rc) {
		if hasError[u.Key] {
			continue
		}
		v, _ := c.r.Value(u.Key)
		c.report(SevNote, "SL114", fmt.Sprintf("%s (%s): shardline run refuses it: %s", u.Key, FormatValue(v), u.Why),
			u.Fix+"; lint and plan accept it", u.Key)
	}
}
