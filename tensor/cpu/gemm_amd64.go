//go:build amd64 && !purego

package cpu

import "golang.org/x/sys/cpu"

// kern12x32AVX512 is kernelGo in AVX-512 (gemm_amd64.s). c must hold 12 rows of 32 at
// stride ldc; a holds k rows of 12 at stride ars and b k rows of 32 at stride ldb;
// add says whether to add to c or overwrite it.
//
//go:noescape
func kern12x32AVX512(k int, a *float32, ars int, b *float32, ldb int, c *float32, ldc int, add bool)

// kern12x32StridedAVX512 is kern12x32AVX512 reading A in place: a[i*lda+p].
//
//go:noescape
func kern12x32StridedAVX512(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, add bool)

// kern6x16AVX2 is a 6×16 quarter of kern12x32AVX512 in AVX2 and FMA
// (gemm_avx2_amd64.s), for CPUs without AVX-512: same arguments, a quarter
// of the tile.
//
//go:noescape
func kern6x16AVX2(k int, a *float32, ars int, b *float32, ldb int, c *float32, ldc int, add bool)

// kern6x16StridedAVX2 is kern6x16AVX2 reading A in place: a[i*lda+p].
//
//go:noescape
func kern6x16StridedAVX2(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, add bool)

var (
	hasAVX512 = cpu.X86.HasAVX512F
	hasAVX2   = cpu.X86.HasAVX2 && cpu.X86.HasFMA
)

// hasStrided says whether kernelStrided can run: the GEMM then skips packing A
// when it is not transposed.
var hasStrided = hasAVX512 || hasAVX2

// kernelStrided is kernel with A read in place (rows at stride lda).
func kernelStrided(k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, add bool) {
	_ = a[(mr-1)*lda+k-1]
	_ = b[(k-1)*ldb+nr-1]
	_ = c[(mr-1)*ldc+nr-1]
	if hasAVX512 {
		kern12x32StridedAVX512(k, &a[0], lda, &b[0], ldb, &c[0], ldc, add)
		return
	}
	const h, w = mr / 2, nr / 2
	kern6x16StridedAVX2(k, &a[0], lda, &b[0], ldb, &c[0], ldc, add)
	kern6x16StridedAVX2(k, &a[0], lda, &b[w], ldb, &c[w], ldc, add)
	kern6x16StridedAVX2(k, &a[h*lda], lda, &b[0], ldb, &c[h*ldc], ldc, add)
	kern6x16StridedAVX2(k, &a[h*lda], lda, &b[w], ldb, &c[h*ldc+w], ldc, add)
}

// kernel runs the fastest micro-kernel the CPU supports.
func kernel(k int, a []float32, ars int, b []float32, ldb int, c []float32, ldc int, add bool) {
	if hasAVX512 && k > 0 {
		_ = a[(k-1)*ars+mr-1]
		_ = b[(k-1)*ldb+nr-1]
		_ = c[(mr-1)*ldc+nr-1]
		kern12x32AVX512(k, &a[0], ars, &b[0], ldb, &c[0], ldc, add)
		return
	}
	if hasAVX2 && k > 0 {
		_ = a[(k-1)*ars+mr-1]
		_ = b[(k-1)*ldb+nr-1]
		_ = c[(mr-1)*ldc+nr-1]
		const h, w = mr / 2, nr / 2
		kern6x16AVX2(k, &a[0], ars, &b[0], ldb, &c[0], ldc, add)
		kern6x16AVX2(k, &a[0], ars, &b[w], ldb, &c[w], ldc, add)
		kern6x16AVX2(k, &a[h], ars, &b[0], ldb, &c[h*ldc], ldc, add)
		kern6x16AVX2(k, &a[h], ars, &b[w], ldb, &c[h*ldc+w], ldc, add)
		return
	}
	kernelGo(k, a, ars, b, ldb, c, ldc, add)
}

// KernelName says which micro-kernel Sgemm uses, for benchmarks and logs.
func KernelName() string {
	switch {
	case hasAVX512:
		return "avx512 12x32"
	case hasAVX2:
		return "avx2 4 x 6x16"
	}
	return "go 12x32"
}
