package model

import (
	"fmt"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
)

// MoE layers: a router scores the E experts for each token; each token goes to its
// top_k experts, whose gates are the softmax of the selected scores; the experts'
// SwiGLU outputs are summed with those gates, plus the shared experts' outputs.
// Tokens are permuted so that each expert's tokens are contiguous, and each expert
// runs as one matmul over its segment of preallocated buffers (no per-expert
// allocation). A capacity factor > 0 drops a token's copy once its expert already
// holds ceil(capacity_factor · BT · k / E) tokens.
//
// The load-balancing loss is Switch Transformer's: aux = E · Σ_e f_e · P_e, with f_e
// the fraction of routed copies that went to expert e and P_e the mean router
// probability of e; its gradient flows through P (f is a count).

// moeParams are one MoE layer's weight or gradient views.
type moeParams[S any] struct {
	router  S
	bias    S      // the expert bias (model.moe.expert_bias; empty otherwise): no gradient
	shared  [][3]S // w1, w3, w2 of each shared expert
	experts [][3]S // w1, w3, w2 of each routed expert
}

// moeActs are one MoE layer's saved activations.
type moeActs[F tensor.Float] struct {
	logits, probs tensor.Buffer   // (BT,E) router scores and their softmax (for the aux loss)
	gates         tensor.Buffer   // (BT,k) the chosen experts' gates
	rt            tensor.Routing  // chosen experts, permuted rows, segments
	n             int             // permuted rows the buffers span for the host: BT·k, or under expert parallelism the kept copies
	x             tensor.Buffer   // (BT·k, C) permuted inputs (under expert parallelism only sent: one buffer for every layer)
	gate, up, sw  tensor.Buffer   // (BT·k, EF)
	y             tensor.Buffer   // (BT·k, C) expert outputs
	sgate, sup    []tensor.Buffer // per shared expert (BT, EF)
	ssw           []tensor.Buffer
	stats         tensor.Buffer // (2E) per-expert kept copies, then router probability sums (RouterStats)

	// Expert parallelism (ep > 1): rows exchanged with each ep rank, per-expert
	// counts, and the received tokens regrouped by local expert (xloc, kept for
	// backward; the exchange's arrival-order buffers are the model's, shared by
	// every layer). Buffers start at the balanced share (BT · k rows, what the plan
	// budgets) and grow to the most rows a layer has received (at most
	// ep · BT · min(k, E/ep), the worst case the plan states).
	sendRows, recvRows []int
	sendEl, recvEl     []int         // the same counts in values (rows · C), for the all-to-alls
	even               []int         // ep values of E/ep: the counts' all-to-all
	localOff           []int32       // (E/ep + 1) each local expert's segment in local order
	localOffB          tensor.Buffer // the same in the model's memory (int32), what the grouped kernels read
	localOffAny        any           // localOff, made an interface once (Memory.Write takes any)
	cntSend, cntRecv   []float32
	// offHost is the routing's offsets read back (dropless expert parallelism:
	// the layer's one read-back), offHostAny the same as an interface.
	offHost            []int32
	offHostAny         any
	srcStart, locStart []int         // (source, local expert) → start row in recv order / in local order
	total              int           // rows received
	xloc               tensor.Buffer // (rows, C)

	// With bf16 stores (stash.go): the slots of the experts' inputs (the permuted
	// tokens, or the received ones) and SwiGLU products, which the experts'
	// products read from the stores; nil otherwise.
	xs, sws *stashSlot
}

// newMoEActs sizes one MoE layer's activations for BT routed token rows (this
// rank's rows of the residual stream) on the model's ep expert-parallel ranks,
// and shared experts over sharedRows rows (all of the micro-batch's rows under
// tensor parallelism) with their ffn split over tp. With work set, the layer's
// routing and router outputs are its own but the buffers bf16 storage keeps
// (stash.go) are work's.
func (m *Model[F]) newMoEActs(BT, sharedRows int, work *moeActs[F]) *moeActs[F] {
	c, ep, tp := m.Cfg, m.ep.Size, m.tpSize()
	E, k, C, EF := c.MoE.NumExperts, c.MoE.TopK, c.Hidden, c.MoE.ExpertFFNHidden
	R := moeShape(c, BT, ep).Rows() // padded: E·capacity, also what expert parallelism receives
	a := &moeActs[F]{
		logits: m.alloc1(BT * E), probs: m.alloc1(BT * E), gates: m.alloc1(BT * k),
		rt: tensor.Routing{Idx: m.allocInt(BT * k), Row: m.allocInt(BT * k), Tok: m.allocInt(BT * k), Offsets: m.allocInt(E + 1),
			Cursor: m.allocInt(E)},
		stats: m.alloc1(2 * E),
	}
	if ep > 1 {
		El := E / ep
		a.sendRows, a.recvRows = make([]int, ep), make([]int, ep)
		a.sendEl, a.recvEl, a.even, a.localOff = make([]int, ep), make([]int, ep), make([]int, ep), make([]int32, El+1)
		a.localOffB, a.localOffAny = m.allocInt(El+1), a.localOff
		a.offHost = make([]int32, E+1)
		a.offHostAny = a.offHost
		a.cntSend, a.cntRecv = make([]float32, ep*El), make([]float32, ep*El)
		a.srcStart, a.locStart = make([]int, ep*El), make([]int, ep*El)
	}
	if work != nil {
		a.x, a.gate, a.up, a.sw, a.y, a.xloc = work.x, work.gate, work.up, work.sw, work.y, work.xloc
		a.sgate, a.sup, a.ssw = work.sgate, work.sup, work.ssw
		return a
	}
	a.x, a.gate, a.up, a.sw, a.y = m.alloc1(R*C), m.alloc1(R*EF), m.alloc1(R*EF), m.alloc1(R*EF), m.alloc1(R*C)
	if ep > 1 {
		a.xloc = m.alloc1(R * C)
	}
	SF := EF / tp
	for s := 0; s < c.MoE.SharedExperts; s++ {
		a.sgate, a.sup, a.ssw = append(a.sgate, m.alloc1(sharedRows*SF)), append(a.sup, m.alloc1(sharedRows*SF)), append(a.ssw, m.alloc1(sharedRows*SF))
	}
	return a
}

// kept lists the layer's buffers that bf16 storage keeps in bf16: the permuted
// inputs (under expert parallelism the received tokens instead: the permuted
// ones are only sent), the experts' intermediates and outputs, the shared
// experts' intermediates.
func (a *moeActs[F]) kept() []*tensor.Buffer {
	out := []*tensor.Buffer{&a.gate, &a.up, &a.sw, &a.y}
	if a.xloc.Storage() != nil {
		out = append(out, &a.xloc)
	} else {
		out = append(out, &a.x)
	}
	for s := range a.sgate {
		out = append(out, &a.sgate[s], &a.sup[s], &a.ssw[s])
	}
	return out
}

// ints lists the layer's int32 buffers: its routing and, under expert
// parallelism, its local experts' segments.
func (a *moeActs[F]) ints() []tensor.Buffer {
	return []tensor.Buffer{a.rt.Idx, a.rt.Row, a.rt.Tok, a.rt.Offsets, a.rt.Cursor, a.localOffB}
}

// floats lists every F buffer of the layer's activations.
func (a *moeActs[F]) floats() []tensor.Buffer {
	var out []tensor.Buffer
	for _, b := range a.kept() {
		out = append(out, *b)
	}
	out = append(out, a.logits, a.probs, a.gates)
	if a.xloc.Storage() != nil {
		out = append(out, a.x) // the permuted tokens, sent under expert parallelism
	}
	return out
}

// count is expert e's kept copies, read on the host: only after the layer's
// read-back of its offsets (dropless expert parallelism).
func (a *moeActs[F]) count(e int) int { return int(a.offHost[e+1] - a.offHost[e]) }

// moeShape is an MoE layer's routing over BT token rows on ep expert-parallel
// ranks, laid out as parallel.MoELayout says (the plan counts the same): under
// expert parallelism a capacity factor pads every expert's segment to its
// capacity (tensor.MoEShape.Padded), static shapes, so that the exchange's
// split sizes need no count on the host. Otherwise the kept copies are packed:
// the grouped kernels read the segments from the routing, and no padding row
// is computed.
func moeShape(c config.Model, BT, ep int) tensor.MoEShape {
	capacity, padded := parallel.MoELayout(c, int64(BT), ep)
	return tensor.MoEShape{BT: BT, E: c.MoE.NumExperts, K: c.MoE.TopK, C: c.Hidden, Capacity: int(capacity), Padded: padded, Router: routerSpec(c.MoE)}
}

// routerSpec is the routing model.moe's keys describe, as the kernels take it.
func routerSpec(c config.MoE) tensor.RouterSpec {
	return tensor.RouterSpec{Sigmoid: c.ScoreFunction == "sigmoid", Raw: !c.NormTopK, Scale: c.TopKScale, Groups: c.NumGroups, GroupK: c.GroupTopK}
}

// routing is the layer's routing as Router takes it: with its expert bias,
// read into biasF (the weights may be bf16), when the model balances by bias.
func (m *Model[F]) routing(p moeParams[tensor.Buffer], a *moeActs[F]) tensor.Routing {
	rt := a.rt
	if m.biasF.Len() > 0 {
		m.mem.Zero(m.biasF)
		m.be.AddInto(m.biasF, p.bias, m.biasF.Len())
		rt.Bias = m.biasF
	}
	return rt
}

// combineGates is what the experts' outputs are combined with: the gates, or
// ones when each token was scaled by its gate before its expert.
func (m *Model[F]) combineGates(a *moeActs[F]) tensor.Buffer {
	if m.Cfg.MoE.ScoreBeforeExpert {
		return m.ones.Slice(0, a.gates.Len())
	}
	return a.gates
}

// segments is where the layer's experts' rows lie for the grouped kernels: the
// static padded segments (their offsets, and the rows of each, which spare a
// device backend reading them back), or the routing's packed offsets (seg 0).
func (m *Model[F]) segments(a *moeActs[F], s tensor.MoEShape) (offsets tensor.Buffer, seg int) {
	if s.Padded {
		return m.padSeg, s.Capacity
	}
	return a.rt.Offsets, 0
}

// localSegment is the rows of each local expert's segment after expert
// parallelism's exchange: padded, every source rank sends each expert its
// capacity (epExchange), so the segments are static; packed, 0 (the offsets
// say).
func (m *Model[F]) localSegment(s tensor.MoEShape) int {
	if s.Padded {
		return m.ep.Size * s.Capacity
	}
	return 0
}

// moeForward adds the MoE block's output for input x (BT,C) into out (BT,C), and
// (unless it is a recompute) the layer's load-balancing loss and dropped copies
// into the model's MoE sums.
func (m *Model[F]) moeForward(l int, out, x tensor.Buffer, p moeParams[tensor.Buffer], a *moeActs[F]) {
	be, c := m.be, m.Cfg
	BT, C := m.rows(), c.Hidden
	E := c.MoE.NumExperts
	if m.fp8Router(l) {
		m.matmul(l, pRouter, a.logits, x, p.router, tensor.MatmulShape{BT: BT, C: C, OC: E}, false)
	} else {
		be.Matmul(a.logits, x, p.router, tensor.MatmulShape{BT: BT, C: C, OC: E}, false)
	}
	s := moeShape(c, BT, m.ep.Size)
	be.Router(a.probs, a.gates, a.logits, m.routing(p, a), s)
	m.clearDropped(l, a.x)
	be.Dispatch(a.x, x, a.rt, s)
	if c.MoE.ScoreBeforeExpert {
		be.ScaleCopies(a.x, a.gates, a.rt, s) // Llama 4: the expert sees gate·x
	}
	// The kernels that follow read the kept copies and the experts' segments from
	// the routing (r.Offsets), or use the static padded ones; the host only knows
	// the rows the buffers span.
	a.n = s.Rows()
	if m.ep.Size > 1 {
		if !s.Padded {
			// Dropless, the exchange's split sizes must reach the host, which the
			// all-to-all takes them from: the layer's one read-back (counted), of
			// the routing's offsets. Padded, they are static.
			m.mem.Read(a.offHostAny, a.rt.Offsets)
			a.n = int(a.offHost[E])
		}
		m.epExchange(a, s)
		sc := &m.scratch
		m.epRegroup(a, a.xloc, sc.moeRecv, true)
		m.expertIn(a.xs, a.xloc, 0, a.total*C, true)
		m.expertsForward(l, p, a, a.xloc, sc.moeYloc, a.localOffB, m.localSegment(s), a.total)
		m.epRegroup(a, sc.moeYloc, sc.moeRecv, false) // back to arrival order, reusing the receive buffer
		m.a2a(a.y.Slice(0, a.n*C), sc.moeRecv.Slice(0, a.total*C), a.recvEl, a.sendEl)
	} else {
		m.expertIn(a.xs, a.x, 0, a.n*C, true)
		off, seg := m.segments(a, s)
		m.expertsForward(l, p, a, a.x, a.y, off, seg, a.n)
	}
	be.Combine(out, a.y, m.combineGates(a), a.rt, s)
	if len(p.shared) > 0 {
		// Shared experts are split like the dense MLP: over all rows, each rank's
		// ffn columns, the outputs reduce-scattered into the rank's rows.
		xs, rows, SF := m.gather(x), m.B*m.T, c.MoE.ExpertFFNHidden/m.tpSize()
		for s, w := range p.shared {
			xq := m.sharedInput(l, xs) // again for each expert: its down projection's input takes the FP8 copy
			m.sharedMatmul(l, pW1, a.sgate[s], xq, w[0], tensor.MatmulShape{BT: rows, C: C, OC: SF}, false)
			m.sharedMatmul(l, pW3, a.sup[s], xq, w[1], tensor.MatmulShape{BT: rows, C: C, OC: SF}, false)
			be.SwiGLU(a.ssw[s], a.sgate[s], a.sup[s], rows*SF)
			m.sharedRowProduct(l, out, a.ssw[s], w[2], SF)
		}
	}
	// Load-balancing loss, over the micro-batch's whole sequences when context or
	// tensor parallelism spreads their tokens over ranks.
	be.RouterStats(a.stats, a.probs, a.rt, s)
	tokens := m.routedTokens(a) // a recompute's backward needs the summed statistics too
	if !m.recomputing {
		be.AuxLoss(m.moeSums, a.stats, a.rt, s, tokens, m.moeLayersRun > 0)
		m.moeLayersRun++
	}
}

// routedTokens is the tokens the layer's router statistics cover: this rank's
// rows, or, when context or tensor parallelism spreads the micro-batch's
// sequences over ranks, theirs, after summing the statistics over those ranks
// (the loss is then the whole sequences', as one rank computes it).
func (m *Model[F]) routedTokens(a *moeActs[F]) int {
	g := m.cpSize() * m.tpSize()
	if g > 1 {
		m.seqRouterStats(a.stats)
	}
	return m.rows() * g
}

// expertsForward runs layer l's local experts' SwiGLU over their segments of
// xin (rows offsets[e]..offsets[e+1], of the rows the buffers span; e·seg..
// when seg, the static segments, is set) into yout.
func (m *Model[F]) expertsForward(l int, p moeParams[tensor.Buffer], a *moeActs[F], xin, yout, offsets tensor.Buffer, seg, rows int) {
	be, C, EF := m.be, m.Cfg.Hidden, m.Cfg.MoE.ExpertFFNHidden
	w := m.expertWeights(p)
	xs := m.expertsInput(l, m.expertIn(a.xs, xin, 0, rows*C, false))
	m.expertsMatmul(l, a.gate, xs, w[0], offsets, tensor.ExpertsShape{C: C, OC: EF, Segment: seg}, false)
	m.expertsMatmul(l, a.up, xs, w[1], offsets, tensor.ExpertsShape{C: C, OC: EF, Segment: seg}, false)
	m.clearDropped(l, a.sw)
	be.ExpertsSwiGLU(a.sw, a.gate, a.up, offsets, EF)
	sw := m.expertsInput(l, m.expertIn(a.sws, a.sw, 0, rows*EF, true))
	m.expertsMatmul(l, yout, sw, w[2], offsets, tensor.ExpertsShape{C: EF, OC: C, Segment: seg}, false)
}

// expertWeights lists the routed experts' w1, w3 and w2 as the grouped kernels
// take them (into the model's scratch lists, filled afresh each pass: the
// buffers change as the FSDP runtime gathers units).
func (m *Model[F]) expertWeights(p moeParams[tensor.Buffer]) *[3][]tensor.Buffer {
	return byProjection(&m.scratch.expertW, p.experts)
}

// expertGrads is expertWeights for the gradients.
func (m *Model[F]) expertGrads(g moeParams[tensor.Buffer]) *[3][]tensor.Buffer {
	return byProjection(&m.scratch.expertG, g.experts)
}

// byProjection fills dst[i] with every expert's i-th buffer (w1, w3, w2),
// reusing its lists' storage.
func byProjection(dst *[3][]tensor.Buffer, experts [][3]tensor.Buffer) *[3][]tensor.Buffer {
	for i := range dst {
		dst[i] = dst[i][:0]
		for _, e := range experts {
			dst[i] = append(dst[i], e[i])
		}
	}
	return dst
}

// a2a is the ep group's all-to-all (F is float32 under expert parallelism); an
// error is kept for Err.
func (m *Model[F]) a2a(dst, src tensor.Buffer, send, recv []int) {
	if err := m.ep.Comm.AllToAll(dst, src, send, recv); err != nil && m.hookErr == nil {
		m.hookErr = fmt.Errorf("expert all-to-all: %w", err)
	}
}

// epExchange sends each ep rank its experts' token copies: first the per-expert
// counts (an even all-to-all), then the rows (uneven), into the model's receive
// buffer in arrival order (source rank, then its local expert). Padded, every
// expert's segment is its capacity: the counts are static and not exchanged.
func (m *Model[F]) epExchange(a *moeActs[F], s tensor.MoEShape) {
	ep, El, C := m.ep.Size, m.Cfg.MoE.NumExperts/m.ep.Size, m.Cfg.Hidden
	for j := 0; j < ep; j++ {
		a.even[j] = El
		if s.Padded {
			a.sendRows[j] = El * s.Capacity
			for q := 0; q < El; q++ {
				a.cntRecv[j*El+q] = float32(s.Capacity)
			}
			continue
		}
		a.sendRows[j] = int(a.offHost[(j+1)*El] - a.offHost[j*El])
		for q := 0; q < El; q++ {
			a.cntSend[j*El+q] = float32(a.count(j*El + q))
		}
	}
	if !s.Padded {
		if err := m.ep.Comm.AllToAllHost(a.cntRecv, a.cntSend, a.even, a.even); err != nil && m.hookErr == nil {
			m.hookErr = fmt.Errorf("expert all-to-all of counts: %w", err)
		}
	}
	a.total = 0
	for i := 0; i < ep; i++ {
		a.recvRows[i] = 0
		for q := 0; q < El; q++ {
			a.srcStart[i*El+q] = a.total + a.recvRows[i]
			a.recvRows[i] += int(a.cntRecv[i*El+q])
		}
		a.total += a.recvRows[i]
	}
	m.growExchange(a, a.total)
	off := 0
	for q := 0; q < El; q++ {
		a.localOff[q] = int32(off)
		for i := 0; i < ep; i++ {
			a.locStart[q*ep+i] = off
			off += int(a.cntRecv[i*El+q])
		}
	}
	a.localOff[El] = int32(off)
	m.mem.Write(a.localOffB, a.localOffAny) // an upload: the grouped kernels read it
	for i := 0; i < ep; i++ {
		a.sendEl[i], a.recvEl[i] = a.sendRows[i]*C, a.recvRows[i]*C
	}
	m.a2a(m.scratch.moeRecv.Slice(0, a.total*C), a.x.Slice(0, a.n*C), a.sendEl, a.recvEl)
}

// growExchange makes the exchange and expert buffers hold rows rows (growing
// them, rarely, past the balanced share they start at): a new buffer of the
// model's memory replaces the old one wherever the model holds it (the layers
// that share the bf16 work set share it still), and the old one is freed.
func (m *Model[F]) growExchange(a *moeActs[F], rows int) {
	C, EF := m.Cfg.Hidden, m.Cfg.MoE.ExpertFFNHidden
	s := &m.scratch
	if rows*C > s.moeRecv.Len() {
		m.regrow(rows*C, &s.moeRecv, &s.moeYloc)
	}
	m.growFP8Experts(rows)
	if rows*EF > s.moeDh.Len() {
		m.regrow(rows*EF, &s.moeDh, &s.moeDg, &s.moeDu)
	}
	if rows*C <= a.xloc.Len() {
		return
	}
	m.regrow(rows*C, &a.xloc)
	m.regrow(rows*EF, &a.gate, &a.up, &a.sw)
}

// regrow replaces each of bufs by a new buffer of n elements, in every MoE
// layer that holds the old one, and frees the old one.
func (m *Model[F]) regrow(n int, bufs ...*tensor.Buffer) {
	for _, b := range bufs {
		old, nb := b.Storage(), m.alloc1(n)
		*b = nb
		for _, ma := range m.a.moe {
			if ma == nil {
				continue
			}
			for _, f := range []*tensor.Buffer{&ma.x, &ma.gate, &ma.up, &ma.sw, &ma.y, &ma.xloc} {
				if old != nil && f.Storage() == old {
					*f = nb
				}
			}
		}
		if old != nil {
			m.mem.Free(tensor.NewBuffer(old, 0, old.Len()))
		}
	}
}

// epRegroup copies rows between arrival order (recv: source, then expert) and
// local order (loc: expert, then source); toLocal picks the direction.
func (m *Model[F]) epRegroup(a *moeActs[F], loc, recv tensor.Buffer, toLocal bool) {
	ep, El, C := m.ep.Size, m.Cfg.MoE.NumExperts/m.ep.Size, m.Cfg.Hidden
	for i := 0; i < ep; i++ {
		for q := 0; q < El; q++ {
			n := int(a.cntRecv[i*El+q])
			r, l := a.srcStart[i*El+q], a.locStart[q*ep+i]
			if toLocal {
				m.mem.Copy(rowsOf(loc, l, l+n, C), rowsOf(recv, r, r+n, C))
			} else {
				m.mem.Copy(rowsOf(recv, r, r+n, C), rowsOf(loc, l, l+n, C))
			}
		}
	}
}

// moeBackward accumulates into dx (BT,C) and the parameter gradients g the
// gradient of dout·out + auxScale·aux_loss_coeff·aux.
func (m *Model[F]) moeBackward(l int, dx, dout, x tensor.Buffer, p moeParams[tensor.Buffer], g moeParams[tensor.Buffer], a *moeActs[F], auxScale float64) {
	be, c := m.be, m.Cfg
	BT, C := m.rows(), c.Hidden
	s := &m.scratch
	dy, dxp, dgates := s.moeDy.Slice(0, a.n*C), s.moeDx.Slice(0, a.n*C), s.moeDgates.Slice(0, BT*c.MoE.TopK)
	sh := moeShape(c, BT, m.ep.Size)
	// The gates' gradient comes from the combination, or, when each token was
	// scaled before its expert, from the experts' input gradient: the router's
	// backward follows the experts' then.
	m.clearDropped(l, dy)
	be.CombineBackward(dy, dgates, dout, a.y, m.combineGates(a), a.rt, sh)
	if m.load != nil {
		// The layer's kept copies per expert (its forward's statistics, over the
		// whole sequences), counted in training only, for the bias update.
		be.AddInto(m.load[l], a.stats, c.MoE.NumExperts)
	}
	before := c.MoE.ScoreBeforeExpert
	if !before {
		m.routerBackward(l, dx, x, p, g, a, dgates, auxScale)
	}
	if m.ep.Size > 1 {
		// dy goes to the experts' owners, is regrouped like the forward's tokens, and
		// the input gradients come back the same way, through the forward's
		// exchange buffers (free again once the layer's forward sent its
		// outputs back): the received gradients in the receive buffer, and the
		// regrouped ones in the outputs' buffer, where the experts' input
		// gradients are then written over them (expertsBackward reads dy in
		// its first product only).
		R := a.total
		dyin, dyloc := s.moeRecv.Slice(0, R*C), s.moeYloc.Slice(0, R*C)
		dxloc := dyloc
		m.a2a(dyin, dy, a.sendEl, a.recvEl)
		m.epRegroup(a, dyloc, dyin, true)
		m.expertsBackward(l, p, g, a, dyloc, a.xloc, dxloc, a.localOffB, m.localSegment(sh), R)
		m.epRegroup(a, dxloc, dyin, false)
		m.a2a(dxp, dyin, a.recvEl, a.sendEl)
	} else {
		off, seg := m.segments(a, sh)
		m.expertsBackward(l, p, g, a, dy, a.x, dxp, off, seg, a.n)
	}
	if before {
		be.ScaleCopiesBackward(dgates, dxp, x, a.gates, a.rt, sh)
		m.routerBackward(l, dx, x, p, g, a, dgates, auxScale)
	}
	be.DispatchBackward(dx, dxp, a.rt, sh)
	if len(p.shared) == 0 {
		return
	}
	// Shared experts: the transposes of the forward's gather and reduce-scatter.
	rows, SF := m.B*m.T, c.MoE.ExpertFFNHidden/m.tpSize()
	dfull, xs, dxf := m.gatherGrad(dout), m.gather(x), m.inputGrad(dx)
	for sIdx, w := range p.shared {
		gw := g.shared[sIdx]
		h, hg, hu := s.moeSh.Slice(0, rows*SF), s.moeSg.Slice(0, rows*SF), s.moeSu.Slice(0, rows*SF)
		m.sharedMatmulBackward(l, pW2, h, gw[2], dfull, m.sharedInput(l, a.ssw[sIdx]), w[2], tensor.MatmulShape{BT: rows, C: SF, OC: C}, false)
		be.SwiGLUBackward(hg, hu, h, a.sgate[sIdx], a.sup[sIdx], rows*SF, false)
		// Into dx itself without tensor parallelism; into the all-rows partial sum
		// (started afresh by the first shared expert) with it.
		xq := m.sharedInput(l, xs)
		m.sharedMatmulBackward(l, pW1, dxf, gw[0], hg, xq, w[0], tensor.MatmulShape{BT: rows, C: C, OC: SF}, m.tp == nil || sIdx > 0)
		m.sharedMatmulBackward(l, pW3, dxf, gw[1], hu, xq, w[1], tensor.MatmulShape{BT: rows, C: C, OC: SF}, true)
	}
	if tp := m.tp; tp != nil {
		m.tpErr("reduce-scatter", tp.Comm.ReduceScatter(tp.red, tp.px))
		be.AddInto(dx, tp.red, tp.red.Len())
	}
}

// routerBackward adds into dx and the router's gradient the gradient through
// the gates (dgates) and, with the aux loss, through the probabilities.
func (m *Model[F]) routerBackward(l int, dx, x tensor.Buffer, p, g moeParams[tensor.Buffer], a *moeActs[F], dgates tensor.Buffer, auxScale float64) {
	be, c := m.be, m.Cfg
	BT, C, E := m.rows(), c.Hidden, c.MoE.NumExperts
	s := &m.scratch
	sh := moeShape(c, BT, m.ep.Size)
	// The aux loss reaches the router through P: d aux / d P[t,e] = E·f_e/BT
	// (of the whole sequences: the forward's summed statistics).
	var dprobs tensor.Buffer // empty: no aux loss reaches the probabilities
	if coeff := auxScale * c.MoE.AuxLossCoeff; coeff != 0 {
		dprobs = s.moeDprobs.Slice(0, BT*E)
		be.AuxLossBackward(dprobs, a.stats, sh, BT*m.cpSize()*m.tpSize(), coeff)
	}
	dlogits := s.moeDlogits.Slice(0, BT*E)
	m.mem.Zero(dlogits)
	be.RouterBackward(dlogits, dgates, dprobs, a.gates, a.probs, a.rt, sh)
	switch {
	case m.fp8Router(l):
		m.matmulBackward(l, pRouter, dx, g.router, dlogits, x, p.router, tensor.MatmulShape{BT: BT, C: C, OC: E}, true)
	case m.tp == nil:
		be.MatmulBackward(dx, g.router, dlogits, x, p.router, tensor.MatmulShape{BT: BT, C: C, OC: E}, true)
	default:
		// The router is replicated over tp and saw this rank's rows only: its
		// gradient is summed over the tp group.
		gr := m.tp.grouter
		m.mem.Zero(gr)
		be.MatmulBackward(dx, gr, dlogits, x, p.router, tensor.MatmulShape{BT: BT, C: C, OC: E}, true)
		m.tpErr("all-reduce", m.tp.Comm.AllReduce(gr))
		be.AddInto(g.router, gr, E*C)
	}
}

// expertsBackward runs layer l's local experts' backward over their segments: dy and
// xin are the output gradients and inputs (rows offsets[e]..offsets[e+1], of the
// rows the buffers span; e·seg.. when seg is set); the input gradients go to dxin
// (overwritten in the segments) and the weight gradients accumulate. dxin may
// be dy: dy is read by the first product only, before dxin is written.
func (m *Model[F]) expertsBackward(l int, p moeParams[tensor.Buffer], g moeParams[tensor.Buffer], a *moeActs[F], dy, xin, dxin, offsets tensor.Buffer, seg, rows int) {
	be, C, EF, s := m.be, m.Cfg.Hidden, m.Cfg.MoE.ExpertFFNHidden, &m.scratch
	dsw, dga, dup := s.moeDh.Slice(0, rows*EF), s.moeDg.Slice(0, rows*EF), s.moeDu.Slice(0, rows*EF)
	w, gw := m.expertWeights(p), m.expertGrads(g)
	sw := m.expertsInput(l, m.expertIn(a.sws, a.sw, 0, rows*EF, false))
	m.expertsMatmulBackward(l, dsw, gw[2], dy, sw, w[2], offsets, tensor.ExpertsShape{C: EF, OC: C, Segment: seg}, false)
	m.clearDropped(l, dga)
	m.clearDropped(l, dup)
	be.ExpertsSwiGLUBackward(dga, dup, dsw, a.gate, a.up, offsets, EF, false)
	xs := m.expertsInput(l, m.expertIn(a.xs, xin, 0, rows*C, false))
	m.expertsMatmulBackward(l, dxin, gw[0], dga, xs, w[0], offsets, tensor.ExpertsShape{C: C, OC: EF, Segment: seg}, false)
	m.expertsMatmulBackward(l, dxin, gw[1], dup, xs, w[1], offsets, tensor.ExpertsShape{C: C, OC: EF, Segment: seg}, true)
}

// ExpertLoads is the buffer (f32, E per MoE layer, in layer order) where the
// training passes since the last ResetExpertLoads counted each expert's kept
// copies (model.moe.expert_bias; the empty Buffer otherwise), for the bias
// update (tensor.Kernels.ExpertBiasUpdate on the expert-bias parameters,
// parallel.Param.Balance). The trainer sums it over the ranks first: the
// update reads only the sign of each expert's difference from the mean, so a
// sum that counts every token the same number of times (the ranks of a
// context- or tensor-parallel group each hold their group's sum) gives the
// one-rank biases.
func (m *Model[F]) ExpertLoads() tensor.Buffer { return m.loads }

// ExpertLoad is layer l's slice of ExpertLoads (the empty Buffer for a
// dense layer or without model.moe.expert_bias).
func (m *Model[F]) ExpertLoad(l int) tensor.Buffer {
	if l < 0 || l >= len(m.load) {
		return tensor.Buffer{}
	}
	return m.load[l]
}

// ResetExpertLoads zeroes the loads, once the biases have moved.
func (m *Model[F]) ResetExpertLoads() {
	if m.loads.Len() > 0 {
		m.mem.Zero(m.loads)
	}
}

// ExpertCounts reads back each MoE layer's kept copies per expert of the last
// forward (in layer order, E each; RouterStats' counts over this rank's
// tokens, or its sequences' under context or tensor parallelism): a counted
// read-back, for checks and benchmarks of the load balance. Nil without MoE
// layers, and under full recompute or bf16 activations, whose MoE layers
// share their buffers.
func (m *Model[F]) ExpertCounts() [][]float64 {
	if m.recompute == "full" || m.st != nil {
		return nil
	}
	E := m.Cfg.MoE.NumExperts
	var out [][]float64
	host := make([]F, 2*E)
	for _, a := range m.a.moe {
		if a == nil {
			continue
		}
		m.mem.Read(host, a.stats)
		c := make([]float64, E)
		for e := range c {
			c[e] = float64(host[e])
		}
		out = append(out, c)
	}
	return out
}
