// Package tensor defines what every backend shares: dtypes (bf16 stored as 16-bit
// values, computed in fp32) and the Backend interface, the kernels the model needs,
// each Forward with its Backward, outputs first in every argument list.
//
// Buffers are slices in host memory: activations and gradients of the kernels'
// element type, compute weights as Weights views, which carry their dtype (F, or
// bf16 storage the kernels read as bf16 or widen to F, as the backend decides). The GPU backend (package cuda,
// build tag cuda) holds device buffers of its own; one buffer type for both is the
// device-ready engine's next step (docs/engine.md).
//
// It imports nothing from shardline. tensor/cpu is the reference implementation.
package tensor
