package cpu_test

import (
	"testing"

	"github.com/shardline/shardline/tensor/cpu"
	"github.com/shardline/shardline/tensor/kerneltest"
)

// TestKernelConformance runs the kernel set every backend must pass: the
// float32 kernels (bf16 operands included) against the same kernels in
// float64, under every micro-kernel level this machine has (EachISA).
func TestKernelConformance(t *testing.T) {
	cpu.EachISA(t, func(t *testing.T) { kerneltest.Run(t, cpu.Backend{}, kerneltest.Options{}) })
}
