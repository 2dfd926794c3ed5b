//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// UniqueIDBytes is the size of the id an NCCL communicator is made from: one
// rank makes it (NewUniqueID), every rank of the group receives it over the
// job's rendezvous (comm.BroadcastBytes), then each calls NewComm with it.
const UniqueIDBytes = 128

// NCCL's data types (ncclDataType_t).
const (
	ncclUint8    = 1
	ncclInt32    = 2
	ncclFloat32  = 7
	ncclFloat64  = 8
	ncclBFloat16 = 9
)

// Comm is an NCCL communicator of one group on one device, its collectives
// issued on the device's stream, in order with the kernels. Like every device
// method, its methods run inside Device.Do. A collective returns an error when
// NCCL refuses to enqueue it; what fails later on the device shows in
// Device.Err, and in AsyncErr.
//
// This file checks every collective's operands, the same in both builds; the
// library under it is NCCL itself (nccl.go, -tags cuda) or the host
// emulator's in-process stand-in (nccl_emu.go, -tags cudaemu).
type Comm struct {
	d          *Device
	h          commHandle
	rank, size int
	registered map[devicePtr]unsafe.Pointer // user buffers: address → the library's registration handle
	aborted    atomic.Bool                  // Abort ran: the communicator is gone
}

// NewComm joins rank of a group of size ranks made from id (NewUniqueID's,
// the same on every rank). It blocks until every rank has joined, as
// ncclCommInitRank does: the job's rendezvous, which carried the id, has
// already seen every rank arrive or named the missing ones.
func (d *Device) NewComm(id []byte, size, rank int) (*Comm, error) {
	if err := loadNCCL(); err != nil {
		return nil, err
	}
	if len(id) != UniqueIDBytes {
		return nil, fmt.Errorf("cuda: an NCCL unique id is %d bytes, got %d", UniqueIDBytes, len(id))
	}
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("cuda: NCCL rank %d of a group of %d", rank, size)
	}
	c := &Comm{d: d, rank: rank, size: size, registered: map[devicePtr]unsafe.Pointer{}}
	if err := c.init(id); err != nil {
		return nil, fmt.Errorf("cuda: ncclCommInitRank (rank %d of %d on device %d): %w", rank, size, d.Ordinal, err)
	}
	return c, nil
}

// Rank is this member's index in the group; Size the group's ranks.
func (c *Comm) Rank() int { return c.rank }
func (c *Comm) Size() int { return c.size }

// Close deregisters the user buffers still registered (their memory is their
// owner's) and releases the communicator, after the work issued on the
// streams; Abort gives it up at once (a rank was lost).
func (c *Comm) Close() error {
	if c.aborted.Load() {
		return nil // Abort released it
	}
	if err := c.d.syncStream(); err != nil {
		return fmt.Errorf("cuda: closing an NCCL communicator: %w", err)
	}
	for p := range c.registered {
		if err := c.deregister(p); err != nil {
			return err
		}
	}
	if err := c.d.syncStream(); err != nil {
		return fmt.Errorf("cuda: closing an NCCL communicator: %w", err)
	}
	if err := c.destroy(); err != nil {
		return fmt.Errorf("cuda: ncclCommDestroy: %w", err)
	}
	return nil
}

// ncclType is NCCL's name for a buffer dtype.
func ncclType(t DType) (int, error) {
	switch t {
	case F32:
		return ncclFloat32, nil
	case BF16:
		return ncclBFloat16, nil
	case I32:
		return ncclInt32, nil
	case F64:
		return ncclFloat64, nil
	case F8E4M3, F8E5M2:
		return ncclUint8, nil // codes, which only all-gathers and broadcasts move
	}
	return 0, fmt.Errorf("no NCCL type for %s", t)
}

// operands checks a collective's buffers: one dtype, the lengths it needs, and
// no earlier failure on the device's stream (which would leave the peers
// waiting on data this rank never makes: the caller aborts the job instead).
func (c *Comm) operands(op string, dst, src Buffer, dstLen, srcLen int) (int, error) {
	if c.aborted.Load() {
		return 0, fmt.Errorf("cuda: NCCL %s (rank %d of %d): the communicator was given up (a rank of the job was lost)", op, c.rank, c.size)
	}
	if c.d.err != nil {
		return 0, fmt.Errorf("cuda: NCCL %s after a failure on the stream: %w", op, c.d.err)
	}
	if dst.DType != src.DType || dst.N != dstLen || src.N != srcLen {
		return 0, fmt.Errorf("cuda: NCCL %s (rank %d of %d): %d %s into %d %s, want %d into %d", op, c.rank, c.size,
			src.N, src.DType, dst.N, dst.DType, srcLen, dstLen)
	}
	t, err := ncclType(dst.DType)
	if err != nil {
		return 0, fmt.Errorf("cuda: NCCL %s: %w", op, err)
	}
	return t, nil
}

// AllGather sets dst (Size·len(src)) to every rank's src in rank order.
func (c *Comm) AllGather(dst, src Buffer) error {
	t, err := c.operands("all-gather", dst, src, c.size*src.N, src.N)
	if err != nil || src.N == 0 {
		return err
	}
	return c.wrap("all-gather", c.allGather(dst, src, t))
}

// ReduceScatter sums src (Size·len(dst)) over the ranks and leaves chunk Rank
// in dst. NCCL sums bf16 in its ring's order, rounding to bf16 at every hop
// (the host communicators sum in fp32 and round once): bf16 results may differ
// from theirs by a few units in the last place.
func (c *Comm) ReduceScatter(dst, src Buffer) error {
	t, err := c.operands("reduce-scatter", dst, src, dst.N, c.size*dst.N)
	if err == nil && t == ncclUint8 {
		err = fmt.Errorf("cuda: NCCL reduce-scatter of %s codes: FP8 codes are gathered, never summed", dst.DType)
	}
	if err != nil || dst.N == 0 {
		return err
	}
	return c.wrap("reduce-scatter", c.reduceScatter(dst, src, t))
}

// AllReduce sums buf over the ranks, in place.
func (c *Comm) AllReduce(buf Buffer) error {
	t, err := c.operands("all-reduce", buf, buf, buf.N, buf.N)
	if err == nil && t == ncclUint8 {
		err = fmt.Errorf("cuda: NCCL all-reduce of %s codes: FP8 codes are gathered, never summed", buf.DType)
	}
	if err != nil || buf.N == 0 {
		return err
	}
	return c.wrap("all-reduce", c.allReduce(buf, t))
}

// Broadcast copies root's buf to every rank's, in place.
func (c *Comm) Broadcast(buf Buffer, root int) error {
	t, err := c.operands("broadcast", buf, buf, buf.N, buf.N)
	if err != nil || buf.N == 0 {
		return err
	}
	if root < 0 || root >= c.size {
		return fmt.Errorf("cuda: NCCL broadcast from rank %d in a group of %d", root, c.size)
	}
	return c.wrap("broadcast", c.broadcast(buf, t, root))
}

// AllToAll sends src[Σ send[:j] : Σ send[:j+1]] to rank j and receives from
// rank i into dst[Σ recv[:i] : Σ recv[:i+1]] (recv[i] must equal rank i's
// send[Rank]): uneven splits, as one NCCL group of sends and receives. This
// rank's own part is a device copy.
func (c *Comm) AllToAll(dst, src Buffer, send, recv []int) error {
	if len(send) != c.size || len(recv) != c.size {
		return fmt.Errorf("cuda: NCCL all-to-all (rank %d of %d): %d send and %d receive counts, want %d each", c.rank, c.size, len(send), len(recv), c.size)
	}
	ns, nr := 0, 0
	for j := range send {
		if send[j] < 0 || recv[j] < 0 {
			return fmt.Errorf("cuda: NCCL all-to-all: negative count (send %v, recv %v)", send, recv)
		}
		ns, nr = ns+send[j], nr+recv[j]
	}
	if send[c.rank] != recv[c.rank] {
		return fmt.Errorf("cuda: NCCL all-to-all (rank %d): sends itself %d values but receives %d", c.rank, send[c.rank], recv[c.rank])
	}
	t, err := c.operands("all-to-all", dst, src, nr, ns)
	if err != nil {
		return err
	}
	so, ro := 0, 0
	for j := 0; j < c.rank; j++ {
		so, ro = so+send[j], ro+recv[j]
	}
	c.d.Copy(dst.Slice(ro, ro+recv[c.rank]), src.Slice(so, so+send[c.rank]))
	return c.wrap("all-to-all", c.exchange(dst, src, t, send, recv))
}

// SendRecv is one ring step: this member sends src to member to and receives
// dst (the same length) from member from. A member that is its own peer copies.
func (c *Comm) SendRecv(dst, src Buffer, to, from int) error {
	t, err := c.operands("send/recv", dst, src, src.N, dst.N)
	if err != nil || src.N == 0 {
		return err
	}
	if to < 0 || to >= c.size || from < 0 || from >= c.size || (to == c.rank) != (from == c.rank) {
		return fmt.Errorf("cuda: NCCL send/recv (rank %d of %d): to %d, from %d", c.rank, c.size, to, from)
	}
	if to == c.rank {
		c.d.Copy(dst, src)
		return nil
	}
	send, recv := make([]int, c.size), make([]int, c.size)
	send[to], recv[from] = src.N, dst.N
	return c.wrap("send/recv", c.exchange(dst, src, t, send, recv))
}

// wrap names the collective and this rank in the library's error.
func (c *Comm) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("cuda: NCCL %s (rank %d of %d): %w", op, c.rank, c.size, err)
}

// offsets are the starts of counts' parts, laid end to end.
func offsets(counts []int) []int {
	off := make([]int, len(counts))
	for j := 1; j < len(counts); j++ {
		off[j] = off[j-1] + counts[j-1]
	}
	return off
}

// AllocUserBuffer allocates n elements of t with ncclMemAlloc and registers
// them with comms (communicators of this device), so that collectives on them
// (the FSDP runtime's arenas under use_nccl_ub) skip NCCL's internal staging
// copies. Free it with FreeUserBuffer and the same communicators.
func (d *Device) AllocUserBuffer(comms []*Comm, t DType, n int) (Buffer, error) {
	if err := UserBuffers(); err != nil {
		return Buffer{}, err
	}
	for _, c := range comms {
		if c.d != d {
			return Buffer{}, fmt.Errorf("cuda: a user buffer of device %d registered with a communicator of device %d", d.Ordinal, c.d.Ordinal)
		}
	}
	b, err := d.ncclAlloc(t, n)
	if err != nil {
		return Buffer{}, err
	}
	for i, c := range comms {
		if err := c.register(b); err != nil {
			for _, prior := range comms[:i] {
				_ = prior.deregister(b.ptr)
			}
			_ = d.ncclFree(b)
			return Buffer{}, err
		}
	}
	return b, nil
}

// FreeUserBuffer deregisters b from comms and frees it, after the work issued
// on the streams; a failure is the device's error.
func (d *Device) FreeUserBuffer(comms []*Comm, b Buffer) {
	d.fail("freeing an NCCL user buffer", d.syncStream())
	for _, c := range comms {
		d.fail("deregistering a user buffer", c.deregister(b.ptr))
	}
	d.fail("freeing an NCCL user buffer", d.ncclFree(b))
}

// AllocUserBuffer is Device.AllocUserBuffer registered with c alone.
func (c *Comm) AllocUserBuffer(t DType, n int) (Buffer, error) {
	return c.d.AllocUserBuffer([]*Comm{c}, t, n)
}

// FreeUserBuffer is Device.FreeUserBuffer for a buffer c.AllocUserBuffer made.
func (c *Comm) FreeUserBuffer(b Buffer) { c.d.FreeUserBuffer([]*Comm{c}, b) }

func versionString(v int) string { return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100) }
