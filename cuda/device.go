//go:build cuda

package cuda

import (
	_ "embed"
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
	"syscall"
	"unsafe"

	"gorgonia.org/cu"
)

//go:embed kernels/kernels.ptx
var kernelsPTX string

// Device is one GPU: its primary CUDA context, used by a goroutine locked to
// its OS thread.
// Every method that touches the GPU must run inside Do.
type Device struct {
	Ordinal  int
	dev      cu.Device
	ctx      cu.CUContext // the device's primary context, retained
	retained bool         // the primary context is retained: release it on the way out
	work     chan func()
	done     chan struct{}
	stream   cu.Stream
	mod      cu.Module
	fns      map[string]cu.Function
	err      error // sticky: the first failure; later work is skipped
	lt       *blasLt
	info     Info
	// readbacks counts device-to-host copies (a synchronisation each): tests hold a
	// step to the number its logging interval allows.
	readbacks atomic.Int64
	scratches []Buffer
	// tid is the OS thread the device's goroutine is locked to (run compares it).
	tid  int
	args [24]uint64
	argp [24]unsafe.Pointer
}

// Info describes the device and the libraries found, for run.json and logs.
type Info struct {
	Name            string
	Major, Minor    int // compute capability
	SMs             int
	MemoryBytes     int64
	Driver          int // cuDriverGetVersion: 1000·major + 10·minor
	CuBLASLt        int // cublasLtGetVersion, 0 when not loaded
	CuBLASLtLibrary string
}

func (i Info) String() string {
	return fmt.Sprintf("%s (sm_%d%d, %d SMs, %.1f GiB), driver %d.%d, cuBLASLt %d (%s)", i.Name, i.Major, i.Minor, i.SMs,
		float64(i.MemoryBytes)/(1<<30), i.Driver/1000, i.Driver%1000/10, i.CuBLASLt, i.CuBLASLtLibrary)
}

// Open makes a context on GPU ordinal (after CUDA_VISIBLE_DEVICES), loads the
// kernels and cuBLASLt, and starts the goroutine that owns them.
func Open(ordinal int) (*Device, error) {
	n, err := cu.NumDevices()
	if err != nil {
		return nil, fmt.Errorf("cuda: counting devices: %w", err)
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("cuda: device %d requested, %d visible (check CUDA_VISIBLE_DEVICES)", ordinal, n)
	}
	d := &Device{Ordinal: ordinal, dev: cu.Device(ordinal), work: make(chan func()), done: make(chan struct{}), fns: map[string]cu.Function{}}
	for i := range d.args {
		d.argp[i] = unsafe.Pointer(&d.args[i])
	}
	ready := make(chan error)
	go d.loop(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Device) loop(ready chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(d.done)
	d.tid = syscall.Gettid() // published to other goroutines by ready
	if err := d.setup(); err != nil {
		if d.retained {
			_ = d.dev.ReleasePrimaryCtx()
		}
		ready <- err
		return
	}
	ready <- nil
	for fn := range d.work {
		fn()
	}
	if d.lt != nil {
		d.lt.close()
	}
	_ = d.stream.Destroy()
	_ = d.mod.Unload()
	if d.retained {
		_ = d.dev.ReleasePrimaryCtx()
	}
}

func (d *Device) setup() (err error) {
	// The device's primary context, the one the CUDA runtime uses: NCCL runs on
	// the runtime, and its threads bind the primary context, so the buffers and
	// streams it is handed must live there. Blocking sync spares a core spinning
	// in a read-back; the flags cannot change once another user of this process
	// has made the context active, which is harmless.
	_ = d.dev.SetPrimaryCtxFlags(cu.SchedBlockingSync)
	if d.ctx, err = d.dev.RetainPrimaryCtx(); err != nil {
		return fmt.Errorf("cuda: retaining device %d's primary context: %w", d.Ordinal, err)
	}
	if err = cu.SetCurrentContext(d.ctx); err != nil {
		_ = d.dev.ReleasePrimaryCtx()
		return fmt.Errorf("cuda: making device %d's primary context current: %w", d.Ordinal, err)
	}
	d.retained = true
	if d.stream, err = cu.MakeStream(cu.NonBlocking); err != nil {
		return fmt.Errorf("cuda: creating a stream: %w", err)
	}
	if d.mod, err = cu.LoadData(kernelsPTX); err != nil {
		return fmt.Errorf("cuda: loading the embedded kernels (PTX for compute_80; the driver compiles it): %w", err)
	}
	i := &d.info
	if i.Name, err = d.dev.Name(); err != nil {
		return err
	}
	i.Major, _ = d.dev.Attribute(cu.ComputeCapabilityMajor)
	i.Minor, _ = d.dev.Attribute(cu.ComputeCapabilityMinor)
	i.SMs, _ = d.dev.Attribute(cu.MultiprocessorCount)
	i.MemoryBytes, _ = d.dev.TotalMem()
	i.Driver = cu.Version()
	if d.lt, err = openBlasLt(d.rawStream()); err != nil {
		return err
	}
	i.CuBLASLt, i.CuBLASLtLibrary = d.lt.version, d.lt.library
	return nil
}

// rawStream is the CUstream handle inside cu.Stream (a struct of that one
// pointer), for the libraries loaded at run time.
func (d *Device) rawStream() unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&d.stream))
}

// Do runs fn on the goroutine that owns the context and waits for it.
func (d *Device) Do(fn func()) {
	ch := make(chan struct{})
	d.work <- func() { defer close(ch); fn() }
	<-ch
}

// run runs fn on the device's goroutine: at once when called there (inside
// Do, or from code Do runs), through Do otherwise. The thread id tells: the
// device's goroutine is locked to its thread, which runs no other goroutine
// while it is, so only that goroutine sees the thread's id.
func (d *Device) run(fn func()) {
	if syscall.Gettid() == d.tid {
		fn()
		return
	}
	d.Do(fn)
}

// Close releases the context and everything made in it.
func (d *Device) Close() {
	close(d.work)
	<-d.done
}

// Info reports the device and library versions.
func (d *Device) Info() Info { return d.info }

// Err waits for the work issued so far and returns the first error since the last
// call (and clears it): the one check of a step.
func (d *Device) Err() error {
	if d.err == nil {
		if err := d.stream.Synchronize(); err != nil {
			d.err = fmt.Errorf("cuda: stream: %w", err)
		}
	}
	err := d.err
	d.err = nil
	return err
}

// Readbacks is the number of device-to-host copies so far.
func (d *Device) Readbacks() int64 { return d.readbacks.Load() }

func (d *Device) fail(what string, err error) {
	if d.err == nil && err != nil {
		d.err = fmt.Errorf("cuda: %s: %w", what, err)
	}
}

func (d *Device) fn(name string) (cu.Function, bool) {
	if f, ok := d.fns[name]; ok {
		return f, true
	}
	f, err := d.mod.Function(name)
	if err != nil {
		d.fail("kernel "+name, err)
		return f, false
	}
	d.fns[name] = f
	return f, true
}

// arg is one kernel argument, widened to the 8-byte slot the launcher copies.
type arg = uint64

func ptr(b Buffer) arg  { return uint64(b.ptr) }
func i32(v int) arg     { return uint64(uint32(int32(v))) }
func i64(v int) arg     { return uint64(int64(v)) }
func f32(v float64) arg { return uint64(math.Float32bits(float32(v))) }
func flag(v bool) arg {
	if v {
		return 1
	}
	return 0
}

// launch runs kernel name on the stream with grid (gx, gy), block threads and the
// arguments in order; a failure is kept as the sticky error.
func (d *Device) launch(name string, gx, gy, threads int, args ...arg) {
	if d.err != nil {
		return
	}
	f, ok := d.fn(name)
	if !ok {
		return
	}
	copy(d.args[:], args)
	if err := f.Launch(gx, gy, 1, threads, 1, 1, 0, d.stream, d.argp[:len(args)]); err != nil {
		d.fail("launching "+name, err)
	}
}
