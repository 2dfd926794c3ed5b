//go:build !amd64 || purego

package cpu

func kernel(k int, a []float32, ars int, b []float32, ldb int, c []float32, ldc int, add bool) {
	kernelGo(k, a, ars, b, ldb, c, ldc, add)
}

// KernelName says which micro-kernel Sgemm uses, for benchmarks and logs.
func KernelName() string { return "go 12x32" }

const hasStrided = false

func kernelStrided(k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, add bool) {
	panic("kernelStrided without AVX-512") // unreachable: hasStrided is false
}
