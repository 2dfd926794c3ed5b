// Package tensor defines what every backend shares: dtypes (bf16 stored as 16-bit
// values, computed in fp32) and the Backend interface, the kernels the model needs,
// each Forward with its Backward, outputs first in every argument list.
//
// Buffers are float32 slices in host memory. The CUDA backend (build tag cuda) will
// need device-resident buffers; that choice belongs to the GPU issue and will extend
// this interface, not fork it.
//
// It imports nothing from shardline. tensor/cpu is the reference implementation.
package tensor
