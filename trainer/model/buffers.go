package model

import (
	"github.com/shardline/shardline/tensor"
)

// The model's memory. Every buffer the model holds (its activations, its
// backward's work buffers, the RoPE tables, tensor and context parallelism's
// gathers and ring, expert parallelism's exchange) is a tensor.Buffer of the
// memory of its stream (m.mem), allocated when the model is built, and so are
// the weights and gradients it is bound to: the model makes, copies, clears
// and fills none of them itself, it asks the memory, and the kernels take the
// buffers. What still reaches elements on the host: the collectives'
// arguments (f32), which take host memory in place as NCCL takes device
// pointers, and one host loop that is not a kernel yet (view): tensor
// parallelism's vocabulary-parallel cross-entropy (tp.go).

// dtypeOf is the buffer dtype of F.
func dtypeOf[F tensor.Float]() tensor.DType {
	if elemBytes[F]() == 8 {
		return tensor.Float64
	}
	return tensor.Float32
}

// alloc1 is n zeroed F elements of the model's memory.
func (m *Model[F]) alloc1(n int) tensor.Buffer { return m.mem.Alloc(dtypeOf[F](), n) }

// allocAct is n zeroed elements of the activations' dtype (m.act): F, or
// bf16 in a bf16-native run.
func (m *Model[F]) allocAct(n int) tensor.Buffer { return m.mem.Alloc(m.act, n) }

// allocInt is n int32 elements of the model's memory (token ids, targets,
// routing indices).
func (m *Model[F]) allocInt(n int) tensor.Buffer { return m.mem.Alloc(tensor.Int32, n) }

// allocN is n activation buffers (allocAct) of size elements each.
func (m *Model[F]) allocN(n, size int) []tensor.Buffer {
	out := make([]tensor.Buffer, n)
	for i := range out {
		out[i] = m.allocAct(size)
	}
	return out
}

// rowsOf is rows [lo, hi) of b, rows of width elements.
func rowsOf(b tensor.Buffer, lo, hi, width int) tensor.Buffer { return b.Slice(lo*width, hi*width) }

// held counts the distinct storage of bufs (buffers that share one, the layers'
// shared slots, count once) in bytes, each at its own dtype's size.
func held(seen map[tensor.Storage]bool, bufs ...tensor.Buffer) int64 {
	var n int64
	for _, b := range bufs {
		if s := b.Storage(); s != nil && !seen[s] {
			seen[s] = true
			n += int64(s.Len()) * int64(s.DType().Size())
		}
	}
	return n
}
