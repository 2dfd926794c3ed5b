// Package model is the Llama-style decoder with explicit Forward and Backward
// passes over a tensor.Kernels backend. The trainer hands the model its
// parameter and gradient buffers (laid out by the plan's parameter table;
// weights fp32 or bf16, which the kernels widen as they read); data
// parallelism and FSDP stay outside it. The parallelisms that change what one pass
// computes live here, each behind an option and a communicator: expert
// parallelism (moe.go: token all-to-alls), context parallelism (cp.go: sequences
// split into chunks, ring attention) and tensor parallelism (tp.go: Megatron's
// column- and row-parallel layers with sequence parallelism, a
// vocabulary-parallel embedding and loss).
//
// The forward pass reads like the math: embed, then for each layer RMSNorm →
// attention with RoPE and grouped KV heads → residual → RMSNorm → SwiGLU MLP →
// residual, then the final RMSNorm, the output head and the cross-entropy.
// Attention is causal, within chunks of model.attention_chunk_size positions
// where that is set (on the rotary layers only when NoPE layers are
// interleaved, as Llama 4's iRoPE: config.Model.AttentionChunk), and within documents with WithDocumentMasks (masks.go:
// each token's document start from the end-of-text tokens, which also take no
// loss with MaskLoss). Backward is the same list reversed. Activations and every other buffer the
// model holds are allocated once per (batch, sequence) shape in the backend's
// memory (buffers.go) and reused every step; with WithBF16Activations (a bf16
// run) what the layers save for backward is kept in bf16 stores beside one F
// work set (stash.go), or, on a backend that computes in bf16 storage
// (tensor.BF16Storage: a GPU's) and a dense model without tensor or context
// parallelism, the activations and their gradients are bf16 buffers
// throughout (BF16Native). With WithFP8 the chosen layers' linear products
// quantise their operands to FP8 under per-tensor current scaling, or each
// tensor's delayed scale from its amax history (FP8Step once per optimizer
// step: fp8delayed.go), on the backend, and multiply the codes (fp8.go).
//
// Initialisation (init.go) draws each element from a counter-based generator keyed
// by (seed, parameter name, element index): any shard can be initialised alone and
// equals the same slice of a full initialisation bit for bit.
//
// It imports config, parallel (the parameter table) and tensor.
package model
