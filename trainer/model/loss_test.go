package model

import (
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
)

// lossBuffer is a one-element f64 buffer for a Forward whose loss no one reads.
func lossBuffer() tensor.Buffer { return cpu.NewMemory().Alloc(tensor.Float64, 1) }

// onMemory moves a test's parameters into a new CPU memory: every weight and
// gradient slice is uploaded into a buffer (weights in bf16 when bf16 is set)
// and w and g are pointed at the buffers' elements in place, so the test goes
// on perturbing weights and reading gradients through them (bf16 weights
// keep their host slices). It returns the memory (WithMemory) and the weight
// and gradient buffers (New).
func onMemory[F float32 | float64](w, g [][]F, bf16 bool) (*cpu.Memory, []tensor.Buffer, []tensor.Buffer) {
	mem := cpu.NewMemory()
	wdt := dtypeOf[F]()
	if bf16 {
		wdt = tensor.BFloat16
	}
	wb, gb := tensor.Upload(mem, wdt, w), tensor.Upload(mem, dtypeOf[F](), g)
	for i := range w {
		if !bf16 {
			w[i] = hostView[F](mem, wb[i])
		}
		g[i] = hostView[F](mem, gb[i])
	}
	return mem, wb, gb
}

// hostView is an F buffer's elements in place.
func hostView[F float32 | float64](mem *cpu.Memory, b tensor.Buffer) []F {
	if dtypeOf[F]() == tensor.Float64 {
		return any(mem.Float64s(b)).([]F)
	}
	return any(mem.Float32s(b)).([]F)
}
