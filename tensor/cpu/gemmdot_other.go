//go:build !amd64 || purego

package cpu

import "github.com/shardline/shardline/tensor"

// hasBF16Dot is false: the dot-product path has no assembly here.
var hasBF16Dot = false

// kernelDot runs the dot-product micro-kernel in Go.
func kernelDot(kp int, a []tensor.BF16, lda int, b []uint32, c []float32, ldc int, add bool) {
	kernelDotGo(kp, a, lda, b, c, ldc, add)
}
