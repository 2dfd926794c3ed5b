package model

import (
	"math"

	"github.com/shardline/shardline/config"
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

// moeParams are one MoE layer's views.
type moeParams[F any] struct {
	router  []F
	shared  [][3][]F // w1, w3, w2 of each shared expert
	experts [][3][]F // w1, w3, w2 of each routed expert
}

// moeActs are one MoE layer's saved activations.
type moeActs[F any] struct {
	logits, probs []F     // (BT,E) router scores and their softmax (for the aux loss)
	idx           []int32 // (BT,k) chosen experts
	gates         []F     // (BT,k) their gates
	row           []int32 // (BT,k) the copy's row in the permuted buffers, −1 if dropped
	tok           []int32 // (BT·k) permuted row → token
	offsets       []int32 // (E+1) start of each expert's segment
	cursor        []int32 // (E) scratch of Dispatch
	n             int     // permuted rows in use
	x             []F     // (BT·k, C) permuted inputs
	gate, up, sw  []F     // (BT·k, EF)
	y             []F     // (BT·k, C) expert outputs
	sgate, sup    [][]F   // per shared expert (BT, EF)
	ssw           [][]F
	aux           float64
}

func newMoEActs[F any](c config.Model, BT int) *moeActs[F] {
	E, k, C, EF := c.MoE.NumExperts, c.MoE.TopK, c.Hidden, c.MoE.ExpertFFNHidden
	a := &moeActs[F]{
		logits: make([]F, BT*E), probs: make([]F, BT*E), idx: make([]int32, BT*k), gates: make([]F, BT*k),
		row: make([]int32, BT*k), tok: make([]int32, BT*k), offsets: make([]int32, E+1), cursor: make([]int32, E),
		x: make([]F, BT*k*C), gate: make([]F, BT*k*EF), up: make([]F, BT*k*EF), sw: make([]F, BT*k*EF), y: make([]F, BT*k*C),
	}
	for s := 0; s < c.MoE.SharedExperts; s++ {
		a.sgate, a.sup, a.ssw = append(a.sgate, make([]F, BT*EF)), append(a.sup, make([]F, BT*EF)), append(a.ssw, make([]F, BT*EF))
	}
	return a
}

func (a *moeActs[F]) size() int64 {
	n := len(a.logits) + len(a.probs) + len(a.gates) + len(a.x) + len(a.gate) + len(a.up) + len(a.sw) + len(a.y)
	for s := range a.sgate {
		n += len(a.sgate[s]) + len(a.sup[s]) + len(a.ssw[s])
	}
	return int64(n)
}

func (a *moeActs[F]) count(e int) int { return int(a.offsets[e+1] - a.offsets[e]) }

// capacity is the most copies one expert keeps: unlimited without a capacity factor.
func capacity(c config.Model, BT int) int {
	k, E := c.MoE.TopK, c.MoE.NumExperts
	if cf := c.MoE.CapacityFactor; cf > 0 {
		return int(math.Ceil(cf * float64(BT*k) / float64(E)))
	}
	return BT * k
}

// moeForward adds the MoE block's output for input x (BT,C) into out (BT,C).
func (m *Model[F]) moeForward(out, x []F, p moeParams[F], a *moeActs[F]) {
	be, c := m.be, m.Cfg
	BT, C := m.B*m.T, c.Hidden
	E, k, EF := c.MoE.NumExperts, c.MoE.TopK, c.MoE.ExpertFFNHidden
	be.Matmul(a.logits, x, p.router, BT, C, E, false)
	be.Router(a.probs, a.idx, a.gates, a.logits, BT, E, k)
	a.n = be.Dispatch(a.x, a.row, a.tok, a.offsets, a.cursor, x, a.idx, BT, C, E, k, capacity(c, BT))
	// Each expert's SwiGLU over its segment.
	for e := 0; e < E; e++ {
		lo, n := int(a.offsets[e]), a.count(e)
		if n == 0 {
			continue
		}
		w := p.experts[e]
		xs, gs, us, ss, ys := a.x[lo*C:(lo+n)*C], a.gate[lo*EF:(lo+n)*EF], a.up[lo*EF:(lo+n)*EF], a.sw[lo*EF:(lo+n)*EF], a.y[lo*C:(lo+n)*C]
		be.Matmul(gs, xs, w[0], n, C, EF, false)
		be.Matmul(us, xs, w[1], n, C, EF, false)
		be.SwiGLU(ss, gs, us, n*EF)
		be.Matmul(ys, ss, w[2], n, EF, C, false)
	}
	be.Combine(out, a.y, a.gates, a.row, BT, C, k)
	for s, w := range p.shared {
		be.Matmul(a.sgate[s], x, w[0], BT, C, EF, false)
		be.Matmul(a.sup[s], x, w[1], BT, C, EF, false)
		be.SwiGLU(a.ssw[s], a.sgate[s], a.sup[s], BT*EF)
		be.Matmul(out, a.ssw[s], w[2], BT, EF, C, true)
	}
	// Load-balancing loss.
	a.aux = 0
	for e := 0; e < E; e++ {
		var pe float64
		for t := 0; t < BT; t++ {
			pe += float64(a.probs[t*E+e])
		}
		a.aux += float64(E) * float64(a.count(e)) / float64(BT*k) * pe / float64(BT)
	}
}

// moeBackward accumulates into dx (BT,C) and the parameter gradients g the
// gradient of dout·out + auxScale·aux_loss_coeff·aux.
func (m *Model[F]) moeBackward(dx, dout, x []F, p, g moeParams[F], a *moeActs[F], auxScale float64) {
	be, c := m.be, m.Cfg
	BT, C := m.B*m.T, c.Hidden
	E, k, EF := c.MoE.NumExperts, c.MoE.TopK, c.MoE.ExpertFFNHidden
	s := &m.scratch
	dy, dxp, dgates := s.moeDy[:a.n*C], s.moeDx[:a.n*C], s.moeDgates[:BT*k]
	be.CombineBackward(dy, dgates, dout, a.y, a.gates, a.row, BT, C, k)
	// The aux loss reaches the router through P: d aux / d P[t,e] = E·f_e/BT.
	var dprobs []F
	if coeff := auxScale * c.MoE.AuxLossCoeff; coeff != 0 {
		dprobs = s.moeDprobs[:BT*E]
		for e := 0; e < E; e++ {
			d := F(coeff * float64(E) * float64(a.count(e)) / float64(BT*k) / float64(BT))
			for t := 0; t < BT; t++ {
				dprobs[t*E+e] = d
			}
		}
	}
	dlogits := s.moeDlogits[:BT*E]
	clear(dlogits)
	be.RouterBackward(dlogits, dgates, dprobs, a.gates, a.probs, a.idx, BT, E, k)
	be.MatmulBackward(dx, g.router, dlogits, x, p.router, BT, C, E)
	dsw, dga, dup := s.moeDh[:a.n*EF], s.moeDg[:a.n*EF], s.moeDu[:a.n*EF]
	clear(dsw)
	clear(dga)
	clear(dup)
	clear(dxp)
	for e := 0; e < E; e++ {
		lo, n := int(a.offsets[e]), a.count(e)
		if n == 0 {
			continue
		}
		w, gw := p.experts[e], g.experts[e]
		sl := func(b []F, width int) []F { return b[lo*width : (lo+n)*width] }
		be.MatmulBackward(sl(dsw, EF), gw[2], sl(dy, C), sl(a.sw, EF), w[2], n, EF, C)
		be.SwiGLUBackward(sl(dga, EF), sl(dup, EF), sl(dsw, EF), sl(a.gate, EF), sl(a.up, EF), n*EF)
		be.MatmulBackward(sl(dxp, C), gw[0], sl(dga, EF), sl(a.x, C), w[0], n, C, EF)
		be.MatmulBackward(sl(dxp, C), gw[1], sl(dup, EF), sl(a.x, C), w[1], n, C, EF)
	}
	be.DispatchBackward(dx, dxp, a.tok, a.n, C)
	for sIdx, w := range p.shared {
		gw := g.shared[sIdx]
		h, hg, hu := s.moeSh[:BT*EF], s.moeSg[:BT*EF], s.moeSu[:BT*EF]
		clear(h)
		clear(hg)
		clear(hu)
		be.MatmulBackward(h, gw[2], dout, a.ssw[sIdx], w[2], BT, EF, C)
		be.SwiGLUBackward(hg, hu, h, a.sgate[sIdx], a.sup[sIdx], BT*EF)
		be.MatmulBackward(dx, gw[0], hg, x, w[0], BT, C, EF)
		be.MatmulBackward(dx, gw[1], hu, x, w[1], BT, C, EF)
	}
}
