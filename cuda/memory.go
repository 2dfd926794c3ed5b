//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/shardline/shardline/tensor"
)

// DType is a buffer's element type: tensor's, which the CPU backend's buffers
// carry too. The device kernels take F32, BF16 and I32; FP8 buffers are
// stored, converted (Cast) and moved between host and device (no other
// kernel reads them yet).
type DType = tensor.DType

const (
	F32    = tensor.Float32    // float32
	BF16   = tensor.BFloat16   // bfloat16
	I32    = tensor.Int32      // int32 (token ids, targets)
	F64    = tensor.Float64    // float64 (statistics; NCCL sums them)
	F8E4M3 = tensor.Float8E4M3 // FP8 E4M3 codes, one byte each
	F8E5M2 = tensor.Float8E5M2 // FP8 E5M2 codes, one byte each
)

// Buffer is device memory: N elements of DType at ptr. Slice views share memory.
type Buffer struct {
	ptr   devicePtr
	N     int
	DType DType
}

// Bytes is the buffer's size in bytes.
func (b Buffer) Bytes() int64 { return int64(b.N) * int64(b.DType.Size()) }

// Slice is elements [lo, hi) of b.
func (b Buffer) Slice(lo, hi int) Buffer {
	return Buffer{ptr: b.ptr + devicePtr(lo*b.DType.Size()), N: hi - lo, DType: b.DType}
}

// Alloc allocates n elements of t; the contents are undefined. Allocation is not
// stream-ordered: the trainer allocates what the plan budgets before the first
// step.
func (d *Device) Alloc(t DType, n int) (Buffer, error) {
	if n <= 0 {
		return Buffer{DType: t}, nil
	}
	b := Buffer{N: n, DType: t}
	p, err := d.memAlloc(b.Bytes())
	if err != nil {
		free, total, _ := d.memInfo()
		return Buffer{}, fmt.Errorf("cuda: allocating %d %s values (%.1f MiB; %.1f of %.1f GiB free): %w", n, t, float64(n*t.Size())/(1<<20),
			float64(free)/(1<<30), float64(total)/(1<<30), err)
	}
	b.ptr = p
	d.hold(b.Bytes())
	return b, nil
}

// Free returns b's memory (b must be the whole allocation).
func (d *Device) Free(b Buffer) {
	if b.ptr != 0 {
		d.fail("free", d.memFree(b.ptr))
		d.hold(-b.Bytes())
	}
}

func (d *Device) checkLen(what string, b Buffer, t DType, n int) bool {
	if d.err != nil {
		return false
	}
	if b.DType != t || n != b.N {
		d.fail(what, fmt.Errorf("buffer of %d %s, host data %d %s", b.N, b.DType, n, t))
		return false
	}
	return n > 0
}

// hostSlice is the address, dtype and length of a host slice of a buffer dtype
// ([]float32, []tensor.BF16, []int32, []float64, []tensor.F8E4M3 or
// []tensor.F8E5M2).
func hostSlice(x any) (p unsafe.Pointer, t DType, n int, err error) {
	switch s := x.(type) {
	case []float32:
		t, n = F32, len(s)
		if n > 0 {
			p = unsafe.Pointer(&s[0])
		}
	case []tensor.BF16:
		t, n = BF16, len(s)
		if n > 0 {
			p = unsafe.Pointer(&s[0])
		}
	case []int32:
		t, n = I32, len(s)
		if n > 0 {
			p = unsafe.Pointer(&s[0])
		}
	case []float64:
		t, n = F64, len(s)
		if n > 0 {
			p = unsafe.Pointer(&s[0])
		}
	case []tensor.F8E4M3:
		t, n = F8E4M3, len(s)
		if n > 0 {
			p = unsafe.Pointer(&s[0])
		}
	case []tensor.F8E5M2:
		t, n = F8E5M2, len(s)
		if n > 0 {
			p = unsafe.Pointer(&s[0])
		}
	default:
		err = fmt.Errorf("host values of type %T (it takes []float32, []tensor.BF16, []int32, []float64, []tensor.F8E4M3 or []tensor.F8E5M2)", x)
	}
	return p, t, n, err
}

// Upload copies host values into b (same length); the copy is finished when it
// returns.
func (d *Device) Upload(b Buffer, src any) {
	p, t, n, err := hostSlice(src)
	if err != nil {
		d.fail("upload", err)
		return
	}
	if !d.checkLen("upload", b, t, n) {
		return
	}
	d.counted("upload", 0, b.Bytes())
	d.fail("upload", d.htod(b.ptr, p, b.Bytes()))
}

// Download copies b into host memory (same length), waiting for the work issued
// before it: a synchronisation, counted by Readbacks.
func (d *Device) Download(dst any, b Buffer) {
	p, t, n, err := hostSlice(dst)
	if err != nil {
		d.fail("download", err)
		return
	}
	if !d.checkLen("download", b, t, n) {
		return
	}
	d.readbacks.Add(1)
	d.counted("download", b.Bytes(), 0)
	d.fail("download", d.dtoh(p, b.ptr, b.Bytes()))
}

// Copy copies src into dst (same dtype and length) on the stream.
func (d *Device) Copy(dst, src Buffer) {
	if d.err != nil || src.N == 0 {
		return
	}
	if dst.DType != src.DType || dst.N != src.N {
		d.fail("copy", fmt.Errorf("%d %s into %d %s", src.N, src.DType, dst.N, dst.DType))
		return
	}
	if d.counted("copy", src.Bytes(), dst.Bytes()); d.tr.dry {
		return
	}
	d.fail("copy", d.dtod(dst.ptr, src.ptr, src.Bytes()))
}

// Zero sets b to zero on the stream.
func (d *Device) Zero(b Buffer) {
	if d.err != nil || b.N == 0 {
		return
	}
	if d.counted("memset", 0, b.Bytes()); d.tr.dry {
		return
	}
	d.fail("zero", d.memset8(b.ptr, 0, b.Bytes()))
}

// Fill sets every element of an f32 buffer to v on the stream.
func (d *Device) Fill(b Buffer, v float32) {
	if d.err != nil || b.N == 0 {
		return
	}
	if b.DType != F32 {
		d.fail("fill", fmt.Errorf("fill of a %s buffer", b.DType))
		return
	}
	if d.counted("memset", 0, b.Bytes()); d.tr.dry {
		return
	}
	d.fail("fill", d.memset32(b.ptr, math.Float32bits(v), int64(b.N)))
}

// fillBits8 sets every element of a 1-byte buffer (FP8) to the bit pattern v
// on the stream.
func (d *Device) fillBits8(b Buffer, v uint8) {
	if d.err != nil || b.N == 0 {
		return
	}
	if d.counted("memset", 0, b.Bytes()); d.tr.dry {
		return
	}
	d.fail("fill", d.memset8(b.ptr, v, int64(b.N)))
}

// fillBits16 sets every element of a 2-byte buffer to the bit pattern v on the
// stream.
func (d *Device) fillBits16(b Buffer, v uint16) {
	if d.err != nil || b.N == 0 {
		return
	}
	if d.counted("memset", 0, b.Bytes()); d.tr.dry {
		return
	}
	d.fail("fill", d.memset16(b.ptr, v, int64(b.N)))
}

// fillBits32 sets every element of a 4-byte buffer to the bit pattern v on the
// stream.
func (d *Device) fillBits32(b Buffer, v uint32) {
	if d.err != nil || b.N == 0 {
		return
	}
	if d.counted("memset", 0, b.Bytes()); d.tr.dry {
		return
	}
	d.fail("fill", d.memset32(b.ptr, v, int64(b.N)))
}
