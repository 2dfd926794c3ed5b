package comm

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"
)

// World is a set of in-process ranks.
type World struct {
	n       int
	timeout time.Duration

	mu     sync.Mutex
	groups map[string]*group
	abort  chan struct{}
	why    error
}

// NewWorld makes a world of n in-process ranks whose collectives fail after timeout.
func NewWorld(n int, timeout time.Duration) *World {
	return &World{n: n, timeout: timeout, groups: map[string]*group{}, abort: make(chan struct{})}
}

// Size is the number of ranks.
func (w *World) Size() int { return w.n }

// Rank returns rank r's communicator over the whole world.
func (w *World) Rank(r int) Communicator {
	all := make([]int, w.n)
	for i := range all {
		all[i] = i
	}
	c, err := w.Group(r, all)
	if err != nil {
		panic(err) // r out of range: a programming error of the caller
	}
	return c
}

// Group returns world rank r's communicator over the group of world ranks `ranks`
// (ascending, containing r). Every member asks for the same list and gets the same
// group.
func (w *World) Group(r int, ranks []int) (Communicator, error) { return w.Tagged(r, ranks, "") }

// Tagged is Group for an independent communicator over the same ranks: collectives
// on groups with different tags never wait on each other (as separate NCCL
// communicators), so one goroutine can use one while another uses the other.
func (w *World) Tagged(r int, ranks []int, tag string) (Communicator, error) {
	idx := slices.Index(ranks, r)
	if idx < 0 || !slices.IsSorted(ranks) || ranks[0] < 0 || ranks[len(ranks)-1] >= w.n {
		return nil, fmt.Errorf("comm: rank %d cannot join group %v of a world of %d", r, ranks, w.n)
	}
	key := tag + fmt.Sprint(ranks)
	w.mu.Lock()
	defer w.mu.Unlock()
	g, ok := w.groups[key]
	if !ok {
		g = newGroup(w, ranks)
		w.groups[key] = g
	}
	return &member{g: g, rank: idx}, nil
}

// Abort makes every pending and future collective of the world fail with err (a
// rank failed; the others must not wait for it).
func (w *World) Abort(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-w.abort:
	default:
		w.why = err
		close(w.abort)
	}
}

// group is the state members of one group share.
type group struct {
	w     *World
	ranks []int
	slots []slot
	temp  []float32 // all-reduce scratch, sized by the last arriver
	bar   barrier
}

// slot is what a member publishes for a collective.
type slot struct {
	op       string
	a, b     []float32
	ha, hb   []uint16
	send     []int
	recv     []int
	root     int
	from     int // send_recv: root is the member sent to
	tempNeed int
}

func newGroup(w *World, ranks []int) *group {
	n := len(ranks)
	g := &group{w: w, ranks: ranks, slots: make([]slot, n)}
	g.bar = barrier{n: n, arrived: make([]bool, n), wake: make([]chan struct{}, n), timers: make([]*time.Timer, n)}
	for i := range g.bar.wake {
		g.bar.wake[i] = make(chan struct{}, 1)
		g.bar.timers[i] = time.NewTimer(time.Hour)
		g.bar.timers[i].Stop()
	}
	return g
}

// barrier releases its members when all have arrived; the last to arrive runs
// onLast first and wakes the others, each through a channel of its own. A member
// that waits past the timeout learns who is missing. Channels and timers are made
// once per group, so a collective allocates nothing.
type barrier struct {
	mu      sync.Mutex
	n       int
	count   int
	arrived []bool
	wake    []chan struct{} // per member, buffered: the last arriver's release
	timers  []*time.Timer   // per member, reset for each wait
}

func (g *group) wait(rank int, op string, onLast func()) error {
	b := &g.bar
	select {
	case <-b.wake[rank]: // a release left over from a wait that timed out
	default:
	}
	b.mu.Lock()
	b.arrived[rank] = true
	b.count++
	if b.count == b.n {
		if onLast != nil {
			onLast()
		}
		for i, waiting := range b.arrived {
			if waiting && i != rank {
				b.wake[i] <- struct{}{} // never blocks: one release per wait
			}
		}
		b.count = 0
		clear(b.arrived)
		b.mu.Unlock()
		return nil
	}
	b.mu.Unlock()
	timer := b.timers[rank]
	timer.Reset(g.w.timeout)
	defer timer.Stop()
	select {
	case <-b.wake[rank]:
		return nil
	case <-g.w.abort:
		return &RankError{Op: op, Err: fmt.Errorf("world aborted: %w", g.w.why)}
	case <-timer.C:
		b.mu.Lock()
		var missing []int
		for i, ok := range b.arrived {
			if !ok {
				missing = append(missing, g.ranks[i])
			}
		}
		b.mu.Unlock()
		return &RankError{Op: op, Missing: missing, Err: fmt.Errorf("%w after %v", ErrTimeout, g.w.timeout)}
	}
}

// member is one rank's view of a group.
type member struct {
	g    *group
	rank int
}

func (m *member) Rank() int { return m.rank }

// Aborted is closed when the world is aborted (Aborting).
func (m *member) Aborted() <-chan struct{} { return m.g.w.abort }
func (m *member) Size() int                { return len(m.g.ranks) }

// run publishes s, waits for everyone, checks that all slots agree (check sees
// every slot), runs body, and waits again so that no rank returns while another
// still reads its buffers.
func (m *member) run(s slot, check func([]slot) error, body func([]slot)) error {
	g := m.g
	g.slots[m.rank] = s
	if err := g.wait(m.rank, s.op, func() {
		need := 0
		for _, sl := range g.slots {
			need = max(need, sl.tempNeed)
		}
		if cap(g.temp) < need {
			g.temp = make([]float32, need)
		}
		g.temp = g.temp[:need]
	}); err != nil {
		return err
	}
	for i, sl := range g.slots {
		if sl.op != s.op {
			err := &RankError{Op: s.op, Err: fmt.Errorf("%w: rank %d called %s", ErrMismatch, g.ranks[i], sl.op)}
			_ = g.wait(m.rank, s.op, nil)
			return err
		}
	}
	if err := check(g.slots); err != nil {
		_ = g.wait(m.rank, s.op, nil)
		return &RankError{Op: s.op, Err: fmt.Errorf("%w: %v", ErrMismatch, err)}
	}
	body(g.slots)
	return g.wait(m.rank, s.op, nil)
}

func sameLen(f func(slot) int, want func(slot) int) func([]slot) error {
	return func(ss []slot) error {
		for i, s := range ss {
			if f(s) != want(ss[0]) {
				return fmt.Errorf("member %d has %d elements, member 0 %d", i, f(s), want(ss[0]))
			}
		}
		return nil
	}
}

func (m *member) AllGather(dst, src []float32) error {
	n := m.Size()
	return m.run(slot{op: "all_gather", a: dst, b: src},
		func(ss []slot) error {
			if err := sameLen(func(s slot) int { return len(s.b) }, func(s slot) int { return len(s.b) })(ss); err != nil {
				return err
			}
			if len(dst) != n*len(src) {
				return fmt.Errorf("dst has %d elements, want %d × %d", len(dst), n, len(src))
			}
			return nil
		},
		func(ss []slot) {
			L := len(src)
			for i, s := range ss {
				// A rank's source may already be its chunk of dst (an in-place
				// gather, as the distributed optimizer does): peers are reading it, so
				// it must not be written, and needs no copy.
				if i == m.rank && L > 0 && &dst[i*L] == &s.b[0] {
					continue
				}
				copy(dst[i*L:(i+1)*L], s.b)
			}
		})
}

func (m *member) ReduceScatter(dst, src []float32) error {
	n, L := m.Size(), len(dst)
	return m.run(slot{op: "reduce_scatter", a: dst, b: src},
		func(ss []slot) error {
			for i, s := range ss {
				if len(s.b) != n*L || len(s.a) != L {
					return fmt.Errorf("member %d: src %d, dst %d; want src = %d × dst %d", i, len(s.b), len(s.a), n, L)
				}
			}
			return nil
		},
		func(ss []slot) {
			// Summed a block at a time in rank order (the same bits on every run),
			// each block's sources read before its sum is written: dst may be this
			// rank's own chunk of its src (in place).
			lo := m.rank * L
			var sum [256]float32
			for b := 0; b < L; b += len(sum) {
				t := sum[:min(len(sum), L-b)]
				copy(t, ss[0].b[lo+b:])
				for _, s := range ss[1:] {
					for j, v := range s.b[lo+b : lo+b+len(t)] {
						t[j] += v
					}
				}
				copy(dst[b:], t)
			}
		})
}

func (m *member) AllReduce(buf []float32) error {
	n, L := m.Size(), len(buf)
	chunk := (L + n - 1) / n
	return m.run(slot{op: "all_reduce", a: buf, tempNeed: L},
		sameLen(func(s slot) int { return len(s.a) }, func(s slot) int { return len(s.a) }),
		func(ss []slot) {
			// Each rank sums its chunk in rank order into the shared scratch...
			lo, hi := min(m.rank*chunk, L), min((m.rank+1)*chunk, L)
			t := m.g.temp[lo:hi]
			copy(t, ss[0].a[lo:hi])
			for _, s := range ss[1:] {
				for j, v := range s.a[lo:hi] {
					t[j] += v
				}
			}
			// ...and once every chunk is summed, copies the whole sum back.
			_ = m.g.wait(m.rank, "all_reduce", nil)
			copy(buf, m.g.temp)
		})
}

func (m *member) AllToAll(dst, src []float32, send, recv []int) error {
	n := m.Size()
	return m.run(slot{op: "all_to_all", a: dst, b: src, send: send, recv: recv},
		func(ss []slot) error {
			for i, s := range ss {
				if len(s.send) != n || len(s.recv) != n {
					return fmt.Errorf("member %d gave %d send and %d recv counts for %d ranks", i, len(s.send), len(s.recv), n)
				}
				if sum(s.send) > len(s.b) || sum(s.recv) > len(s.a) {
					return fmt.Errorf("member %d: counts exceed its buffers", i)
				}
			}
			for i, s := range ss {
				for j := range ss {
					if s.send[j] != ss[j].recv[i] {
						return fmt.Errorf("member %d sends %d to %d, which expects %d", i, s.send[j], j, ss[j].recv[i])
					}
				}
			}
			return nil
		},
		func(ss []slot) {
			off := 0
			for _, s := range ss {
				from := sum(s.send[:m.rank])
				k := s.send[m.rank]
				copy(dst[off:off+k], s.b[from:from+k])
				off += k
			}
		})
}

func (m *member) SendRecv(dst, src []float32, to, from int) error {
	return m.run(slot{op: "send_recv", a: dst, b: src, root: to, from: from},
		func(ss []slot) error {
			n := len(ss)
			for i, s := range ss {
				if s.root < 0 || s.root >= n || s.from < 0 || s.from >= n {
					return fmt.Errorf("member %d sends to %d and receives from %d in a group of %d", i, s.root, s.from, n)
				}
				if ss[s.root].from != i {
					return fmt.Errorf("member %d sends to %d, which receives from %d", i, s.root, ss[s.root].from)
				}
				if len(s.b) != len(ss[s.root].a) {
					return fmt.Errorf("member %d sends %d elements to %d, which expects %d", i, len(s.b), s.root, len(ss[s.root].a))
				}
			}
			return nil
		},
		func(ss []slot) { copy(dst, ss[from].b) })
}

func sum(xs []int) int {
	t := 0
	for _, x := range xs {
		t += x
	}
	return t
}

func (m *member) Broadcast(buf []float32, root int) error {
	return m.run(slot{op: "broadcast", a: buf, root: root},
		func(ss []slot) error {
			if root < 0 || root >= len(ss) {
				return fmt.Errorf("root %d outside the group of %d", root, len(ss))
			}
			for i, s := range ss {
				if s.root != root || len(s.a) != len(buf) {
					return fmt.Errorf("member %d: root %d, %d elements", i, s.root, len(s.a))
				}
			}
			return nil
		},
		func(ss []slot) {
			if m.rank != root {
				copy(buf, ss[root].a)
			}
		})
}

func (m *member) ReduceScatterBF16(dst, src []uint16) error {
	n, L := m.Size(), len(dst)
	return m.run(slot{op: "reduce_scatter_bf16", ha: dst, hb: src},
		func(ss []slot) error {
			for i, s := range ss {
				if len(s.hb) != n*L || len(s.ha) != L {
					return fmt.Errorf("member %d: src %d, dst %d", i, len(s.hb), len(s.ha))
				}
			}
			return nil
		},
		func(ss []slot) {
			lo := m.rank * L
			for j := 0; j < L; j++ {
				var acc float32 // fp32 accumulation, rank order
				for _, s := range ss {
					acc += bf16ToF32(s.hb[lo+j])
				}
				dst[j] = f32ToBF16(acc)
			}
		})
}

func (m *member) AllGatherBF16(dst, src []uint16) error {
	n := m.Size()
	return m.run(slot{op: "all_gather_bf16", ha: dst, hb: src},
		func(ss []slot) error {
			for i, s := range ss {
				if len(s.hb) != len(src) || len(s.ha) != n*len(src) {
					return fmt.Errorf("member %d: src %d, dst %d", i, len(s.hb), len(s.ha))
				}
			}
			return nil
		},
		func(ss []slot) {
			L := len(src)
			for i, s := range ss {
				// In place (src is this rank's chunk of dst), as AllGather.
				if i == m.rank && L > 0 && &dst[i*L] == &s.hb[0] {
					continue
				}
				copy(dst[i*L:(i+1)*L], s.hb)
			}
		})
}

func (m *member) Barrier() error {
	return m.run(slot{op: "barrier"}, func([]slot) error { return nil }, func([]slot) {})
}

// Stream runs a communicator's asynchronous operations one at a time, in the order
// they were started (as a CUDA stream would), so every rank issues them in the same
// order even when compute and communication overlap.
type Stream struct {
	c    Communicator
	jobs chan *Handle
}

// NewStream starts a stream over c. Close ends it.
func NewStream(c Communicator) *Stream {
	s := &Stream{c: c, jobs: make(chan *Handle, 64)}
	go func() {
		for h := range s.jobs {
			h.done <- h.op.Run(s.c)
		}
	}()
	return s
}

// InlineStream is a stream that runs each operation in Start, on the caller's
// goroutine: for collectives that only enqueue work on a device's stream
// (NCCL), whose device then orders them. Issued from one goroutine, a rank's
// collectives on every group keep the program's order, the same on every
// rank; issued from a goroutine of their own beside the model's (NewStream),
// two groups' collectives could reach a GPU in different orders on different
// ranks, and each rank's GPU would wait on the other's.
func InlineStream(c Communicator) *Stream { return &Stream{c: c} }

// Start queues h's operation; h.Wait returns its error. h must not be in flight.
// It yields the core once so the stream's goroutine starts the operation now,
// not after the caller's compute where every core is busy computing. An
// inline stream runs it before returning.
func (s *Stream) Start(h *Handle) {
	if s.jobs == nil {
		h.done <- h.op.Run(s.c)
		return
	}
	s.jobs <- h
	runtime.Gosched()
}

// Close stops the stream after the queued operations.
func (s *Stream) Close() {
	if s.jobs != nil {
		close(s.jobs)
	}
}
