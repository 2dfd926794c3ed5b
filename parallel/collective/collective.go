package collective

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/tensor"
)

// Group runs collectives among the ranks of one group on buffers; every member
// calls the same collectives in the same order with matching sizes (the
// semantics are comm.Communicator's).
type Group interface {
	Rank() int
	Size() int
	// AllGather sets dst (Size·len(src)) to every rank's src in rank order: f32,
	// bf16 or FP8 buffers of one dtype. FP8 codes move a byte a value (the
	// FSDP units' FP8 weights, precision.fp8.param_gather); on the host's
	// communicators as pairs of codes, so an FP8 src has an even length.
	AllGather(dst, src tensor.Buffer) error
	// ReduceScatter sums src (Size·len(dst)) over the ranks and leaves chunk
	// Rank in dst: f32, or bf16 summed in fp32 and rounded once.
	ReduceScatter(dst, src tensor.Buffer) error
	// AllReduce sums an f32 buffer over the ranks, in place.
	AllReduce(buf tensor.Buffer) error
	// AllToAll is comm.Communicator's uneven all-to-all on f32 buffers.
	AllToAll(dst, src tensor.Buffer, send, recv []int) error
	// SendRecv is one ring step on f32 buffers: this member sends src to member
	// to and receives dst from member from.
	SendRecv(dst, src tensor.Buffer, to, from int) error
	// AllToAllHost is AllToAll on host values: the dropless expert exchange's
	// split sizes, which the host reads back by design.
	AllToAllHost(dst, src []float32, send, recv []int) error
}

// OnHost returns c's collectives on buffers of h. A buffer that is not one of
// h's, or not of a dtype the collective takes, fails the collective with h's
// error and sends nothing.
func OnHost(c comm.Communicator, h tensor.HostMemory) Group { return host{c, h} }

type host struct {
	c comm.Communicator
	h tensor.HostMemory
}

func (g host) Rank() int { return g.c.Rank() }
func (g host) Size() int { return g.c.Size() }

func (g host) AllToAllHost(dst, src []float32, send, recv []int) error {
	return g.c.AllToAll(dst, src, send, recv)
}

// f32 views x in place; nil (with h's failure kept) when it is not an f32
// buffer of h.
func (g host) f32(x tensor.Buffer) []float32 {
	if x.Len() == 0 {
		return nil
	}
	return g.h.Float32s(x)
}

// bits views a bf16 buffer's elements as the bit patterns comm carries.
func (g host) bits(x tensor.Buffer) []uint16 {
	if x.Len() == 0 {
		return nil
	}
	return bf16Bits(g.h.BF16s(x))
}

// bf16Bits views bf16 values as the uint16 bit patterns comm carries, in place
// (nil for none).
func bf16Bits(v []tensor.BF16) []uint16 {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(v))), len(v))
}

// codePairs views an FP8 buffer's codes as the uint16 pairs comm's bf16
// all-gather carries (nil for none, or for an odd length: fp8Pairs refuses
// it first).
func (g host) codePairs(x tensor.Buffer) []uint16 {
	if x.Len() == 0 {
		return nil
	}
	return bytePairs(g.h.FP8Codes(x))
}

// bytePairs views an even number of bytes as uint16 pairs, in place (nil for
// none or an odd count). The pairs only travel: every rank views them the
// same way, so the bytes arrive as they left.
func bytePairs(v []uint8) []uint16 {
	if len(v) == 0 || len(v)%2 != 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(v))), len(v)/2)
}

// fp8Pairs checks an FP8 all-gather's operands: src and dst of one FP8 dtype,
// src of an even length (the host's communicators carry codes in pairs; the
// FSDP groups' shards are multiples of parallel.Align).
func fp8Pairs(dst, src tensor.Buffer) error {
	if dst.DType() != src.DType() {
		return fmt.Errorf("all-gather on buffers: %s into %s (it takes buffers of one dtype)", src.DType(), dst.DType())
	}
	if src.Len()%2 != 0 {
		return fmt.Errorf("all-gather on buffers: %d %s codes: the host's communicators carry FP8 codes in pairs, so a rank's part has an even length", src.Len(), src.DType())
	}
	return nil
}

// bad is the error for operands that did not view (a view shorter than its
// buffer), nil when they all did.
func (g host) bad(op string, views ...int) error {
	for i := 0; i+1 < len(views); i += 2 {
		if views[i] != views[i+1] {
			err := g.h.Err()
			if err == nil {
				err = fmt.Errorf("an operand of %d elements has a view of %d", views[i+1], views[i])
			}
			return fmt.Errorf("%s on buffers: %w", op, err)
		}
	}
	return nil
}

func (g host) AllGather(dst, src tensor.Buffer) error {
	if _, ok := dst.DType().FP8(); ok {
		if err := fp8Pairs(dst, src); err != nil {
			return err
		}
		d, s := g.codePairs(dst), g.codePairs(src)
		if err := g.bad("all-gather", 2*len(d), dst.Len(), 2*len(s), src.Len()); err != nil {
			return err
		}
		return g.c.AllGatherBF16(d, s)
	}
	if dst.DType() == tensor.BFloat16 {
		d, s := g.bits(dst), g.bits(src)
		if err := g.bad("all-gather", len(d), dst.Len(), len(s), src.Len()); err != nil {
			return err
		}
		return g.c.AllGatherBF16(d, s)
	}
	d, s := g.f32(dst), g.f32(src)
	if err := g.bad("all-gather", len(d), dst.Len(), len(s), src.Len()); err != nil {
		return err
	}
	return g.c.AllGather(d, s)
}

func (g host) ReduceScatter(dst, src tensor.Buffer) error {
	if dst.DType() == tensor.BFloat16 {
		d, s := g.bits(dst), g.bits(src)
		if err := g.bad("reduce-scatter", len(d), dst.Len(), len(s), src.Len()); err != nil {
			return err
		}
		return g.c.ReduceScatterBF16(d, s)
	}
	d, s := g.f32(dst), g.f32(src)
	if err := g.bad("reduce-scatter", len(d), dst.Len(), len(s), src.Len()); err != nil {
		return err
	}
	return g.c.ReduceScatter(d, s)
}

func (g host) AllReduce(buf tensor.Buffer) error {
	b := g.f32(buf)
	if err := g.bad("all-reduce", len(b), buf.Len()); err != nil {
		return err
	}
	return g.c.AllReduce(b)
}

func (g host) AllToAll(dst, src tensor.Buffer, send, recv []int) error {
	d, s := g.f32(dst), g.f32(src)
	if err := g.bad("all-to-all", len(d), dst.Len(), len(s), src.Len()); err != nil {
		return err
	}
	return g.c.AllToAll(d, s, send, recv)
}

func (g host) SendRecv(dst, src tensor.Buffer, to, from int) error {
	d, s := g.f32(dst), g.f32(src)
	if err := g.bad("send/recv", len(d), dst.Len(), len(s), src.Len()); err != nil {
		return err
	}
	return g.c.SendRecv(d, s, to, from)
}

// Native is a memory whose device has collectives of its own (a GPU's
// memory: NCCL). Collectives makes c's group on its buffers when every member
// of c holds a device of its own, and returns a nil group, with the reason,
// where members share a device (NCCL refuses two ranks on one GPU: the
// caller stages c through the host instead, Staged). It is collective: every
// member of c calls it at the same point, and all get the same answer. The
// group's collectives are ordered on the device's stream (they enqueue work
// and return), so a rank must issue them from one goroutine, in program
// order (comm.InlineStream); close releases the group.
type Native interface {
	Collectives(c comm.Communicator) (g Group, close func(), why string, err error)
}

// Streamed is a memory whose device runs work on a communication stream
// beside its compute stream (a GPU's): Background runs fn, whose work on the
// memory's buffers and the device's collectives is issued there, after the
// compute work issued so far, and returns a mark; after Await(mark) the
// compute work issued sees it. Neither blocks the host: the FSDP runtime's
// gathers and reductions overlap the layers' compute this way. Each mark is
// awaited once.
type Streamed interface {
	Background(fn func() error) (mark int, err error)
	Await(mark int)
}

// Timed is a Streamed memory that can time its streams' work, for traces:
// Stamp marks the point the current stream (the communication stream inside
// Background) has reached, and Times waits for every stamp since the last
// call and returns their host times, in order (it waits: tracing only).
type Timed interface {
	Streamed
	Stamp() int
	Times() ([]time.Time, error)
}

// Registered is a Native memory that allocates buffers registered with its
// groups' communicators (NCCL user buffers, use_nccl_ub): collectives on them
// skip the library's staging copies. groups are groups Collectives made; the
// buffer is zeroed, and Free releases it.
type Registered interface {
	AllocRegistered(t tensor.DType, n int, groups []Group) (tensor.Buffer, error)
}

// Abortable is a group whose collectives wait on the job's ranks outside the
// host's communicators (a GPU's NCCL): AsyncErr is a failure the library met
// on its own (a peer process gone), and Abort gives the group up from any
// goroutine, so that collectives waiting on a lost rank end with an error
// instead of holding the device forever.
type Abortable interface {
	AsyncErr() error
	Abort()
}
