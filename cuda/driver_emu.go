//go:build cudaemu

package cuda

/*
#cgo CXXFLAGS: -std=c++17 -O1 -DSHARDLINE_EMU -I${SRCDIR}/kernels -I${SRCDIR}/kernels/emu -w
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
int emu_launch(const char* name, unsigned gx, unsigned gy, unsigned threads, const uint64_t* args, int nargs);
*/
import "C"

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/shardline/shardline/tensor"
)

// The host emulator under Device (the cudaemu build tag, for tests without a
// GPU): device memory is host memory from malloc, the stream is synchronous,
// kernels run under kernels/emu/emu.h (emu.cc: every kernel of kernels.cu but
// the tensor-core ones, which refuse), and products run as plain loops
// accumulated in float64. It exercises everything above the driver, the
// engine's kernel set and memory included, as the GPU runs it; timings and
// fast-math rounding are not the GPU's. NCCL and cuBLASLt are not part of it.

// Emulated is true in the host emulator's build: device tests shrink their
// shapes by it (the emulator runs a kernel's threads one after another).
const Emulated = true

// devicePtr is an emulated device address (host memory).
type devicePtr = uintptr

// driver is the emulator's state: the kernel arguments' slots, in C memory
// (cgo may not keep a Go pointer).
type driver struct {
	args *C.uint64_t
	// The communication stream (streams.go), lazy: work issued on it while
	// onComm is queued, and runs when the compute stream awaits it or at a
	// synchronisation. issued counts the work ever queued, done what ran.
	onComm       bool
	queue        []func() error
	issued, done int
	stamps       []time.Time // when each stamp since the last Times ran
}

// emuSMs is the emulated device's multiprocessors: an H100's, so that grids
// are shaped as there.
const emuSMs = 132

// Count is the number of emulated devices: SHARDLINE_EMU_DEVICES (1 to 8;
// 1 when unset), so that tests can run ranks on devices of their own (with
// the emulator's NCCL) as well as ranks sharing one.
func Count() (int, error) {
	v := os.Getenv("SHARDLINE_EMU_DEVICES")
	if v == "" {
		return 1, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 8 {
		return 0, fmt.Errorf("cuda: SHARDLINE_EMU_DEVICES=%q: the host emulator runs 1 to 8 devices", v)
	}
	return n, nil
}

// Open opens emulated device ordinal (below Count).
func Open(ordinal int) (*Device, error) {
	n, err := Count()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("cuda: device %d requested, the host emulator has %d (SHARDLINE_EMU_DEVICES)", ordinal, n)
	}
	d := &Device{Ordinal: ordinal}
	// A UUID per emulated ordinal (16 bytes): ranks on one device see the
	// same one.
	copy(d.uuid[:], fmt.Sprintf("host-emulator/%02d", ordinal))
	if err := d.start(); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Device) setup() error {
	d.drv.args = (*C.uint64_t)(C.calloc(64, 8))
	d.info = Info{Name: "host emulator (cuda/kernels/emu)", Major: 9, SMs: emuSMs, MemoryBytes: 1 << 34, CuBLASLtLibrary: "none: plain loops"}
	return nil
}

func (d *Device) teardown() {
	if d.drv.args != nil {
		C.free(unsafe.Pointer(d.drv.args))
	}
}

// syncStream runs the communication stream's queued work.
func (d *Device) syncStream() error { return d.drain(d.drv.issued) }

// issue runs fn now on the compute stream, or queues it on the
// communication stream inside Background.
func (d *Device) issue(fn func() error) error {
	if !d.drv.onComm {
		return fn()
	}
	d.drv.queue = append(d.drv.queue, fn)
	d.drv.issued++
	return nil
}

// drain runs the communication stream's queued work up to mark (a count of
// work issued); the first failure is kept as the device's.
func (d *Device) drain(mark int) error {
	v := &d.drv
	var first error
	for v.done < mark && len(v.queue) > 0 {
		fn := v.queue[0]
		v.queue[0] = nil
		v.queue = v.queue[1:]
		v.done++
		if err := fn(); err != nil && first == nil {
			first = err
		}
	}
	if len(v.queue) == 0 {
		v.queue = v.queue[:0:0]
	}
	return first
}

// fenceComm: the compute stream runs eagerly, so the communication stream's
// next work already comes after it.
func (d *Device) fenceComm() {}

// markComm is the count of work issued on the communication stream.
func (d *Device) markComm() int { return d.drv.issued }

// stamp reads the host's clock when its stream runs it.
func (d *Device) stamp() int {
	i := len(d.drv.stamps)
	d.drv.stamps = append(d.drv.stamps, time.Time{})
	d.fail("stamp", d.issue(func() error {
		d.drv.stamps[i] = time.Now()
		return nil
	}))
	return i
}

// stampTimes returns the stamps' times (the streams are done).
func (d *Device) stampTimes() ([]time.Time, error) {
	out := d.drv.stamps
	d.drv.stamps = nil
	return out, nil
}

// awaitComm runs the communication stream's work up to mark.
func (d *Device) awaitComm(mark int) { d.fail("background work", d.drain(mark)) }

func (d *Device) launchRaw(name string, gx, gy, threads int, args []arg) error {
	if len(args) > 64 {
		return fmt.Errorf("%d arguments", len(args))
	}
	args = slices.Clone(args) // a queued launch runs later
	return d.issue(func() error { return d.launchNow(name, gx, gy, threads, args) })
}

func (d *Device) launchNow(name string, gx, gy, threads int, args []arg) error {
	copy(unsafe.Slice((*uint64)(unsafe.Pointer(d.drv.args)), 64), args)
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	// One kernel at a time in the process: a kernel's shared memory is its
	// static locals (emu.h), which the emulated devices would share.
	emuLaunch.Lock()
	defer emuLaunch.Unlock()
	switch r := C.emu_launch(cname, C.uint(gx), C.uint(gy), C.uint(threads), d.drv.args, C.int(len(args))); {
	case r == -1:
		return fmt.Errorf("the host emulator has no kernel %s (the tensor-core kernels are not emulated)", name)
	case r != 0:
		return fmt.Errorf("%d arguments for %d parameters", len(args), r)
	}
	return nil
}

// emuLaunch serialises the emulated devices' kernels.
var emuLaunch sync.Mutex

// addr is an emulated device address as a pointer (C memory, which the
// collector does not move or free).
func addr(p devicePtr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

func (d *Device) memAlloc(bytes int64) (devicePtr, error) {
	// 256-byte aligned, as cuMemAlloc's allocations are: a kernel's vector
	// path is taken here where it is on the device.
	p := C.aligned_alloc(256, C.size_t((max(bytes, 1)+255)&^255))
	if p == nil {
		return 0, fmt.Errorf("malloc of %d bytes failed", bytes)
	}
	return devicePtr(uintptr(p)), nil
}

func (d *Device) memFree(p devicePtr) error {
	C.free(addr(p))
	return nil
}

func (d *Device) memInfo() (free, total int64, err error) { return 1 << 34, 1 << 34, nil }

// htod and dtoh copy after both streams' work, as the driver's do.
func (d *Device) htod(dst devicePtr, src unsafe.Pointer, bytes int64) error {
	if err := d.syncStream(); err != nil {
		return err
	}
	C.memcpy(addr(dst), src, C.size_t(bytes))
	return nil
}
func (d *Device) dtoh(dst unsafe.Pointer, src devicePtr, bytes int64) error {
	if err := d.syncStream(); err != nil {
		return err
	}
	C.memcpy(dst, addr(src), C.size_t(bytes))
	return nil
}

// dtod, memset8, memset16 and memset32 run on the current stream.
func (d *Device) dtod(dst, src devicePtr, bytes int64) error {
	return d.issue(func() error {
		C.memmove(addr(dst), addr(src), C.size_t(bytes))
		return nil
	})
}
func (d *Device) memset8(p devicePtr, v byte, n int64) error {
	return d.issue(func() error {
		C.memset(addr(p), C.int(v), C.size_t(n))
		return nil
	})
}
func (d *Device) memset16(p devicePtr, v uint16, n int64) error {
	return d.issue(func() error {
		fillWith(unsafe.Slice((*uint16)(addr(p)), n), v)
		return nil
	})
}
func (d *Device) memset32(p devicePtr, v uint32, n int64) error {
	return d.issue(func() error {
		fillWith(unsafe.Slice((*uint32)(addr(p)), n), v)
		return nil
	})
}

// fillWith sets every element of s to v.
func fillWith[T uint16 | uint32](s []T, v T) {
	for i := range s {
		s[i] = v
	}
}

// batchedProduct is the column-major C (m×n) = op(A)·op(B) + beta·C over batch
// products (A, B and C at i·sa, i·sb and i·sc elements), each sum in float64,
// as plain loops: cuBLASLt's contract, not its speed.
func (d *Device) batchedProduct(ta, tb bool, m, n, k int, A Buffer, lda, sa int, B Buffer, ldb, sb int, beta float32, Cb Buffer, ldc, sc, batch int) {
	a, b := emuWiden(A), emuWiden(B)
	c := emuWiden(Cb)
	for bi := 0; bi < batch; bi++ {
		for j := 0; j < n; j++ {
			for i := 0; i < m; i++ {
				// op(A)(i,p) at ai + p·as, op(B)(p,j) at bj + p·bs.
				ai, as := bi*sa+i, lda
				if ta {
					ai, as = bi*sa+i*lda, 1
				}
				bj, bs := bi*sb+j*ldb, 1
				if tb {
					bj, bs = bi*sb+j, ldb
				}
				var s float64
				for p := 0; p < k; p++ {
					s += float64(a[ai+p*as]) * float64(b[bj+p*bs])
				}
				ci := bi*sc + i + j*ldc
				if beta != 0 {
					s += float64(beta) * float64(c[ci])
				}
				c[ci] = float32(s)
			}
		}
	}
	if Cb.DType == BF16 {
		tensor.CastToBF16(unsafe.Slice((*tensor.BF16)(addr(Cb.ptr)), Cb.N), c)
	}
}

// fp8Product is gemmFP8's product as plain loops under cuBLASLt's FP8 rules
// (which gemmFP8 checked): C (m×n) = (sa·sb)·Aᵀ·B + β·C, each sum of the
// codes' values in float64, times the fp32 product of the scale inverses,
// rounded once into C.
func (d *Device) fp8Product(m, n, k int, A Buffer, lda int, sa Buffer, B Buffer, ldb int, sb Buffer, beta float32, Cb Buffer, ldc int) {
	fa, _ := A.DType.FP8()
	fb, _ := B.DType.FP8()
	a := unsafe.Slice((*uint8)(addr(A.ptr)), A.N)
	b := unsafe.Slice((*uint8)(addr(B.ptr)), B.N)
	alpha := float64(*(*float32)(addr(sa.ptr)) * *(*float32)(addr(sb.ptr)))
	c := emuWiden(Cb)
	for j := 0; j < n; j++ {
		for i := 0; i < m; i++ {
			var s float64
			for p := 0; p < k; p++ {
				s += float64(fa.Decode(a[i*lda+p])) * float64(fb.Decode(b[j*ldb+p]))
			}
			s *= alpha
			ci := i + j*ldc
			if beta != 0 {
				s += float64(beta) * float64(c[ci])
			}
			c[ci] = float32(s)
		}
	}
	if Cb.DType == BF16 {
		tensor.CastToBF16(unsafe.Slice((*tensor.BF16)(addr(Cb.ptr)), Cb.N), c)
	}
}

// emuWiden is an f32 buffer's elements in place, or a bf16 buffer's widened
// into a new slice.
func emuWiden(b Buffer) []float32 {
	if b.DType == BF16 {
		out := make([]float32, b.N)
		tensor.CastToFloat32(out, unsafe.Slice((*tensor.BF16)(addr(b.ptr)), b.N))
		return out
	}
	return unsafe.Slice((*float32)(addr(b.ptr)), b.N)
}
