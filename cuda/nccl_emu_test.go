//go:build cudaemu

package cuda

import (
	"strings"
	"testing"
	"time"
)

// TestEmulatedNCCLCatchesMisuse: the host emulator's NCCL fails, on every
// rank and naming what differs, where real NCCL would hang or corrupt: ranks
// issuing different collectives, disagreeing sizes, and ranks issuing two
// groups' collectives in opposite orders (each waits on the other; the
// emulator names the missing ranks after its timeout, shortened here).
func TestEmulatedNCCLCatchesMisuse(t *testing.T) {
	t.Setenv("SHARDLINE_EMU_DEVICES", "2")
	devs := []*Device{dev}
	d1, err := Open(1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d1.Close)
	devs = append(devs, d1)

	a := ncclGroup(t, devs)
	check := func(what, want string, errs []error) {
		t.Helper()
		for r, err := range errs {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: rank %d: %v, want an error with %q", what, r, err, want)
			}
		}
	}
	run := func(fn func(r int, d *Device) error) []error { return rankErrors(devs, fn) }
	check("different collectives", "issued", run(func(r int, d *Device) error {
		buf := upload(d, F32, rankValues(r, 4))
		defer d.Free(buf)
		if r == 0 {
			return a[r].AllReduce(buf)
		}
		return a[r].Broadcast(buf, 0)
	}))
	check("different sizes", "passes", run(func(r int, d *Device) error {
		buf := upload(d, F32, rankValues(r, 4+r))
		defer d.Free(buf)
		return a[r].AllReduce(buf)
	}))

	b := ncclGroup(t, devs)
	old := emuNCCLTimeout
	emuNCCLTimeout = 200 * time.Millisecond
	defer func() { emuNCCLTimeout = old }()
	check("opposite orders", "did not issue it", run(func(r int, d *Device) error {
		buf := upload(d, F32, rankValues(r, 4))
		defer d.Free(buf)
		first, second := a[r], b[r]
		if r == 1 {
			first, second = second, first
		}
		if err := first.AllReduce(buf); err != nil {
			return err
		}
		return second.AllReduce(buf)
	}))
}
