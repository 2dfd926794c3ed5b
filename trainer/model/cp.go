package model

import (
	"fmt"
	"math"
	"runtime"
	"time"

	"github.com/shardline/shardline/tensor"
)

// Context parallelism: every sequence of T tokens is cut into 2·Size chunks of
// T/(2·Size) tokens, and rank r holds chunks r and 2·Size−1−r, so that under the
// causal mask every rank has the same attention work. The rank's tokens are laid
// out chunk-major: chunk r of every sequence, then chunk 2·Size−1−r of every
// sequence, so each half is a (B, T/(2·Size)) batch that one kernel call covers.
// Everything but attention and RoPE is per token and runs on the rank's T/Size
// tokens of each sequence unchanged; RoPE uses the chunks' true positions. Attention is a ring: each rank's K/V
// block travels once around the context-parallel group (one SendRecv per step,
// overlapped with the flash attention of the block already held), and each
// query chunk's partial results (output and log-sum-exp) are merged by the
// online-softmax rule. In backward the K/V blocks travel again, each carrying its
// dK/dV accumulator, which ends back at the block's owner after Size steps.

// CPComm is what context parallelism needs from the context-parallel group
// on f32 buffers of the model's memory (collective.Group has it): the ring
// step, and the sum of the MoE router's statistics over the whole sequence.
type CPComm interface {
	SendRecv(dst, src tensor.Buffer, to, from int) error
	AllReduce(buf tensor.Buffer) error
}

// ContextParallel splits every sequence over the Size ranks of a context-parallel
// group; this rank is Rank. It needs float32 and T divisible by 2·Size.
type ContextParallel struct {
	Comm       CPComm
	Rank, Size int
	// Trace, when set, receives a span for every ring step's transfer (comm true)
	// and every step's attention compute, to show how they overlap.
	Trace func(name string, comm bool, start, end time.Time)
}

// WithContextParallel splits the model's sequences over a context-parallel group.
// New's T is then the whole sequence; the model holds T/Size tokens of each.
func WithContextParallel(cp ContextParallel) Option { return func(o *options) { o.cp = &cp } }

// LocalTokens copies into dst (B·T/size) the tokens of src (B sequences of T)
// that context-parallel rank holds, chunk-major: chunk rank of every sequence,
// then chunk 2·size−1−rank of every sequence. With size 1 it copies src.
func LocalTokens(dst, src []int32, B, T, rank, size int) {
	if size <= 1 {
		copy(dst, src)
		return
	}
	c := T / (2 * size)
	for i, g := range [2]int{rank, 2*size - 1 - rank} {
		for b := 0; b < B; b++ {
			copy(dst[(i*B+b)*c:(i*B+b+1)*c], src[b*T+g*c:b*T+(g+1)*c])
		}
	}
}

// cpState is a context-parallel model's ring: two blocks of [k | v | dk | dv]
// (one held, one arriving), the partial dK/dV of the block held, and one half's
// partial output and log-sum-exps (one key chunk's attention). Ring steps run on
// one goroutine of the model's (started with the first step, ended by Close):
// requests go to it and results come back over channels made once, so a step
// allocates nothing.
type cpState[F tensor.Float] struct {
	ContextParallel
	ring      [2]tensor.Buffer
	pd        tensor.Buffer
	out, lse  tensor.Buffer
	requests  chan ringStep
	exchanged chan error
	running   bool // the ring goroutine is started
}

// ringStep is one SendRecv for the ring's goroutine, with what the trace calls it.
type ringStep struct {
	what     ringWhat
	step     int
	dst, src tensor.Buffer
}

// ringWhat names what a ring step carries, or which compute it overlaps.
type ringWhat int

const (
	ringKV ringWhat = iota
	ringKVGrads
	ringGradsHome
	ringAttn
	ringAttnBwd
)

func (w ringWhat) name(step int) string {
	switch w {
	case ringKV:
		return fmt.Sprintf("cp send_recv K/V %d", step)
	case ringKVGrads:
		return fmt.Sprintf("cp send_recv K/V+dK/dV %d", step)
	case ringGradsHome:
		return "cp send_recv dK/dV home"
	case ringAttn:
		return fmt.Sprintf("ring attention %d", step)
	}
	return fmt.Sprintf("ring attention backward %d", step)
}

func (m *Model[F]) setupCP(cp ContextParallel, T int) error {
	var z F
	if _, ok := any(z).(float32); !ok || cp.Comm == nil || cp.Rank < 0 || cp.Rank >= cp.Size {
		return fmt.Errorf("model: context parallelism needs float32, a communicator and a rank in 0..%d", cp.Size-1)
	}
	if T%(2*cp.Size) != 0 {
		return fmt.Errorf("model: a sequence of %d tokens does not split into 2 × %d equal chunks", T, cp.Size)
	}
	m.cp = &cpState[F]{ContextParallel: cp, requests: make(chan ringStep, 1), exchanged: make(chan error, 1)}
	m.T = T / cp.Size
	return nil
}

// cpSize is the context-parallel degree (1 without context parallelism).
func (m *Model[F]) cpSize() int {
	if m.cp == nil {
		return 1
	}
	return m.cp.Size
}

func (m *Model[F]) allocCP() {
	_, _, NH, NKV, HD, _, _ := m.dims()
	n := m.B * m.T * NKV * HD
	c := m.T / 2
	p := m.cp
	p.ring = [2]tensor.Buffer{m.alloc1(4 * n), m.alloc1(4 * n)}
	p.pd = m.alloc1(2 * n)
	p.out, p.lse = m.alloc1(m.B*c*NH*HD), m.alloc1(m.B*NH*c)
}

// ropeTablesCP fills the RoPE tables with the rows of the rank's chunks'
// positions.
func (m *Model[F]) ropeTablesCP(invFreq []float64) {
	_, _, _, _, HD, _, _ := m.dims()
	T := m.T * m.cp.Size
	half := HD / 2
	cos, sin := m.alloc1(T*half), m.alloc1(T*half) // the whole sequence's, freed once the rank's rows are copied
	m.be.RopeTables(cos, sin, T, invFreq)
	c := m.T / 2
	for i, g := range m.chunks(m.cp.Rank) {
		m.mem.Copy(rowsOf(m.cos, i*c, (i+1)*c, half), rowsOf(cos, g*c, (g+1)*c, half))
		m.mem.Copy(rowsOf(m.sin, i*c, (i+1)*c, half), rowsOf(sin, g*c, (g+1)*c, half))
	}
	m.mem.Free(cos)
	m.mem.Free(sin)
}

// chunks are the global chunk indices rank holds, in its local order.
func (m *Model[F]) chunks(rank int) [2]int { return [2]int{rank, 2*m.cp.Size - 1 - rank} }

// exchange starts the ring step that sends src to the next rank and receives dst
// from the previous one; wait ends it.
func (m *Model[F]) exchange(what ringWhat, step int, dst, src tensor.Buffer) {
	p := m.cp
	if !p.running {
		p.running = true
		go p.serve()
	}
	p.requests <- ringStep{what: what, step: step, dst: dst, src: src}
	// Let the ring goroutine start the transfer before this one computes: where
	// every core is computing (in-process ranks get one thread each on a small
	// machine) it would otherwise wait for a preemption, after the compute.
	runtime.Gosched()
}

// serve runs the ring steps asked of it, one at a time, until Close.
func (p *cpState[F]) serve() {
	for r := range p.requests {
		t0 := time.Now()
		err := p.Comm.SendRecv(r.dst, r.src, (p.Rank+1)%p.Size, (p.Rank-1+p.Size)%p.Size)
		if p.Trace != nil {
			p.Trace(r.what.name(r.step), true, t0, time.Now())
		}
		p.exchanged <- err
	}
}

// Close ends the model's background work (context parallelism's ring
// goroutine). The model must not run a pass after it.
func (m *Model[F]) Close() {
	if m.cp != nil && m.cp.running {
		close(m.cp.requests)
		m.cp.running = false
	}
}

// traced runs f and reports it as a compute span.
func (m *Model[F]) traced(what ringWhat, step int, f func()) {
	if m.cp.Trace == nil {
		f()
		return
	}
	t0 := time.Now()
	f()
	m.cp.Trace(what.name(step), false, t0, time.Now())
}

func (m *Model[F]) wait() {
	if err := <-m.cp.exchanged; err != nil && m.hookErr == nil {
		m.hookErr = fmt.Errorf("context-parallel ring: %w", err)
	}
}

// blockPairs calls f, for layer l, for every (local query half, key half of block src) that
// causal attention computes: a key chunk at or before the query chunk, and,
// with chunked attention, not wholly before the attention chunk of the query
// chunk's first position. qo and ko are the element offsets of the halves in
// (B·T, NH·HD) and (B·T, NKV·HD) tensors (each half a (B, T/2) batch); lo is
// the offset of the query half's log-sum-exps, (B, NH, T/2) per half. The
// shape carries the query half's document starts (global positions), with
// which the kernels skip what a document mask hides.
func (m *Model[F]) blockPairs(l, src int, f func(qo, ko, lo int, s tensor.AttentionShape)) {
	_, _, NH, NKV, HD, _, _ := m.dims()
	c := m.T / 2
	chunk := m.Cfg.AttentionChunk(l)
	for qi, gq := range m.chunks(m.cp.Rank) {
		for kj, gk := range m.chunks(src) {
			if gk > gq {
				continue
			}
			if chunk > 0 && (gk+1)*c <= gq*c/chunk*chunk {
				continue // every key lies before every query's attention chunk
			}
			s := tensor.AttentionShape{B: m.B, Tq: c, Tk: c, NH: NH, NKV: NKV, HD: HD, QOff: gq * c, KOff: gk * c, Causal: true, Chunk: chunk}
			if st := m.startsBuf(); st.Len() > 0 {
				s.Starts = st.Slice(qi*m.B*c, (qi+1)*m.B*c)
			}
			f(qi*m.B*c*NH*HD, kj*m.B*c*NKV*HD, qi*m.B*NH*c, s)
		}
	}
}

// rope applies (or, backward, undoes the gradient of) RoPE to x (B·T, heads·HD):
// each half at its chunk's positions.
func (m *Model[F]) rope(xb tensor.Buffer, heads int, backward bool) {
	_, _, _, _, HD, _, _ := m.dims()
	c, half, n := m.T/2, HD/2, m.B*m.T/2*heads*HD
	for i := 0; i < 2; i++ {
		xs, cos, sin := xb.Slice(i*n, (i+1)*n), rowsOf(m.cos, i*c, (i+1)*c, half), rowsOf(m.sin, i*c, (i+1)*c, half)
		if backward {
			m.be.RopeBackward(xs, cos, sin, tensor.RopeShape{B: m.B, T: c, NH: heads, HD: HD})
		} else {
			m.be.Rope(xs, cos, sin, tensor.RopeShape{B: m.B, T: c, NH: heads, HD: HD})
		}
	}
}

// ringSizes are a ring pass's sizes: n values in each of K, V, dK, dV of a block,
// and the elements of one half of q (and out), of k or v, and of the
// log-sum-exps; and its two blocks, cur holding this rank's K/V.
type ringSizes struct {
	n, hq, hk, hl int
	cur, nxt      tensor.Buffer
}

// ringStart loads this rank's K and V into the first ring block.
func (m *Model[F]) ringStart(k, v tensor.Buffer) ringSizes {
	_, _, NH, NKV, HD, _, _ := m.dims()
	c := m.T / 2
	r := ringSizes{n: m.B * m.T * NKV * HD, hq: m.B * c * NH * HD, hk: m.B * c * NKV * HD, hl: m.B * NH * c,
		cur: m.cp.ring[0], nxt: m.cp.ring[1]}
	m.mem.Copy(r.cur.Slice(0, r.n), k)
	m.mem.Copy(r.cur.Slice(r.n, 2*r.n), v)
	return r
}

// ringAttention is layer l's causal attention of the local queries over the whole
// sequence: out (B·T, NH·HD) and lse, (B, NH, T/2) per half.
func (m *Model[F]) ringAttention(l int, out, lse, q, k, v tensor.Buffer) {
	p, be := m.cp, m.be
	r := m.ringStart(k, v)
	n, hq, hk, hl := r.n, r.hq, r.hk, r.hl
	cur, nxt := r.cur, r.nxt
	m.mem.Zero(out)
	m.mem.Fill(lse, math.Inf(-1))
	for s := 0; s < p.Size; s++ {
		if s < p.Size-1 {
			m.exchange(ringKV, s, nxt.Slice(0, 2*n), cur.Slice(0, 2*n))
		}
		src := (p.Rank - s + p.Size) % p.Size
		m.traced(ringAttn, s, func() {
			m.blockPairs(l, src, func(qo, ko, lo int, sh tensor.AttentionShape) {
				be.FlashAttention(p.out, p.lse, q.Slice(qo, qo+hq), cur.Slice(ko, ko+hk), cur.Slice(n+ko, n+ko+hk), sh)
				be.MergeAttention(out.Slice(qo, qo+hq), lse.Slice(lo, lo+hl), p.out, p.lse, sh)
			})
		})
		if s < p.Size-1 {
			m.wait()
		}
		cur, nxt = nxt, cur
	}
}

// ringAttentionBackward accumulates dq, dk, dv of ringAttention from dout and its
// out and lse. Step s computes the contributions of the block held (owner
// rank−s) while the ring passes on that block's K/V and the dK/dV accumulator of
// the block of the step before; after the last step each accumulator takes one
// more step, home to its owner.
func (m *Model[F]) ringAttentionBackward(l int, dq, dk, dv, dout, out, lse, q, k, v tensor.Buffer) {
	p, be := m.cp, m.be
	r := m.ringStart(k, v)
	n, hq, hk, hl := r.n, r.hq, r.hk, r.hl
	cur, nxt := r.cur, r.nxt
	for s := 0; s < p.Size; s++ {
		// What travels: K/V while another rank still needs them, and from the second
		// step on the accumulator of the block before.
		lo, hi := 0, 4*n
		if s == p.Size-1 {
			lo = 2 * n
		}
		if s == 0 {
			hi = 2 * n
		}
		m.exchange(ringKVGrads, s, nxt.Slice(lo, hi), cur.Slice(lo, hi))
		src := (p.Rank - s + p.Size) % p.Size
		m.mem.Zero(p.pd)
		m.traced(ringAttnBwd, s, func() {
			m.blockPairs(l, src, func(qo, ko, lo int, sh tensor.AttentionShape) {
				qs, os, ds := q.Slice(qo, qo+hq), out.Slice(qo, qo+hq), dout.Slice(qo, qo+hq)
				be.FlashAttentionBackward(dq.Slice(qo, qo+hq), p.pd.Slice(ko, ko+hk), p.pd.Slice(n+ko, n+ko+hk),
					ds, os, lse.Slice(lo, lo+hl), qs, cur.Slice(ko, ko+hk), cur.Slice(n+ko, n+ko+hk), sh, true)
			})
		})
		m.wait()
		acc := nxt.Slice(2*n, 4*n) // the accumulator of this step's block, from the previous rank
		if s == 0 {
			m.mem.Copy(acc, p.pd)
		} else {
			be.AddInto(acc, p.pd, 2*n)
		}
		cur, nxt = nxt, cur
	}
	m.exchange(ringGradsHome, 0, nxt.Slice(2*n, 4*n), cur.Slice(2*n, 4*n))
	m.wait()
	be.AddInto(dk, nxt.Slice(2*n, 3*n), n)
	be.AddInto(dv, nxt.Slice(3*n, 4*n), n)
}

// seqRouterStats sums an MoE layer's per-expert copy counts and router
// probability sums over the ranks that split the micro-batch's tokens (the tp
// group, then the cp group), so the load-balancing loss is the whole sequences'
// (as one rank computes it). stats holds E counts then E sums; an error is kept
// for Err.
func (m *Model[F]) seqRouterStats(statsB tensor.Buffer) {
	if m.tp != nil {
		m.tpErr("router statistics", m.tp.Comm.AllReduce(statsB))
	}
	if m.cp != nil {
		if err := m.cp.Comm.AllReduce(statsB); err != nil && m.hookErr == nil {
			m.hookErr = fmt.Errorf("context-parallel router statistics: %w", err)
		}
	}
}
