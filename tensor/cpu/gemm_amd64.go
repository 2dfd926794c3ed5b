//go:build amd64 && !purego

package cpu

import "golang.org/x/sys/cpu"

// kern6x32AVX512 is kernelGo in AVX-512 (gemm_amd64.s). c must hold 6 rows of 32 at
// stride ldc; a holds k×6 and b k×32 values.
//
//go:noescape
func kern6x32AVX512(k int, a, b, c *float32, ldc int)

var hasAVX512 = cpu.X86.HasAVX512F

// kernel runs the fastest micro-kernel the CPU supports.
func kernel(k int, a, b, c []float32, ldc int) {
	if hasAVX512 && k > 0 {
		_ = a[k*mr-1]
		_ = b[k*nr-1]
		_ = c[5*ldc+nr-1]
		kern6x32AVX512(k, &a[0], &b[0], &c[0], ldc)
		return
	}
	kernelGo(k, a, b, c, ldc)
}

// KernelName says which micro-kernel Sgemm uses, for benchmarks and logs.
func KernelName() string {
	if hasAVX512 {
		return "avx512 6x32"
	}
	return "go 6x32"
}
