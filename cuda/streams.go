//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"time"
)

// The communication stream. A device issues its work on the compute stream,
// except inside Background, whose work (kernels, copies, memsets, NCCL
// collectives; not matrix products, whose cuBLASLt handle is bound to the
// compute stream) goes on a second stream that runs beside it: the FSDP
// runtime's gathers and reductions, overlapping the layers' compute. Events
// order the two without the host waiting: Background's work starts after the
// compute work issued before it (fenceComm), and the compute work issued after
// Await(mark) starts after the background work the mark covers.
//
// On the host emulator the communication stream is lazy: its work is queued
// and runs only when the compute stream awaits it (or at a synchronisation:
// Err, a read-back, Close). Compute that reads what background work writes
// without awaiting it sees the old values there, deterministically, so a
// missing Await shows as wrong results in the emulated tests rather than as a
// race on a GPU.

// Background runs fn with the device's work issued on the communication
// stream after the compute work issued so far, and returns a mark of the
// background work issued so far, for Await. It runs on the device's goroutine.
// After a failure fn still runs (callers wait for what it does; the device
// skips its work), and the mark is -1, which Await ignores.
func (d *Device) Background(fn func()) (mark int) {
	d.run(func() {
		mark = -1
		ok := d.err == nil
		if ok {
			d.fenceComm()
		}
		d.drv.onComm = true
		defer func() { d.drv.onComm = false }()
		fn()
		if ok && d.err == nil {
			mark = d.markComm()
		}
	})
	return mark
}

// Await makes the compute work issued from now on wait for the background
// work mark covers. A mark is awaited once.
func (d *Device) Await(mark int) {
	d.run(func() {
		if d.err == nil && mark >= 0 {
			d.awaitComm(mark)
		}
	})
}

// Background is Device.Background for the memory's work, with the memory's
// error (collective.Streamed).
func (m *Memory) Background(fn func() error) (mark int, err error) {
	mark = m.d.Background(func() { err = fn() })
	if err == nil && !m.ok() {
		err = fmt.Errorf("background work: %w", m.err)
	}
	return mark, err
}

// Await is Device.Await.
func (m *Memory) Await(mark int) { m.d.Await(mark) }

// Stamp marks the point the current stream has reached (the communication
// stream inside Background), for a trace; Times resolves the stamps.
func (d *Device) Stamp() (i int) {
	d.run(func() { i = d.stamp() })
	return i
}

// Times waits for both streams and returns the host time each stamp since
// the last call was reached, in order; the stamps are then reused.
func (d *Device) Times() (out []time.Time, err error) {
	d.run(func() {
		if err = d.syncStream(); err == nil {
			out, err = d.stampTimes()
		}
	})
	return out, err
}

// Stamp is Device.Stamp (collective.Timed).
func (m *Memory) Stamp() int { return m.d.Stamp() }

// Times is Device.Times.
func (m *Memory) Times() ([]time.Time, error) { return m.d.Times() }
