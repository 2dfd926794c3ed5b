// Package parallel compiles a recipe and a topology into a Plan: the device mesh and
// process groups, the model's parameter table, FSDP units, parameter groups with
// their sharded flat-buffer layouts, the collectives of a step, and a cost model of
// per-rank memory and step time. The trainer executes a Plan without making further
// layout decisions, so the Plan is the single source of truth for layout.
//
// # Mesh
//
// Megatron's order: tp fastest, then cp, then dp, then pp. Within each pipeline
// stage the expert mesh folds the same ranks as etp (fastest), ep, edp. Dense
// parameters shard over the dp×cp group; expert parameters over edp only, so an
// expert weight is never sharded across ranks that hold different experts.
//
// # Strategies (Megatron-FSDP)
//
//	no_shard            weights, grads, optimizer state replicated; grads all-reduced
//	optim               optimizer state and main weights sharded; grads reduce-scattered
//	                    after the last micro-batch; updated weights all-gathered
//	optim_grads         also gradients sharded, reduce-scattered per unit per micro-batch
//	optim_grads_params  also compute weights sharded, all-gathered per unit before
//	                    forward and again before backward, released after use
//
// # Purity
//
// Compile is a pure function of its inputs: no device, no I/O. It imports config only.
package parallel
