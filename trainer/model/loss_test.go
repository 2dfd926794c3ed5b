package model

import (
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
)

// lossOf is m.Loss through a new CPU memory.
func lossOf[F tensor.Float](m *Model[F], tokens, targets []int32) (float64, int) {
	return m.Loss(cpu.NewMemory(), tokens, targets)
}

// lossBuffer is a one-element f64 buffer for a Forward whose loss no one reads.
func lossBuffer() tensor.Buffer { return cpu.NewMemory().Alloc(tensor.Float64, 1) }
