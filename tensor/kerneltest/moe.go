package kerneltest

import "github.com/shardline/shardline/tensor"

// moeLayout is a named routing shape: 23 tokens over 8 experts, top 2.
type moeLayout struct {
	name string
	s    tensor.MoEShape
}

// moeLayouts covers the three layouts the model runs: packed and dropless
// (capacity BT·K), packed with copies dropped past a capacity of 4, and padded
// segments of 7 rows (static shapes for expert parallelism), some of which
// drop copies and some of which leave rows unused.
func moeLayouts() []moeLayout {
	const BT, E, K, C = 23, 8, 2, 16
	return []moeLayout{
		{"dropless", tensor.MoEShape{BT: BT, E: E, K: K, C: C, Capacity: BT * K}},
		{"capacity", tensor.MoEShape{BT: BT, E: E, K: K, C: C, Capacity: 4}},
		{"padded", tensor.MoEShape{BT: BT, E: E, K: K, C: C, Capacity: 7, Padded: true}},
	}
}

// routerSpec is a named router (tensor.RouterSpec) and whether it chooses
// with an expert bias.
type routerSpec struct {
	name string
	spec tensor.RouterSpec
	bias bool
}

// routerSpecs are the routers beside the default one: sigmoid scores
// renormalised and scaled (DeepSeek-V3) with a bias and groups (8 experts in 4
// groups of 2, 2 kept, each scored by its best one), sigmoid scores as they
// are (Llama 4), softmax scores as they are with a bias (Qwen3-MoE without
// renormalisation), and the default softmax scaled.
func routerSpecs() []routerSpec {
	return []routerSpec{
		{"sigmoid-groups-bias", tensor.RouterSpec{Sigmoid: true, Scale: 2.5, Groups: 4, GroupK: 2}, true},
		{"sigmoid-raw", tensor.RouterSpec{Sigmoid: true, Raw: true}, false},
		{"softmax-raw-bias", tensor.RouterSpec{Raw: true}, true},
		{"softmax-scaled", tensor.RouterSpec{Scale: 1.5}, false},
	}
}

// routeWith is route with a bias (of scale 0.3, when withBias) in the routing.
func routeWith(e *env, s tensor.MoEShape, withBias bool) *routed {
	var bias tensor.Buffer
	if withBias {
		bias = e.floats(s.E, 0.3)
	}
	return routeBias(e, s, bias)
}

// routed is one MoE layer's forward state up to the experts.
type routed struct {
	s                           tensor.MoEShape
	r                           tensor.Routing
	x, logits, probs, gates, xp tensor.Buffer
	seg                         tensor.Buffer // the experts' segments: r.Offsets packed, e·Capacity padded (as the model passes them)
}

// route draws a layer's input and router logits and runs Router and Dispatch.
func route(e *env, s tensor.MoEShape) *routed { return routeBias(e, s, tensor.Buffer{}) }

// routeBias is route with an expert bias (empty: none).
func routeBias(e *env, s tensor.MoEShape, bias tensor.Buffer) *routed {
	n := s.BT * s.K
	m := &routed{s: s, r: tensor.Routing{Idx: e.intsN(n), Row: e.intsN(n), Tok: e.intsN(max(n, s.Rows())),
		Offsets: e.intsN(s.E + 1), Cursor: e.intsN(s.E), Bias: bias}}
	m.x, m.logits = e.floats(s.BT*s.C, 1), e.floats(s.BT*s.E, 3)
	m.probs, m.gates, m.xp = e.floats(s.BT*s.E, 1), e.floats(n, 1), e.floats(s.Rows()*s.C, 1)
	e.k.Router(m.probs, m.gates, m.logits, m.r, s)
	e.k.Dispatch(m.xp, m.x, m.r, s)
	m.seg = m.r.Offsets
	if s.Padded {
		static := make([]int32, s.E+1)
		for i := range static {
			static[i] = int32(i * s.Capacity)
		}
		m.seg = e.ints(static)
	}
	return m
}

// experts is the shape of the experts' products from C to OC as the model
// passes it: with the padded layout's static segments named (Segment), so
// that a backend may read no offsets.
func (m *routed) experts(C, OC int) tensor.ExpertsShape {
	sh := tensor.ExpertsShape{C: C, OC: OC}
	if m.s.Padded {
		sh.Segment = m.s.Capacity
	}
	return sh
}

// experts makes E expert buffers of n values each by alloc: apart, or, with
// together, slices of one allocation 5 values apart (as a layer's experts lie
// in their unit's buffer: a device backend may run them as one batched
// product over static segments).
func (e *env) experts(E, n int, together bool, alloc func(n int) tensor.Buffer) []tensor.Buffer {
	bs := make([]tensor.Buffer, E)
	if !together {
		for i := range bs {
			bs[i] = alloc(n)
		}
		return bs
	}
	const gap = 5
	all := alloc(E*(n+gap) - gap)
	for i := range bs {
		bs[i] = all.Slice(i*(n+gap), i*(n+gap)+n)
	}
	return bs
}

// moeCases are the routing, the permutation and combination, the experts'
// grouped products and the load-balancing loss, on each layout.
func moeCases() []kcase {
	var cs []kcase
	add := func(c ...kcase) { cs = append(cs, c...) }
	for _, l := range moeLayouts() {
		s := l.s
		add(kcase{name: "Router/" + l.name, run: func(e *env) bufs {
			m := route(e, s)
			return bufs{m.probs, m.gates, m.r.Idx}
		}})
		add(kcase{name: "Dispatch/" + l.name, run: func(e *env) bufs {
			m := route(e, s)
			return bufs{m.xp, m.r.Row, m.r.Tok.Slice(0, s.Rows()), m.r.Offsets}
		}})
		add(kcase{name: "DispatchBackward/" + l.name, run: func(e *env) bufs {
			m := route(e, s)
			dx := e.floats(s.BT*s.C, 1)
			e.k.DispatchBackward(dx, e.floats(s.Rows()*s.C, 1), m.r, s)
			return bufs{dx}
		}})
		add(kcase{name: "Combine/" + l.name, run: func(e *env) bufs {
			m := route(e, s)
			out := e.floats(s.BT*s.C, 1)
			e.k.Combine(out, e.floats(s.Rows()*s.C, 1), m.gates, m.r, s)
			return bufs{out}
		}})
		add(kcase{name: "CombineBackward/" + l.name, run: func(e *env) bufs {
			m := route(e, s)
			dy, dgates := e.floats(s.Rows()*s.C, 1), e.floats(s.BT*s.K, 1)
			e.k.CombineBackward(dy, dgates, e.floats(s.BT*s.C, 1), e.floats(s.Rows()*s.C, 1), m.gates, m.r, s)
			return bufs{dy, dgates}
		}})
		add(variants("RouterBackward/"+l.name, []string{"aux loss"}, func(on []bool) kcase {
			return kcase{run: func(e *env) bufs {
				m := route(e, s)
				dlogits := e.floats(s.BT*s.E, 1)
				var dprobs tensor.Buffer
				if on[0] {
					dprobs = e.floats(s.BT*s.E, 0.1)
				}
				e.k.RouterBackward(dlogits, e.floats(s.BT*s.K, 1), dprobs, m.gates, m.probs, m.r, s)
				return bufs{dlogits}
			}}
		})...)
		for _, sp := range routerSpecs() {
			s := s
			s.Router = sp.spec
			add(kcase{name: "Router/" + sp.name + "/" + l.name, run: func(e *env) bufs {
				m := routeWith(e, s, sp.bias)
				return bufs{m.probs, m.gates, m.r.Idx, m.r.Row}
			}})
			add(variants("RouterBackward/"+sp.name+"/"+l.name, []string{"aux loss"}, func(on []bool) kcase {
				return kcase{run: func(e *env) bufs {
					m := routeWith(e, s, sp.bias)
					dlogits := e.floats(s.BT*s.E, 1)
					var dprobs tensor.Buffer
					if on[0] {
						dprobs = e.floats(s.BT*s.E, 0.1)
					}
					e.k.RouterBackward(dlogits, e.floats(s.BT*s.K, 1), dprobs, m.gates, m.probs, m.r, s)
					return bufs{dlogits}
				}}
			})...)
		}
		add(kcase{name: "ScaleCopies/" + l.name, run: func(e *env) bufs {
			m := route(e, s)
			e.k.ScaleCopies(m.xp, m.gates, m.r, s)
			return bufs{m.xp}
		}})
		add(kcase{name: "ScaleCopiesBackward/" + l.name, run: func(e *env) bufs {
			m := route(e, s)
			dg, dxp := e.floats(s.BT*s.K, 1), e.floats(s.Rows()*s.C, 1)
			e.k.ScaleCopiesBackward(dg, dxp, m.x, m.gates, m.r, s)
			return bufs{dg, dxp}
		}})
		add(variants("AuxLoss/"+l.name, []string{"accumulate"}, func(on []bool) kcase {
			return kcase{run: func(e *env) bufs {
				m := route(e, s)
				stats := e.floats(2*s.E, 1)
				e.k.RouterStats(stats, m.probs, m.r, s)
				dst := e.stats([]float64{0.25, 3})
				e.k.AuxLoss(dst, stats, m.r, s, s.BT, on[0])
				dprobs := e.floats(s.BT*s.E, 1)
				e.k.AuxLossBackward(dprobs, stats, s, s.BT, 0.01)
				return bufs{stats, dst, dprobs}
			}}
		})...)
		add(variants("ExpertsMatmul/"+l.name, []string{"bf16 weights", "accumulate", "one allocation"}, func(on []bool) kcase {
			return kcase{tol: tolIf(on[0]), run: func(e *env) bufs {
				m := route(e, s)
				const OC = 12
				w := e.experts(s.E, OC*s.C, on[2], func(n int) tensor.Buffer { return e.weight(n, 0.3, on[0]) })
				out := e.floats(s.Rows()*OC, 1)
				e.k.ExpertsMatmul(out, m.xp, w, m.seg, m.experts(s.C, OC), on[1])
				return bufs{out}
			}}
		})...)
		add(variants("ExpertsMatmulBackward/"+l.name, []string{"bf16 weights", "accumulate", "one allocation", "bf16 gradients"}, func(on []bool) kcase {
			return kcase{tol: tolIf(on[0], on[3]), run: func(e *env) bufs {
				m := route(e, s)
				const OC = 12
				w := e.experts(s.E, OC*s.C, on[2], func(n int) tensor.Buffer { return e.weight(n, 0.3, on[0]) })
				dw := e.experts(s.E, OC*s.C, on[2], func(n int) tensor.Buffer { return e.weight(n, 1, on[3]) })
				dinp := e.floats(s.Rows()*s.C, 1)
				e.k.ExpertsMatmulBackward(dinp, dw, e.floats(s.Rows()*OC, 1), m.xp, w, m.seg, m.experts(s.C, OC), on[1])
				return append(bufs{dinp}, dw...)
			}}
		})...)
		add(expertsFP8Cases(l)...)
		add(kcase{name: "ExpertsSwiGLU/" + l.name, run: func(e *env) bufs {
			m := route(e, s)
			const W = 12
			out := e.floats(s.Rows()*W, 1)
			e.k.ExpertsSwiGLU(out, e.floats(s.Rows()*W, 4), e.floats(s.Rows()*W, 2), m.seg, W)
			return bufs{out}
		}})
		add(variants("ExpertsSwiGLUBackward/"+l.name, []string{"accumulate"}, func(on []bool) kcase {
			return kcase{run: func(e *env) bufs {
				m := route(e, s)
				const W = 12
				dg, du := e.floats(s.Rows()*W, 1), e.floats(s.Rows()*W, 1)
				e.k.ExpertsSwiGLUBackward(dg, du, e.floats(s.Rows()*W, 1), e.floats(s.Rows()*W, 4), e.floats(s.Rows()*W, 2), m.seg, W, on[0])
				return bufs{dg, du}
			}}
		})...)
	}
	return cs
}
