package comm

import (
	"errors"
	"fmt"
	"math"
)

// Communicator runs collectives among the ranks of one group. Rank is this
// member's index in the group, 0..Size-1. Every member must call the same
// collectives in the same order with matching sizes.
type Communicator interface {
	Rank() int
	Size() int
	// AllGather sets dst (Size·len(src)) to every rank's src, in rank order.
	AllGather(dst, src []float32) error
	// ReduceScatter sums src (Size·len(dst)) over ranks and leaves chunk Rank in dst.
	// dst may be src's own chunk Rank (in place, as NCCL allows: the distributed
	// optimizer's gradient shard is its part of the full gradients); otherwise
	// the two must not overlap.
	ReduceScatter(dst, src []float32) error
	// AllReduce sums buf over ranks, in place.
	AllReduce(buf []float32) error
	// AllToAll sends src[Σ send[:j] : Σ send[:j+1]] to rank j and receives from rank
	// i into dst[Σ recv[:i] : Σ recv[:i+1]]; recv[i] must equal rank i's send[Rank].
	AllToAll(dst, src []float32, send, recv []int) error
	// Broadcast copies root's buf to every rank.
	Broadcast(buf []float32, root int) error
	// SendRecv is a point-to-point step that every member takes together (a ring
	// shift, as context parallelism passes K/V blocks): this member sends src to
	// member to and receives dst from member from. Member to's from must be this
	// member and the lengths must agree; dst and src must not overlap.
	SendRecv(dst, src []float32, to, from int) error
	// ReduceScatterBF16 is ReduceScatter over bf16 values (uint16 bit patterns):
	// the sum is accumulated in fp32 and rounded to bf16 once.
	ReduceScatterBF16(dst, src []uint16) error
	// AllGatherBF16 is AllGather over bf16 values.
	AllGatherBF16(dst, src []uint16) error
	Barrier() error
}

// Grouper makes communicators over subsets of a world, by world rank (the TCP
// world communicator is one). A tag makes an independent communicator over the
// same ranks.
type Grouper interface {
	Group(ranks []int, tag string) (Communicator, error)
}

// Aborting is a communicator that says when its job can no longer complete a
// collective: a rank of the world failed (in process), or a collective of this
// process failed (over TCP: a peer lost, timed out or out of step). Aborted is
// closed then. Work that waits elsewhere on the job's ranks (a GPU's NCCL
// collectives) watches it, so as not to wait forever.
type Aborting interface {
	Aborted() <-chan struct{}
}

// Op is an operation a Stream runs: its collectives on the stream's communicator.
type Op interface {
	Run(c Communicator) error
}

// Handle is an operation to run on a Stream, made once (NewHandle) and started
// any number of times, one run in flight at a time: a runtime that makes its
// handles up front starts operations without allocating.
type Handle struct {
	op   Op
	done chan error
}

// NewHandle makes a handle for op.
func NewHandle(op Op) *Handle { return &Handle{op: op, done: make(chan error, 1)} }

// Wait blocks until the operation started last ends and returns its error.
func (h *Handle) Wait() error { return <-h.done }

// ErrTimeout marks a collective that did not complete in time.
var ErrTimeout = errors.New("collective timed out")

// ErrMismatch marks collectives whose ranks disagree on sizes or on the operation.
var ErrMismatch = errors.New("ranks disagree on a collective")

// RankError says which ranks failed a collective and why.
type RankError struct {
	Op      string
	Missing []int // group ranks that did not arrive
	Err     error
}

func (e *RankError) Error() string {
	if len(e.Missing) > 0 {
		return fmt.Sprintf("%s: rank(s) %v did not arrive: %v", e.Op, e.Missing, e.Err)
	}
	return fmt.Sprintf("%s: %v", e.Op, e.Err)
}

func (e *RankError) Unwrap() error { return e.Err }

// bf16 conversions (round to nearest, ties to even), kept here so comm imports
// nothing from shardline; tensor.BF16 uses the same bit layout.
func bf16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

func f32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16 | 0x40)
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}
