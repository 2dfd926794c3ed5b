package tensor

import "fmt"

// DType is a buffer's element type.
type DType uint8

const (
	Float32    DType = iota // float32
	BFloat16                // bfloat16 (BF16 values)
	Int32                   // int32 (token ids, targets, routing indices)
	Float64                 // float64 (a step's statistics: loss and square sums)
	Float8E4M3              // FP8 E4M3 codes (F8E4M3 values), one byte each
	Float8E5M2              // FP8 E5M2 codes (F8E5M2 values), one byte each
)

// Size is the bytes per element.
func (t DType) Size() int {
	switch t {
	case BFloat16:
		return 2
	case Float64:
		return 8
	case Float8E4M3, Float8E5M2:
		return 1
	}
	return 4
}

// FP8 is the 8-bit format of an FP8 dtype (false for the others).
func (t DType) FP8() (FP8Format, bool) {
	switch t {
	case Float8E4M3:
		return E4M3, true
	case Float8E5M2:
		return E5M2, true
	}
	return 0, false
}

// MaxDType is the last dtype: every DType from Float32 to it is one.
const MaxDType = Float8E5M2

func (t DType) String() string {
	if int(t) < len(dtypeNames) {
		return dtypeNames[t]
	}
	return fmt.Sprintf("dtype(%d)", uint8(t))
}

var dtypeNames = [...]string{"f32", "bf16", "i32", "f64", "f8e4m3", "f8e5m2"}

// Storage is one allocation of a backend's memory. Only the backend that made it
// reaches its elements (by asserting its own type); everything else holds it
// inside a Buffer.
type Storage interface {
	// DType and Len describe the whole allocation.
	DType() DType
	Len() int
	// Backend names the backend whose memory it is.
	Backend() string
}

// Buffer is a view of Len elements of a backend's memory, from element Offset of
// its storage. It is opaque: its elements are reached through the backend that
// owns it (Memory), never as a Go slice, so the same code drives host and device
// memory and every read of a value back to the host is a call the backend can
// count. Slice views share storage. The zero Buffer is empty.
type Buffer struct {
	s      Storage
	off, n int
}

// NewBuffer is the view of elements [off, off+n) of s; backends make buffers
// with it. It returns the empty Buffer when the range lies outside s.
func NewBuffer(s Storage, off, n int) Buffer {
	if s == nil || off < 0 || n < 0 || off+n > s.Len() {
		return Buffer{}
	}
	return Buffer{s: s, off: off, n: n}
}

// Storage is the allocation the view lies in (nil for the empty Buffer).
func (b Buffer) Storage() Storage { return b.s }

// Offset is the view's first element within its storage.
func (b Buffer) Offset() int { return b.off }

// Len is the view's element count.
func (b Buffer) Len() int { return b.n }

// DType is the view's element type (Float32 for the empty Buffer).
func (b Buffer) DType() DType {
	if b.s == nil {
		return Float32
	}
	return b.s.DType()
}

// Bytes is what the view's elements occupy.
func (b Buffer) Bytes() int64 { return int64(b.n) * int64(b.DType().Size()) }

// Slice is elements [lo, hi) of the view; a range outside it gives the empty
// Buffer, which every backend operation refuses with a sticky error.
func (b Buffer) Slice(lo, hi int) Buffer {
	if lo < 0 || hi < lo || hi > b.n {
		return Buffer{}
	}
	return Buffer{s: b.s, off: b.off + lo, n: hi - lo}
}

// At is the one-element view of element i.
func (b Buffer) At(i int) Buffer { return b.Slice(i, i+1) }

// Memory is a backend's memory and the stream its work is issued on, in order.
// Operations do not return errors: the first failure (a buffer of another
// backend, a dtype or length mismatch, an allocation the backend cannot make) is
// kept, later work is skipped, and Err reports it; the trainer checks it once a
// step. A backend may run the stream synchronously (the CPU's does).
type Memory interface {
	// Alloc returns n zeroed elements of dtype t, or the empty Buffer after a
	// failure (kept for Err). Allocation is not stream-ordered: the trainer
	// allocates what the plan budgets before the first step.
	Alloc(t DType, n int) Buffer
	// Free gives a buffer's storage back (b must be a whole allocation).
	Free(b Buffer)
	// Write copies host values (a []float64, []float32, []BF16 or []int32) into
	// dst (same length), converting to dst's dtype: an upload, not a read-back.
	Write(dst Buffer, src any)
	// Read copies src's values into a host slice as Write takes (same length),
	// converting to its type, after the stream's work so far: a read-back, which
	// on a GPU waits for the device. Readbacks counts them.
	Read(dst any, src Buffer)
	// Copy copies src into dst (same length), converting between float dtypes
	// (to the nearest value, ties to even).
	Copy(dst, src Buffer)
	// Zero sets b's elements to 0; Fill sets them to v.
	Zero(b Buffer)
	Fill(b Buffer, v float64)
	// Sync waits for the stream's work so far so that the host may use what it
	// wrote: a synchronisation, counted with the read-backs. Code that reads
	// results on the host outside Read (the CPU's host-side MoE routing) calls
	// it, so that no such read goes uncounted.
	Sync()
	// Readbacks is the number of Read and Sync calls so far.
	Readbacks() int64
	// Err is the first failure of the stream, nil if none.
	Err() error
}

// HostMemory is a Memory whose buffers lie in host memory, so that collectives
// over host memory (the in-process and TCP communicators) can take an f32
// buffer's elements in place: no copy, no read-back, as NCCL takes a device
// pointer. Float32s (BF16s, Float64s) is nil, with the failure kept for Err, for
// a buffer that is not an f32 (bf16, f64) buffer of this memory; FP8Codes is
// an FP8 buffer's codes (either format, a byte a value), nil likewise for any
// other buffer.
type HostMemory interface {
	Memory
	Float32s(b Buffer) []float32
	BF16s(b Buffer) []BF16
	Float64s(b Buffer) []float64
	FP8Codes(b Buffer) []uint8
}

// HostValue is an element type Memory.Write takes host slices of.
type HostValue interface {
	float32 | float64 | BF16 | int32
}

// Upload allocates one buffer of dtype t in mem for each host slice of xs and
// writes the slice there (converting to t): parameters held on the host
// (a weights file, a test's values) made into the buffers a model takes.
func Upload[E HostValue](mem Memory, t DType, xs [][]E) []Buffer {
	out := make([]Buffer, len(xs))
	for i, x := range xs {
		out[i] = mem.Alloc(t, len(x))
		mem.Write(out[i], x)
	}
	return out
}
