// Package model is the Llama-style decoder with explicit Forward and Backward
// passes over a tensor.Kernels backend. It is written for one device: parallelism
// is applied by the trainer, which hands the model views of its parameter and
// gradient buffers (laid out by the plan's parameter table).
//
// The forward pass reads like the math: embed, then for each layer RMSNorm →
// attention with RoPE and grouped KV heads → residual → RMSNorm → SwiGLU MLP →
// residual, then the final RMSNorm, the output head and the cross-entropy.
// Backward is the same list reversed. Activations are allocated once per
// (batch, sequence) shape and reused every step.
//
// Initialisation (init.go) draws each element from a counter-based generator keyed
// by (seed, parameter name, element index): any shard can be initialised alone and
// equals the same slice of a full initialisation bit for bit.
//
// It imports config, parallel (the parameter table) and tensor.
package model
