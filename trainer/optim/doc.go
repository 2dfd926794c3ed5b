// Package optim holds the learning-rate schedule. The update rules (AdamW, SGD)
// and gradient-norm clipping are backend kernels (tensor.Kernels: CloseStep,
// Scale), so a GPU backend runs them where the parameters and the step's
// statistics live.
//
// It imports nothing from shardline.
package optim
