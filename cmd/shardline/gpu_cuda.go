//go:build cuda || cudaemu

package main

import (
	"fmt"
	"github.com/shardline/shardline/cuda"
	"github.com/shardline/shardline/tensor"
)

// This file is the GPU engine of the shardline-cuda build (make cuda); under
// -tags cudaemu, the same engine on the host emulator, for tests.
func init() { rankGPUs, gpuCount = gpuPerRank, cuda.Count }

// gpuPerRank opens a rank's GPU: the one at its node index (localRank) in a
// job, else at its index among this process's ranks, modulo the GPUs visible,
// so that ranks beyond the GPUs share them (their collectives then go through
// the host: cuda.Memory.Collectives). Each rank opens its own Device: a
// goroutine and stream of its own, in the GPU's one primary context.
func gpuPerRank(localRank int) func(rank int) (tensor.Backend, func(), error) {
	return func(rank int) (tensor.Backend, func(), error) {
		n, err := cuda.Count()
		if err != nil {
			return nil, nil, err
		}
		if n == 0 {
			return nil, nil, fmt.Errorf("cuda: no GPU visible (check CUDA_VISIBLE_DEVICES)")
		}
		idx := rank
		if localRank >= 0 {
			idx = localRank
		}
		d, err := cuda.Open(idx % n)
		if err != nil {
			return nil, nil, err
		}
		return d.Kernels(), d.Close, nil
	}
}
