//go:build !amd64 || purego

package cpu

import "github.com/shardline/shardline/tensor"

// widenPanel writes dst[p*NR+j] = src[p*ldb+j] widened to float32, for p < k and
// j < NR: a full panel of an untransposed bf16 B.
func widenPanel(dst []float32, src []tensor.BF16, ldb, k int) { widenPanelGo(dst, src, ldb, k) }

// toBF16Rows rounds src to bf16 into dst (same length) on the calling goroutine.
func toBF16Rows(dst []tensor.BF16, src []float32) { tensor.CastToBF16(dst, src) }
