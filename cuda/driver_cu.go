//go:build cuda

package cuda

import (
	_ "embed"
	"fmt"
	"time"
	"unsafe"

	"gorgonia.org/cu"
)

// The CUDA driver under Device (the shardline-cuda build): the primary
// context, one stream, the embedded PTX module, cuBLASLt. driver_emu.go has
// the same primitives over the host emulator.

//go:embed kernels/kernels.ptx
var kernelsPTX string

// Emulated is false: this build drives a GPU (driver_emu.go's is true).
const Emulated = false

// devicePtr is a device address.
type devicePtr = cu.DevicePtr

// driver is the CUDA driver's state of a Device, used on its goroutine.
type driver struct {
	dev      cu.Device
	ctx      cu.CUContext // the device's primary context, retained
	retained bool         // the primary context is retained: release it on the way out
	stream   cu.Stream    // the compute stream
	comm     cu.Stream    // the communication stream (streams.go)
	onComm   bool         // work is issued on comm (inside Background)
	fence    cu.Event     // recorded on the compute stream for comm to wait on
	events   []cu.Event
	free     []int // indices of events no mark holds
	// Stamps (traces): timing events, the first nstamps recorded since the
	// last Times, timed against base, recorded and waited for at the first
	// stamp, when the host's clock read baseAt.
	stamps  []cu.Event
	nstamps int
	base    cu.Event
	baseAt  time.Time
	mod     cu.Module
	fns     map[string]cu.Function
	lt      *blasLt
	args    [24]uint64
	argp    [24]unsafe.Pointer
}

// Count is the number of GPUs visible (after CUDA_VISIBLE_DEVICES).
func Count() (int, error) {
	n, err := cu.NumDevices()
	if err != nil {
		return 0, fmt.Errorf("cuda: counting devices: %w", err)
	}
	return n, nil
}

// Open makes a context on GPU ordinal (after CUDA_VISIBLE_DEVICES), loads the
// kernels and cuBLASLt, and starts the goroutine that owns them.
func Open(ordinal int) (*Device, error) {
	n, err := Count()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("cuda: device %d requested, %d visible (check CUDA_VISIBLE_DEVICES)", ordinal, n)
	}
	d := &Device{Ordinal: ordinal, drv: driver{dev: cu.Device(ordinal), fns: map[string]cu.Function{}}}
	for i := range d.drv.args {
		d.drv.argp[i] = unsafe.Pointer(&d.drv.args[i])
	}
	if err := d.start(); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Device) setup() (err error) {
	v := &d.drv
	// The device's primary context, the one the CUDA runtime uses: NCCL runs on
	// the runtime, and its threads bind the primary context, so the buffers and
	// streams it is handed must live there. Blocking sync spares a core spinning
	// in a read-back; the flags cannot change once another user of this process
	// has made the context active, which is harmless.
	_ = v.dev.SetPrimaryCtxFlags(cu.SchedBlockingSync)
	if v.ctx, err = v.dev.RetainPrimaryCtx(); err != nil {
		return fmt.Errorf("cuda: retaining device %d's primary context: %w", d.Ordinal, err)
	}
	v.retained = true
	if err = cu.SetCurrentContext(v.ctx); err != nil {
		return fmt.Errorf("cuda: making device %d's primary context current: %w", d.Ordinal, err)
	}
	if v.stream, err = cu.MakeStream(cu.NonBlocking); err != nil {
		return fmt.Errorf("cuda: creating a stream: %w", err)
	}
	if v.comm, err = cu.MakeStream(cu.NonBlocking); err != nil {
		return fmt.Errorf("cuda: creating the communication stream: %w", err)
	}
	if v.fence, err = cu.MakeEvent(cu.DisableTiming); err != nil {
		return fmt.Errorf("cuda: creating an event: %w", err)
	}
	if v.mod, err = cu.LoadData(kernelsPTX); err != nil {
		return fmt.Errorf("cuda: loading the embedded kernels (PTX for compute_80; the driver compiles it): %w", err)
	}
	i := &d.info
	if i.Name, err = v.dev.Name(); err != nil {
		return err
	}
	i.Major, _ = v.dev.Attribute(cu.ComputeCapabilityMajor)
	i.Minor, _ = v.dev.Attribute(cu.ComputeCapabilityMinor)
	i.SMs, _ = v.dev.Attribute(cu.MultiprocessorCount)
	i.MemoryBytes, _ = v.dev.TotalMem()
	if u, err := v.dev.UUID(); err == nil {
		copy(d.uuid[:], u[:])
	}
	i.Driver = cu.Version()
	if v.lt, err = openBlasLt(d.rawStream()); err != nil {
		return err
	}
	i.CuBLASLt, i.CuBLASLtLibrary = v.lt.version, v.lt.library
	return nil
}

// teardown releases what setup made (as far as it got).
func (d *Device) teardown() {
	v := &d.drv
	if v.lt != nil {
		v.lt.close()
	}
	for i := range v.events {
		_ = cu.DestroyEvent(&v.events[i])
	}
	for i := range v.stamps {
		_ = cu.DestroyEvent(&v.stamps[i])
	}
	if v.base != (cu.Event{}) {
		_ = cu.DestroyEvent(&v.base)
	}
	if v.fence != (cu.Event{}) {
		_ = cu.DestroyEvent(&v.fence)
	}
	if v.comm != (cu.Stream{}) {
		_ = v.comm.Destroy()
	}
	if v.stream != (cu.Stream{}) {
		_ = v.stream.Destroy()
	}
	if v.mod != (cu.Module{}) {
		_ = v.mod.Unload()
	}
	if v.retained {
		_ = v.dev.ReleasePrimaryCtx()
	}
}

// cur is the stream work is issued on now: the communication stream inside
// Background, else the compute stream.
func (d *Device) cur() cu.Stream {
	if d.drv.onComm {
		return d.drv.comm
	}
	return d.drv.stream
}

// rawStream is the CUstream handle inside cu.Stream (a struct of that one
// pointer) of the stream work is issued on now, for the libraries loaded at
// run time.
func (d *Device) rawStream() unsafe.Pointer {
	s := d.cur()
	return *(*unsafe.Pointer)(unsafe.Pointer(&s))
}

// syncStream waits for the work issued on both streams.
func (d *Device) syncStream() error {
	if err := d.drv.stream.Synchronize(); err != nil {
		return err
	}
	return d.drv.comm.Synchronize()
}

// fenceComm makes the communication stream's next work wait for the compute
// work issued so far. The wait takes the event as recorded now, so the one
// fence event serves every call.
func (d *Device) fenceComm() {
	v := &d.drv
	if err := v.fence.Record(v.stream); err != nil {
		d.fail("recording an event", err)
		return
	}
	d.fail("ordering the communication stream", v.comm.Wait(v.fence, 0))
}

// markComm records an event of the communication stream's work so far, from
// the pool, and returns its index.
func (d *Device) markComm() int {
	v := &d.drv
	if len(v.free) == 0 {
		ev, err := cu.MakeEvent(cu.DisableTiming)
		if err != nil {
			d.fail("creating an event", err)
			return -1
		}
		v.events = append(v.events, ev)
		v.free = append(v.free, len(v.events)-1)
	}
	i := v.free[len(v.free)-1]
	v.free = v.free[:len(v.free)-1]
	d.fail("recording an event", v.events[i].Record(v.comm))
	return i
}

// stamp records a timing event on the current stream.
func (d *Device) stamp() int {
	v := &d.drv
	if v.base == (cu.Event{}) {
		ev, err := cu.MakeEvent(cu.DefaultEvent)
		if err == nil {
			err = ev.Record(v.stream)
		}
		if err == nil {
			err = ev.Synchronize()
		}
		if err != nil {
			d.fail("a trace's base event", err)
			return -1
		}
		v.base, v.baseAt = ev, time.Now()
	}
	if v.nstamps == len(v.stamps) {
		ev, err := cu.MakeEvent(cu.DefaultEvent)
		if err != nil {
			d.fail("creating a timing event", err)
			return -1
		}
		v.stamps = append(v.stamps, ev)
	}
	i := v.nstamps
	v.nstamps++
	d.fail("recording a timing event", v.stamps[i].Record(d.cur()))
	return i
}

// stampTimes is each stamp's time since the base event, on the host's clock
// (the streams are done).
func (d *Device) stampTimes() ([]time.Time, error) {
	v := &d.drv
	out := make([]time.Time, v.nstamps)
	for i := range out {
		ms, err := v.base.Elapsed(v.stamps[i])
		if err != nil {
			return nil, fmt.Errorf("cuda: timing event %d: %w", i, err)
		}
		out[i] = v.baseAt.Add(time.Duration(ms * float64(time.Millisecond)))
	}
	v.nstamps = 0
	return out, nil
}

// awaitComm makes the compute stream's next work wait for mark's event and
// returns the event to the pool (the wait holds the event as recorded).
func (d *Device) awaitComm(mark int) {
	v := &d.drv
	if mark < 0 || mark >= len(v.events) {
		d.fail("awaiting", fmt.Errorf("no mark %d", mark))
		return
	}
	d.fail("ordering the compute stream", v.stream.Wait(v.events[mark], 0))
	v.free = append(v.free, mark)
}

func (d *Device) fn(name string) (cu.Function, error) {
	if f, ok := d.drv.fns[name]; ok {
		return f, nil
	}
	f, err := d.drv.mod.Function(name)
	if err != nil {
		return f, fmt.Errorf("kernel %s: %w", name, err)
	}
	d.drv.fns[name] = f
	return f, nil
}

// launchRaw launches kernel name on the stream.
func (d *Device) launchRaw(name string, gx, gy, threads int, args []arg) error {
	f, err := d.fn(name)
	if err != nil {
		return err
	}
	copy(d.drv.args[:], args)
	return f.Launch(gx, gy, 1, threads, 1, 1, 0, d.cur(), d.drv.argp[:len(args)])
}

func (d *Device) memAlloc(bytes int64) (devicePtr, error) { return cu.MemAlloc(bytes) }
func (d *Device) memFree(p devicePtr) error               { return cu.MemFree(p) }
func (d *Device) memInfo() (free, total int64, err error) { return cu.MemInfo() }

// htod and dtoh copy between host and device memory, after both streams' work.
func (d *Device) htod(dst devicePtr, src unsafe.Pointer, bytes int64) error {
	if err := d.syncStream(); err != nil {
		return err
	}
	return cu.MemcpyHtoD(dst, src, bytes)
}
func (d *Device) dtoh(dst unsafe.Pointer, src devicePtr, bytes int64) error {
	if err := d.syncStream(); err != nil {
		return err
	}
	return cu.MemcpyDtoH(dst, src, bytes)
}

// dtod, memset8, memset16 and memset32 are issued on the current stream.
func (d *Device) dtod(dst, src devicePtr, bytes int64) error {
	return cu.MemcpyDtoDAsync(dst, src, bytes, d.cur())
}
func (d *Device) memset8(p devicePtr, v byte, n int64) error {
	return cu.MemsetD8Async(p, v, n, d.cur())
}
func (d *Device) memset16(p devicePtr, v uint16, n int64) error {
	return cu.MemsetD16Async(p, v, n, d.cur())
}
func (d *Device) memset32(p devicePtr, v uint32, n int64) error {
	return cu.MemsetD32Async(p, uint(v), n, d.cur())
}
