// Package tensor defines what every backend shares: dtypes (bf16 stored as 16-bit
// values, computed in fp32) and the Backend interface, the kernels the model needs,
// each Forward with its Backward, outputs first in every argument list.
//
// Memory is a backend's: Buffer is an opaque view of it (dtype, element
// offset and count), and Memory allocates, copies, fills and reads it back,
// counting read-backs, with errors kept until checked once a step. A step's
// statistics (loss sums, gradient norm, clip factor, whether the update
// applies) live in such a buffer, so a step needs no value on the host. The
// kernels take every operand as a Buffer: activations and gradients in the
// kernels' element type F, compute weights and the matmuls' inputs in F or
// bf16 (read as bf16 or widened to F, as the backend decides). Weights is the
// host view a CPU kernel reads a weight through. Token ids, targets and MoE
// routing indices are int32 buffers. The GPU backend
// (package cuda, build tag cuda) shares DType and the shape structs.
//
// FP8 (fp8.go) is the two 8-bit formats of FP8 training, E4M3 and E5M2: the
// casts from float32 (round to nearest even, saturating or as PyTorch's plain
// casts), their 256 values, per-tensor current scales and delayed scaling's
// amax history, as Transformer Engine computes them. Float8E4M3 and Float8E5M2
// buffers hold one byte a value on every backend; Memory converts to and from
// them at scale 1 (the scales are the engine's). No compute kernel reads them
// yet.
//
// It imports nothing from shardline. tensor/cpu is the reference implementation.
package tensor
