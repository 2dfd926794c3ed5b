package model

import "github.com/shardline/shardline/tensor"

// FP8 compute of the MoE layers' experts (FP8.Experts; docs/engine.md,
// "FP8"). In a layer of First..Last−1 that is an MoE layer, the routed
// experts' grouped products (ExpertsMatmul, ExpertsMatmulBackward) and the
// shared experts' products read FP8 operands as the dense layers' do
// (fp8.go): inputs and weights in E4M3, output gradients in the run's
// gradient format (E5M2 in the hybrid format), each under per-tensor
// current scaling, remade in backward, never kept.
//
// Scaling granularity: the grouped input (the permuted token copies of every
// local expert, or under expert parallelism the received ones) is one
// tensor with one scale, and so is the grouped output gradient; each routed
// expert's weight has a scale of its own (tensor.ExpertsShape.Scales.Weight,
// one scale inverse per expert), as Transformer Engine's GroupedLinear keeps
// one FP8 meta per GEMM: one scale over all the experts' weights would let
// the expert with the largest weights set every expert's step, and an
// expert whose weights are small would lose its low bits to the format's
// underflow. A shared expert is a dense product: one scale per operand.
//
// Buffers: the dense products' FP8 copies (fp8State's x, w and d) serve the
// experts' products too, in turn on the model's stream, sized for the
// largest they take (the permuted rows' inputs and gradients, at the widths
// C and the expert ffn, and every local expert's weight side by side in w);
// the experts' weights' scale inverses follow the dense ones in fp8State's
// inv (inv[4:], one per local expert). Under dropless expert parallelism the
// rows a rank receives can pass the balanced share the buffers start at:
// the FP8 copies grow with the exchange buffers (growFP8Experts), as the
// plan's worst case counts (parallel/memory.go, fp8Bytes).
//
// Packed layouts that drop copies past capacity leave rows past the kept
// copies (Offsets[E]) unwritten, holding whatever an earlier layer or step
// left there, and the host does not know where the kept rows end (nothing
// is read back): those rows are cleared before they are written
// (clearDropped), so that the grouped tensors' amaxes are those of the kept
// rows (zeros change no amax) and a scale never depends on stale values.

// fp8ExpertsOn reports whether layer l's experts compute in FP8.
func (m *Model[F]) fp8ExpertsOn(l int) bool {
	return m.fp8On(l) && m.fp8.f.Experts && m.Cfg.IsMoELayer(l)
}

// fp8ExpertSizes raises the FP8 copies' sizes x, w and d (fp8State's) to what
// layer l's experts take when they compute in FP8.
func (m *Model[F]) fp8ExpertSizes(l, x, w, d int) (int, int, int) {
	if !m.fp8.f.Experts || !m.Cfg.IsMoELayer(l) {
		return x, w, d
	}
	c := m.Cfg
	C, EF := c.Hidden, c.MoE.ExpertFFNHidden
	R := moeShape(c, m.rows(), m.ep.Size).Rows() // the permuted rows, and the received ones the buffers start at
	El := c.MoE.NumExperts / m.ep.Size
	x, w, d = max(x, R*C, R*EF), max(w, El*EF*C), max(d, R*C, R*EF)
	if c.MoE.SharedExperts > 0 {
		// The shared experts see all of the rank's rows (gathered under
		// tensor parallelism) and, split like the MLP, their ffn share.
		rows, SF := m.B*m.T, EF/m.tpSize()
		x, w, d = max(x, rows*C, rows*SF), max(w, SF*C), max(d, rows*C, rows*SF)
	}
	return x, w, d
}

// fp8ExpertScales is the experts' weights' scale inverses fp8State's inv
// holds after the dense ones: one per local expert when any layer's experts
// compute in FP8, none otherwise.
func (m *Model[F]) fp8ExpertScales() int {
	for l := m.fp8.f.First; l < m.fp8.f.Last; l++ {
		if m.fp8.f.Experts && m.Cfg.IsMoELayer(l) {
			return m.Cfg.MoE.NumExperts / m.ep.Size
		}
	}
	return 0
}

// expertsWInv is the local experts' weights' scale inverses (n of them).
func (p *fp8State) expertsWInv(n int) tensor.Buffer { return p.inv.Slice(4, 4+n) }

// growFP8Experts makes the FP8 input and gradient copies hold rows permuted
// rows at the experts' widths (growExchange's rows), growing them, rarely,
// past the balanced share they start at.
func (m *Model[F]) growFP8Experts(rows int) {
	p := m.fp8
	if p == nil || p.inv.Len() == 4 {
		return // no layer's experts compute in FP8
	}
	n := rows * max(m.Cfg.Hidden, m.Cfg.MoE.ExpertFFNHidden)
	for _, b := range []*tensor.Buffer{&p.x, &p.d} {
		if b.Len() < n {
			dt := b.DType()
			m.mem.Free(*b)
			*b = m.mem.Alloc(dt, n)
		}
	}
}

// clearDropped zeroes b, a buffer of layer l's permuted rows about to be
// written over the kept copies' rows only, when the layer's experts compute
// in FP8 and its packed layout can drop copies (see above).
func (m *Model[F]) clearDropped(l int, b tensor.Buffer) {
	if !m.fp8ExpertsOn(l) {
		return
	}
	if s := moeShape(m.Cfg, m.rows(), m.ep.Size); !s.Padded && s.Capacity < s.BT*s.K {
		m.mem.Zero(b)
	}
}

// expertsInput is what layer l's grouped products read for their input x
// (the permuted rows they span): its E4M3 codes under one scale where the
// experts compute in FP8, x itself elsewhere.
func (m *Model[F]) expertsInput(l int, x tensor.Buffer) tensor.Buffer {
	if !m.fp8ExpertsOn(l) {
		return x
	}
	return m.quantize(m.fp8.x, m.fp8.xInv(), x, tensor.E4M3, 0)
}

// expertsFP8Weights quantises each expert's weight of w to E4M3 under its
// own scale, into its slice of the FP8 weight copy and its scale inverse
// (expertsWInv), and returns the codes' views (in the model's scratch list)
// and the scale inverses.
func (m *Model[F]) expertsFP8Weights(w []tensor.Buffer) ([]tensor.Buffer, tensor.Buffer) {
	p := m.fp8
	inv := p.expertsWInv(len(w))
	q := m.scratch.expertQ[:0]
	off := 0
	for e, b := range w {
		n := b.Len()
		q = append(q, m.quantize(p.w.Slice(off, off+n), inv.Slice(e, e+1), b, tensor.E4M3, 0))
		off += n
	}
	m.scratch.expertQ = q
	return q, inv
}

// expertsMatmul is layer l's grouped product (ExpertsMatmul), x from
// expertsInput: in FP8 every expert's weight is quantised first and the
// product reads codes with their scale inverses.
func (m *Model[F]) expertsMatmul(l int, out, x tensor.Buffer, w []tensor.Buffer, offsets tensor.Buffer, s tensor.ExpertsShape, accumulate bool) {
	if m.fp8ExpertsOn(l) {
		var inv tensor.Buffer
		w, inv = m.expertsFP8Weights(w)
		s.Scales = tensor.MatmulScales{Inp: m.fp8.xInv(), Weight: inv}
	}
	m.be.ExpertsMatmul(out, x, w, offsets, s, accumulate)
}

// expertsMatmulBackward is layer l's grouped backward
// (ExpertsMatmulBackward), x from expertsInput: in FP8 the weights and the
// output gradient dout (the rows the products span) are quantised first.
func (m *Model[F]) expertsMatmulBackward(l int, dinp tensor.Buffer, dw []tensor.Buffer, dout, x tensor.Buffer, w []tensor.Buffer, offsets tensor.Buffer, s tensor.ExpertsShape, accumulate bool) {
	if m.fp8ExpertsOn(l) {
		p := m.fp8
		var inv tensor.Buffer
		w, inv = m.expertsFP8Weights(w)
		dout = m.quantize(p.d, p.dInv(), dout, p.f.Grad, 0)
		s.Scales = tensor.MatmulScales{Inp: p.xInv(), Weight: inv, Dout: p.dInv()}
	}
	m.be.ExpertsMatmulBackward(dinp, dw, dout, x, w, offsets, s, accumulate)
}

// sharedInput is what layer l's shared-expert products read for their
// input x: as expertsInput (one scale over the tensor).
func (m *Model[F]) sharedInput(l int, x tensor.Buffer) tensor.Buffer { return m.expertsInput(l, x) }

// sharedMatmul is a shared expert's product of layer l: the dense layers'
// FP8 product (matmul) where the experts compute in FP8.
func (m *Model[F]) sharedMatmul(l int, pr product, out, x, w tensor.Buffer, s tensor.MatmulShape, accumulate bool) {
	if m.fp8ExpertsOn(l) {
		m.matmul(l, pr, out, x, w, s, accumulate)
		return
	}
	m.be.Matmul(out, x, w, s, accumulate)
}

// sharedMatmulBackward is sharedMatmul's backward.
func (m *Model[F]) sharedMatmulBackward(l int, pr product, dinp, dweight, dout, x, w tensor.Buffer, s tensor.MatmulShape, accumulate bool) {
	if m.fp8ExpertsOn(l) {
		m.matmulBackward(l, pr, dinp, dweight, dout, x, w, s, accumulate)
		return
	}
	m.be.MatmulBackward(dinp, dweight, dout, x, w, s, accumulate)
}

// sharedRowProduct adds a shared expert's down projection (of layer l) into
// out: rowParallel, or where the experts compute in FP8 rowProduct's FP8
// product of x's codes.
func (m *Model[F]) sharedRowProduct(l int, out, x, w tensor.Buffer, K int) {
	if m.fp8ExpertsOn(l) {
		m.rowProduct(l, pW2, out, m.sharedInput(l, x), w, K)
		return
	}
	m.rowParallel(out, x, w, K)
}
