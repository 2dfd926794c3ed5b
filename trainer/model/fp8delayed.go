package model

import (
	"fmt"

	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
)

// Delayed scaling (FP8.Delayed; docs/engine.md, "FP8"), as Transformer
// Engine's DelayedScaling recipe: every FP8 tensor of every FP8 layer has its
// own scale and amax history (tensor.DelayedScaling). A cast quantises with
// the scale the earlier steps' amaxes gave and records its tensor's amax in
// the step's slot (Amax accumulating: a maximum over the step's
// micro-batches, and over backward's re-quantisation of what forward
// quantised, the same tensor again). Once per optimizer step (FP8Step) the
// ranks' slots are reduced with a maximum (one all-gather of the step's
// amaxes, then the kernel's maximum over the ranks' rows), the histories roll
// and the scales are recomputed (Kernels.FP8DelayedScale), all on the
// backend: nothing is read back in a step. The scales start at 1 with an
// empty history, as Transformer Engine's (its scale buffers start at ones),
// so the first step quantises at scale 1 and the second with the first's
// amaxes.
//
// The tensors: each product's weight (q, k, v, the attention output's o and a
// dense layer's w1, w3, w2) and output gradient, and each product input: the
// attention's normed input (q, k and v read it, and quantise it once), the
// attention output (o's), the MLP's normed input (w1's and w3's) and w2's
// SwiGLU output; with FP8.Router an MoE layer's router weight and output
// gradient, and its input, the MLP's normed input. Products that read one
// input share its scale: their
// histories would hold the same amaxes step for step (Transformer Engine's
// fused QKV and gated fc1 products have one input scale too). An MoE layer's
// attention has the first two inputs, four weights and four gradients (its
// router one more of each).
//
// Only training passes record (ForwardBackward, Backward): Forward alone
// (evaluation, sampling) quantises at the scales and leaves the state as it
// is, so that evaluating (on one rank or all) does not change training.

// Delayed is delayed scaling's settings (precision.fp8's amax_history_len,
// amax_compute_algo, margin) and the ranks whose amaxes a step reduces.
type Delayed struct {
	// History is the steps each amax history holds (1 to
	// tensor.MaxAmaxHistory).
	History int
	Algo    tensor.AmaxAlgo
	// Margin: scales map the amax onto the format's largest value·2^−Margin.
	Margin int
	// Ranks and Comm: the data-parallel ranks that reduce their step's
	// amaxes with a maximum, so that they all keep one state; Comm is unused
	// (may be nil) for one rank.
	Ranks int
	Comm  Gatherer
}

// Gatherer all-gathers f32 buffers (collective.Group's AllGather).
type Gatherer interface {
	AllGather(dst, src tensor.Buffer) error
}

// product names a layer's linear product.
type product uint8

const (
	pQ product = iota
	pK
	pV
	pO
	pW1
	pW3
	pW2
	pRouter // an MoE layer's router (FP8.Router)
	numProducts
)

// inputOf is the input a product reads (stash.go's inLn1..inSw).
func inputOf(p product) int {
	switch p {
	case pQ, pK, pV:
		return inLn1
	case pO:
		return inAtty
	case pW1, pW3, pRouter:
		return inLn2
	}
	return inSw
}

// delayedState is the delayed-scaling state and buffers.
type delayedState struct {
	d Delayed
	// fwd and n: columns 0..fwd−1 are E4M3 tensors (inputs and weights),
	// fwd..n−1 output gradients (FP8.Grad).
	fwd, n int
	// x, w and g are each FP8 layer's columns (by l−First) of its inputs,
	// weights and output gradients; −1 where the layer has none.
	x [][numInputs]int
	w [][numProducts]int
	g [][numProducts]int
	// cur (f64, n) is the step's amaxes as the casts record them; mine (f32,
	// n) the same rounded to f32 (exact) for the all-gather; all (f32, Ranks
	// rows of n) every rank's (mine itself for one rank); hist (f32,
	// History rows of n) the histories, row j the amaxes of j steps ago (row
	// 0 zero between steps); scales (f32, n) what the casts quantise with.
	cur, mine, all, hist, scales tensor.Buffer
	// record: the pass running is a training pass (its casts record).
	record bool
}

// checkDelayed checks the delayed settings before anything is made.
func checkDelayed(d Delayed) error {
	if d.History < 1 || d.History > tensor.MaxAmaxHistory {
		return fmt.Errorf("model: FP8 amax history of %d steps: want 1 to %d", d.History, tensor.MaxAmaxHistory)
	}
	if d.Algo > tensor.AmaxMostRecent || d.Margin < 0 || d.Margin > tensor.MaxScaleMargin {
		return fmt.Errorf("model: FP8 delayed scaling by %v with margin %d: want max or most_recent, a margin of 0 to %d", d.Algo, d.Margin, tensor.MaxScaleMargin)
	}
	if d.Ranks < 1 || (d.Ranks > 1 && d.Comm == nil) {
		return fmt.Errorf("model: FP8 delayed scaling over %d ranks without their group", d.Ranks)
	}
	return nil
}

// allocDelayed lays out the columns and makes the state: histories zero,
// scales 1.
func (m *Model[F]) allocDelayed() {
	p := m.fp8
	f := p.f
	s := &delayedState{d: *f.Delayed}
	s.fwd, s.n = parallel.DelayedFP8Tensors(m.Cfg, f.First, f.Last, f.Router) // the plan's count; the layout below follows it
	L := f.Last - f.First
	s.x, s.w, s.g = make([][numInputs]int, L), make([][numProducts]int, L), make([][numProducts]int, L)
	fc, gc := 0, s.fwd
	for i := range L {
		ps := []product{pQ, pK, pV, pO, pW1, pW3, pW2}
		if m.Cfg.IsMoELayer(f.First + i) {
			ps = ps[:pW1] // attention, and the router in FP8
			if f.Router {
				ps = append(ps, pRouter)
			}
		}
		for j := range numInputs {
			s.x[i][j] = -1
		}
		for q := range numProducts {
			s.w[i][q], s.g[i][q] = -1, -1
		}
		for _, q := range ps {
			if in := inputOf(q); s.x[i][in] < 0 {
				s.x[i][in], fc = fc, fc+1
			}
		}
		for _, q := range ps {
			s.w[i][q], fc = fc, fc+1
			s.g[i][q], gc = gc, gc+1
		}
	}
	s.cur, s.mine = m.mem.Alloc(tensor.Float64, s.n), m.mem.Alloc(tensor.Float32, s.n)
	s.all = s.mine
	if s.d.Ranks > 1 {
		s.all = m.mem.Alloc(tensor.Float32, s.d.Ranks*s.n)
	}
	s.hist, s.scales = m.mem.Alloc(tensor.Float32, s.d.History*s.n), m.mem.Alloc(tensor.Float32, s.n)
	m.mem.Zero(s.cur)
	m.mem.Zero(s.hist)
	m.mem.Fill(s.scales, 1)
	p.dl = s
}

// delayedBuffers are the delayed-scaling buffers (ScratchBytes counts them).
func (s *delayedState) buffers() []tensor.Buffer {
	b := []tensor.Buffer{s.cur, s.mine, s.hist, s.scales}
	if s.d.Ranks > 1 {
		b = append(b, s.all)
	}
	return b
}

// delayedQuantize sets the first x.Len() codes of dst to x at column col's
// scale and inv[0] to its inverse, recording x's amax in the step's slot in
// a training pass.
func (m *Model[F]) delayedQuantize(dst, inv, x tensor.Buffer, col int) tensor.Buffer {
	s := m.fp8.dl
	q := dst.Slice(0, x.Len())
	if s.record {
		m.be.Amax(s.cur.Slice(col, col+1), x, true)
	}
	m.be.Quantize(q, inv, x, s.scales.Slice(col, col+1))
	return q
}

// recordFP8 marks the passes that follow as training passes (on) or not.
func (m *Model[F]) recordFP8(on bool) {
	if m.fp8 != nil && m.fp8.dl != nil {
		m.fp8.dl.record = on
	}
}

// FP8Step ends an optimizer step of delayed scaling: every rank's amaxes of
// the step (the training passes since the last FP8Step) reduced with a
// maximum, the histories rolled and the scales recomputed, on the backend.
// Every rank of the group calls it after each optimizer step, skipped ones
// too (Transformer Engine updates its scales whatever the optimizer does;
// a non-finite amax leaves the scale as it was). Nothing without delayed
// scaling.
func (m *Model[F]) FP8Step() error {
	if m.fp8 == nil || m.fp8.dl == nil {
		return nil
	}
	s := m.fp8.dl
	m.mem.Copy(s.mine, s.cur)
	if s.d.Ranks > 1 {
		if err := s.d.Comm.AllGather(s.all, s.mine); err != nil {
			return fmt.Errorf("model: gathering the FP8 amaxes: %w", err)
		}
	}
	sh := tensor.DelayedShape{Steps: s.d.History, Ranks: s.d.Ranks, Stride: s.n, Algo: s.d.Algo, Margin: s.d.Margin}
	m.be.FP8DelayedScale(s.scales.Slice(0, s.fwd), s.hist, s.all, tensor.E4M3, sh)
	if s.fwd < s.n {
		end := s.hist.Len()
		m.be.FP8DelayedScale(s.scales.Slice(s.fwd, s.n), s.hist.Slice(s.fwd, end), s.all.Slice(s.fwd, s.all.Len()), m.fp8.f.Grad, sh)
	}
	m.mem.Zero(s.cur)
	return m.mem.Err()
}

// FP8Scaling is the delayed-scaling state a checkpoint keeps: the scales (n
// f32 values, n the tensors) and the histories (History rows of n, row j
// the amaxes of j steps ago), in the model's memory; the empty Buffers
// without delayed scaling. Between steps (after FP8Step) that is the whole
// state: the step's amaxes are zero, as is the histories' row 0. Every rank
// holds the same.
func (m *Model[F]) FP8Scaling() (scales, history tensor.Buffer) {
	if m.fp8 == nil || m.fp8.dl == nil {
		return tensor.Buffer{}, tensor.Buffer{}
	}
	return m.fp8.dl.scales, m.fp8.dl.hist
}
