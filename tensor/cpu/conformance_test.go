package cpu_test

import (
	"testing"

	"github.com/shardline/shardline/tensor/cpu"
	"github.com/shardline/shardline/tensor/kerneltest"
)

// TestKernelConformance runs the kernel set every backend must pass: the
// float32 kernels (bf16 operands included, on whichever matmul path this
// machine takes) against the same kernels in float64.
func TestKernelConformance(t *testing.T) {
	kerneltest.Run(t, cpu.Backend{}, kerneltest.Options{})
}
