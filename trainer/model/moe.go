package model

import (
	"math"
	"sort"

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
	offsets       []int   // (E+1) start of each expert's segment
	x             []F     // (BT·k, C) permuted inputs
	gate, up, sw  []F     // (BT·k, EF)
	y             []F     // (BT·k, C) expert outputs
	sgate, sup    [][]F   // per shared expert (BT, EF)
	ssw           [][]F
	counts        []int
	aux           float64
}

func newMoEActs[F any](c config.Model, BT int) *moeActs[F] {
	E, k, C, EF := c.MoE.NumExperts, c.MoE.TopK, c.Hidden, c.MoE.ExpertFFNHidden
	a := &moeActs[F]{
		logits: make([]F, BT*E), probs: make([]F, BT*E), idx: make([]int32, BT*k), gates: make([]F, BT*k),
		row: make([]int32, BT*k), tok: make([]int32, BT*k), offsets: make([]int, E+1), counts: make([]int, E),
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

// moeForward adds the MoE block's output for input x (BT,C) into out (BT,C).
func (m *Model[F]) moeForward(out, x []F, p moeParams[F], a *moeActs[F]) {
	be, c := m.be, m.Cfg
	BT, C := m.B*m.T, c.Hidden
	E, k, EF := c.MoE.NumExperts, c.MoE.TopK, c.MoE.ExpertFFNHidden
	be.Matmul(a.logits, x, p.router, BT, C, E, false)
	order := make([]int, E)
	for t := 0; t < BT; t++ {
		l, pr := a.logits[t*E:(t+1)*E], a.probs[t*E:(t+1)*E]
		softmaxInto(pr, l)
		for e := range order {
			order[e] = e
		}
		// Top-k by score; ties go to the lower expert index (deterministic).
		sort.SliceStable(order, func(i, j int) bool { return l[order[i]] > l[order[j]] })
		sel := a.idx[t*k : (t+1)*k]
		g := a.gates[t*k : (t+1)*k]
		for j := 0; j < k; j++ {
			sel[j] = int32(order[j])
			g[j] = l[order[j]]
		}
		softmaxInto(g, g)
	}
	// Permute: expert-major order, tokens in order within an expert.
	clear(a.counts)
	capacity := BT * k
	if cf := c.MoE.CapacityFactor; cf > 0 {
		capacity = int(math.Ceil(cf * float64(BT*k) / float64(E)))
	}
	for i, e := range a.idx {
		if a.counts[e] < capacity {
			a.counts[e]++
			a.row[i] = 0
		} else {
			a.row[i] = -1 // dropped
		}
	}
	a.offsets[0] = 0
	for e := 0; e < E; e++ {
		a.offsets[e+1] = a.offsets[e] + a.counts[e]
	}
	next := append([]int(nil), a.offsets[:E]...)
	for i, e := range a.idx {
		if a.row[i] < 0 {
			continue
		}
		r := next[e]
		next[e]++
		a.row[i] = int32(r)
		a.tok[r] = int32(i / k)
		copy(a.x[r*C:(r+1)*C], x[(i/k)*C:(i/k+1)*C])
	}
	// Each expert's SwiGLU over its segment.
	for e := 0; e < E; e++ {
		lo, n := a.offsets[e], a.counts[e]
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
	// Combine with the gates.
	for i, r := range a.row {
		if r < 0 {
			continue
		}
		t, g := i/k, a.gates[i]
		o, y := out[t*C:(t+1)*C], a.y[int(r)*C:(int(r)+1)*C]
		for d := range o {
			o[d] += g * y[d]
		}
	}
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
		a.aux += float64(E) * float64(a.counts[e]) / float64(BT*k) * pe / float64(BT)
	}
}

// moeBackward accumulates into dx (BT,C) and the parameter gradients g the
// gradient of dout·out + auxScale·aux_loss_coeff·aux.
func (m *Model[F]) moeBackward(dx, dout, x []F, p, g moeParams[F], a *moeActs[F], auxScale float64) {
	be, c := m.be, m.Cfg
	BT, C := m.B*m.T, c.Hidden
	E, k, EF := c.MoE.NumExperts, c.MoE.TopK, c.MoE.ExpertFFNHidden
	s := &m.scratch
	dlogits := s.moeDlogits[:BT*E]
	clear(dlogits)
	// Gates: out[t] += g_j · y_j, so dg_j = dout[t]·y_j; gates are a softmax of the
	// selected scores.
	dg := make([]F, k)
	for t := 0; t < BT; t++ {
		do := dout[t*C : (t+1)*C]
		for j := 0; j < k; j++ {
			dg[j] = 0
			if r := a.row[t*k+j]; r >= 0 {
				y := a.y[int(r)*C : (int(r)+1)*C]
				for d := range do {
					dg[j] += do[d] * y[d]
				}
			}
		}
		gt := a.gates[t*k : (t+1)*k]
		var dot F
		for j := range dg {
			dot += gt[j] * dg[j]
		}
		for j := range dg {
			dlogits[t*E+int(a.idx[t*k+j])] += gt[j] * (dg[j] - dot)
		}
	}
	// Aux loss through the router probabilities: d aux / d P[t,e] = E·f_e/BT.
	coeff := auxScale * c.MoE.AuxLossCoeff
	if coeff != 0 {
		for t := 0; t < BT; t++ {
			pr := a.probs[t*E : (t+1)*E]
			var dot F
			dp := s.moeDp[:E]
			for e := range dp {
				dp[e] = F(coeff * float64(E) * float64(a.counts[e]) / float64(BT*k) / float64(BT))
				dot += pr[e] * dp[e]
			}
			for e := range dp {
				dlogits[t*E+e] += pr[e] * (dp[e] - dot)
			}
		}
	}
	be.MatmulBackward(dx, g.router, dlogits, x, p.router, BT, C, E)
	// Experts: dy_r = g · dout[t].
	dy, dxp := s.moeDy[:len(a.y)], s.moeDx[:len(a.x)]
	clear(dy)
	clear(dxp)
	for i, r := range a.row {
		if r < 0 {
			continue
		}
		t, gi := i/k, a.gates[i]
		d, do := dy[int(r)*C:(int(r)+1)*C], dout[t*C:(t+1)*C]
		for j := range d {
			d[j] = gi * do[j]
		}
	}
	dsw, dga, dup := s.moeDh[:len(a.sw)], s.moeDg[:len(a.gate)], s.moeDu[:len(a.up)]
	clear(dsw)
	clear(dga)
	clear(dup)
	for e := 0; e < E; e++ {
		lo, n := a.offsets[e], a.counts[e]
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
	for r := 0; r < a.offsets[E]; r++ {
		t := int(a.tok[r])
		d, src := dx[t*C:(t+1)*C], dxp[r*C:(r+1)*C]
		for j := range d {
			d[j] += src[j]
		}
	}
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

// softmaxInto writes softmax(src) into dst (which may alias src), in float64.
func softmaxInto[F interface{ ~float32 | ~float64 }](dst, src []F) {
	mx := math.Inf(-1)
	for _, v := range src {
		mx = math.Max(mx, float64(v))
	}
	var sum float64
	for i, v := range src {
		e := math.Exp(float64(v) - mx)
		dst[i] = F(e)
		sum += e
	}
	for i := range dst {
		dst[i] = F(float64(dst[i]) / sum)
	}
}
