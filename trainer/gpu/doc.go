// Package gpu trains a dense Llama-style decoder on one NVIDIA GPU through the
// cuda backend: parameters, gradients, optimizer state and activations live in
// device buffers the model allocates once, every kernel runs on the device's
// stream, and a step reads nothing back (the loss sum and gradient norm stay on
// the device until Metrics reads them, once per logging interval).
//
// It is the GPU half of the engine until the device-ready engine (one model over
// any backend's buffers) replaces both it and the CPU model's slices: it covers
// dense and MoE models on one GPU (no FSDP sharding, no expert parallelism, no
// recompute) and says so when asked for more. MoE layers route on the device into
// padded expert segments (capacity ceil(capacity_factor·BT·k/E), or BT·k without
// a capacity factor), so every expert runs in one strided batch and no count
// comes back to the host. Everything but this file is behind the `cuda` build tag.
package gpu
