package comm

import "sync/atomic"

// Counted is a Communicator that adds up the bytes this member sends, by the
// accounting of the ring algorithms the TCP communicator runs (and the plan's
// "sent per rank" predicts): (n−1)/n of the full buffer for an all-gather or a
// reduce-scatter, twice that for an all-reduce, what goes to other members for an
// all-to-all, the whole buffer for a send/recv step. The in-process communicator
// copies instead of sending; the count is what a network would carry.
type Counted struct {
	Communicator
	sent atomic.Int64
}

// NewCounted counts what c sends from now on.
func NewCounted(c Communicator) *Counted { return &Counted{Communicator: c} }

// Sent is the bytes sent so far.
func (c *Counted) Sent() int64 { return c.sent.Load() }

func (c *Counted) ring(fullElems, bytesPer int, factor int) {
	n := c.Size()
	c.sent.Add(int64(factor) * int64(fullElems) * int64(bytesPer) * int64(n-1) / int64(n))
}

// CountRing adds what a ring collective over a full buffer of fullElems
// values of bytesPer bytes sends, factor times (an all-reduce is 2): for
// collectives that run beside c (a GPU's NCCL) over c's members.
func (c *Counted) CountRing(fullElems, bytesPer, factor int) { c.ring(fullElems, bytesPer, factor) }

// CountSent adds bytes sent beside c.
func (c *Counted) CountSent(bytes int64) { c.sent.Add(bytes) }

func (c *Counted) AllGather(dst, src []float32) error {
	c.ring(len(dst), 4, 1)
	return c.Communicator.AllGather(dst, src)
}

func (c *Counted) ReduceScatter(dst, src []float32) error {
	c.ring(len(src), 4, 1)
	return c.Communicator.ReduceScatter(dst, src)
}

func (c *Counted) AllReduce(buf []float32) error {
	c.ring(len(buf), 4, 2)
	return c.Communicator.AllReduce(buf)
}

func (c *Counted) AllToAll(dst, src []float32, send, recv []int) error {
	var out int
	for j, k := range send {
		if j != c.Rank() {
			out += k
		}
	}
	c.sent.Add(4 * int64(out))
	return c.Communicator.AllToAll(dst, src, send, recv)
}

func (c *Counted) SendRecv(dst, src []float32, to, from int) error {
	if to != c.Rank() {
		c.sent.Add(4 * int64(len(src)))
	}
	return c.Communicator.SendRecv(dst, src, to, from)
}

func (c *Counted) ReduceScatterBF16(dst, src []uint16) error {
	c.ring(len(src), 2, 1)
	return c.Communicator.ReduceScatterBF16(dst, src)
}

func (c *Counted) AllGatherBF16(dst, src []uint16) error {
	c.ring(len(dst), 2, 1)
	return c.Communicator.AllGatherBF16(dst, src)
}
