// Package trainer runs a compiled plan on one or many ranks: ranks are goroutines of
// one process (parallel.world_size, run --nproc) or processes joined over TCP
// (shardline launch). Each rank lays its buffers out by the plan's parameter groups,
// initialises only its own shard from (seed, name, index), and drives the training
// loop (gradient accumulation over micro-batches, per-token loss over the global
// batch, global-norm clipping from shard norms, AdamW or SGD on the fp32 main-weight
// shard, evaluation, metrics, the final weights, a loss-curve PNG and a sample).
// A step's statistics (loss, norm, clip factor, whether its update applies) stay
// in the backend's memory and are read back once per logging interval
// (docs/engine.md, "What a step reads back").
//
// # Strategies (Megatron-FSDP's table, as executed here)
//
//	no_shard            weights, gradients, optimizer state whole on every rank;
//	                    gradients all-reduced after the last micro-batch
//	optim               main weights and optimizer state sharded; gradients whole,
//	                    reduce-scattered after the last micro-batch; updated shards
//	                    all-gathered into the whole compute weights
//	optim_grads         also gradients sharded: each FSDP unit's gradients are
//	                    reduce-scattered as soon as its backward ends, every
//	                    micro-batch; weights gathered after the step
//	optim_grads_params  also compute weights sharded: each unit is all-gathered
//	                    before its forward and again before its backward, and
//	                    released after (fsdp.go)
//
// With overlap_param_gather the next unit's gather runs during the current unit's
// compute; with overlap_grad_reduce a unit's reduce-scatter runs behind the next
// unit's backward, bounded by suggested_communication_unit_size. Under activation
// recompute one gather serves both the recompute and the backward. Gradients are
// held, accumulated and reduced in bf16 with grad_reduce_in_bf16 (as
// Megatron-FSDP's main gradients; each kernel adds in fp32 and rounds once). With
// precision.bf16 the compute weights are stored in bf16 (2 bytes a value), each
// rank rounding its shard of the fp32 main weights after every step; they are
// gathered in bf16 and the kernels read them as such (bf16 buffers): the
// matmuls multiply bf16 pairs where the CPU has AVX-512 BF16, else widen them;
// the model keeps its saved activations in bf16 (model.WithBF16Activations),
// and on GPUs a dense model's activations and their gradients throughout.
//
// # Run directory
//
//	resolved.toml   the recipe with every key explicit, and its fingerprint
//	run.json        fingerprints, seed, version, device, result
//	plan.txt        the compiled plan
//	metrics.jsonl   one object per step: step, loss, lr, grad_norm, tokens_per_s,
//	                measured step time, TFLOP/s and MFU beside the plan's,
//	                memory held beside planned, val_loss when evaluated
//	events.out.tfevents.<time>.<host>
//	                the same scalars as TensorBoard events (logging.tensorboard)
//	run.log         the log, one JSON object per line
//	weights.bin     final weights (see weights.go); tokenizer.json
//	loss.png        the loss curve, redrawn at each evaluation; sample.txt a
//	                text sample
//
// docs/monitoring.md says what the figures are and how to watch them.
//
// It imports config, parallel, tensor and its own sub-packages.
package trainer
