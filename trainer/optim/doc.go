// Package optim holds the learning-rate schedule and gradient-norm clipping. The
// update rules themselves (AdamW, SGD) are backend kernels (tensor.Kernels), so a
// GPU backend runs them where the parameters live.
//
// It imports nothing from shardline.
package optim
