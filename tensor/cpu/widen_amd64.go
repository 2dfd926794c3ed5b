//go:build amd64 && !purego

package cpu

import "github.com/shardline/shardline/tensor"

//go:noescape
func widenPanelAVX512(dst *float32, src *tensor.BF16, ldb, k int)

// widenPanel writes dst[p*NR+j] = src[p*ldb+j] widened to float32, for p < k and
// j < NR: a full panel of an untransposed bf16 B.
func widenPanel(dst []float32, src []tensor.BF16, ldb, k int) {
	if k == 0 {
		return
	}
	_ = dst[k*nr-1]
	_ = src[(k-1)*ldb+nr-1]
	switch {
	case hasAVX512:
		widenPanelAVX512(&dst[0], &src[0], ldb, k)
	case hasAVX2:
		widenPanelAVX2(&dst[0], &src[0], ldb, k)
	default:
		widenPanelGo(dst, src, ldb, k)
	}
}

//go:noescape
func widenPanelAVX2(dst *float32, src *tensor.BF16, ldb, k int)

//go:noescape
func toBF16AVX2(dst *tensor.BF16, src *float32, n int)

//go:noescape
func toBF16AVX512(dst *tensor.BF16, src *float32, n int)

// toBF16Rows rounds src to bf16 into dst (same length) on the calling goroutine.
func toBF16Rows(dst []tensor.BF16, src []float32) {
	n := len(src)
	bulk := n &^ 15
	switch {
	case hasAVX512 && bulk > 0:
		_ = dst[n-1]
		toBF16AVX512(&dst[0], &src[0], bulk)
	case hasAVX2 && bulk > 0:
		_ = dst[n-1]
		toBF16AVX2(&dst[0], &src[0], bulk)
	default:
		bulk = 0
	}
	for i := bulk; i < n; i++ {
		dst[i] = tensor.ToBF16(src[i])
	}
}
