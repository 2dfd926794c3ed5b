// Package optim holds the optimizer (AdamW with decoupled weight decay, or SGD with
// momentum), the learning-rate schedule, and gradient-norm clipping. Each works on
// flat float32 slices, so the same code updates a whole model or one rank's shard.
//
// It imports nothing from shardline.
package optim
