// Package recipes holds shardline's shipped TOML recipes, embedded in the
// binary (FS), so that `shardline run` trains its default recipe from any
// directory and shipped:NAME names one anywhere; its tests load and lint every
// one and keep the embedded copies equal to the files.
//
//   - tiny.toml: the CPU default, a byte-level Llama of about one million parameters.
//   - moe-tiny.toml: tiny with 8 routed experts (top-2) in every layer, for CPU.
//   - moe-llama4-tiny.toml: moe-tiny with Llama 4's routing (sigmoid, top-1
//     scaled before the expert, a shared expert, expert biases, NoPE layers).
//   - dense-125m.toml, llama-1b.toml: dense Llama-style models on one 8-GPU node.
//   - llama4-3bx128e.toml: the Llama-4-style MoE (128 experts, top-8, torchtitan
//     llama4's router) on 8 GPUs, EP 4.
//   - base/gpu-node.toml: settings the GPU recipes extend.
package recipes
