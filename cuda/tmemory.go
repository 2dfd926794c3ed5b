//go:build cuda || cudaemu

package cuda

import (
	"fmt"

	"github.com/shardline/shardline/tensor"
)

// Memory is a device's memory as a tensor.Memory: tensor.Buffers whose storage
// is a device allocation, so that code written against tensor.Memory (the
// engine's model and FSDP runtime, collective.Group) holds device buffers as
// it holds host ones. Its work is issued on the device's stream; its
// tensor.Memory methods may be called from any goroutine and run on the
// device's (at once when called there, through Device.Do otherwise). Its error is sticky: the
// first failure, on the stream or of an operand, stays until the memory is
// dropped, as the CPU memory's does.
type Memory struct {
	d   *Device
	err error
}

// NewMemory is d's memory as a tensor.Memory.
func (d *Device) NewMemory() *Memory { return &Memory{d: d} }

// storage is one device allocation behind tensor.Buffers.
type storage struct {
	buf Buffer // the whole allocation
	mem *Memory
	// release frees buf when it was not allocated by Device.Alloc (an NCCL
	// user buffer); nil otherwise.
	release func()
}

func (s *storage) DType() tensor.DType { return s.buf.DType }
func (s *storage) Len() int            { return s.buf.N }
func (s *storage) Backend() string     { return "cuda" }

func (m *Memory) fail(err error) {
	if m.err == nil && err != nil {
		m.err = err
	}
}

// ok reports whether work may be issued: no failure kept, here or on the
// device's stream (which is kept here when seen).
func (m *Memory) ok() bool {
	if m.err == nil && m.d.err != nil {
		m.err, m.d.err = m.d.err, nil
	}
	return m.err == nil
}

// Device is the device buffer b views, or false (with the failure kept) when b
// is not a buffer of this memory.
func (m *Memory) Device(op string, b tensor.Buffer) (Buffer, bool) {
	if !m.ok() {
		return Buffer{}, false
	}
	s, mine := b.Storage().(*storage)
	if !mine || s.mem != m {
		backend := "none (the empty buffer)"
		if b.Storage() != nil {
			backend = b.Storage().Backend()
			if mine {
				backend = "cuda, another device memory"
			}
		}
		m.fail(fmt.Errorf("cuda: %s: a buffer of %d %s that is not this device memory's (its backend: %s)", op, b.Len(), b.DType(), backend))
		return Buffer{}, false
	}
	if s.buf.ptr == 0 && s.buf.N > 0 {
		m.fail(fmt.Errorf("cuda: %s: the buffer was freed", op))
		return Buffer{}, false
	}
	return s.buf.Slice(b.Offset(), b.Offset()+b.Len()), true
}

// alloc (Alloc) returns n zeroed elements of t on the device.
func (m *Memory) alloc(t tensor.DType, n int) tensor.Buffer {
	if !m.ok() {
		return tensor.Buffer{}
	}
	if n < 0 || t > tensor.MaxDType {
		m.fail(fmt.Errorf("cuda: allocating %d values of %s", n, t))
		return tensor.Buffer{}
	}
	b, err := m.d.Alloc(t, n)
	if err != nil {
		m.fail(err)
		return tensor.Buffer{}
	}
	m.d.Zero(b)
	return tensor.NewBuffer(&storage{buf: b, mem: m}, 0, n)
}

// free (Free) gives a whole allocation back, after the work issued on the stream.
func (m *Memory) free(b tensor.Buffer) {
	s, mine := b.Storage().(*storage)
	if !mine || s.mem != m || b.Offset() != 0 || b.Len() != s.buf.N {
		m.fail(fmt.Errorf("cuda: free of a buffer that is not a whole allocation of this memory (%d %s at %d)", b.Len(), b.DType(), b.Offset()))
		return
	}
	if s.buf.ptr != 0 {
		m.d.fail("free", m.d.syncStream())
		if s.release != nil {
			s.release()
		} else {
			m.d.Free(s.buf)
		}
		s.buf.ptr = 0
	}
}

// widen is host values as float64, exactly.
func widen(x any) []float64 {
	var out []float64
	switch v := x.(type) {
	case []float32:
		out = make([]float64, len(v))
		for i, e := range v {
			out[i] = float64(e)
		}
	case []tensor.BF16:
		out = make([]float64, len(v))
		for i, e := range v {
			out[i] = float64(e.Float32())
		}
	case []int32:
		out = make([]float64, len(v))
		for i, e := range v {
			out[i] = float64(e)
		}
	case []float64:
		out = v
	case []tensor.F8E4M3:
		out = make([]float64, len(v))
		for i, e := range v {
			out[i] = float64(e.Float32())
		}
	case []tensor.F8E5M2:
		out = make([]float64, len(v))
		for i, e := range v {
			out[i] = float64(e.Float32())
		}
	}
	return out
}

// narrow stores v into dst, a host slice of v's length, rounded to its type as
// the CPU memory rounds (float32(x); tensor.ToBF16 or the FP8 formats'
// saturating casts of that; integers truncate).
func narrow(dst any, v []float64) {
	switch d := dst.(type) {
	case []float32:
		for i, e := range v {
			d[i] = float32(e)
		}
	case []tensor.BF16:
		for i, e := range v {
			d[i] = tensor.ToBF16(float32(e))
		}
	case []int32:
		for i, e := range v {
			d[i] = int32(e)
		}
	case []float64:
		copy(d, v)
	case []tensor.F8E4M3:
		for i, e := range v {
			d[i] = tensor.ToF8E4M3(float32(e))
		}
	case []tensor.F8E5M2:
		for i, e := range v {
			d[i] = tensor.ToF8E5M2(float32(e))
		}
	}
}

// hostSliceOf is a new host slice of dtype t's type, n long.
func hostSliceOf(t tensor.DType, n int) any {
	switch t {
	case F32:
		return make([]float32, n)
	case BF16:
		return make([]tensor.BF16, n)
	case I32:
		return make([]int32, n)
	case F8E4M3:
		return make([]tensor.F8E4M3, n)
	case F8E5M2:
		return make([]tensor.F8E5M2, n)
	}
	return make([]float64, n)
}

// write (Write) copies host values into dst (same length), converting on the host to
// dst's dtype when they are of another type (as the CPU memory rounds): an
// upload.
func (m *Memory) write(dst tensor.Buffer, src any) {
	b, ok := m.Device("write", dst)
	if !ok {
		return
	}
	_, t, n, err := hostSlice(src)
	if err == nil && n != b.N {
		err = fmt.Errorf("%d host values into a buffer of %d: lengths differ", n, b.N)
	}
	if err != nil {
		m.fail(fmt.Errorf("cuda: write: %w", err))
		return
	}
	if t != b.DType {
		conv := hostSliceOf(b.DType, n)
		narrow(conv, widen(src))
		src = conv
	}
	m.d.Upload(b, src)
}

// read (Read) copies src into a host slice of src's length, converting to its type
// on the host: a read-back, which waits for the stream's work so far.
func (m *Memory) read(dst any, src tensor.Buffer) {
	b, ok := m.Device("read", src)
	if !ok {
		return
	}
	_, t, n, err := hostSlice(dst)
	if err == nil && n != b.N {
		err = fmt.Errorf("a buffer of %d into %d host values: lengths differ", b.N, n)
	}
	if err != nil {
		m.fail(fmt.Errorf("cuda: read: %w", err))
		return
	}
	if t == b.DType {
		m.d.Download(dst, b)
		return
	}
	staged := hostSliceOf(b.DType, n)
	m.d.Download(staged, b)
	narrow(dst, widen(staged))
}

// copy (Copy) copies src into dst (same length) on the stream, converting between
// float dtypes (f32, bf16, f64, FP8) by a kernel that rounds as the CPU memory
// does; int32 copies only to int32.
func (m *Memory) copy(dst, src tensor.Buffer) {
	d, ok := m.Device("copy to", dst)
	if !ok {
		return
	}
	s, ok := m.Device("copy from", src)
	if !ok {
		return
	}
	if d.N != s.N || (d.DType == I32) != (s.DType == I32) {
		m.fail(fmt.Errorf("cuda: copying %d %s into %d %s (lengths must agree; integers copy only to integers)", s.N, s.DType, d.N, d.DType))
		return
	}
	m.d.Cast(d, s)
}

// zero (Zero) sets b's elements to 0 on the stream.
func (m *Memory) zero(b tensor.Buffer) {
	if x, ok := m.Device("zero", b); ok {
		m.d.Zero(x)
	}
}

// fill (Fill) sets b's elements to v on the stream (f32, bf16, FP8 and int32 by a
// memset of v's bits, rounded to the dtype); an f64 buffer is written from the host, since no memset is
// 8 bytes wide.
func (m *Memory) fill(b tensor.Buffer, v float64) {
	x, ok := m.Device("fill", b)
	if !ok || x.N == 0 {
		return
	}
	switch x.DType {
	case F32:
		m.d.Fill(x, float32(v))
	case BF16:
		m.d.fillBits16(x, uint16(tensor.ToBF16(float32(v))))
	case F8E4M3:
		m.d.fillBits8(x, uint8(tensor.ToF8E4M3(float32(v))))
	case F8E5M2:
		m.d.fillBits8(x, uint8(tensor.ToF8E5M2(float32(v))))
	case I32:
		if v != float64(int32(v)) {
			m.fail(fmt.Errorf("cuda: filling an int32 buffer with %v", v))
			return
		}
		m.d.fillBits32(x, uint32(int32(v)))
	default:
		h := make([]float64, x.N)
		for i := range h {
			h[i] = v
		}
		m.d.Upload(x, h)
	}
}

// sync (Sync) waits for the stream's work so far: a synchronisation, counted with the
// read-backs.
func (m *Memory) sync() {
	if !m.ok() {
		return
	}
	m.d.readbacks.Add(1)
	m.d.fail("sync", m.d.syncStream())
}

// Readbacks is the device's read-backs and synchronisations so far.
func (m *Memory) Readbacks() int64 { return m.d.Readbacks() }

// firstErr (Err) waits for the work issued so far and returns the first failure, kept.
func (m *Memory) firstErr() error {
	if m.ok() {
		m.fail(m.d.Err())
	}
	return m.err
}

var _ tensor.Memory = (*Memory)(nil)

// The tensor.Memory methods: each runs on the device's goroutine (Device.run),
// so that any goroutine may call them.

func (m *Memory) Alloc(t tensor.DType, n int) (r tensor.Buffer) {
	m.d.run(func() { r = m.alloc(t, n) })
	return r
}
func (m *Memory) Free(b tensor.Buffer)             { m.d.run(func() { m.free(b) }) }
func (m *Memory) Write(dst tensor.Buffer, src any) { m.d.run(func() { m.write(dst, src) }) }
func (m *Memory) Read(dst any, src tensor.Buffer)  { m.d.run(func() { m.read(dst, src) }) }
func (m *Memory) Copy(dst, src tensor.Buffer)      { m.d.run(func() { m.copy(dst, src) }) }
func (m *Memory) Zero(b tensor.Buffer)             { m.d.run(func() { m.zero(b) }) }
func (m *Memory) Fill(b tensor.Buffer, v float64)  { m.d.run(func() { m.fill(b, v) }) }
func (m *Memory) Sync()                            { m.d.run(func() { m.sync() }) }
func (m *Memory) Err() (r error) {
	m.d.run(func() { r = m.firstErr() })
	return r
}
