//go:build cudaemu

package cuda

import (
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/shardline/shardline/tensor"
)

// The host emulator's NCCL: the collectives of ranks in one process, each on
// its own emulated device, met at a rendezvous. A collective blocks the rank's
// device goroutine until every rank of the group has issued it (a GPU's
// stream would wait instead), then each rank reads its peers' operands
// (emulated device memory is this process's memory) and a second rendezvous
// keeps every operand alive until all have read. So what goes wrong with
// NCCL goes wrong here, visibly: ranks issuing a group's collectives in
// different orders wait on each other (the emulator names the collective and
// the ranks missing after emuNCCLTimeout instead of hanging), and ranks
// disagreeing on a collective's kind or sizes fail it on every rank.
//
// A collective issued inside Background waits on the lazy communication
// stream (streams.go) and meets its peers when that runs.
//
// Sums run in rank order, in fp32 (f64 for f64), and bf16 rounds once at the
// end, as the host communicators sum; NCCL's ring order rounds bf16 at every
// hop. Ranks of other processes cannot join: a group whose ranks do not all
// join in this process fails its NewComm after the timeout.

// emuNCCLTimeout bounds every wait of the emulated NCCL: far above the longest
// gap between two ranks' collectives in the emulated tests (a rank's kernels
// run one CUDA thread at a time there), short enough to fail a test that
// would otherwise hang.
var emuNCCLTimeout = 3 * time.Minute

// emuNCCLVersion is the NCCL version the emulator reports: 2.19, which has
// user buffers.
const emuNCCLVersion = 21900

func loadNCCL() error { return nil }

// ncclSpansProcesses: the emulator's NCCL meets in this process's memory.
const ncclSpansProcesses = false

// NCCLVersion is the emulator's stand-in version and name.
func NCCLVersion() (int, string, error) {
	return emuNCCLVersion, "host emulator (in-process rendezvous)", nil
}

// NewUniqueID makes a random id, which names the group in this process.
func NewUniqueID() ([]byte, error) {
	id := make([]byte, UniqueIDBytes)
	if _, err := rand.Read(id); err != nil {
		return nil, fmt.Errorf("cuda: emulated ncclGetUniqueId: %w", err)
	}
	return id, nil
}

// emuGroups are the groups being joined, by unique id.
var emuGroups = struct {
	sync.Mutex
	m map[string]*emuGroup
}{m: map[string]*emuGroup{}}

// emuGroup is one communicator's shared state: the ranks' posted operands and
// the rendezvous they meet at.
type emuGroup struct {
	size     int
	joined   []bool
	posts    []emuPost
	meet     *emuBarrier
	mu       sync.Mutex
	poisoned error // a wait timed out: the group's ranks no longer meet in step
}

// emuPost is one rank's side of a collective.
type emuPost struct {
	op         string
	dtype      DType
	src, dst   Buffer
	root       int
	send, recv []int // exchange: counts per peer
}

// emuBarrier is a reusable barrier of n parties with a timeout.
type emuBarrier struct {
	mu      sync.Mutex
	n, in   int
	arrived []bool
	release chan struct{}
	abort   chan struct{} // closed when the group is given up (poisoned)
}

func newEmuBarrier(n int) *emuBarrier {
	return &emuBarrier{n: n, arrived: make([]bool, n), release: make(chan struct{}), abort: make(chan struct{})}
}

// wait blocks until all n parties have called it (rank is the caller), or
// returns the ranks missing after emuNCCLTimeout or once the group is given
// up.
func (b *emuBarrier) wait(rank int) (missing []int) {
	b.mu.Lock()
	ch := b.release
	b.arrived[rank] = true
	if b.in++; b.in == b.n {
		b.in, b.release = 0, make(chan struct{})
		clear(b.arrived)
		close(ch)
		b.mu.Unlock()
		return nil
	}
	b.mu.Unlock()
	timer := time.NewTimer(emuNCCLTimeout)
	defer timer.Stop()
	select {
	case <-ch:
		return nil
	case <-b.abort:
	case <-timer.C:
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-ch: // released as the timer fired
		return nil
	default:
	}
	for r, ok := range b.arrived {
		if !ok {
			missing = append(missing, r)
		}
	}
	return missing
}

// commHandle is the rank's view of its emulated group.
type commHandle = *emuGroup

func (c *Comm) init(id []byte) error {
	emuGroups.Lock()
	g := emuGroups.m[string(id)]
	if g == nil {
		g = &emuGroup{size: c.size, joined: make([]bool, c.size), posts: make([]emuPost, c.size), meet: newEmuBarrier(c.size)}
		emuGroups.m[string(id)] = g
	}
	var err error
	switch {
	case g.size != c.size:
		err = fmt.Errorf("the group was made with %d ranks, this rank says %d", g.size, c.size)
	case g.joined[c.rank]:
		err = fmt.Errorf("rank %d joined twice", c.rank)
	}
	if err == nil {
		g.joined[c.rank] = true
	}
	emuGroups.Unlock()
	if err != nil {
		return err
	}
	c.h = g
	missing := g.meet.wait(c.rank)
	emuGroups.Lock()
	delete(emuGroups.m, string(id))
	emuGroups.Unlock()
	if missing != nil {
		return fmt.Errorf("ranks %v did not join in %v (the host emulator's NCCL joins ranks of this process only)", missing, emuNCCLTimeout)
	}
	return nil
}

func (c *Comm) destroy() error { return nil }

// Abort gives the communicator up, from any goroutine: every rank's wait in
// the group ends with an error, as NCCL's kernels end after ncclCommAbort.
func (c *Comm) Abort() {
	c.aborted.Store(true)
	c.poison(errors.New("aborted"))
}

// AsyncErr is the group's failure, if a wait timed out.
func (c *Comm) AsyncErr() error {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	return c.h.poisoned
}

func (c *Comm) poison(err error) {
	c.h.mu.Lock()
	if c.h.poisoned == nil {
		c.h.poisoned = err
		close(c.h.meet.abort)
	}
	c.h.mu.Unlock()
}

// meet posts this rank's side of a collective, waits for every rank's, checks
// that they agree (agree says how; every rank sees the same posts, so all
// fail together), runs pull (this rank's reads of its peers' operands) and
// waits until every rank has read.
func (c *Comm) meet(p emuPost, agree func(me, peer emuPost, r int) error, pull func(posts []emuPost)) error {
	if err := c.AsyncErr(); err != nil {
		return fmt.Errorf("an earlier collective failed: %w", err)
	}
	g := c.h
	g.posts[c.rank] = p
	if missing := g.meet.wait(c.rank); missing != nil {
		if err := c.AsyncErr(); err != nil {
			return fmt.Errorf("the group was given up while ranks %v had not issued it: %w", missing, err)
		}
		err := fmt.Errorf("ranks %v did not issue it within %v: ranks issuing a group's collectives in different orders wait on each other", missing, emuNCCLTimeout)
		c.poison(err)
		return err
	}
	var err error
	for r, q := range g.posts {
		if q.op != p.op || q.dtype != p.dtype {
			err = fmt.Errorf("rank %d issued %s of %s while rank %d issued %s of %s", c.rank, p.op, p.dtype, r, q.op, q.dtype)
		} else if err == nil {
			err = agree(p, q, r)
		}
		if err != nil {
			break
		}
	}
	if err == nil {
		pull(g.posts)
	}
	if missing := g.meet.wait(c.rank); missing != nil {
		err = fmt.Errorf("ranks %v did not finish reading", missing)
		c.poison(err)
	}
	return err
}

// sameLengths is agree for collectives whose ranks pass equal lengths.
func sameLengths(me, peer emuPost, r int) error {
	if me.src.N != peer.src.N || me.dst.N != peer.dst.N {
		return fmt.Errorf("rank %d passes %d into %d values, this rank %d into %d", r, peer.src.N, peer.dst.N, me.src.N, me.dst.N)
	}
	return nil
}

func emuType(t int) DType {
	switch t {
	case ncclInt32:
		return I32
	case ncclBFloat16:
		return BF16
	case ncclFloat64:
		return F64
	case ncclUint8:
		return F8E4M3 // bytes: FP8 codes of either format
	}
	return F32
}

// bytesOf is b's memory.
func bytesOf(b Buffer) []byte { return unsafe.Slice((*byte)(addr(b.ptr)), b.Bytes()) }

func (c *Comm) allGather(dst, src Buffer, t int) error {
	return c.d.issue(func() error { return c.allGatherNow(dst, src, t) })
}

func (c *Comm) allGatherNow(dst, src Buffer, t int) error {
	return c.meet(emuPost{op: "all-gather", dtype: emuType(t), src: src, dst: dst}, sameLengths, func(posts []emuPost) {
		out := bytesOf(dst)
		for r, q := range posts {
			n := len(bytesOf(q.src))
			copy(out[r*n:(r+1)*n], bytesOf(q.src))
		}
	})
}

func (c *Comm) reduceScatter(dst, src Buffer, t int) error {
	return c.d.issue(func() error { return c.reduceScatterNow(dst, src, t) })
}

func (c *Comm) reduceScatterNow(dst, src Buffer, t int) error {
	return c.meet(emuPost{op: "reduce-scatter", dtype: emuType(t), src: src, dst: dst}, sameLengths, func(posts []emuPost) {
		parts := make([]Buffer, len(posts))
		for r, q := range posts {
			parts[r] = q.src.Slice(c.rank*dst.N, (c.rank+1)*dst.N)
		}
		emuSum(bytesOf(dst), dst.DType, parts)
	})
}

func (c *Comm) allReduce(buf Buffer, t int) error {
	return c.d.issue(func() error { return c.allReduceNow(buf, t) })
}

func (c *Comm) allReduceNow(buf Buffer, t int) error {
	// In place: every rank sums into scratch, and writes buf only after every
	// rank has read every buf.
	sum := make([]byte, buf.Bytes())
	err := c.meet(emuPost{op: "all-reduce", dtype: emuType(t), src: buf, dst: buf}, sameLengths, func(posts []emuPost) {
		parts := make([]Buffer, len(posts))
		for r, q := range posts {
			parts[r] = q.src
		}
		emuSum(sum, buf.DType, parts)
	})
	if err == nil {
		copy(bytesOf(buf), sum)
	}
	return err
}

func (c *Comm) broadcast(buf Buffer, t, root int) error {
	return c.d.issue(func() error { return c.broadcastNow(buf, t, root) })
}

func (c *Comm) broadcastNow(buf Buffer, t, root int) error {
	agree := func(me, peer emuPost, r int) error {
		if peer.root != me.root {
			return fmt.Errorf("rank %d broadcasts from rank %d, this rank from %d", r, peer.root, me.root)
		}
		return sameLengths(me, peer, r)
	}
	return c.meet(emuPost{op: "broadcast", dtype: emuType(t), src: buf, dst: buf, root: root}, agree, func(posts []emuPost) {
		if c.rank != root {
			copy(bytesOf(buf), bytesOf(posts[root].src))
		}
	})
}

func (c *Comm) exchange(dst, src Buffer, t int, send, recv []int) error {
	send, recv = slices.Clone(send), slices.Clone(recv) // NCCL takes the counts when issued
	return c.d.issue(func() error { return c.exchangeNow(dst, src, t, send, recv) })
}

func (c *Comm) exchangeNow(dst, src Buffer, t int, send, recv []int) error {
	agree := func(me, peer emuPost, r int) error {
		if r != c.rank && peer.send[c.rank] != me.recv[r] {
			return fmt.Errorf("rank %d sends %d values to rank %d, which expects %d", r, peer.send[c.rank], c.rank, me.recv[r])
		}
		return nil
	}
	return c.meet(emuPost{op: "send/recv", dtype: emuType(t), src: src, dst: dst, send: send, recv: recv}, agree, func(posts []emuPost) {
		ro := offsets(recv)
		for r, q := range posts {
			if r == c.rank || recv[r] == 0 {
				continue
			}
			so := offsets(q.send)[c.rank]
			copy(bytesOf(dst.Slice(ro[r], ro[r]+recv[r])), bytesOf(q.src.Slice(so, so+q.send[c.rank])))
		}
	})
}

// emuSum sets out (the bytes of values of t) to the sum of parts (each as
// long), in rank order: fp32 for f32 and bf16 (rounded once), f64 for f64,
// int32 for i32.
func emuSum(out []byte, t DType, parts []Buffer) {
	switch t {
	case F64:
		sumInto(out, parts, func(s, x float64) float64 { return s + x })
	case I32:
		sumInto(out, parts, func(s, x int32) int32 { return s + x })
	case BF16:
		o := view[tensor.BF16](out)
		for i := range o {
			var s float32
			for _, p := range parts {
				s += view[tensor.BF16](bytesOf(p))[i].Float32()
			}
			o[i] = tensor.ToBF16(s)
		}
	default:
		sumInto(out, parts, func(s, x float32) float32 { return s + x })
	}
}

// sumInto sets out's values to add's fold of the parts' values, in rank order.
func sumInto[T float32 | float64 | int32](out []byte, parts []Buffer, add func(s, x T) T) {
	o := view[T](out)
	for i := range o {
		var s T
		for _, p := range parts {
			s = add(s, view[T](bytesOf(p))[i])
		}
		o[i] = s
	}
}

// view is b's bytes as values of T.
func view[T any](b []byte) []T {
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(z)))
}

// UserBuffers: the emulator's NCCL has them (plain emulated device memory).
func UserBuffers() error { return nil }

// ncclAlloc allocates emulated device memory.
func (d *Device) ncclAlloc(t DType, n int) (Buffer, error) { return d.Alloc(t, n) }

// ncclFree frees it.
func (d *Device) ncclFree(b Buffer) error {
	d.Free(b)
	return nil
}

// register records b as registered with the communicator.
func (c *Comm) register(b Buffer) error {
	c.registered[b.ptr] = nil
	return nil
}

// deregister undoes register.
func (c *Comm) deregister(p devicePtr) error {
	delete(c.registered, p)
	return nil
}
