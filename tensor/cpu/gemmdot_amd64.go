//go:build amd64 && !purego

package cpu

import (
	"golang.org/x/sys/cpu"

	"github.com/shardline/shardline/tensor"
)

// kern12x32DotBF16 is kernelDotGo in AVX-512 BF16 (gemmdot_amd64.s).
//
//go:noescape
func kern12x32DotBF16(kp int, a *tensor.BF16, lda int, b *uint32, c *float32, ldc int, add bool)

// hasBF16Dot says whether the CPU has VDPBF16PS (AVX-512 BF16).
var hasBF16Dot = hasAVX512 && cpu.X86.HasAVX512BF16

// kernelDot runs the dot-product micro-kernel: kp pair steps of MR bf16 rows of
// A at stride lda (even) and of a B panel (NR words each) into an MR×NR tile of c.
func kernelDot(kp int, a []tensor.BF16, lda int, b []uint32, c []float32, ldc int, add bool) {
	if hasBF16Dot && kp > 0 {
		_ = a[(mr-1)*lda+2*kp-1]
		_ = b[kp*nr-1]
		_ = c[(mr-1)*ldc+nr-1]
		kern12x32DotBF16(kp, &a[0], lda, &b[0], &c[0], ldc, add)
		return
	}
	kernelDotGo(kp, a, lda, b, c, ldc, add)
}
