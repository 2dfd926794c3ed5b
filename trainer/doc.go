// Package trainer runs a compiled plan: it allocates one flat buffer per parameter
// group of the plan (parameters and gradients are views at the plan's offsets),
// initialises each element from (seed, name, index), and drives the training loop
// (gradient accumulation over micro-batches, per-token loss, global-norm clipping,
// AdamW on the main weights, evaluation, metrics, checkpoints of the final weights,
// a loss-curve PNG and a text sample).
//
// # Run directory
//
//	resolved.toml   the recipe with every key explicit, and its fingerprint
//	run.json        fingerprints, seed, version, device, result
//	plan.txt        the compiled plan
//	metrics.jsonl   one object per step: step, loss, lr, grad_norm, tokens_per_s,
//	                val_loss when evaluated; memory at the end
//	run.log         the log, one JSON object per line
//	weights.bin     final weights (see weights.go); tokenizer.json
//	loss.png        the loss curve; sample.txt a text sample
//
// It imports config, parallel, tensor and its own sub-packages.
package trainer
