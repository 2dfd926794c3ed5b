//go:build cuda || cudaemu

package cuda

// The NCCL tests: a group of one on GPU 0 wherever a GPU is (every collective,
// the refusals, user buffers where the library has them), and a group of every
// visible GPU, one rank each, which is skipped, saying so, on a machine with
// one. Both make the unique id on rank 0 and hand it to the others over the
// in-process communicator with comm.BroadcastBytes, as a job hands it over its
// TCP rendezvous.
//
// Tolerances: gathers, broadcasts, all-to-all and send/recv move values, so they
// are exact. Sums run in NCCL's ring order: fp32 within 1e-6 relative of the
// serial sum (a few roundings of sums of unit-scale values); bf16 within 8e-3,
// the bf16 tolerance of the kernel tests, since NCCL rounds to bf16 at each hop.

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardline/shardline/parallel/collective"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/tensor"
)

// rankValues is rank r's n source values: distinct per rank and element, exact
// in bf16 (small integers over 8), so the exact collectives compare bit for bit.
func rankValues(r, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32((r*7+i*3)%23-11) / 8
	}
	return x
}

// ncclGroup makes a group over devs (rank r on devs[r]): rank 0's unique id
// goes to the others by comm.BroadcastBytes, then every rank joins at once.
func ncclGroup(t testing.TB, devs []*Device) []*Comm {
	t.Helper()
	n := len(devs)
	world := comm.NewWorld(n, time.Minute)
	comms := make([]*Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := make([]byte, UniqueIDBytes)
			if r == 0 {
				made, err := NewUniqueID()
				if err != nil {
					errs[r] = err
					world.Abort(err) // the others fail instead of waiting for the id
					return
				}
				copy(id, made)
			}
			if err := comm.BroadcastBytes(world.Rank(r), id, 0); err != nil {
				errs[r] = err
				return
			}
			devs[r].Do(func() { comms[r], errs[r] = devs[r].NewComm(id, n, r) })
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for r, c := range comms {
			devs[r].Do(func() {
				if err := c.Close(); err != nil {
					t.Error(err)
				}
			})
		}
	})
	return comms
}

// onRanks runs fn for every rank at once, each on its device's goroutine
// (collectives block until the peers take part), and reports the errors of fn
// and of the devices' streams.
func onRanks(t *testing.T, devs []*Device, comms []*Comm, fn func(r int, d *Device, c *Comm) error) {
	t.Helper()
	errs := rankErrors(devs, func(r int, d *Device) error { return errors.Join(fn(r, d, comms[r]), d.Err()) })
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// rankErrors runs fn for every rank at once, each on its device's goroutine,
// and returns their errors.
func rankErrors(devs []*Device, fn func(r int, d *Device) error) []error {
	errs := make([]error, len(devs))
	var wg sync.WaitGroup
	for r, d := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.Do(func() { errs[r] = fn(r, d) })
		}()
	}
	wg.Wait()
	return errs
}

func exact(what string, got, want []float32) error {
	for i := range want {
		if got[i] != want[i] {
			return fmt.Errorf("%s: element %d is %v, want %v", what, i, got[i], want[i])
		}
	}
	return nil
}

func near(what string, got, want []float32, tol float64) error {
	if e := relErr(got, want); e > tol {
		return fmt.Errorf("%s: relative error %.3g, tolerance %.1g", what, e, tol)
	}
	return nil
}

// checkCollectives runs every collective over the group, in f32 and bf16
// where it takes both, against values computed on the host.
func checkCollectives(t *testing.T, devs []*Device, comms []*Comm) {
	n := len(devs)
	const L = 1000 // per-rank chunk
	for _, dt := range []DType{F32, BF16} {
		onRanks(t, devs, comms, func(r int, d *Device, c *Comm) error {
			src := upload(d, dt, rankValues(r, L))
			dst := upload(d, dt, make([]float32, n*L))
			defer d.Free(src)
			defer d.Free(dst)
			if err := c.AllGather(dst, src); err != nil {
				return err
			}
			var want []float32
			for q := 0; q < n; q++ {
				want = append(want, rankValues(q, L)...)
			}
			return exact(fmt.Sprintf("%s all-gather", dt), download(d, dst), want)
		})
		onRanks(t, devs, comms, func(r int, d *Device, c *Comm) error {
			src := upload(d, dt, rankValues(r, n*L))
			dst := upload(d, dt, make([]float32, L))
			defer d.Free(src)
			defer d.Free(dst)
			if err := c.ReduceScatter(dst, src); err != nil {
				return err
			}
			want := make([]float32, L)
			for q := 0; q < n; q++ {
				for i, v := range rankValues(q, n*L)[r*L : (r+1)*L] {
					want[i] += v
				}
			}
			return near(fmt.Sprintf("%s reduce-scatter", dt), download(d, dst), roundTo(dt, want), map[DType]float64{F32: 1e-6, BF16: 8e-3}[dt])
		})
	}
	// FP8 codes all-gather as bytes (ncclUint8), every one of the 256 codes
	// unchanged in both formats; they are never summed.
	for _, dt := range []DType{F8E4M3, F8E5M2} {
		onRanks(t, devs, comms, func(r int, d *Device, c *Comm) error {
			codes := func(q int) []tensor.F8E4M3 {
				x := make([]tensor.F8E4M3, 256)
				for i := range x {
					x[i] = tensor.F8E4M3(uint8(i + 85*q))
				}
				return x
			}
			src, err := d.Alloc(dt, 256)
			if err != nil {
				return err
			}
			dst, err := d.Alloc(dt, n*256)
			if err != nil {
				return err
			}
			defer d.Free(src)
			defer d.Free(dst)
			if dt == F8E5M2 {
				e := make([]tensor.F8E5M2, 256)
				for i, x := range codes(r) {
					e[i] = tensor.F8E5M2(x)
				}
				d.Upload(src, e)
			} else {
				d.Upload(src, codes(r))
			}
			if err := c.AllGather(dst, src); err != nil {
				return err
			}
			got := make([]tensor.F8E4M3, n*256)
			if dt == F8E5M2 {
				e := make([]tensor.F8E5M2, n*256)
				d.Download(e, dst)
				for i, x := range e {
					got[i] = tensor.F8E4M3(x)
				}
			} else {
				d.Download(got, dst)
			}
			for q := 0; q < n; q++ {
				for i, x := range codes(q) {
					if got[q*256+i] != x {
						return fmt.Errorf("%s all-gather: rank %d's code %d is %#x, want %#x", dt, q, i, got[q*256+i], x)
					}
				}
			}
			if err := c.ReduceScatter(src.Slice(0, 2), dst.Slice(0, 2*n)); err == nil || !strings.Contains(err.Error(), "never summed") {
				return fmt.Errorf("%s reduce-scatter: %v, want a refusal", dt, err)
			}
			return nil
		})
	}
	onRanks(t, devs, comms, func(r int, d *Device, c *Comm) error {
		buf := upload(d, F32, rankValues(r, L))
		defer d.Free(buf)
		if err := c.AllReduce(buf); err != nil {
			return err
		}
		want := make([]float32, L)
		for q := 0; q < n; q++ {
			for i, v := range rankValues(q, L) {
				want[i] += v
			}
		}
		if err := near("all-reduce", download(d, buf), want, 1e-6); err != nil {
			return err
		}
		root := n - 1
		bc := upload(d, F32, rankValues(r, L))
		defer d.Free(bc)
		if err := c.Broadcast(bc, root); err != nil {
			return err
		}
		return exact("broadcast", download(d, bc), rankValues(root, L))
	})
	// Uneven all-to-all: rank r sends r+j+1 values to rank j (a zero count
	// where (r+j)%3 == 2), the values tagged by sender and receiver.
	count := func(from, to int) int {
		if (from+to)%3 == 2 && from != to {
			return 0
		}
		return from + to + 1
	}
	tag := func(from, to, i int) float32 { return float32(from*1000 + to*100 + i) }
	onRanks(t, devs, comms, func(r int, d *Device, c *Comm) error {
		send, recv := make([]int, n), make([]int, n)
		var out, want []float32
		for j := 0; j < n; j++ {
			send[j], recv[j] = count(r, j), count(j, r)
			for i := 0; i < send[j]; i++ {
				out = append(out, tag(r, j, i))
			}
			for i := 0; i < recv[j]; i++ {
				want = append(want, tag(j, r, i))
			}
		}
		src, dst := upload(d, F32, out), upload(d, F32, make([]float32, len(want)))
		defer d.Free(src)
		defer d.Free(dst)
		if err := c.AllToAll(dst, src, send, recv); err != nil {
			return err
		}
		if err := exact("all-to-all", download(d, dst), want); err != nil {
			return err
		}
		// A ring step: send to the next rank, receive from the previous.
		to, from := (r+1)%n, (r+n-1)%n
		a, b := upload(d, F32, rankValues(r, L)), upload(d, F32, make([]float32, L))
		defer d.Free(a)
		defer d.Free(b)
		if err := c.SendRecv(b, a, to, from); err != nil {
			return err
		}
		return exact("send/recv", download(d, b), rankValues(from, L))
	})
}

// TestNCCLGroupOfOne: every collective on GPU 0 alone; operands that do not fit
// are refused with an error naming them and leave the stream usable; user
// buffers are made and used where the library has them, and refused naming
// the version where it does not.
func TestNCCLGroupOfOne(t *testing.T) {
	v, lib, err := NCCLVersion()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: NCCL %s", lib, versionString(v))
	devs := []*Device{dev}
	comms := ncclGroup(t, devs)
	checkCollectives(t, devs, comms)

	c := comms[0]
	onDevice(t, func() {
		a, b := upload(dev, F32, make([]float32, 8)), upload(dev, F32, make([]float32, 7))
		defer dev.Free(a)
		defer dev.Free(b)
		err := c.AllGather(b, a)
		if err == nil || !strings.Contains(err.Error(), "8 f32 into 7 f32, want 8 into 8") {
			t.Errorf("all-gather of 8 into 7: %v", err)
		}
		if err := c.AllToAll(a, a, []int{8, 1}, []int{8}); err == nil || !strings.Contains(err.Error(), "want 1 each") {
			t.Errorf("all-to-all with two counts in a group of one: %v", err)
		}
		if err := c.Broadcast(a, 1); err == nil {
			t.Error("broadcast from rank 1 of a group of one was taken")
		}
	})

	if err := UserBuffers(); err != nil {
		if !strings.Contains(err.Error(), "NCCL 2.19 or later") {
			t.Errorf("the refusal does not say which NCCL has user buffers: %v", err)
		}
		t.Logf("user buffers refused, as they should be with %s: %v", versionString(v), err)
		return
	}
	onDevice(t, func() {
		ub, err := c.AllocUserBuffer(BF16, 4096)
		if err != nil {
			t.Error(err)
			return
		}
		src := upload(dev, BF16, rankValues(0, 4096))
		defer dev.Free(src)
		if err := c.AllGather(ub, src); err != nil {
			t.Error(err)
		}
		if err := exact("all-gather into a user buffer", download(dev, ub), rankValues(0, 4096)); err != nil {
			t.Error(err)
		}
		c.FreeUserBuffer(ub)
	})
}

// TestNCCLManyGPUs: every collective over all visible GPUs, one rank each. It
// needs two or more GPUs and says so where there are fewer.
func TestNCCLManyGPUs(t *testing.T) {
	n, err := Count()
	if err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Skipf("%d GPU visible: an NCCL group of several ranks needs one GPU per rank (NCCL refuses two ranks on one GPU)", n)
	}
	devs := []*Device{dev}
	for i := 1; i < n; i++ {
		d, err := Open(i)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.Close)
		devs = append(devs, d)
	}
	checkCollectives(t, devs, ncclGroup(t, devs))
}

// TestGroupOnMemory: NCCL's collectives on a device memory's tensor.Buffers
// through collective.Group's method set, in a group of one: a gather on
// slices of larger buffers, an all-reduce, the host-valued all-to-all, and a
// foreign buffer refused with the memory's error before anything is issued.
func TestGroupOnMemory(t *testing.T) {
	comms := ncclGroup(t, []*Device{dev})
	m := dev.NewMemory()
	var g collective.Group
	onDevice(t, func() {
		grp, err := m.Group(comms[0])
		if err != nil {
			t.Error(err)
			return
		}
		defer grp.Close()
		g = grp
		whole, out := m.Alloc(tensor.BFloat16, 6), m.Alloc(tensor.BFloat16, 4)
		m.Write(whole, []float32{9, 1, 2, 3, 4, 9})
		if err := g.AllGather(out, whole.Slice(1, 5)); err != nil {
			t.Error(err)
		}
		got := make([]float32, 4)
		m.Read(got, out)
		if err := exact("all-gather of a slice", got, []float32{1, 2, 3, 4}); err != nil {
			t.Error(err)
		}
		sum := m.Alloc(tensor.Float32, 3)
		m.Write(sum, []float32{1, 2, 3})
		if err := g.AllReduce(sum); err != nil {
			t.Error(err)
		}
		host := make([]float32, 2)
		if err := g.AllToAllHost(host, []float32{5, 6}, []int{2}, []int{2}); err != nil {
			t.Error(err)
		}
		if err := exact("all-to-all of host values", host, []float32{5, 6}); err != nil {
			t.Error(err)
		}
		if err := m.Err(); err != nil {
			t.Error(err)
		}
		if err := g.AllReduce(m.Alloc(tensor.BFloat16, 2)); err == nil || !strings.Contains(err.Error(), "it takes f32") {
			t.Errorf("a bf16 all-reduce: %v", err)
		}
		// Last: the refusal is kept as the memory's error, which is sticky.
		err = g.AllReduce(dev.NewMemory().Alloc(tensor.Float32, 2))
		if err == nil || !strings.Contains(err.Error(), "not this device memory's") {
			t.Errorf("a buffer of another memory: %v", err)
		}
	})
}
