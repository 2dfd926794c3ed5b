//go:build cuda || cudaemu

package cuda

import (
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/memtest"
)

// TestMemoryConformance: the device memory behaves as every tensor.Memory
// must (tensor/memtest: conversions and rounding, slices, counted read-backs,
// sticky refusals), the checks the CPU memory passes in the ordinary suite;
// memtest calls it from the test's goroutine, so every call also takes the
// way to the device's goroutine.
func TestMemoryConformance(t *testing.T) {
	memtest.Run(t, func() tensor.Memory { return dev.NewMemory() })
}
