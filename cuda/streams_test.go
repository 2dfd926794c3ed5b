//go:build cuda || cudaemu

package cuda

import (
	"strings"
	"testing"
)

// TestCommunicationStream: work issued inside Background runs on the
// communication stream after the compute work issued before it, and compute
// work issued after Await(mark) sees it; a read-back waits for both streams.
// On the host emulator, whose communication stream is lazy, compute that does
// not await sees the old values, as the emulator promises (a missing Await is
// then a wrong result, not a race); on a GPU that case is a race and is not
// checked. A matrix product inside Background is refused (cuBLASLt's handle
// is bound to the compute stream), and after that failure Background still
// runs its function, with a mark Await ignores. Values are moved, not
// summed: exact.
func TestCommunicationStream(t *testing.T) {
	const n = 4096
	comms := ncclGroup(t, []*Device{dev})
	onDevice(t, func() {
		a, b, c := upload(dev, F32, rankValues(1, n)), upload(dev, F32, rankValues(2, n)), upload(dev, F32, make([]float32, n))
		defer dev.Free(a)
		defer dev.Free(b)
		defer dev.Free(c)
		dev.Copy(a, b) // compute work the background copy must follow: a = rankValues(2)
		mark := dev.Background(func() { dev.Copy(c, a) })
		if Emulated {
			dev.Copy(b, c) // not awaited: the lazy stream has not run, so b gets c's zeros
			if err := exact("not awaited", download(dev, b), make([]float32, n)); err != nil {
				t.Error(err)
			}
		}
		dev.Await(mark)
		dev.Copy(b, c) // after the await: b = c = rankValues(2)
		if err := exact("awaited", download(dev, b), rankValues(2, n)); err != nil {
			t.Error(err)
		}

		// Without the await, a read-back still waits for both streams.
		mark = dev.Background(func() { dev.Zero(c) })
		if err := exact("read back", download(dev, c), make([]float32, n)); err != nil {
			t.Error(err)
		}
		dev.Await(mark)

		// NCCL in the background: a group of one gathers on the communication stream.
		mark = dev.Background(func() {
			if err := comms[0].AllGather(c, a); err != nil {
				t.Error(err)
			}
		})
		dev.Await(mark)
		dev.Copy(b, c)
		if err := exact("gathered in the background", download(dev, b), rankValues(2, n)); err != nil {
			t.Error(err)
		}
	})
	var err error
	dev.Do(func() {
		a := upload(dev, F32, rankValues(1, 16))
		defer dev.Free(a)
		dev.Background(func() { dev.gemmBatched(false, false, 4, 4, 4, a, 4, 0, a, 4, 0, 0, a, 4, 0, 1) })
		// After the failure, fn still runs (a caller waits on what it
		// does) and the mark is one Await ignores.
		ran := false
		if mark := dev.Background(func() { ran = true }); mark != -1 || !ran {
			t.Errorf("Background after a failure: mark %d, fn ran %v", mark, ran)
		}
		dev.Await(-1)
		err = dev.Err()
	})
	if err == nil || !strings.Contains(err.Error(), "inside Background") {
		t.Errorf("a product inside Background: %v", err)
	}
}
