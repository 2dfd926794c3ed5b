//go:build cuda

package cuda

import (
	"strings"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/kerneltest"
)

// moeNotAdapted is why the conformance cases of the mixture-of-experts kernels
// are skipped: Kernels refuses them (TestKernelsRefuseMoE).
const moeNotAdapted = "the engine's device kernel set refuses the mixture-of-experts kernels (not adapted yet)"

// TestKernelConformance: the engine's kernel set on the device computes what
// the CPU's does in float64 (tensor/kerneltest: every kernel, its bf16
// operands, accumulation and edge rows), the checks the CPU's float32 kernels
// pass in the ordinary suite.
func TestKernelConformance(t *testing.T) {
	skip := map[string]string{}
	for _, k := range []string{"Router", "RouterBackward", "Dispatch", "DispatchBackward", "Combine", "CombineBackward", "AuxLoss",
		"ExpertsMatmul", "ExpertsMatmulBackward", "ExpertsSwiGLU", "ExpertsSwiGLUBackward"} {
		skip[k] = moeNotAdapted
	}
	kerneltest.Run(t, dev.Kernels(), kerneltest.Options{Skip: skip, Do: dev.Do})
}

// TestKernelsRefuseMoE: a mixture-of-experts kernel keeps a refusal that says
// what to do in the memory's error, and a buffer of another memory is refused
// before anything runs.
func TestKernelsRefuseMoE(t *testing.T) {
	k := dev.Kernels()
	dev.Do(func() {
		m := k.NewMemory()
		b := m.Alloc(tensor.Float32, 4)
		k.Router(b, b, b, tensor.Routing{}, tensor.MoEShape{})
		if err := m.Err(); err == nil || !strings.Contains(err.Error(), "mixture-of-experts") {
			t.Errorf("Router on the device: %v", err)
		}
		m2, m3 := k.NewMemory(), k.NewMemory()
		k.Add(m2.Alloc(tensor.Float32, 2), m3.Alloc(tensor.Float32, 2), m2.Alloc(tensor.Float32, 2), 2)
		if err := m2.Err(); err == nil || !strings.Contains(err.Error(), "not this device memory's") {
			t.Errorf("Add over two memories: %v", err)
		}
	})
}
