package kerneltest

import (
	"math"

	"github.com/shardline/shardline/tensor"
)

// bufs is the outputs a case compares.
type bufs = []tensor.Buffer

// tolIf is tolBF16 when any flag is set (a bf16 operand), else tolF32.
func tolIf(flags ...bool) float64 {
	for _, f := range flags {
		if f {
			return tolBF16
		}
	}
	return tolF32
}

// cases is every check, kernel by kernel, in the order of tensor.Kernels.
func cases() []kcase {
	var cs []kcase
	add := func(c ...kcase) { cs = append(cs, c...) }

	add(variants("Matmul", []string{"bf16 weight", "bf16 input", "accumulate"}, func(on []bool) kcase {
		return kcase{tol: tolIf(on[0], on[1]), run: func(e *env) bufs {
			s := tensor.MatmulShape{BT: 37, C: 48, OC: 20}
			inp, w := e.weight(s.BT*s.C, 1, on[1]), e.weight(s.OC*s.C, 0.3, on[0])
			out := e.floats(s.BT*s.OC, 1)
			e.k.Matmul(out, inp, w, s, on[2])
			return bufs{out}
		}}
	})...)
	add(variants("MatmulBackward", []string{"bf16 weight", "bf16 input", "accumulate", "no input gradient", "bf16 gradient"}, func(on []bool) kcase {
		return kcase{tol: tolIf(on[0], on[1], on[4]), run: func(e *env) bufs {
			s := tensor.MatmulShape{BT: 37, C: 48, OC: 20}
			inp, w := e.weight(s.BT*s.C, 1, on[1]), e.weight(s.OC*s.C, 0.3, on[0])
			dout, dw := e.floats(s.BT*s.OC, 1), e.weight(s.OC*s.C, 1, on[4])
			var dinp tensor.Buffer
			if !on[3] {
				dinp = e.floats(s.BT*s.C, 1)
			}
			e.k.MatmulBackward(dinp, dw, dout, inp, w, s, on[2])
			if on[3] {
				return bufs{dw}
			}
			return bufs{dinp, dw}
		}}
	})...)

	// The input gradient alone: no weight gradient, inp not read (the
	// empty Buffer), fp32 and bf16 operands.
	add(variants("MatmulBackward/no weight gradient", []string{"bf16 weight", "accumulate"}, func(on []bool) kcase {
		return kcase{tol: tolIf(on[0]), run: func(e *env) bufs {
			s := tensor.MatmulShape{BT: 37, C: 48, OC: 20}
			w, dout, dinp := e.weight(s.OC*s.C, 0.3, on[0]), e.floats(s.BT*s.OC, 1), e.floats(s.BT*s.C, 1)
			e.k.MatmulBackward(dinp, tensor.Buffer{}, dout, tensor.Buffer{}, w, s, on[1])
			return bufs{dinp}
		}}
	})...)

	add(fp8Cases()...)

	// The vocabulary part: rows 20..36 of a 50-token vocabulary (a
	// tensor-parallel rank's), tokens from all of it.
	embed := func(part bool) tensor.EmbeddingShape {
		if part {
			return tensor.EmbeddingShape{BT: 30, C: 24, Lo: 20, N: 17}
		}
		return tensor.EmbeddingShape{BT: 30, C: 24, N: 50}
	}
	add(variants("Embedding", []string{"bf16 table", "vocabulary part"}, func(on []bool) kcase {
		return kcase{run: func(e *env) bufs {
			s := embed(on[1])
			tok := e.ints(e.tokens(s.BT, 0, 50))
			wte, out := e.weight(s.N*s.C, 1, on[0]), e.floats(s.BT*s.C, 1)
			e.k.Embedding(out, tok, wte, s)
			return bufs{out}
		}}
	})...)
	add(variants("EmbeddingBackward", []string{"vocabulary part", "bf16 gradient"}, func(on []bool) kcase {
		return kcase{tol: tolIf(on[1]), run: func(e *env) bufs {
			s := embed(on[0])
			tok := e.ints(e.tokens(s.BT, 0, 50))
			dwte, dout := e.weight(s.N*s.C, 1, on[1]), e.floats(s.BT*s.C, 1)
			e.k.EmbeddingBackward(dwte, dout, tok, s)
			return bufs{dwte}
		}}
	})...)

	// RMSNorm over more rows than one block of either backend's weight
	// gradient partial sums (the CPU's 64, the GPU's 32).
	const normRows, normC = 100, 40
	add(variants("RMSNorm", []string{"bf16 weight"}, func(on []bool) kcase {
		return kcase{run: func(e *env) bufs {
			x, w := e.floats(normRows*normC, 2), e.weight(normC, 1, on[0])
			out, rstd := e.floats(normRows*normC, 1), e.floats(normRows, 1)
			e.k.RMSNorm(out, rstd, x, w, normRows, normC, 1e-5)
			return bufs{out, rstd}
		}}
	})...)
	add(variants("RMSNormBackward", []string{"bf16 weight", "accumulate", "bf16 gradient"}, func(on []bool) kcase {
		return kcase{tol: tolIf(on[2]), run: func(e *env) bufs {
			x, w := e.floats(normRows*normC, 2), e.weight(normC, 1, on[0])
			out, rstd := e.floats(normRows*normC, 1), e.floats(normRows, 1)
			e.k.RMSNorm(out, rstd, x, w, normRows, normC, 1e-5)
			dinp, dw, dout := e.floats(normRows*normC, 1), e.weight(normC, 1, on[2]), e.floats(normRows*normC, 1)
			e.k.RMSNormBackward(dinp, dw, dout, x, w, rstd, normRows, normC, on[1])
			return bufs{dinp, dw}
		}}
	})...)

	add(variants("Rope", []string{"backward"}, func(on []bool) kcase {
		return kcase{run: func(e *env) bufs {
			s := tensor.RopeShape{B: 2, T: 9, NH: 3, HD: 16}
			inv := tensor.RopeInvFreq(s.HD, 10000, tensor.RopeScaling{})
			cos, sin := e.floats(s.T*s.HD/2, 1), e.floats(s.T*s.HD/2, 1)
			e.k.RopeTables(cos, sin, s.T, inv)
			x := e.floats(s.B*s.T*s.NH*s.HD, 1)
			if on[0] {
				e.k.RopeBackward(x, cos, sin, s)
			} else {
				e.k.Rope(x, cos, sin, s)
			}
			return bufs{x, cos, sin}
		}}
	})...)

	for _, a := range attentionShapes() {
		a := a
		add(kcase{name: "FlashAttention/" + a.name, run: func(e *env) bufs {
			out, lse, _, _, _ := attention(e, a.shape(e))
			return bufs{out, lse}
		}})
		for _, accumulate := range []bool{true, false} {
			name := "FlashAttentionBackward/" + a.name
			if !accumulate {
				name += "/overwrite"
			}
			add(kcase{name: name, run: func(e *env) bufs {
				s := a.shape(e)
				out, lse, q, k, v := attention(e, s)
				dq, dk, dv := e.floats(q.Len(), 1), e.floats(k.Len(), 1), e.floats(v.Len(), 1)
				e.k.FlashAttentionBackward(dq, dk, dv, e.floats(out.Len(), 1), out, lse, q, k, v, s, accumulate)
				return bufs{dq, dk, dv}
			}})
		}
	}
	add(kcase{name: "MergeAttention", run: func(e *env) bufs {
		s := tensor.AttentionShape{B: 2, Tq: 5, NH: 2, HD: 8}
		n := s.B * s.NH * s.Tq
		lse, lseB := e.draw(n, 3), e.draw(n, 3)
		// Rows that saw no key so far, rows whose block saw none, and rows of both.
		lse[0], lse[7], lseB[1], lseB[7] = math.Inf(-1), math.Inf(-1), math.Inf(-1), math.Inf(-1)
		out, outB := e.floats(n*s.HD, 1), e.floats(n*s.HD, 1)
		l := e.vals(lse)
		e.k.MergeAttention(out, l, outB, e.vals(lseB), s)
		return bufs{out, l}
	}})

	add(kcase{name: "SwiGLU", run: func(e *env) bufs {
		const n = 1000
		out := e.floats(n, 1)
		e.k.SwiGLU(out, e.floats(n, 4), e.floats(n, 2), n)
		return bufs{out}
	}})
	add(variants("SwiGLUBackward", []string{"accumulate"}, func(on []bool) kcase {
		return kcase{run: func(e *env) bufs {
			const n = 1000
			dg, du := e.floats(n, 1), e.floats(n, 1)
			e.k.SwiGLUBackward(dg, du, e.floats(n, 1), e.floats(n, 4), e.floats(n, 2), n, on[0])
			return bufs{dg, du}
		}}
	})...)

	// The loss: a whole vocabulary of 70, and a part of 25 entries from 30 of a
	// vocabulary split over 3 ranks; targets −1 are ignored.
	const ceRows = 9
	targets := func(e *env, V int) tensor.Buffer {
		t := e.tokens(ceRows, 0, V)
		t[2], t[6] = -1, -1
		return e.ints(t)
	}
	part := tensor.VocabShape{BT: ceRows, V: 25, Lo: 30, Parts: 3}
	// "in place": the probabilities written over the logits (the model's
	// training forward does so).
	add(variants("CrossEntropy", []string{"in place"}, func(on []bool) kcase {
		return kcase{run: func(e *env) bufs {
			s := tensor.VocabShape{BT: ceRows, V: 70, Parts: 1}
			losses, logits := e.floats(s.BT, 1), e.floats(s.BT*s.V, 4)
			probs := logits
			if !on[0] {
				probs = e.floats(s.BT*s.V, 1)
			}
			e.k.CrossEntropy(losses, probs, logits, targets(e, s.V), s)
			return bufs{losses, probs}
		}}
	})...)
	// HeadLoss over 37 rows, 10 at a time (the last chunk 7), a few targets
	// ignored: every row's loss, dx overwritten (drawn nonzero), dw added to.
	add(variants("HeadLoss", []string{"bf16 weight", "bf16 input", "loss only", "bf16 gradient"}, func(on []bool) kcase {
		if on[2] && on[3] {
			return kcase{} // no gradient to hold in bf16: the case is "loss only"
		}
		return kcase{tol: tolIf(on[0], on[1], on[3]), run: func(e *env) bufs {
			s := tensor.HeadShape{BT: 37, C: 24, V: 70, Rows: 10}
			x, w := e.weight(s.BT*s.C, 1, on[1]), e.weight(s.V*s.C, 0.3, on[0])
			tgt := e.tokens(s.BT, 0, s.V)
			for i := 0; i < s.BT; i += 9 {
				tgt[i] = -1
			}
			// The work buffer's size is the backend's (HeadWork): it draws
			// nothing, so both sides draw the same inputs.
			losses, work := e.floats(s.BT, 1), e.m.Alloc(e.f, e.k.HeadWork(s))
			if on[2] {
				e.k.HeadLoss(losses, tensor.Buffer{}, tensor.Buffer{}, work, x, w, e.ints(tgt), tensor.Buffer{}, s)
				return bufs{losses}
			}
			dx, dw, dloss := e.floats(s.BT*s.C, 1), e.weight(s.V*s.C, 1, on[3]), e.floats(s.BT, 1)
			e.k.HeadLoss(losses, dx, dw, work, x, w, e.ints(tgt), dloss, s)
			return bufs{losses, dx, dw}
		}}
	})...)
	// CrossEntropyBackward overwrites dlogits (drawn nonzero here), in place:
	// over the probabilities.
	add(variants("CrossEntropyBackward", []string{"vocabulary part", "in place"}, func(on []bool) kcase {
		return kcase{run: func(e *env) bufs {
			s, V := tensor.VocabShape{BT: ceRows, V: 70, Parts: 1}, 70
			if on[0] {
				s, V = part, 75
			}
			dlogits, probs := e.floats(s.BT*s.V, 1), e.floats(s.BT*s.V, 0.5)
			if on[1] {
				dlogits = probs
			}
			e.k.CrossEntropyBackward(dlogits, e.floats(s.BT, 1), probs, targets(e, V), s)
			return bufs{dlogits}
		}}
	})...)
	add(kcase{name: "CrossEntropyParts", run: func(e *env) bufs {
		lse, tlogit := e.floats(part.BT, 1), e.floats(part.BT, 1)
		e.k.CrossEntropyParts(lse, tlogit, e.floats(part.BT*part.V, 4), targets(e, 75), part)
		return bufs{lse, tlogit}
	}})
	add(variants("CrossEntropyCombine", []string{"in place"}, func(on []bool) kcase {
		return kcase{run: func(e *env) bufs {
			lseAll := e.draw(part.Parts*part.BT, 1)
			for i := range lseAll {
				lseAll[i] += 4
			}
			losses, logits := e.floats(part.BT, 1), e.floats(part.BT*part.V, 4)
			probs := logits
			if !on[0] {
				probs = e.floats(part.BT*part.V, 1)
			}
			e.k.CrossEntropyCombine(losses, probs, logits, e.vals(lseAll), e.floats(part.BT, 3), targets(e, 75), part)
			return bufs{losses, probs}
		}}
	})...)

	add(kcase{name: "Add", run: func(e *env) bufs {
		out := e.floats(333, 1)
		e.k.Add(out, e.floats(333, 1), e.floats(333, 1), 333)
		return bufs{out}
	}})
	add(variants("AddInto", []string{"bf16 source", "bf16 destination"}, func(on []bool) kcase {
		return kcase{tol: tolIf(on[1]), run: func(e *env) bufs {
			dst := e.weight(333, 1, on[1])
			e.k.AddInto(dst, e.weight(333, 1, on[0]), 333)
			return bufs{dst}
		}}
	})...)

	cs = append(cs, moeCases()...)
	cs = append(cs, stepCases()...)
	return cs
}

// attentionCase is a named attention shape.
type attentionCase struct {
	name   string
	s      tensor.AttentionShape
	starts []int32 // document starts (B,Tq), nil for none
}

// shape is the case's shape with its document starts in e's memory.
func (a attentionCase) shape(e *env) tensor.AttentionShape {
	s := a.s
	if a.starts != nil {
		s.Starts = e.ints(a.starts)
	}
	return s
}

// starts gives each of B rows of Tq queries at positions qoff.. the start of
// its document, documents beginning at the positions cuts[b] (and 0).
func starts(B, Tq, qoff int, cuts [][]int) []int32 {
	st := make([]int32, B*Tq)
	for b := range B {
		for i := range Tq {
			for _, c := range cuts[b] {
				if c <= qoff+i {
					st[b*Tq+i] = int32(max(int(st[b*Tq+i]), c))
				}
			}
		}
	}
	return st
}

// attentionShapes covers causal self-attention with grouped key/value heads,
// attention without a mask over more keys than queries, and two key blocks of
// context parallelism: one that masks part of each query's keys, and one that
// leaves the first queries no key at all (lse −∞, output 0).
func attentionShapes() []attentionCase {
	return []attentionCase{
		{"causal GQA", tensor.AttentionShape{B: 2, Tq: 37, Tk: 37, NH: 4, NKV: 2, HD: 32, Causal: true}, nil},
		{"full", tensor.AttentionShape{B: 1, Tq: 20, Tk: 29, NH: 2, NKV: 2, HD: 64}, nil},
		{"key block", tensor.AttentionShape{B: 1, Tq: 16, Tk: 24, NH: 2, NKV: 1, HD: 32, QOff: 24, KOff: 20, Causal: true}, nil},
		{"unseen rows", tensor.AttentionShape{B: 1, Tq: 16, Tk: 8, NH: 2, NKV: 2, HD: 32, QOff: 0, KOff: 10, Causal: true}, nil},
		// Block masks over more than one of the kernels' key tiles, so that
		// whole tiles are skipped: chunked attention, documents, both on a
		// context-parallel key block, and a block no query of which sees a key.
		{"chunked", tensor.AttentionShape{B: 2, Tq: 100, Tk: 100, NH: 4, NKV: 2, HD: 32, Causal: true, Chunk: 24}, nil},
		{"documents", tensor.AttentionShape{B: 2, Tq: 90, Tk: 90, NH: 2, NKV: 1, HD: 64, Causal: true}, starts(2, 90, 0, [][]int{{3, 40, 41, 77}, {50}})},
		{"key block, chunked documents", tensor.AttentionShape{B: 2, Tq: 48, Tk: 64, NH: 2, NKV: 2, HD: 32, QOff: 96, KOff: 32, Causal: true, Chunk: 80},
			starts(2, 48, 96, [][]int{{50, 100, 130}, {120}})},
		{"key block unseen", tensor.AttentionShape{B: 1, Tq: 32, Tk: 32, NH: 2, NKV: 2, HD: 32, QOff: 64, KOff: 0, Causal: true, Chunk: 64}, nil},
	}
}

// attention draws q, k, v for s and runs the forward.
func attention(e *env, s tensor.AttentionShape) (out, lse, q, k, v tensor.Buffer) {
	q = e.floats(s.B*s.Tq*s.NH*s.HD, 1)
	k, v = e.floats(s.B*s.Tk*s.NKV*s.HD, 1), e.floats(s.B*s.Tk*s.NKV*s.HD, 1)
	out, lse = e.floats(q.Len(), 1), e.floats(s.B*s.NH*s.Tq, 1)
	e.k.FlashAttention(out, lse, q, k, v, s)
	return out, lse, q, k, v
}

// stepCases are the step's statistics and the optimizers: f64 statistics on
// both sides.
func stepCases() []kcase {
	var cs []kcase
	add := func(c ...kcase) { cs = append(cs, c...) }
	add(variants("LossSum", []string{"accumulate"}, func(on []bool) kcase {
		return kcase{run: func(e *env) bufs {
			t := e.tokens(50, 0, 10)
			t[3], t[17], t[40] = -1, -1, -1
			dst := e.stats([]float64{7.5})
			e.k.LossSum(dst, e.floats(50, 5), e.ints(t), on[0])
			return bufs{dst}
		}}
	})...)
	// More values than one block of the CPU's partial sums (1<<14) and than the
	// GPU's fixed grid of threads.
	add(variants("SumSquares", []string{"accumulate", "bf16"}, func(on []bool) kcase {
		return kcase{run: func(e *env) bufs {
			dst := e.stats([]float64{7.5})
			e.k.SumSquares(dst, on[0], e.weight(70001, 1, on[1]))
			return bufs{dst}
		}}
	})...)
	// A list: three buffers of one allocation lying end to end (which a GPU
	// sums as one span) and one apart.
	add(variants("SumSquares/list", []string{"accumulate", "bf16"}, func(on []bool) kcase {
		return kcase{run: func(e *env) bufs {
			dst := e.stats([]float64{7.5})
			whole := e.weight(30001, 1, on[1])
			e.k.SumSquares(dst, on[0], whole.Slice(0, 100), whole.Slice(100, 20100), whole.Slice(20100, 30001), e.weight(5000, 1, on[1]))
			return bufs{dst}
		}}
	})...)
	nan, inf := math.NaN(), math.Inf(1)
	for _, c := range []struct {
		name           string
		loss, sq, clip float64
	}{{"clipped", 20, 9, 1}, {"not clipped", 20, 9, 10}, {"no clipping", 20, 9, 0}, {"non-finite loss", nan, 9, 1}, {"non-finite norm", 20, inf, 1}} {
		add(kcase{name: "CloseStep/" + c.name, run: func(e *env) bufs {
			st := make([]float64, tensor.NumStats)
			st[tensor.StatLoss], st[tensor.StatTokens], st[tensor.StatSumSq], st[tensor.StatExpertSumSq], st[tensor.StatOptSteps] = c.loss, 10, c.sq, 7, 3
			b := e.stats(st)
			e.k.CloseStep(b, c.clip)
			return bufs{b}
		}})
	}
	// Loads of 8 experts whose mean (4) some equal: those biases stay. The
	// biases of experts 2..6 (a shard's).
	add(kcase{name: "ExpertBiasUpdate", run: func(e *env) bufs {
		bias, load := e.floats(5, 0.1), e.vals([]float64{3, 5, 4, 4, 6, 2, 4, 4})
		e.k.ExpertBiasUpdate(bias, load, 8, 2, 1e-3)
		return bufs{bias, load}
	}})
	add(kcase{name: "Axpy", run: func(e *env) bufs {
		dst := e.stats([]float64{1, 2, 3, 4, 5})
		e.k.Axpy(dst, e.stats([]float64{0.5, -1, 2, 1e-3, 7}), -0.25)
		return bufs{dst}
	}})
	// applied is a closed step's statistics: applied or not, clipped by 0.5, at
	// optimizer step 3.
	applied := func(e *env, skip bool) tensor.Buffer {
		st := make([]float64, tensor.NumStats)
		st[tensor.StatClip], st[tensor.StatApplied], st[tensor.StatOptSteps] = 0.5, 1, 3
		if skip {
			st[tensor.StatApplied] = 0
		}
		return e.stats(st)
	}
	// compute is n values of a bf16 compute copy (drawn, so that a step not
	// applied is seen to leave them), or the empty Buffer.
	compute := func(e *env, on bool, n int) tensor.Buffer {
		if !on {
			return tensor.Buffer{}
		}
		c := e.m.Alloc(tensor.BFloat16, n)
		e.m.Write(c, e.draw(n, 1))
		return c
	}
	// The optimizers read the gradients clipped (by 0.5 here) and, with a
	// compute copy, write the updated weights rounded to bf16 (to within
	// bf16's rounding of the reference's float64 weights).
	add(variants("AdamW", []string{"not applied", "bf16 copy", "bf16 gradients"}, func(on []bool) kcase {
		return kcase{tol: tolIf(on[1]), run: func(e *env) bufs {
			const n = 1003 // not a multiple of a vector's width
			p, g, m := e.floats(n, 1), e.weight(n, 1, on[2]), e.floats(n, 0.1)
			vs := e.draw(n, 0.01)
			for i := range vs {
				vs[i] = math.Abs(vs[i])
			}
			v := e.vals(vs)
			c := compute(e, on[1], n)
			e.k.AdamW(p, c, g, m, v, 1e-2, 0.9, 0.95, 1e-8, 0.1, applied(e, on[0]))
			if on[1] {
				return bufs{p, m, v, c}
			}
			return bufs{p, m, v}
		}}
	})...)
	add(variants("SGD", []string{"not applied", "bf16 copy", "bf16 gradients"}, func(on []bool) kcase {
		return kcase{tol: tolIf(on[1]), run: func(e *env) bufs {
			p, g, b := e.floats(1003, 1), e.weight(1003, 1, on[2]), e.floats(1003, 1)
			c := compute(e, on[1], 1003)
			e.k.SGD(p, c, g, b, 1e-2, 0.9, 0.1, applied(e, on[0]))
			if on[1] {
				return bufs{p, b, c}
			}
			return bufs{p, b}
		}}
	})...)
	return cs
}
