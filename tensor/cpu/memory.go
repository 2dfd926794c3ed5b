package cpu

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/shardline/shardline/tensor"
)

// Memory is the CPU backend's memory (tensor.Memory): buffers are Go slices the
// backend keeps to itself, and the stream runs synchronously, on the calling
// goroutine. It counts read-backs as a GPU backend must (each would wait for the
// device), so the CPU trainer is held to the same rule: none inside a step. One
// Memory serves one rank; its methods may be called from several goroutines.
type Memory struct {
	readbacks atomic.Int64
	mu        sync.Mutex
	err       error
	held      int64 // bytes allocated and not freed
	peak      int64 // the most held at once
}

var _ tensor.Memory = (*Memory)(nil)

// NewMemory returns an empty CPU memory.
func NewMemory() *Memory { return &Memory{} }

// store is one CPU allocation: exactly one slice is set, by dtype.
type store struct {
	mem   *Memory
	dt    tensor.DType
	n     int
	f32   []float32
	bf16  []tensor.BF16
	i32   []int32
	f64   []float64
	f8    []uint8 // either FP8 dtype's codes
	freed bool
}

func (s *store) DType() tensor.DType { return s.dt }
func (s *store) Len() int            { return s.n }
func (s *store) Backend() string     { return "cpu" }

// Alloc returns n zeroed elements of dtype t.
func (m *Memory) Alloc(t tensor.DType, n int) tensor.Buffer {
	if n < 0 || t > tensor.MaxDType {
		m.fail(fmt.Errorf("cpu: allocating %d elements of %v: want a count ≥ 0 of f32, bf16, i32, f64, f8e4m3 or f8e5m2", n, t))
		return tensor.Buffer{}
	}
	s := &store{mem: m, dt: t, n: n}
	switch t {
	case tensor.Float32:
		s.f32 = make([]float32, n)
	case tensor.BFloat16:
		s.bf16 = make([]tensor.BF16, n)
	case tensor.Int32:
		s.i32 = make([]int32, n)
	case tensor.Float64:
		s.f64 = make([]float64, n)
	case tensor.Float8E4M3, tensor.Float8E5M2:
		s.f8 = make([]uint8, n)
	}
	m.mu.Lock()
	m.held += int64(n) * int64(t.Size())
	m.peak = max(m.peak, m.held)
	m.mu.Unlock()
	return tensor.NewBuffer(s, 0, n)
}

// Free gives b's storage back; b must be a whole allocation of this memory.
func (m *Memory) Free(b tensor.Buffer) {
	s, ok := m.own("free", b)
	if !ok {
		return
	}
	if b.Offset() != 0 || b.Len() != s.n {
		m.fail(fmt.Errorf("cpu: freeing elements [%d, %d) of an allocation of %d: free whole allocations", b.Offset(), b.Offset()+b.Len(), s.n))
		return
	}
	m.mu.Lock()
	m.held -= int64(s.n) * int64(s.dt.Size())
	m.mu.Unlock()
	s.freed, s.f32, s.bf16, s.i32, s.f64, s.f8 = true, nil, nil, nil, nil, nil
}

// Held is the bytes allocated and not freed.
func (m *Memory) Held() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held
}

// Peak is the most bytes held at once since the memory was made.
func (m *Memory) Peak() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.peak
}

// Write copies src, a host slice ([]float64, []float32, []tensor.BF16,
// []int32, []tensor.F8E4M3 or []tensor.F8E5M2), into dst (same length),
// converting to dst's dtype (into an FP8 buffer, float32(x) then the
// format's saturating round to nearest even: its codes at scale 1).
func (m *Memory) Write(dst tensor.Buffer, src any) {
	s, ok := m.own("write", dst)
	if !ok {
		return
	}
	n, ok := m.hostLen("write", src)
	if !ok || !m.sameLen("write", dst.Len(), n) {
		return
	}
	lo := dst.Offset()
	switch v := src.(type) {
	case []float32:
		if s.dt == tensor.Float32 {
			copy(s.f32[lo:lo+n], v)
			return
		}
		for i, x := range v {
			s.set(lo+i, float64(x))
		}
	case []tensor.BF16:
		if s.dt == tensor.BFloat16 {
			copy(s.bf16[lo:lo+n], v)
			return
		}
		for i, x := range v {
			s.set(lo+i, float64(x.Float32()))
		}
	case []int32:
		for i, x := range v {
			s.set(lo+i, float64(x))
		}
	case []float64:
		for i, x := range v {
			s.set(lo+i, x)
		}
	case []tensor.F8E4M3:
		writeFP8(s, tensor.Float8E4M3, lo, v)
	case []tensor.F8E5M2:
		writeFP8(s, tensor.Float8E5M2, lo, v)
	}
}

// fp8Code is an FP8 format's code type (tensor.F8E4M3, tensor.F8E5M2).
type fp8Code interface {
	~uint8
	Float32() float32
}

// writeFP8 is Write of codes of the format of dtype dt: into a buffer of that
// dtype, the codes as they are; into any other, their values.
func writeFP8[T fp8Code](s *store, dt tensor.DType, lo int, v []T) {
	if s.dt == dt {
		for i, x := range v {
			s.f8[lo+i] = uint8(x)
		}
		return
	}
	for i, x := range v {
		s.set(lo+i, float64(x.Float32()))
	}
}

// readFP8 is Read into codes of the format of dtype dt: from a buffer of
// that dtype, its codes; from any other, its values rounded by round.
func readFP8[T fp8Code](s *store, dt tensor.DType, lo int, v []T, round func(float32) T) {
	for i := range v {
		if s.dt == dt {
			v[i] = T(s.f8[lo+i])
		} else {
			v[i] = round(float32(s.get(lo + i)))
		}
	}
}

// Read copies src into dst, a host slice as Write takes (same length),
// converting to its type: a read-back, counted.
func (m *Memory) Read(dst any, src tensor.Buffer) {
	m.readbacks.Add(1)
	s, ok := m.own("read", src)
	if !ok {
		return
	}
	n, ok := m.hostLen("read", dst)
	if !ok || !m.sameLen("read", n, src.Len()) {
		return
	}
	lo := src.Offset()
	switch v := dst.(type) {
	case []float32:
		if s.dt == tensor.Float32 {
			copy(v, s.f32[lo:lo+n])
			return
		}
		for i := range v {
			v[i] = float32(s.get(lo + i))
		}
	case []tensor.BF16:
		if s.dt == tensor.BFloat16 {
			copy(v, s.bf16[lo:lo+n])
			return
		}
		for i := range v {
			v[i] = tensor.ToBF16(float32(s.get(lo + i)))
		}
	case []int32:
		for i := range v {
			v[i] = int32(s.get(lo + i))
		}
	case []float64:
		for i := range v {
			v[i] = s.get(lo + i)
		}
	case []tensor.F8E4M3:
		readFP8(s, tensor.Float8E4M3, lo, v, tensor.ToF8E4M3)
	case []tensor.F8E5M2:
		readFP8(s, tensor.Float8E5M2, lo, v, tensor.ToF8E5M2)
	}
}

// hostLen is the length of a host slice Write and Read take.
func (m *Memory) hostLen(op string, x any) (int, bool) {
	switch v := x.(type) {
	case []float64:
		return len(v), true
	case []float32:
		return len(v), true
	case []tensor.BF16:
		return len(v), true
	case []int32:
		return len(v), true
	case []tensor.F8E4M3:
		return len(v), true
	case []tensor.F8E5M2:
		return len(v), true
	}
	m.fail(fmt.Errorf("cpu: %s of a %T: host values are []float64, []float32, []tensor.BF16, []int32, []tensor.F8E4M3 or []tensor.F8E5M2", op, x))
	return 0, false
}

// Copy copies src into dst, converting between float dtypes (float32(x),
// tensor.ToBF16 and the FP8 formats' saturating casts round to nearest, ties
// to even; an FP8 code is read as its value, at scale 1); i32 copies only to
// i32.
func (m *Memory) Copy(dst, src tensor.Buffer) {
	d, ok := m.own("copy to", dst)
	if !ok {
		return
	}
	s, ok := m.own("copy from", src)
	if !ok || !m.sameLen("copy", dst.Len(), src.Len()) {
		return
	}
	if (d.dt == tensor.Int32) != (s.dt == tensor.Int32) {
		m.fail(fmt.Errorf("cpu: copying %v into %v: integers copy only to integers", s.dt, d.dt))
		return
	}
	dl, sl, n := dst.Offset(), src.Offset(), dst.Len()
	switch {
	case d.dt == s.dt && d.dt == tensor.Float32:
		copy(d.f32[dl:dl+n], s.f32[sl:sl+n])
	case d.dt == s.dt && d.dt == tensor.BFloat16:
		copy(d.bf16[dl:dl+n], s.bf16[sl:sl+n])
	case d.dt == s.dt && d.dt == tensor.Int32:
		copy(d.i32[dl:dl+n], s.i32[sl:sl+n])
	case d.dt == s.dt && d.dt == tensor.Float64:
		copy(d.f64[dl:dl+n], s.f64[sl:sl+n])
	case d.dt == s.dt: // an FP8 dtype: the codes
		copy(d.f8[dl:dl+n], s.f8[sl:sl+n])
	case d.dt == tensor.BFloat16 && s.dt == tensor.Float32:
		ToBF16(d.bf16[dl:dl+n], s.f32[sl:sl+n])
	case d.dt == tensor.Float32 && s.dt == tensor.BFloat16:
		FromBF16(d.f32[dl:dl+n], s.bf16[sl:sl+n])
	default: // through float64, which holds every f32 and bf16 value exactly
		for i := 0; i < n; i++ {
			d.set(dl+i, s.get(sl+i))
		}
	}
}

// Zero sets b's elements to 0.
func (m *Memory) Zero(b tensor.Buffer) { m.Fill(b, 0) }

// Fill sets b's elements to v (rounded to b's dtype).
func (m *Memory) Fill(b tensor.Buffer, v float64) {
	s, ok := m.own("fill", b)
	if !ok {
		return
	}
	lo, n := b.Offset(), b.Len()
	switch {
	case v == 0 && !math.Signbit(v):
		s.clear(lo, lo+n)
	case s.dt == tensor.Float32:
		f := s.f32[lo : lo+n]
		for i := range f {
			f[i] = float32(v)
		}
	default:
		for i := 0; i < n; i++ {
			s.set(lo+i, v)
		}
	}
}

// Sync counts a synchronisation: the stream is synchronous, so the host may
// already use what it wrote.
func (m *Memory) Sync() { m.readbacks.Add(1) }

// Readbacks is the number of Read and Sync calls so far.
func (m *Memory) Readbacks() int64 { return m.readbacks.Load() }

// Err is the first failure, nil if none.
func (m *Memory) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// BF16s is a bf16 buffer's elements in place, as Float32s.
func (m *Memory) BF16s(b tensor.Buffer) []tensor.BF16 {
	if s, lo, hi, ok := m.viewed(b, tensor.BFloat16); ok {
		return s.bf16[lo:hi:hi]
	}
	return nil
}

// Float32s is an f32 buffer's elements in place, for collectives over host
// memory (the in-process and TCP communicators): nothing is copied and nothing
// leaves the backend's memory, as when NCCL is handed a device pointer. It is
// nil, with the failure kept, for any other buffer.
func (m *Memory) Float32s(b tensor.Buffer) []float32 {
	if s, lo, hi, ok := m.viewed(b, tensor.Float32); ok {
		return s.f32[lo:hi:hi]
	}
	return nil
}

// Float64s is an f64 buffer's elements in place, as Float32s.
func (m *Memory) Float64s(b tensor.Buffer) []float64 {
	if s, lo, hi, ok := m.viewed(b, tensor.Float64); ok {
		return s.f64[lo:hi:hi]
	}
	return nil
}

// FP8Codes is an FP8 buffer's codes in place (Float8E4M3 or Float8E5M2), as
// Float32s: what an all-gather of FP8 weights moves, a byte a value.
func (m *Memory) FP8Codes(b tensor.Buffer) []uint8 {
	t := tensor.Float8E4M3
	if b.DType() == tensor.Float8E5M2 {
		t = tensor.Float8E5M2
	}
	if s, lo, hi, ok := m.viewed(b, t); ok {
		return s.f8[lo:hi:hi]
	}
	return nil
}

// viewed is b's storage and element range for a host view of dtype t, when b
// is a live buffer of this memory of that dtype; otherwise the failure is kept.
func (m *Memory) viewed(b tensor.Buffer, t tensor.DType) (s *store, lo, hi int, ok bool) {
	if s, ok = m.own("view", b); !ok {
		return nil, 0, 0, false
	}
	if s.dt != t {
		m.fail(fmt.Errorf("cpu: a %v buffer viewed as %v", s.dt, t))
		return nil, 0, 0, false
	}
	return s, b.Offset(), b.Offset() + b.Len(), true
}

func (m *Memory) fail(err error) {
	m.mu.Lock()
	if m.err == nil {
		m.err = err
	}
	m.mu.Unlock()
}

// errForeign is the failure for a buffer that is not this memory's.
var errForeign = errors.New("the buffer is not this CPU memory's (another backend's, another rank's, or empty)")

// own is b's storage when b is a live buffer of this memory; otherwise the
// failure is kept.
func (m *Memory) own(op string, b tensor.Buffer) (*store, bool) {
	s, ok := b.Storage().(*store)
	switch {
	case !ok || s.mem != m:
		m.fail(fmt.Errorf("cpu: %s: %w", op, errForeign))
		return nil, false
	case s.freed:
		m.fail(fmt.Errorf("cpu: %s: the buffer was freed", op))
		return nil, false
	case m.Err() != nil: // sticky: work after a failure is skipped
		return nil, false
	}
	return s, true
}

func (m *Memory) sameLen(op string, a, b int) bool {
	if a != b {
		m.fail(fmt.Errorf("cpu: %s of %d elements into %d: lengths differ", op, b, a))
		return false
	}
	return true
}

// clear zeroes elements [lo, hi) of s.
func (s *store) clear(lo, hi int) {
	switch s.dt {
	case tensor.Float32:
		clear(s.f32[lo:hi])
	case tensor.BFloat16:
		clear(s.bf16[lo:hi])
	case tensor.Int32:
		clear(s.i32[lo:hi])
	case tensor.Float8E4M3, tensor.Float8E5M2:
		clear(s.f8[lo:hi])
	default:
		clear(s.f64[lo:hi])
	}
}

// get is element i of s as a float64 (exact for every dtype).
func (s *store) get(i int) float64 {
	switch s.dt {
	case tensor.Float32:
		return float64(s.f32[i])
	case tensor.BFloat16:
		return float64(s.bf16[i].Float32())
	case tensor.Int32:
		return float64(s.i32[i])
	case tensor.Float8E4M3:
		return float64(tensor.F8E4M3(s.f8[i]).Float32())
	case tensor.Float8E5M2:
		return float64(tensor.F8E5M2(s.f8[i]).Float32())
	}
	return s.f64[i]
}

// set stores v in element i of s, rounded to its dtype (integers truncate;
// FP8 rounds float32(v), saturating).
func (s *store) set(i int, v float64) {
	switch s.dt {
	case tensor.Float32:
		s.f32[i] = float32(v)
	case tensor.BFloat16:
		s.bf16[i] = tensor.ToBF16(float32(v))
	case tensor.Int32:
		s.i32[i] = int32(v)
	case tensor.Float8E4M3:
		s.f8[i] = uint8(tensor.ToF8E4M3(float32(v)))
	case tensor.Float8E5M2:
		s.f8[i] = uint8(tensor.ToF8E5M2(float32(v)))
	default:
		s.f64[i] = v
	}
}

// floats is a CPU buffer's elements as F values in place: an f32 buffer for
// float32 kernels, an f64 buffer for float64 ones (the gradient checks). It is
// nil for any other buffer, after keeping the failure when the buffer is a CPU
// one. (The view is made with unsafe.Slice, of a slice whose element type the
// dtype has just matched: a conversion through an interface would allocate.)
func floats[F Float](op string, b tensor.Buffer) []F {
	s, ok := b.Storage().(*store)
	if !ok || s.freed {
		return nil
	}
	var z F
	lo, n := b.Offset(), b.Len()
	switch {
	case n == 0:
		return []F{}
	case unsafe.Sizeof(z) == 4 && s.dt == tensor.Float32:
		return unsafe.Slice((*F)(unsafe.Pointer(&s.f32[lo])), n)
	case unsafe.Sizeof(z) == 8 && s.dt == tensor.Float64:
		return unsafe.Slice((*F)(unsafe.Pointer(&s.f64[lo])), n)
	}
	s.mem.fail(fmt.Errorf("cpu: %s: a %v buffer where the kernels run in %T", op, s.dt, z))
	return nil
}

// int32s is a CPU int32 buffer's elements in place (nil, with the failure
// kept, for any other buffer).
func int32s(op string, b tensor.Buffer) []int32 {
	s, ok := b.Storage().(*store)
	if !ok || s.freed {
		return nil
	}
	if s.dt != tensor.Int32 {
		s.mem.fail(fmt.Errorf("cpu: %s: a %v buffer where int32 values are read", op, s.dt))
		return nil
	}
	lo, n := b.Offset(), b.Len()
	return s.i32[lo : lo+n : lo+n]
}

// bf16s is a CPU bf16 buffer's elements in place (as floats; nil, with the
// failure kept, for any other buffer).
func bf16s(op string, b tensor.Buffer) []tensor.BF16 {
	s, ok := b.Storage().(*store)
	if !ok || s.freed {
		return nil
	}
	if s.dt != tensor.BFloat16 {
		s.mem.fail(fmt.Errorf("cpu: %s: a %v buffer where bf16 values are read", op, s.dt))
		return nil
	}
	lo, n := b.Offset(), b.Len()
	return s.bf16[lo : lo+n : lo+n]
}
