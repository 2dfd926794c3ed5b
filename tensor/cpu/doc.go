// Package cpu is shardline's reference backend: every kernel the model needs, on
// float32 slices in host memory, written to be read against the math and tested
// against float64 finite differences, and fast where it matters (Sgemm).
//
// Kernels take their arguments in one order: outputs, inputs, weights, sizes.
// Backward kernels accumulate parameter gradients with += and overwrite activation
// gradients unless their comment says otherwise.
//
// It imports nothing from shardline but tensor.
package cpu
