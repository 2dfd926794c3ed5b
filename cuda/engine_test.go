//go:build cuda

package cuda

import (
	"strings"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/kerneltest"
)

// TestKernelConformance: the engine's kernel set on the device computes what
// the CPU's does in float64 (tensor/kerneltest: every kernel, its bf16
// operands, accumulation, edge rows and the three MoE layouts), the checks the
// CPU's float32 kernels pass in the ordinary suite.
func TestKernelConformance(t *testing.T) {
	kerneltest.Run(t, dev.Kernels(), kerneltest.Options{Do: dev.Do})
}

// TestKernelsRefuse: a kernel handed a buffer of another memory, of a dtype it
// does not read, or shorter than its shape keeps a failure that says so in the
// memory's error and does nothing.
func TestKernelsRefuse(t *testing.T) {
	k := dev.Kernels()
	for name, c := range map[string]struct {
		run  func(m, other tensor.Memory)
		want string
	}{
		"another memory": {func(m, other tensor.Memory) {
			k.Add(m.Alloc(tensor.Float32, 2), other.Alloc(tensor.Float32, 2), m.Alloc(tensor.Float32, 2), 2)
		}, "not this device memory's"},
		"a bf16 activation": {func(m, _ tensor.Memory) {
			k.SwiGLU(m.Alloc(tensor.BFloat16, 4), m.Alloc(tensor.Float32, 4), m.Alloc(tensor.Float32, 4), 4)
		}, "a bf16 buffer where the kernel reads [f32]"},
		"too short": {func(m, _ tensor.Memory) {
			k.Matmul(m.Alloc(tensor.Float32, 5), m.Alloc(tensor.Float32, 6), m.Alloc(tensor.Float32, 6), tensor.MatmulShape{BT: 2, C: 3, OC: 3}, false)
		}, "a buffer of 5 f32 values where the kernel reads 6"},
	} {
		t.Run(name, func(t *testing.T) {
			dev.Do(func() {
				m, other := k.NewMemory(), k.NewMemory()
				c.run(m, other)
				if err := m.Err(); err == nil || !strings.Contains(err.Error(), c.want) {
					t.Errorf("got %v, want an error containing %q", err, c.want)
				}
			})
		})
	}
}
