//go:build cuda || cudaemu

package cuda

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// KernelTraffic is what one kind of device operation did while traffic was
// counted: how many times it ran, and the bytes of its operands it read and
// wrote. The bytes are nominal: every operand a kernel reads counts its whole
// size once, every one it writes once more, and an output it adds to (an
// accumulating product or backward kernel) counts as read and written; a
// matrix product counts op(A), op(B) and C (C read too when beta ≠ 0). Caches
// and tiles re-reading an operand are not counted, so the figures compare the
// work two ways of running a step ask of the memory, not what a profiler would
// measure.
type KernelTraffic struct {
	Ops           int64 `json:"ops"`
	Read, Written int64 // bytes
}

// Bytes is what the operation read and wrote together.
func (k KernelTraffic) Bytes() int64 { return k.Read + k.Written }

func (k KernelTraffic) add(o KernelTraffic) KernelTraffic {
	return KernelTraffic{Ops: k.Ops + o.Ops, Read: k.Read + o.Read, Written: k.Written + o.Written}
}

// Traffic is the traffic counted, by operation: a kernel's name as
// kernels.ptx has it, "gemm A·B→C" for cuBLASLt products by their dtypes,
// "copy" and "memset" for the stream's copies and fills, and "upload" and
// "download" for copies between host and device.
type Traffic map[string]KernelTraffic

// Total is the traffic of every operation together; Kernels that of kernel
// launches and products alone (every operation but copies, fills and host
// transfers).
func (t Traffic) Total() KernelTraffic {
	var s KernelTraffic
	for _, k := range t {
		s = s.add(k)
	}
	return s
}

// Kernels is the traffic of the launched kernels and the products: what a
// GPU runs as kernels (a copy or fill is a stream operation; uploads and
// downloads cross the host link).
func (t Traffic) Kernels() KernelTraffic {
	var s KernelTraffic
	for name, k := range t {
		if !notKernel(name) {
			s = s.add(k)
		}
	}
	return s
}

func notKernel(name string) bool {
	return name == "copy" || name == "memset" || name == "upload" || name == "download"
}

// String lists the operations by bytes moved, largest first, one a line.
func (t Traffic) String() string {
	names := slices.Collect(maps.Keys(t))
	slices.SortFunc(names, func(a, b string) int {
		if d := t[b].Bytes() - t[a].Bytes(); d != 0 {
			if d > 0 {
				return 1
			}
			return -1
		}
		return strings.Compare(a, b)
	})
	var sb strings.Builder
	for _, n := range names {
		k := t[n]
		fmt.Fprintf(&sb, "%-32s %6d ops %10.1f MB read %10.1f MB written\n", n, k.Ops, float64(k.Read)/1e6, float64(k.Written)/1e6)
	}
	return sb.String()
}

// traffic is a Device's counting state; it lives on the device's goroutine.
type traffic struct {
	on, dry bool
	pend    KernelTraffic // the operands of the launch being issued (rd, wr, rw, acc)
	by      Traffic
}

// CountTraffic starts counting the device's operations afresh (on) or stops
// (off); Traffic returns what was counted.
func (d *Device) CountTraffic(on bool) {
	d.run(func() {
		d.tr.on, d.tr.pend = on, KernelTraffic{}
		if on {
			d.tr.by = Traffic{}
		}
	})
}

// Traffic is a copy of what was counted since CountTraffic(true).
func (d *Device) Traffic() Traffic {
	var out Traffic
	d.run(func() { out = maps.Clone(d.tr.by) })
	return out
}

// SetDryRun makes the host emulator count its operations without running
// them (on) or run them again (off): kernels, products, copies and fills are
// skipped, so a step of a large model can be counted in seconds, with every
// value it would compute left undefined. Transfers between host and device
// still run. A GPU refuses it: its work is issued asynchronously and skipping
// it would not be cheaper to count.
func (d *Device) SetDryRun(on bool) error {
	if !Emulated {
		return errors.New("cuda: a dry run is the host emulator's (build with -tags cudaemu)")
	}
	d.run(func() { d.tr.dry = on })
	return nil
}

// rd, wr and rw are a kernel argument naming buffer b, which the kernel reads,
// writes or both (acc: writes, and reads as well when accumulate is set):
// each counts b's bytes toward the launch that takes it.
func (d *Device) rd(b Buffer) arg {
	d.tr.pend.Read += b.Bytes()
	return ptr(b)
}

func (d *Device) wr(b Buffer) arg {
	d.tr.pend.Written += b.Bytes()
	return ptr(b)
}

func (d *Device) rw(b Buffer) arg {
	d.tr.pend.Read += b.Bytes()
	d.tr.pend.Written += b.Bytes()
	return ptr(b)
}

func (d *Device) acc(b Buffer, accumulate bool) arg {
	if accumulate {
		return d.rw(b)
	}
	return d.wr(b)
}

// counted records one operation named name with the operands gathered since
// the last (the pending launch's), and clears them; it runs whether or not
// the operation then runs, so that a failed launch leaves nothing pending.
func (d *Device) counted(name string, read, written int64) {
	p := d.tr.pend
	d.tr.pend = KernelTraffic{}
	if !d.tr.on {
		return
	}
	d.tr.by[name] = d.tr.by[name].add(KernelTraffic{Ops: 1, Read: p.Read + read, Written: p.Written + written})
}
