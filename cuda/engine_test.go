//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/kerneltest"
)

// TestKernelConformance: the engine's kernel set on the device computes what
// the CPU's does in float64 (tensor/kerneltest: every kernel, its bf16
// operands, accumulation, edge rows and the three MoE layouts), the checks the
// CPU's float32 kernels pass in the ordinary suite. One side of each case
// runs inside Device.Do (the calls stay on the device's goroutine), the
// other from the test's goroutine (each call finds its way there).
func TestKernelConformance(t *testing.T) {
	t.Run("inside Do", func(t *testing.T) { kerneltest.Run(t, dev.Kernels(), kerneltest.Options{Do: dev.Do}) })
	t.Run("from the test's goroutine", func(t *testing.T) { kerneltest.Run(t, dev.Kernels(), kerneltest.Options{}) })
}

// TestKernelsFromGoroutines: four goroutines, each with its own memory (as
// the trainer's in-process ranks sharing one GPU), issue kernels and
// read-backs at once; each gets its own results.
func TestKernelsFromGoroutines(t *testing.T) {
	k := dev.Kernels()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for r := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := k.NewMemory()
			a, b, out := m.Alloc(tensor.Float32, 1000), m.Alloc(tensor.Float32, 1000), m.Alloc(tensor.Float32, 1000)
			m.Fill(a, float64(r))
			m.Fill(b, 0.5)
			got := make([]float32, 1000)
			for i := 0; i < 50; i++ {
				k.Add(out, a, b, 1000)
				k.AddInto(a, b, 1000)
			}
			m.Read(got, out)
			// a ends at r + 50·0.5; the last Add read a before its last AddInto.
			if want := float32(r) + 49*0.5 + 0.5; got[999] != want || got[0] != want {
				errs[r] = fmt.Errorf("rank %d: %v, want %v", r, got[999], want)
			}
			if err := m.Err(); err != nil {
				errs[r] = err
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
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
