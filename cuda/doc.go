// Package cuda is shardline's NVIDIA GPU backend: a device owned by one goroutine
// locked to its OS thread, device buffers, one stream that work is issued on in
// order, the kernels of cuda/kernels (CUDA C compiled to PTX by `make ptx` and
// embedded), bf16/fp32 matrix products through cuBLASLt, and collectives through
// NCCL (Comm: one group's communicator, on the device's stream), both loaded at
// run time.
//
// Everything but this file (and the PTX freshness and emulator tests) is behind
// the `cuda` build tag, or `cudaemu`: under `cudaemu` the same Device, Memory and
// Kernels run over a host driver (driver_emu.go, emu.cc) that launches
// kernels.cu compiled as C++ under cuda/kernels/emu/emu.h, one fiber per CUDA
// thread, and multiplies matrices in float64 loops (no cuBLASLt, no NCCL), so
// the engine's device path is tested on a machine without a GPU. The driver bindings
// (gorgonia.org/cu) exit the process at start-up on a machine without a GPU, so the
// `shardline` binary that lints, plans and launches never links this package; GPU
// ranks run in a separately built executable (`make cuda`). Errors are sticky: the
// first failed launch or copy is kept and every later call is skipped until
// Device.Err is read, once per step.
//
// Conventions shared with tensor/cpu: storage dtype S is fp32 or bf16, every kernel
// accumulates in fp32, weight gradients and optimizer state are fp32, and a
// backward kernel accumulates into weight gradients while it overwrites activation
// gradients unless told to accumulate. Reductions run in a fixed order, so a kernel
// gives the same bits on every run. See docs/cuda.md.
package cuda
