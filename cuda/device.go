//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
	"syscall"
)

// Device is one GPU: its primary CUDA context, used by a goroutine locked to
// its OS thread.
// Every method that touches the GPU must run inside Do.
type Device struct {
	Ordinal int
	drv     driver // the driver's state: the CUDA driver's (driver_cu.go) or the host emulator's (driver_emu.go)
	work    chan func()
	done    chan struct{}
	err     error // sticky: the first failure; later work is skipped
	info    Info
	// widenFP8 sends every FP8 product down the widening path (fp8.go), as
	// on a device before compute capability 8.9: tests compare the paths.
	widenFP8 bool
	// readbacks counts device-to-host copies (a synchronisation each): tests hold a
	// step to the number its logging interval allows.
	readbacks atomic.Int64
	// held is the device memory this Device has allocated and not freed
	// (Alloc, NCCL user buffers; not cuBLASLt's workspace or NCCL's own
	// buffers), peak the most it reached.
	held, peak atomic.Int64
	scratches  []Buffer
	// uuid identifies the device (cuDeviceGetUuid): ranks compare theirs to
	// find whether they share a GPU.
	uuid [16]byte
	// tid is the OS thread the device's goroutine is locked to (run compares it).
	tid int
	// tr counts what the device's operations move, when asked (traffic.go).
	tr traffic
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

// start runs the device's goroutine, which sets the driver up (setup) and then
// runs the work Do sends it until Close.
func (d *Device) start() error {
	d.work, d.done = make(chan func()), make(chan struct{})
	ready := make(chan error)
	go d.loop(ready)
	return <-ready
}

func (d *Device) loop(ready chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(d.done)
	d.tid = syscall.Gettid() // published to other goroutines by ready
	if err := d.setup(); err != nil {
		d.teardown()
		ready <- err
		return
	}
	ready <- nil
	for fn := range d.work {
		fn()
	}
	d.teardown()
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

// UUID identifies the GPU among every GPU (the same on every process that
// opens it): ranks that share one see the same.
func (d *Device) UUID() [16]byte { return d.uuid }

// Info reports the device and library versions.
func (d *Device) Info() Info { return d.info }

// Err waits for the work issued so far and returns the first error since the last
// call (and clears it): the one check of a step.
func (d *Device) Err() error {
	if d.err == nil {
		if err := d.syncStream(); err != nil {
			d.err = fmt.Errorf("cuda: stream: %w", err)
		}
	}
	err := d.err
	d.err = nil
	return err
}

// Allocated is the device memory this Device holds now and the most it has
// held: every allocation it made (buffers, kernel scratch, NCCL user
// buffers), besides cuBLASLt's workspace and NCCL's own buffers.
func (d *Device) Allocated() (now, peak int64) { return d.held.Load(), d.peak.Load() }

// hold counts bytes allocated (negative: freed).
func (d *Device) hold(bytes int64) {
	n := d.held.Add(bytes)
	for {
		p := d.peak.Load()
		if n <= p || d.peak.CompareAndSwap(p, n) {
			return
		}
	}
}

// Readbacks is the number of device-to-host copies so far.
func (d *Device) Readbacks() int64 { return d.readbacks.Load() }

func (d *Device) fail(what string, err error) {
	if d.err == nil && err != nil {
		d.err = fmt.Errorf("cuda: %s: %w", what, err)
	}
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
// arguments in order; a failure is kept as the sticky error. The buffers among
// the arguments are passed through rd, wr, rw or acc, which count their bytes
// toward this launch when traffic is counted (traffic.go).
func (d *Device) launch(name string, gx, gy, threads int, args ...arg) {
	d.counted(name, 0, 0)
	if d.err != nil || d.tr.dry {
		return
	}
	d.fail("launching "+name, d.launchRaw(name, gx, gy, threads, args))
}
