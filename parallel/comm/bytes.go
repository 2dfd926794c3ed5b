package comm

import (
	"fmt"
	"math"
	"unsafe"
)

// BroadcastBytes copies root's buf to every rank's buf (every rank passes one of
// the same length): an opaque blob, such as the unique id an NCCL communicator
// is made from, passed over the rendezvous a job already has, so the blob
// inherits its job token, timeouts and lost-rank errors. The bytes travel as
// the bit patterns of float32 values and arrive exactly, NaN patterns
// included: a broadcast copies, it does no arithmetic.
func BroadcastBytes(c Communicator, buf []byte, root int) error {
	words := make([]float32, (len(buf)+3)/4)
	view := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(words))), 4*len(words)) // the words' bytes, in place
	if c.Rank() == root {
		copy(view, buf)
	}
	// The lengths are gathered first, so that ranks passing buffers of
	// different lengths all fail with a mismatch (none waits on a broadcast
	// the others left) instead of reading a blob cut short.
	lens := make([]float32, c.Size())
	if err := c.AllGather(lens, []float32{math.Float32frombits(uint32(len(buf)))}); err != nil {
		return err
	}
	for r, l := range lens {
		if got := int(math.Float32bits(l)); got != len(buf) {
			return &RankError{Op: "broadcast bytes", Err: fmt.Errorf("%w: rank %d passes %d bytes, rank %d %d", ErrMismatch, r, got, c.Rank(), len(buf))}
		}
	}
	if err := c.Broadcast(words, root); err != nil {
		return err
	}
	copy(buf, view)
	return nil
}
