package trainer

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/parallel/collective"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/trainer/model"
)

// unitRuntime runs optim_grads_params as Megatron-FSDP does: a rank holds only its
// shards; each FSDP unit is all-gathered into a buffer when a block needs it
// and released when no block holds it; in backward the unit also gets a gradient
// buffer, which is reduce-scattered into the rank's gradient shard (and released)
// as soon as the last block using the unit has run its backward. It implements
// model.Hooks.
//
// Under optim_grads the weights stay whole (gathered after each optimizer step) and
// the runtime only manages the gradient buffers and their reduce-scatters.
//
// Overlap: all of a rank's collectives go through one stream, so every rank issues
// them in the same order. With overlap_param_gather the next block's units (the
// previous block's in backward) are gathered while the current block computes;
// with overlap_grad_reduce a unit's reduce-scatter runs while the next block
// computes backward. flush waits for what is in flight; the trainer calls it after
// every pass, before collectives of its own.
type unitRuntime struct {
	st      *state
	m       *model.Model[float32]
	groups  [][]int   // unit → its groups
	offsets [][]int64 // unit → offset of each group in the unit's gradient buffer
	length  []int64   // unit → gradient buffer length
	// A unit's gathered weights are two buffers: its groups in the compute
	// dtype (wbuf, wlen elements), its FP8 groups' codes (w8buf, w8len; FP8
	// compute weights, precision.fp8.param_gather); woffsets places each
	// group in its buffer, and held says whether the unit's weights are held.
	woffsets    [][]int64
	wlen, w8len []int64
	wbuf, w8buf []tensor.Buffer
	held        []bool
	gbuf        []tensor.Buffer // unit → its gradient buffer in backward (empty: not held)
	ready       []*comm.Handle  // unit → its gather in flight
	holds       []int           // blocks holding the unit's weights now
	left        []int           // backward: blocks still to run that use the unit
	uses        []int           // blocks that use the unit
	// resident units have only unsharded groups: their views point straight at the
	// compute shard and the gradient shard, with nothing to gather or reduce.
	resident []bool
	direct   map[int]bool // groups bound straight to the shards
	// Buffers: weight and gradient buffers are carved from two arenas of the sizes
	// the plan computed by running these rules (parallel.UnitBuffers), made before
	// the first step, so a step allocates nothing. woff is each gathered unit's
	// offset in its arena (w8off in w8pool's). Gathered weights are in the
	// compute dtype, wpool's arena fp32, or bf16 in a bf16 run, beside FP8
	// compute weights' codes in w8pool's (E4M3, empty without them).
	wpool, w8pool, gpool *unitPool
	woff, w8off, goff    []int64
	stream               *comm.Stream
	inflight             []flight
	// Per unit: its all-gather and its reduce-scatter as stream operations, made
	// once, and the gradient buffer the reduce-scatter in flight reads.
	gatherH, reduceH []*comm.Handle
	reducing         []tensor.Buffer
	gatherName       []string // trace span names
	reduceName       []string
	weights          bool // gather weights per unit (optim_grads_params); else they are whole
	prefetch         bool // overlap_param_gather
	async            bool // overlap_grad_reduce
	// capBytes bounds the gradient bytes reducing in the background (from
	// suggested_communication_unit_size); 0 means one unit.
	capBytes int64
	trace    *tracer
	start    time.Time // current block's compute start
	// dev is the device's streams when its collectives run there (NCCL): each
	// operation then runs on the communication stream (begin), and waiting for
	// it orders the compute stream after it (wait), with no host waiting;
	// marks holds each begun operation's mark until it is waited for.
	dev   collective.Streamed
	marks map[*comm.Handle]mark
	// timed is dev when tracing: the trace's spans are then the device's
	// (stamps on both streams, resolved at the end of each pass), not the
	// host's, which only issues the work; startStamp is the current block's
	// compute start there, and stamped the spans waiting for their times.
	timed      collective.Timed
	startStamp int
	stamped    []stampedSpan
}

// stampedSpan is a trace span between two of the device's stamps.
type stampedSpan struct {
	name, cat  string
	tid        int
	start, end int
}

// mark is an operation's place on the device's communication stream and the
// error issuing it met.
type mark struct {
	at  int
	err error
}

// begin starts h's operation (name: its trace span): on the runtime's
// stream, and, where the device runs the collectives, inside its
// communication stream.
func (u *unitRuntime) begin(h *comm.Handle, name string) {
	if u.dev == nil {
		u.stream.Start(h)
		return
	}
	at, err := u.dev.Background(func() error {
		if u.timed == nil {
			u.stream.Start(h) // an inline stream: h runs now
			return nil
		}
		s0 := u.timed.Stamp()
		u.stream.Start(h)
		u.stamped = append(u.stamped, stampedSpan{name, "comm", 1, s0, u.timed.Stamp()})
		return nil
	})
	u.marks[h] = mark{at, err}
}

// wait returns h's error once it is done: on the host's streams, when the
// operation has run; on a device's, at once, with the compute stream ordered
// after the operation.
func (u *unitRuntime) wait(h *comm.Handle) error {
	err := h.Wait()
	if u.dev != nil {
		m := u.marks[h]
		delete(u.marks, h)
		u.dev.Await(m.at)
		if err == nil {
			err = m.err
		}
	}
	return err
}

// flight is an asynchronous reduce-scatter and the gradient buffer it reads (at
// off in the gradient arena).
type flight struct {
	h   *comm.Handle
	buf tensor.Buffer
	off int64
}

// newCollectiveStream is the stream the runtime's collectives go through: a
// goroutine of its own, which overlaps host collectives with compute, or, where
// the device runs them (NCCL), the model's own goroutine, which keeps every
// group's collectives in program order on every rank (comm.InlineStream):
// they then run on the device's communication stream in that order, beside
// the compute stream (begin, wait).
func newCollectiveStream(st *state) *comm.Stream {
	if st.nativeGroups() {
		return comm.InlineStream(st.world)
	}
	return comm.NewStream(st.world)
}

func newUnitRuntime(st *state, m *model.Model[float32], prefetch, async bool, capElems int64, tr *tracer) (*unitRuntime, error) {
	p := st.plan
	u := &unitRuntime{st: st, m: m, stream: newCollectiveStream(st), prefetch: prefetch && st.perUnit, async: async,
		capBytes: 4 * capElems, trace: tr, weights: st.perUnit}
	if d, ok := st.mem.(collective.Streamed); ok && st.nativeGroups() {
		u.dev, u.marks = d, map[*comm.Handle]mark{}
		if timed, ok := d.(collective.Timed); ok && tr != nil {
			u.timed = timed
		}
	}
	n := len(p.Units)
	u.groups, u.offsets, u.length = make([][]int, n), make([][]int64, n), make([]int64, n)
	u.wbuf, u.w8buf, u.gbuf, u.ready = make([]tensor.Buffer, n), make([]tensor.Buffer, n), make([]tensor.Buffer, n), make([]*comm.Handle, n)
	u.woffsets, u.wlen, u.w8len, u.held = make([][]int64, n), make([]int64, n), make([]int64, n), make([]bool, n)
	u.holds, u.left, u.uses = make([]int, n), make([]int, n), make([]int, n)
	u.resident = make([]bool, n)
	u.gatherH, u.reduceH, u.reducing = make([]*comm.Handle, n), make([]*comm.Handle, n), make([]tensor.Buffer, n)
	u.gatherName, u.reduceName = make([]string, n), make([]string, n)
	u.inflight = make([]flight, 0, n)
	for ui := range p.Units {
		u.gatherH[ui], u.reduceH[ui] = comm.NewHandle(unitOp{u, ui, false}), comm.NewHandle(unitOp{u, ui, true})
		u.gatherName[ui], u.reduceName[ui] = "all_gather "+p.Units[ui].Name, "reduce_scatter "+p.Units[ui].Name
	}
	// A unit's buffers hold only its sharded groups; unsharded groups (an expert
	// group when edp = 1) are bound straight to the rank's compute and gradient
	// shards, which already hold them whole (as the plan counts them).
	u.direct = map[int]bool{}
	for ui, unit := range p.Units {
		u.resident[ui] = true
		for _, gi := range unit.Groups {
			if p.Groups[gi].Shards > 1 && st.comms[gi].Size() > 1 {
				u.resident[ui] = false
				u.groups[ui] = append(u.groups[ui], gi)
				u.offsets[ui] = append(u.offsets[ui], u.length[ui])
				u.length[ui] += p.Groups[gi].Padded
				wl := &u.wlen[ui]
				if p.Groups[gi].FP8 {
					wl = &u.w8len[ui]
				}
				u.woffsets[ui] = append(u.woffsets[ui], *wl)
				*wl += p.Groups[gi].Padded
			} else {
				u.direct[gi] = true
				w, g := st.computeShardBuffer(gi), st.gshardB[gi]
				for _, e := range p.Groups[gi].Entries {
					wv := w.Slice(int(e.Offset), int(e.Offset+e.Numel))
					if !st.perUnit {
						wv = st.wviews[e.Param]
					}
					m.Bind(e.Param, wv, g.Slice(int(e.Offset), int(e.Offset+e.Numel)))
				}
			}
		}
		if !u.resident[ui] && !st.perUnit {
			u.bind(ui) // full weights, no gradient buffer until backward
		}
	}
	for _, b := range m.Blocks() {
		for _, ui := range b {
			u.uses[ui]++
		}
	}
	copy(u.left, u.uses)
	// The arenas the plan budgets (parallel.UnitBuffers), made now in the rank's
	// backend memory.
	wdt := tensor.Float32
	if st.bf16 {
		wdt = tensor.BFloat16
	}
	alloc, err := u.arenaAlloc()
	if err != nil {
		return nil, err
	}
	if u.wpool, err = newUnitPool(st.mem, alloc, wdt, p.Buffers.Gather, p.Buffers.GatherSlot); err != nil {
		return nil, err
	}
	if u.w8pool, err = newUnitPool(st.mem, alloc, tensor.Float8E4M3, p.Buffers.GatherFP8, p.Buffers.GatherFP8Slot); err != nil {
		return nil, err
	}
	if u.gpool, err = newUnitPool(st.mem, alloc, st.gradDType(), p.Buffers.Reduce, p.Buffers.ReduceSlot); err != nil {
		return nil, err
	}
	u.woff, u.w8off, u.goff = make([]int64, n), make([]int64, n), make([]int64, n)
	return u, nil
}

// arenaAlloc is how the runtime's two arenas are allocated: in the rank's
// memory, or, under use_nccl_ub, as NCCL user buffers registered with every
// group whose units gather or reduce through them (collective.Registered),
// which needs every such group to run on NCCL.
func (u *unitRuntime) arenaAlloc() (func(t tensor.DType, n int) (tensor.Buffer, error), error) {
	st := u.st
	plain := func(t tensor.DType, n int) (tensor.Buffer, error) { return st.mem.Alloc(t, n), nil }
	if !st.userBuffers {
		return plain, nil
	}
	reg, ok := st.mem.(collective.Registered)
	refuse := func(why string) error {
		return config.ValueProblem("fsdp.use_nccl_ub", true, errors.New(why), "set use_nccl_ub = false")
	}
	if !ok {
		return nil, refuse("this backend's memory has no NCCL user buffers")
	}
	var groups []collective.Group
	for ui := range st.plan.Units {
		for _, gi := range u.groups[ui] {
			if g := st.comms[gi]; !slices.Contains(groups, g) {
				groups = append(groups, g)
			}
		}
	}
	for _, g := range groups {
		if !st.isNative(g) {
			return nil, refuse("ranks of this run share GPUs, so their FSDP collectives are staged through the host and there is no NCCL communicator to register the buffers with (run one rank per GPU)")
		}
	}
	return func(t tensor.DType, n int) (tensor.Buffer, error) {
		if n == 0 || len(groups) == 0 {
			return plain(t, n)
		}
		return reg.AllocRegistered(t, n, groups)
	}, nil
}

// unitPool hands out unit buffers of one dtype carved from one arena of the
// rank's backend memory (parallel.Arena, the plan's first fit), and allocates a
// buffer apart for a request the arena cannot hold (the plan did not foresee
// it: memory reports the most held apart at once).
type unitPool struct {
	mem          tensor.Memory
	dt           tensor.DType
	arena        tensor.Buffer
	fit          *parallel.Arena
	apart, extra int64 // elements held apart now, and at most
}

// newUnitPool allocates (with alloc) an arena of n elements of dtype t, handed
// out in slots of slot elements; what the arena cannot hold is allocated in
// mem.
func newUnitPool(mem tensor.Memory, alloc func(tensor.DType, int) (tensor.Buffer, error), t tensor.DType, n, slot int64) (*unitPool, error) {
	arena, err := alloc(t, int(n))
	if err != nil {
		return nil, fmt.Errorf("the FSDP unit arena (%d %s values): %w", n, t, err)
	}
	return &unitPool{mem: mem, dt: t, arena: arena, fit: parallel.NewArena(n, slot)}, nil
}

// get returns n elements and their offset in the arena (−1: allocated apart).
func (p *unitPool) get(n int64) (tensor.Buffer, int64) {
	if off, ok := p.fit.Alloc(n); ok {
		return p.arena.Slice(int(off), int(off+n)), off
	}
	p.apart += n
	p.extra = max(p.extra, p.apart)
	return p.mem.Alloc(p.dt, int(n)), -1
}

// put returns a buffer get handed out at off.
func (p *unitPool) put(off int64, b tensor.Buffer) {
	if off >= 0 {
		p.fit.Free(off, int64(b.Len()))
	} else {
		p.apart -= int64(b.Len())
		p.mem.Free(b)
	}
}

// bytes is what the pool holds: its arena and the most it held apart.
func (p *unitPool) bytes() int64 {
	return int64(p.dt.Size()) * (int64(p.arena.Len()) + p.extra)
}

// putWeights releases unit ui's gathered weights.
func (u *unitRuntime) putWeights(ui int) {
	if u.wlen[ui] > 0 {
		u.wpool.put(u.woff[ui], u.wbuf[ui])
	}
	if u.w8len[ui] > 0 {
		u.w8pool.put(u.w8off[ui], u.w8buf[ui])
	}
	u.wbuf[ui], u.w8buf[ui], u.held[ui] = tensor.Buffer{}, tensor.Buffer{}, false
}

// poolOf is the arena of gathered weights of dtype t: the FP8 codes' for an
// FP8 dtype, else the compute dtype's.
func (u *unitRuntime) poolOf(t tensor.DType) *unitPool {
	if _, ok := t.FP8(); ok {
		return u.w8pool
	}
	return u.wpool
}

// weightBuffer is unit ui's gathered buffer that holds its k-th group.
func (u *unitRuntime) weightBuffer(ui, k int) tensor.Buffer {
	if u.st.plan.Groups[u.groups[ui][k]].FP8 {
		return u.w8buf[ui]
	}
	return u.wbuf[ui]
}

func (u *unitRuntime) close() { u.stream.Close() }

// bind points the model's views of the unit's parameters at its buffers (nil when
// a buffer is not held).
func (u *unitRuntime) bind(ui int) {
	p := u.st.plan
	for k, gi := range u.groups[ui] {
		off, woff := u.offsets[ui][k], u.woffsets[ui][k]
		for _, e := range p.Groups[gi].Entries {
			var w, g tensor.Buffer
			if !u.weights {
				w = u.st.wviews[e.Param]
			} else if u.held[ui] {
				w = u.weightBuffer(ui, k).Slice(int(woff+e.Offset), int(woff+e.Offset+e.Numel))
			}
			if b := u.gbuf[ui]; b.Len() > 0 {
				g = b.Slice(int(off+e.Offset), int(off+e.Offset+e.Numel))
			}
			u.m.Bind(e.Param, w, g)
		}
	}
}

// startGather queues the unit's all-gather on the stream.
func (u *unitRuntime) startGather(ui int) {
	if u.wlen[ui] > 0 {
		u.wbuf[ui], u.woff[ui] = u.wpool.get(u.wlen[ui])
	}
	if u.w8len[ui] > 0 {
		u.w8buf[ui], u.w8off[ui] = u.w8pool.get(u.w8len[ui])
	}
	u.held[ui] = true
	u.ready[ui] = u.gatherH[ui]
	u.begin(u.gatherH[ui], u.gatherName[ui])
}

// unitOp is a unit's all-gather into its weight buffer (wbuf) or, with reduce,
// the reduce-scatter of its gradient buffer (reducing) into the rank's gradient
// shards, as a stream operation.
type unitOp struct {
	u      *unitRuntime
	ui     int
	reduce bool
}

func (o unitOp) Run(comm.Communicator) error {
	u, ui, st := o.u, o.ui, o.u.st
	t0 := time.Now()
	// Each op reads only its own buffer: the weights of a unit reducing may be
	// released meanwhile.
	name, what := u.gatherName[ui], "gathering"
	if o.reduce {
		name, what = u.reduceName[ui], "reducing"
	}
	for k, gi := range u.groups[ui] {
		g := &st.plan.Groups[gi]
		var err error
		if o.reduce {
			lo, hi := u.offsets[ui][k], u.offsets[ui][k]+g.Padded
			err = st.reduceInto(gi, u.reducing[ui].Slice(int(lo), int(hi)))
		} else {
			lo, hi := u.woffsets[ui][k], u.woffsets[ui][k]+g.Padded
			err = st.gatherGroup(gi, u.weightBuffer(ui, k).Slice(int(lo), int(hi)))
		}
		if err != nil {
			return fmt.Errorf("%s unit %s: %w", what, st.plan.Units[ui].Name, err)
		}
	}
	if u.timed == nil { // else the device's stamps time it (begin)
		u.trace.span(name, "comm", st.rank, 1, t0, time.Now())
	}
	return nil
}

// Acquire makes the block's units available: it waits for their gathers (queuing
// any not yet started), gives them gradient buffers in backward, and then starts
// gathering the next block's units when prefetching.
func (u *unitRuntime) Acquire(block int, units []int, backward bool) error {
	var first error
	for _, ui := range units {
		if u.resident[ui] {
			continue
		}
		if u.weights && !u.held[ui] {
			u.startGather(ui)
		}
		if h := u.ready[ui]; h != nil {
			if err := u.wait(h); err != nil && first == nil {
				first = err
			}
			u.ready[ui] = nil
		}
		if backward && u.gbuf[ui].Len() == 0 {
			buf, off := u.gpool.get(u.length[ui])
			u.goff[ui] = off
			u.st.mem.Zero(buf)
			u.gbuf[ui] = buf
		}
		u.holds[ui]++
		u.bind(ui)
	}
	u.start = time.Now() // the block computes from here; the prefetch runs alongside
	if u.timed != nil {
		u.startStamp = u.timed.Stamp()
	}
	if u.prefetch {
		next := block + 1
		if backward {
			next = block - 1
		}
		if blocks := u.m.Blocks(); next >= 0 && next < len(blocks) {
			for _, ui := range blocks[next] {
				if !u.resident[ui] && !u.held[ui] {
					u.startGather(ui)
				}
			}
		}
	}
	return first
}

// Release ends a block's use of the units: weights no block holds are released;
// in backward, a unit whose last block has run reduce-scatters its gradients into
// the rank's shard (adding to earlier micro-batches) and releases its buffer, in
// the background when overlapping.
func (u *unitRuntime) Release(block int, units []int, backward bool) error {
	st := u.st
	if u.trace != nil {
		phase := "forward"
		if backward {
			phase = "backward"
		}
		name := fmt.Sprintf("%s block %d", phase, block)
		if u.timed != nil {
			u.stamped = append(u.stamped, stampedSpan{name, "compute", 0, u.startStamp, u.timed.Stamp()})
		} else {
			u.trace.span(name, "compute", st.rank, 0, u.start, time.Now())
		}
	}
	var first error
	for _, ui := range units {
		if u.resident[ui] {
			continue
		}
		u.holds[ui]--
		if backward {
			u.left[ui]--
			if u.left[ui] == 0 {
				u.left[ui] = u.uses[ui]
				buf := u.gbuf[ui]
				u.gbuf[ui], u.reducing[ui] = tensor.Buffer{}, buf
				h := u.reduceH[ui]
				u.begin(h, u.reduceName[ui])
				u.inflight = append(u.inflight, flight{h, buf, u.goff[ui]})
				if err := u.bound(); err != nil && first == nil {
					first = err
				}
			}
		}
		if u.holds[ui] == 0 && u.held[ui] && u.ready[ui] == nil {
			u.putWeights(ui)
		}
		u.bind(ui)
	}
	return first
}

// bound keeps the reduce-scatters in flight within their budget: none without
// overlap; with it, one unit (reducing while the next block's gradients fill
// another buffer), or as many as fit in suggested_communication_unit_size.
func (u *unitRuntime) bound() error {
	var first error
	for len(u.inflight) > 0 {
		var bytes int64
		for _, f := range u.inflight {
			bytes += int64(f.buf.Len()) * 4
		}
		if u.async && (len(u.inflight) == 1 || bytes <= u.capBytes) {
			break
		}
		f := u.inflight[0]
		if err := u.wait(f.h); err != nil && first == nil {
			first = err
		}
		u.gpool.put(f.off, f.buf)
		n := copy(u.inflight, u.inflight[1:]) // keep the slice's start: appends reuse it
		u.inflight = u.inflight[:n]
	}
	return first
}

// flush waits for the reduce-scatters in flight and recycles their buffers, and
// for prefetched gathers nobody used (the pass ended), which it releases; when
// tracing on a device, it adds the pass's device spans (traceDevice).
func (u *unitRuntime) flush() error {
	var first error
	for _, f := range u.inflight {
		if err := u.wait(f.h); err != nil && first == nil {
			first = err
		}
		u.gpool.put(f.off, f.buf)
	}
	u.inflight = u.inflight[:0]
	for ui, h := range u.ready {
		if h == nil {
			continue
		}
		if err := u.wait(h); err != nil && first == nil {
			first = err
		}
		u.ready[ui] = nil
		if u.holds[ui] == 0 {
			u.putWeights(ui)
			u.bind(ui)
		}
	}
	if err := u.traceDevice(); err != nil && first == nil {
		first = err
	}
	return first
}

// traceDevice adds the pass's device spans to the trace, from their stamps'
// times: it waits for the device (tracing only, once a pass).
func (u *unitRuntime) traceDevice() error {
	if u.timed == nil || len(u.stamped) == 0 {
		return nil
	}
	times, err := u.timed.Times()
	if err != nil {
		return fmt.Errorf("timing the trace's spans: %w", err)
	}
	for _, s := range u.stamped {
		if min(s.start, s.end) < 0 || max(s.start, s.end) >= len(times) {
			return fmt.Errorf("timing the trace's spans: %d stamps, a span ends at stamp %d", len(times), s.end)
		}
		u.trace.span(s.name, s.cat, u.st.rank, s.tid, times[s.start], times[s.end])
	}
	u.stamped = u.stamped[:0]
	return nil
}

var _ model.Hooks = (*unitRuntime)(nil)

// memory is what the runtime holds beside the plan's gathered-unit and
// grad-reduce buffers: its arenas and anything made apart.
func (u *unitRuntime) memory() (gathered, gradBuffers int64) {
	return u.wpool.bytes() + u.w8pool.bytes(), u.gpool.bytes()
}

// tracer collects Chrome trace events (viewable in Perfetto or chrome://tracing):
// one process per rank, thread 0 compute and thread 1 communication. A nil tracer
// records nothing.
type tracer struct {
	mu     sync.Mutex
	origin time.Time
	events []traceEvent
}

type traceEvent struct {
	Name string  `json:"name"`
	Cat  string  `json:"cat"`
	Ph   string  `json:"ph"`
	Ts   float64 `json:"ts"`  // µs since the run started
	Dur  float64 `json:"dur"` // µs
	Pid  int     `json:"pid"`
	Tid  int     `json:"tid"`
}

func (t *tracer) span(name, cat string, rank, tid int, start, end time.Time) {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.events = append(t.events, traceEvent{Name: name, Cat: cat, Ph: "X", Ts: float64(start.Sub(t.origin).Nanoseconds()) / 1e3,
		Dur: float64(end.Sub(start).Nanoseconds()) / 1e3, Pid: rank, Tid: tid})
	t.mu.Unlock()
}
