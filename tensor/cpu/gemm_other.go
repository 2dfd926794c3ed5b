//go:build !amd64 || purego

package cpu

func kernel(k int, a, b, c []float32, ldc int) { kernelGo(k, a, b, c, ldc) }

// KernelName says which micro-kernel Sgemm uses, for benchmarks and logs.
func KernelName() string { return "go 6x32" }
