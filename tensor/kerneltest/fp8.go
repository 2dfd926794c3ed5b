package kerneltest

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/shardline/shardline/tensor"
)

// fp8Cases are the FP8 kernels: products of FP8 operands (against the
// reference's products of the values they stand for, env.fp8), Amax,
// FP8Scale and Quantize (exact: the formats' definitions on both sides), and
// current scaling end to end (Amax, FP8Scale and Quantize of both operands,
// then their product).
func fp8Cases() []kcase {
	var cs []kcase
	add := func(c ...kcase) { cs = append(cs, c...) }
	// operand is a product's operand: FP8 in format f when on, else drawn as
	// weight draws it (bf16 when bf16 is set).
	operand := func(e *env, n int, scale float64, on bool, f tensor.FP8Format, bf16 bool) (tensor.Buffer, tensor.Buffer) {
		if on {
			return e.fp8(n, scale, f)
		}
		return e.weight(n, scale, bf16), tensor.Buffer{}
	}

	// The forward: E4M3 inputs and weights (either alone: the other F or
	// bf16, widened), out F.
	add(variants("Matmul", []string{"e4m3 input", "e4m3 weight", "bf16 input", "accumulate"}, func(on []bool) kcase {
		if !on[0] && !on[1] || on[0] && on[2] {
			return kcase{} // no FP8 operand (the cases above), or an input both FP8 and bf16
		}
		return kcase{run: func(e *env) bufs {
			s := tensor.MatmulShape{BT: 37, C: 48, OC: 20}
			inp, si := operand(e, s.BT*s.C, 1, on[0], tensor.E4M3, on[2])
			w, sw := operand(e, s.OC*s.C, 0.3, on[1], tensor.E4M3, false)
			s.Scales = tensor.MatmulScales{Inp: si, Weight: sw}
			out := e.floats(s.BT*s.OC, 1)
			e.k.Matmul(out, inp, w, s, on[3])
			return bufs{out}
		}}
	})...)
	// The backward: output gradients in E5M2 (hybrid) or E4M3, inputs and
	// weights in E4M3, in every combination with F operands, into an F or a
	// bf16 weight gradient.
	add(variants("MatmulBackward", []string{"e5m2 gradient", "e4m3 gradient", "e4m3 operands", "accumulate", "no input gradient", "bf16 weight gradient"}, func(on []bool) kcase {
		if on[0] && on[1] || !on[0] && !on[1] && !on[2] {
			return kcase{}
		}
		tol := tolF32
		if on[5] {
			tol = tolBF16
		}
		return kcase{tol: tol, run: func(e *env) bufs {
			s := tensor.MatmulShape{BT: 37, C: 48, OC: 20}
			gf := tensor.E5M2
			if on[1] {
				gf = tensor.E4M3
			}
			inp, si := operand(e, s.BT*s.C, 1, on[2], tensor.E4M3, false)
			w, sw := operand(e, s.OC*s.C, 0.3, on[2], tensor.E4M3, false)
			dout, sd := operand(e, s.BT*s.OC, 1, on[0] || on[1], gf, false)
			s.Scales = tensor.MatmulScales{Inp: si, Weight: sw, Dout: sd}
			dw := e.weight(s.OC*s.C, 1, on[5])
			var dinp tensor.Buffer
			if !on[4] {
				dinp = e.floats(s.BT*s.C, 1)
			}
			e.k.MatmulBackward(dinp, dw, dout, inp, w, s, on[3])
			if on[4] {
				return bufs{dw}
			}
			return bufs{dinp, dw}
		}}
	})...)

	// The input gradient alone (no weight gradient, no input read: a run
	// whose weight gradients compute in bf16 apart, precision.fp8.wgrad =
	// false), from E5M2 or E4M3 output gradients and E4M3 weights, and the
	// bf16 weight gradient beside it from the unquantised operands.
	for _, gf := range []tensor.FP8Format{tensor.E5M2, tensor.E4M3} {
		add(kcase{name: "MatmulBackward/no weight gradient/" + gf.String(), run: func(e *env) bufs {
			s := tensor.MatmulShape{BT: 37, C: 48, OC: 20}
			w, sw := e.fp8(s.OC*s.C, 0.3, tensor.E4M3)
			dout, sd := e.fp8(s.BT*s.OC, 1, gf)
			s.Scales = tensor.MatmulScales{Weight: sw, Dout: sd}
			dinp := e.floats(s.BT*s.C, 1)
			e.k.MatmulBackward(dinp, tensor.Buffer{}, dout, tensor.Buffer{}, w, s, true)
			return bufs{dinp}
		}})
	}

	// Amax over more values than a block of the GPU's (12 blocks), into three
	// slots that held 0.25 (below the amax), 7.5 (above it) and NaN: with
	// accumulate the first is raised, the others stay; a NaN or an inf
	// among the values makes the amax NaN or inf (NaN where both are).
	add(variants("Amax", []string{"bf16", "accumulate", "nan", "inf"}, func(on []bool) kcase {
		return kcase{exact: true, run: func(e *env) bufs {
			const n = 3001
			x := e.draw(n, 3)
			if on[2] {
				x[2000] = math.NaN()
			}
			if on[3] {
				x[123] = math.Inf(-1)
			}
			xs := e.weightOf(x, on[0])
			dst := e.stats([]float64{0.25, 7.5, math.NaN()})
			for i := range 3 {
				e.k.Amax(dst.Slice(i, i+1), xs, on[1])
			}
			return bufs{dst}
		}}
	})...)
	add(kcase{name: "Amax/empty", exact: true, run: func(e *env) bufs {
		dst := e.stats([]float64{7.5})
		e.k.Amax(dst, e.floats(0, 1), false)
		return bufs{dst}
	}})

	// FP8Scale from every kind of amax: zero, NaN, inf (scale 1), one whose
	// quotient overflows float32 (float32's largest), a negative one (1),
	// and ordinary ones, in both formats, with and without a margin.
	for _, f := range []tensor.FP8Format{tensor.E4M3, tensor.E5M2} {
		for _, margin := range []int{0, 3} {
			add(kcase{name: "FP8Scale/" + f.String() + "/margin " + string(rune('0'+margin)), exact: true, run: func(e *env) bufs {
				amaxes := []float64{0, math.NaN(), math.Inf(1), 1e-40, -2, 448, 0.37, 3e5, 1e-3, 57344, float64(float32(1.0 / 3))}
				amax := e.stats(amaxes)
				scale := e.scalars(make([]float64, len(amaxes))...)
				for i := range amaxes {
					e.k.FP8Scale(scale.Slice(i, i+1), amax.Slice(i, i+1), f, margin)
				}
				return bufs{scale}
			}})
		}
	}

	// FP8DelayedScale over six steps of three ranks' amaxes (zeros, NaNs,
	// infinities, values whose scale overflows, ordinary ones) for five
	// E4M3 tensors and three E5M2 ones in one history (two calls, each on
	// its columns), every algorithm, a history of one step and of four:
	// scales and histories exactly the CPU's.
	for _, algo := range []tensor.AmaxAlgo{tensor.AmaxMax, tensor.AmaxMostRecent} {
		for _, steps := range []int{1, 4} {
			add(kcase{name: fmt.Sprintf("FP8DelayedScale/%v/history %d", algo, steps), exact: true, run: func(e *env) bufs {
				hist, scale, amax := delayedRun(e, algo, steps, 6)
				return bufs{scale, hist, amax}
			}})
		}
	}

	// Quantize at a scale that saturates the largest values (1.7 times
	// current scaling's), over zeros, NaNs, infinities and values that round
	// to subnormals: codes and scale inverse exactly the CPU's.
	add(variants("Quantize", []string{"e5m2", "bf16 input"}, func(on []bool) kcase {
		return kcase{exact: true, run: func(e *env) bufs {
			f, dt := tensor.E4M3, tensor.Float8E4M3
			if on[0] {
				f, dt = tensor.E5M2, tensor.Float8E5M2
			}
			const n = 5000
			x := e.draw(n, 2)
			x32 := make([]float32, n)
			for i, v := range x {
				x32[i] = float32(v)
			}
			sc := 1.7 * float64(f.CurrentScale(tensor.Amax(x32)))
			x[0], x[1], x[2], x[3], x[4] = 0, math.Copysign(0, -1), math.NaN(), math.Inf(1), math.Inf(-1)
			for i := 5; i < 40; i++ {
				x[i] *= 1e-6 // subnormal in both formats once scaled
			}
			xs := e.weightOf(x, on[1])
			q, inv := e.m.Alloc(dt, n), e.scalars(0)
			e.k.Quantize(q, inv, xs, e.scalars(float64(float32(sc))))
			return bufs{q, inv}
		}}
	})...)

	// Current scaling end to end, on the backend's memory alone: each
	// operand's amax, scale and codes, then their product (on the reference,
	// the same kernels in float64: the same codes, and their product in
	// float64).
	add(variants("FP8 current scaling", []string{"e5m2 weight"}, func(on []bool) kcase {
		return kcase{run: func(e *env) bufs {
			s := tensor.MatmulShape{BT: 37, C: 48, OC: 20}
			wf, wt := tensor.E4M3, tensor.Float8E4M3
			if on[0] {
				wf, wt = tensor.E5M2, tensor.Float8E5M2
			}
			quant := func(x tensor.Buffer, f tensor.FP8Format, t tensor.DType) (tensor.Buffer, tensor.Buffer) {
				amax, scale, inv := e.stats([]float64{0}), e.scalars(0), e.scalars(0)
				q := e.m.Alloc(t, x.Len())
				e.k.Amax(amax, x, false)
				e.k.FP8Scale(scale, amax, f, 0)
				e.k.Quantize(q, inv, x, scale)
				return q, inv
			}
			xq, xi := quant(e.floats(s.BT*s.C, 2), tensor.E4M3, tensor.Float8E4M3)
			wq, wi := quant(e.floats(s.OC*s.C, 0.1), wf, wt)
			s.Scales = tensor.MatmulScales{Inp: xi, Weight: wi}
			out := e.floats(s.BT*s.OC, 1)
			e.k.Matmul(out, xq, wq, s, false)
			return bufs{out, xi, wi}
		}}
	})...)
	return cs
}

// expertsFP8Cases are the experts' grouped products on FP8 operands over
// layout l's segments (routed by l: packed with or without dropped copies,
// or padded): the grouped input (E4M3) and output gradient (E5M2, the hybrid
// format, or E4M3) each under one scale, every expert's weight (E4M3) under
// its own (ExpertsShape.Scales.Weight, one per expert), against the
// reference's products of the values they stand for. An operand not FP8 is
// F (the input, or the input and weights of a backward whose gradient alone
// is FP8), widened.
func expertsFP8Cases(l moeLayout) []kcase {
	s := l.s
	const OC = 12
	// weights are the experts' weights: FP8 each under its own scale, or F.
	weights := func(e *env, on, together bool) ([]tensor.Buffer, tensor.Buffer) {
		if on {
			return e.fp8Experts(s.E, OC*s.C, 0.3, together)
		}
		return e.experts(s.E, OC*s.C, together, func(n int) tensor.Buffer { return e.floats(n, 0.3) }), tensor.Buffer{}
	}
	var cs []kcase
	cs = append(cs, variants("ExpertsMatmul FP8/"+l.name, []string{"e4m3 input", "e4m3 weights", "accumulate", "one allocation"}, func(on []bool) kcase {
		if !on[0] && !on[1] {
			return kcase{} // no FP8 operand: ExpertsMatmul's cases
		}
		return kcase{run: func(e *env) bufs {
			m := route(e, s)
			sh := m.experts(s.C, OC)
			inp := m.xp
			if on[0] {
				inp, sh.Scales.Inp = e.fp8(s.Rows()*s.C, 1, tensor.E4M3)
			}
			w, wi := weights(e, on[1], on[3])
			sh.Scales.Weight = wi
			out := e.floats(s.Rows()*OC, 1)
			e.k.ExpertsMatmul(out, inp, w, m.seg, sh, on[2])
			return bufs{out}
		}}
	})...)
	cs = append(cs, variants("ExpertsMatmulBackward FP8/"+l.name, []string{"e4m3 gradient", "f32 operands", "accumulate", "one allocation", "bf16 gradients"}, func(on []bool) kcase {
		return kcase{tol: tolIf(on[4]), run: func(e *env) bufs {
			m := route(e, s)
			sh := m.experts(s.C, OC)
			gf := tensor.E5M2
			if on[0] {
				gf = tensor.E4M3
			}
			inp := m.xp
			if !on[1] {
				inp, sh.Scales.Inp = e.fp8(s.Rows()*s.C, 1, tensor.E4M3)
			}
			w, wi := weights(e, !on[1], on[3])
			sh.Scales.Weight = wi
			dout, di := e.fp8(s.Rows()*OC, 1, gf)
			sh.Scales.Dout = di
			dw := e.experts(s.E, OC*s.C, on[3], func(n int) tensor.Buffer { return e.weight(n, 1, on[4]) })
			dinp := e.floats(s.Rows()*s.C, 1)
			e.k.ExpertsMatmulBackward(dinp, dw, dout, inp, w, m.seg, sh, on[2])
			return append(bufs{dinp}, dw...)
		}}
	})...)
	return cs
}

// The layout of delayedRun's buffers: nf E4M3 tensors then nb E5M2 ones,
// the amaxes of delayedRanks ranks.
const (
	delayedF, delayedB, delayedRanks = 5, 3, 3
)

// DelayedAmaxes draws a step's amaxes for DelayedScaling checks: one in four
// special (0, NaN, +inf, 1e-40 whose scale overflows float32, E4M3's and
// E5M2's largest), the rest spread over ten binades each side of 1. Every
// value is a float32.
func DelayedAmaxes(rng *rand.Rand, n int) []float64 {
	special := []float64{0, math.NaN(), math.Inf(1), float64(float32(1e-40)), 448, 57344}
	out := make([]float64, n)
	for i := range out {
		if rng.IntN(4) == 0 {
			out[i] = special[rng.IntN(len(special))]
		} else {
			out[i] = float64(float32(math.Ldexp(1+rng.Float64(), rng.IntN(21)-10)))
		}
	}
	return out
}

// delayedRun runs FP8DelayedScale for steps steps on e's backend (see the
// case) and returns its history, scales and last amaxes.
func delayedRun(e *env, algo tensor.AmaxAlgo, history, steps int) (hist, scale, amax tensor.Buffer) {
	const stride = delayedF + delayedB
	hist = e.scalars(make([]float64, history*stride)...)
	ones := make([]float64, stride)
	for i := range ones {
		ones[i] = 1
	}
	scale, amax = e.scalars(ones...), e.scalars(make([]float64, delayedRanks*stride)...)
	fwd := tensor.DelayedShape{Steps: history, Ranks: delayedRanks, Stride: stride, Algo: algo}
	bwd := fwd
	bwd.Margin = 2
	for range steps {
		e.m.Write(amax, DelayedAmaxes(e.rng, delayedRanks*stride))
		e.k.FP8DelayedScale(scale.Slice(0, delayedF), hist, amax, tensor.E4M3, fwd)
		e.k.FP8DelayedScale(scale.Slice(delayedF, stride), hist.Slice(delayedF, hist.Len()), amax.Slice(delayedF, amax.Len()), tensor.E5M2, bwd)
	}
	return hist, scale, amax
}

// refusal is a call a kernel set must refuse: run makes it on a fresh
// memory, whose kept error then contains want (the words both backends use).
type refusal struct {
	name, want string
	run        func(k tensor.Backend, m tensor.Memory)
}

// refusals are the FP8 kernels' refusals: operands and scale inverses that
// do not go together, a margin out of range, a length mismatch, a scale
// inverse over its scale, and an FP8 output.
func refusals() []refusal {
	f32 := func(m tensor.Memory, n int) tensor.Buffer { return m.Alloc(tensor.Float32, n) }
	e4m3 := func(m tensor.Memory, n int) tensor.Buffer { return m.Alloc(tensor.Float8E4M3, n) }
	s := tensor.MatmulShape{BT: 2, C: 3, OC: 4}
	return []refusal{
		{"FP8 operand without its scale inverse", "without its scale inverse", func(k tensor.Backend, m tensor.Memory) {
			k.Matmul(f32(m, 8), e4m3(m, 6), f32(m, 12), s, false)
		}},
		{"scale inverse of an fp32 operand", "only FP8 operands take one", func(k tensor.Backend, m tensor.Memory) {
			s := s
			s.Scales.Weight = f32(m, 1)
			k.Matmul(f32(m, 8), f32(m, 6), f32(m, 12), s, false)
		}},
		{"backward without the gradient's scale inverse", "without its scale inverse", func(k tensor.Backend, m tensor.Memory) {
			k.MatmulBackward(f32(m, 6), f32(m, 12), m.Alloc(tensor.Float8E5M2, 8), f32(m, 6), f32(m, 12), s, false)
		}},
		{"a forward product with a gradient's scale inverse", "a forward product has none", func(k tensor.Backend, m tensor.Memory) {
			s := s
			s.Scales = tensor.MatmulScales{Inp: f32(m, 1), Weight: f32(m, 1), Dout: f32(m, 1)}
			k.Matmul(f32(m, 8), e4m3(m, 6), e4m3(m, 12), s, false)
		}},
		{"FP8 product output", "f8e4m3 buffer where", func(k tensor.Backend, m tensor.Memory) {
			s := s
			s.Scales = tensor.MatmulScales{Inp: f32(m, 1), Weight: f32(m, 1)}
			k.Matmul(e4m3(m, 8), e4m3(m, 6), e4m3(m, 12), s, false)
		}},
		{"negative margin", "margin -1: want 0 to 126", func(k tensor.Backend, m tensor.Memory) {
			k.FP8Scale(f32(m, 1), m.Alloc(tensor.Float64, 1), tensor.E4M3, -1)
		}},
		{"delayed scaling's history too short", "want at least 11", func(k tensor.Backend, m tensor.Memory) {
			k.FP8DelayedScale(f32(m, 3), f32(m, 10), f32(m, 3), tensor.E4M3, tensor.DelayedShape{Steps: 3, Ranks: 1, Stride: 4})
		}},
		{"delayed scaling's margin", "margin 127: want 0 to 126", func(k tensor.Backend, m tensor.Memory) {
			k.FP8DelayedScale(f32(m, 3), f32(m, 3), f32(m, 3), tensor.E4M3, tensor.DelayedShape{Steps: 1, Ranks: 1, Stride: 3, Margin: 127})
		}},
		{"quantize lengths", "want one length", func(k tensor.Backend, m tensor.Memory) {
			k.Quantize(e4m3(m, 5), f32(m, 1), f32(m, 6), f32(m, 1))
		}},
		{"experts' weights with fewer scale inverses than experts", "2 weight scale inverses (ExpertsShape.Scales.Weight) for 3 experts", func(k tensor.Backend, m tensor.Memory) {
			w := []tensor.Buffer{e4m3(m, 12), e4m3(m, 12), e4m3(m, 12)}
			es := tensor.ExpertsShape{C: 3, OC: 4, Segment: 1, Scales: tensor.MatmulScales{Inp: f32(m, 1), Weight: f32(m, 2)}}
			k.ExpertsMatmul(f32(m, 12), e4m3(m, 9), w, tensor.Buffer{}, es, false)
		}},
		{"FP8 experts' weights without their scale inverses", "without its scale inverse", func(k tensor.Backend, m tensor.Memory) {
			w := []tensor.Buffer{e4m3(m, 12), e4m3(m, 12)}
			es := tensor.ExpertsShape{C: 3, OC: 4, Segment: 1}
			k.ExpertsMatmul(f32(m, 8), f32(m, 6), w, tensor.Buffer{}, es, false)
		}},
		{"scale inverse over the scale", "give them two buffers", func(k tensor.Backend, m tensor.Memory) {
			sc := f32(m, 1)
			k.Quantize(e4m3(m, 6), sc, f32(m, 6), sc)
		}},
	}
}
