// Package kerneltest is the behaviour every tensor.Kernels must have, as tests
// a backend runs on its own kernels: the CPU's in the ordinary suite, the GPU's
// in the device tests. Each case draws its inputs from a fixed seed, runs one
// kernel (or a short chain of them) on the backend under test and on the CPU
// backend in float64, and compares every output the kernel writes, the
// accumulating ones pre-filled with values the kernel must add to. The model
// and the FSDP runtime are written against tensor.Kernels and were proven on
// the CPU, so a backend that passes here computes what they expect of it.
//
// It owns the cases and their tolerances; it imports tensor and, for the
// reference, tensor/cpu, and nothing above them.
package kerneltest
