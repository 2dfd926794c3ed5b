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
	add(r.Precision.FP8On(), "precision.fp8.format", "FP8 compute is not built yet: the engine computes the linear layers in bf16 or fp32, and the plan counts them so (package tensor has the FP8 formats, casts and scaling the engine will use; docs/engine.md, \"FP8\")", `set format = "none" under [precision.fp8] (precision.bf16 = true is the nearest)`)
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
