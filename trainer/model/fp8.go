package model

import (
	"fmt"

	"github.com/shardline/shardline/tensor"
)

// FP8 compute of the dense layers' linear products (WithFP8; docs/engine.md,
// "FP8"). In a layer that computes in FP8 each of q, k, v, o and the MLP's
// w1, w3, w2 quantises its input and its weight to E4M3 under per-tensor
// current scaling (Amax, FP8Scale, Quantize: the scale maps the tensor's own
// amax onto the format's largest value, computed on the backend, nothing read
// back), or at its tensor's delayed scale (FP8.Delayed: fp8delayed.go), and
// multiplies the codes with their scale inverses (Matmul's FP8
// operands); its backward quantises the output gradient too (E5M2 in the
// hybrid format, E4M3 in e4m3) for the input-gradient and weight-gradient
// products, which then read the FP8 input and weight.
//
// Buffers: one FP8 copy of a product's input, one of its weight and one of
// its output gradient serve every product of every layer in turn (each is
// sized for the largest it takes), with their scale inverses and one amax and
// scale slot: the products run one after another on the model's stream, and
// backward quantises again what forward quantised (the input from what the
// layer keeps for its backward, the weight from the compute weight), which
// gives the same codes, since current scaling is a function of the tensor
// alone. So the FP8 copies are remade, not kept, under every recompute mode,
// and a layer's products read the same bits under none and selective
// recompute (full recompute's products read the fp32 work set where the
// others read bf16 stores: its codes are rounded from those values). The
// plan counts these buffers in scratch (parallel/memory.go).
//
// What stays as it was (bf16 products, or fp32 without precision.bf16): the
// embedding, the output head, the norms, attention, an MoE layer's router
// (unless FP8.Router), its experts (routed and shared) unless FP8.Experts
// (fp8experts.go), and the layers outside First..Last−1.

// FP8 is the model's FP8 compute (WithFP8).
type FP8 struct {
	// Grad is the format of the output gradients the backward quantises:
	// tensor.E5M2 (the hybrid format) or tensor.E4M3.
	Grad tensor.FP8Format
	// First and Last bound the layers that compute in FP8: First..Last−1
	// (the recipe's first and last layers kept in bf16 lie outside).
	First, Last int
	// Delayed, when set, scales every tensor by delayed scaling
	// (fp8delayed.go) instead of current scaling.
	Delayed *Delayed
	// BF16Wgrad computes the weight-gradient products apart, from the
	// unquantised input (a bf16 run's store or activation) and output
	// gradient, as bf16 products do, while the input-gradient products
	// read FP8 codes (precision.fp8.wgrad = false, Megatron's
	// --no-fp8-wgrad). Backward then quantises no product input.
	BF16Wgrad bool
	// Router computes an MoE layer's router product in FP8 too (its input
	// the MLP's normed input, E4M3 like the others; precision.fp8.router_bf16
	// = false).
	Router bool
	// Experts computes the MoE layers' expert products (routed and shared)
	// in FP8 too (fp8experts.go), under current scaling.
	Experts bool
}

// WithFP8 computes the linear products of layers f.First..f.Last−1 in FP8
// (see fp8.go): float32 in training, float64 in the gradient checks (whose
// products read the dequantised values in float64). Under tensor or context
// parallelism each rank scales the operands it holds by their own amax (a
// shard of a weight, its heads' or ffn columns' gradients, its tokens'
// rows) under current scaling, with no amax reduced over the group: each
// rank's product (a row-parallel product's partial sums included) carries
// its own operands' scale inverses. A column-parallel product's input is the
// gathered normed rows, the same on every tp rank, so its scale is too.
// Under delayed scaling the step's amaxes are reduced over the ranks
// Delayed.Comm joins.
func WithFP8(f FP8) Option { return func(o *options) { o.fp8 = &f } }

// fp8State is the FP8 buffers of the model's memory (see above).
type fp8State struct {
	f FP8
	// x, w and d are the codes of a product's input (E4M3), weight (E4M3)
	// and output gradient (f.Grad); inv their scale inverses (f32, one each:
	// inv[0] x's, inv[1] w's, inv[2] d's) beside the scale Quantize reads
	// (inv[3]), then one per local expert's weight with FP8 experts (inv[4:],
	// fp8experts.go), in one buffer; amax is the f64 slot Amax writes.
	x, w, d   tensor.Buffer
	inv, amax tensor.Buffer
	// dl is delayed scaling's state (nil under current scaling, which
	// then uses inv[3] and amax; delayed scaling has neither).
	dl *delayedState
	// backward: a backward pass is running (under BF16Wgrad its products'
	// inputs stay unquantised).
	backward bool
}

func (p *fp8State) xInv() tensor.Buffer  { return p.inv.Slice(0, 1) }
func (p *fp8State) wInv() tensor.Buffer  { return p.inv.Slice(1, 2) }
func (p *fp8State) dInv() tensor.Buffer  { return p.inv.Slice(2, 3) }
func (p *fp8State) scale() tensor.Buffer { return p.inv.Slice(3, 4) }

// setupFP8 checks f against the model (options o) before its buffers are
// made.
func (m *Model[F]) setupFP8(f FP8, o options) error {
	if f.Grad > tensor.E5M2 {
		return fmt.Errorf("model: FP8 output gradients in %v: want e4m3 or e5m2", f.Grad)
	}
	if f.First < 0 || f.Last > m.Cfg.Layers || f.First > f.Last {
		return fmt.Errorf("model: FP8 layers %d..%d of a model of %d layers", f.First, f.Last-1, m.Cfg.Layers)
	}
	if f.Delayed != nil {
		if err := checkDelayed(*f.Delayed); err != nil {
			return err
		}
		if f.Experts && m.Cfg.MoE.NumExperts > 0 {
			return fmt.Errorf("model: FP8 experts under delayed scaling are not built: their weights scale per expert under current scaling")
		}
		d := *f.Delayed
		f.Delayed = &d
	}
	m.fp8 = &fp8State{f: f}
	return nil
}

// fp8Backward marks a backward pass as running (on) or not.
func (m *Model[F]) fp8Backward(on bool) {
	if m.fp8 != nil {
		m.fp8.backward = on
	}
}

// fp8Router reports whether layer l's router computes its product in FP8.
func (m *Model[F]) fp8Router(l int) bool { return m.fp8On(l) && m.fp8.f.Router }

// fp8On reports whether layer l computes its linear products in FP8.
func (m *Model[F]) fp8On(l int) bool {
	return m.fp8 != nil && l >= m.fp8.f.First && l < m.fp8.f.Last
}

// allocFP8 makes the FP8 buffers, each sized for the largest tensor it takes
// in the layers that compute in FP8 (none when no layer does).
func (m *Model[F]) allocFP8() {
	p := m.fp8
	if p == nil {
		return
	}
	BT, C, NH, NKV, HD, FF, _ := m.dims()
	var x, w, d int
	for l := p.f.First; l < p.f.Last; l++ {
		x = max(x, BT*C, BT*NH*HD)
		w = max(w, NH*HD*C, NKV*HD*C)
		d = max(d, BT*C, BT*NH*HD, BT*NKV*HD)
		if !m.Cfg.IsMoELayer(l) {
			x, w, d = max(x, BT*FF), max(w, FF*C), max(d, BT*FF)
		} else if p.f.Router {
			E := m.Cfg.MoE.NumExperts
			w, d = max(w, E*C), max(d, BT*E)
		}
		x, w, d = m.fp8ExpertSizes(l, x, w, d)
	}
	if x == 0 {
		m.fp8 = nil // no layer computes in FP8: nothing to hold
		return
	}
	p.x, p.w = m.mem.Alloc(tensor.Float8E4M3, x), m.mem.Alloc(tensor.Float8E4M3, w)
	dt := tensor.Float8E4M3
	if p.f.Grad == tensor.E5M2 {
		dt = tensor.Float8E5M2
	}
	p.d = m.mem.Alloc(dt, d)
	if p.f.Delayed != nil {
		p.inv = m.mem.Alloc(tensor.Float32, 3)
		m.allocDelayed()
		return
	}
	p.inv, p.amax = m.mem.Alloc(tensor.Float32, 4+m.fp8ExpertScales()), m.mem.Alloc(tensor.Float64, 1)
}

// fp8Buffers are the FP8 buffers (ScratchBytes counts them).
func (m *Model[F]) fp8Buffers() []tensor.Buffer {
	if p := m.fp8; p != nil && p.dl != nil {
		return append([]tensor.Buffer{p.x, p.w, p.d, p.inv}, p.dl.buffers()...)
	} else if p != nil {
		return []tensor.Buffer{p.x, p.w, p.d, p.inv, p.amax}
	}
	return nil
}

// quantize sets the first x.Len() codes of dst (FP8, of format f) to x under
// current scaling and inv[0] to their scale inverse, on the backend: Amax,
// FP8Scale, Quantize; under delayed scaling at the scale of x's column col
// (delayedQuantize). It returns those codes.
func (m *Model[F]) quantize(dst, inv, x tensor.Buffer, f tensor.FP8Format, col int) tensor.Buffer {
	p := m.fp8
	if p.dl != nil {
		return m.delayedQuantize(dst, inv, x, col)
	}
	q := dst.Slice(0, x.Len())
	m.be.Amax(p.amax, x, false)
	m.be.FP8Scale(p.scale(), p.amax, f, 0)
	m.be.Quantize(q, inv, x, p.scale())
	return q
}

// fp8Input is what layer l's products read for their input x (which, one
// of inLn1..inSw): x's E4M3 codes (in the shared input copy) where the layer
// computes in FP8, x itself elsewhere.
//
// Under BF16Wgrad a backward pass leaves x as it is, for the weight
// gradient's bf16 product (a product that reads x there, a recomputed one,
// quantises it itself: matmul); delayed scaling still records x's amax, as
// the re-quantisation would.
func (m *Model[F]) fp8Input(l, which int, x tensor.Buffer) tensor.Buffer {
	if !m.fp8On(l) {
		return x
	}
	p := m.fp8
	if p.f.BF16Wgrad && p.backward {
		if p.dl != nil && p.dl.record {
			col := m.fp8Col(l, 'x', which)
			m.be.Amax(p.dl.cur.Slice(col, col+1), x, true)
		}
		return x
	}
	return m.quantize(p.x, p.xInv(), x, tensor.E4M3, m.fp8Col(l, 'x', which))
}

// fp8Col is delayed scaling's column of layer l's input which ('x'), or of
// product which's weight ('w') or output gradient ('g'); 0 under current
// scaling, which has none.
func (m *Model[F]) fp8Col(l int, role byte, which int) int {
	s := m.fp8.dl
	if s == nil {
		return 0
	}
	i := l - m.fp8.f.First
	switch role {
	case 'x':
		return s.x[i][which]
	case 'w':
		return s.w[i][which]
	}
	return s.g[i][which]
}

// matmul is layer l's product pr, out = x·wᵀ (+= with accumulate), x from
// fp8Input: in FP8 the weight is quantised to E4M3 first and the product
// reads both operands' codes with their scale inverses. An x that is not
// codes (the router's input, or one a BF16Wgrad backward left as it was) is
// quantised here, at its input's scale.
func (m *Model[F]) matmul(l int, pr product, out, x, w tensor.Buffer, s tensor.MatmulShape, accumulate bool) {
	if m.fp8On(l) {
		p := m.fp8
		if _, codes := x.DType().FP8(); !codes { // an input backward left as it was (BF16Wgrad)
			x = m.quantize(p.x, p.xInv(), x, tensor.E4M3, m.fp8Col(l, 'x', inputOf(pr)))
		}
		var winv tensor.Buffer
		w, winv = m.fp8Weight(l, pr, w) // fp8param.go
		s.Scales = tensor.MatmulScales{Inp: p.xInv(), Weight: winv}
	}
	m.be.Matmul(out, x, w, s, accumulate)
}

// matmulBackward is layer l's MatmulBackward of product pr, x from
// fp8Input: in FP8 the weight and the output gradient are quantised first
// (the gradient to the run's gradient format) and both products read codes
// (an x that is not codes, the router's, quantised here). Under BF16Wgrad
// the input gradient reads the codes alone and the weight gradient is a
// product apart of x and dout as they are.
func (m *Model[F]) matmulBackward(l int, pr product, dinp, dweight, dout, x, w tensor.Buffer, s tensor.MatmulShape, accumulate bool) {
	if m.fp8On(l) {
		p := m.fp8
		if _, codes := x.DType().FP8(); !codes && !p.f.BF16Wgrad { // an input no fp8Input quantised (the router's)
			x = m.quantize(p.x, p.xInv(), x, tensor.E4M3, m.fp8Col(l, 'x', inputOf(pr)))
		}
		wq, winv := m.fp8Weight(l, pr, w) // fp8param.go
		dq := m.quantize(p.d, p.dInv(), dout, p.f.Grad, m.fp8Col(l, 'g', int(pr)))
		if p.f.BF16Wgrad {
			// The input gradient from the codes, the weight gradient from
			// x and dout as they are (x unquantised: fp8Input).
			if dinp.Len() > 0 {
				m.be.MatmulBackward(dinp, tensor.Buffer{}, dq, tensor.Buffer{}, wq, tensor.MatmulShape{BT: s.BT, C: s.C, OC: s.OC,
					Scales: tensor.MatmulScales{Weight: winv, Dout: p.dInv()}}, accumulate)
			}
			// (An FP8 compute weight, param_gather's, goes unread here but
			// carries its scale inverse, as every FP8 operand does.)
			ws := tensor.MatmulShape{BT: s.BT, C: s.C, OC: s.OC}
			if _, codes := w.DType().FP8(); codes {
				ws.Scales.Weight = winv
			}
			m.be.MatmulBackward(tensor.Buffer{}, dweight, dout, x, w, ws, false)
			return
		}
		w, dout = wq, dq
		s.Scales = tensor.MatmulScales{Inp: p.xInv(), Weight: winv, Dout: p.dInv()}
	}
	m.be.MatmulBackward(dinp, dweight, dout, x, w, s, accumulate)
}

// rowProduct is layer l's row-parallel product pr (the attention output's
// projection, the MLP's w2) added into out: rowParallel, or in FP8 one
// accumulating FP8 product, or under tensor parallelism an FP8 product of
// partial sums over all rows whose reduce-scatter adds this rank's rows
// (rowParallel's steps).
func (m *Model[F]) rowProduct(l int, pr product, out, x, w tensor.Buffer, K int) {
	if !m.fp8On(l) {
		m.rowParallel(out, x, w, K)
		return
	}
	s := tensor.MatmulShape{BT: m.B * m.T, C: K, OC: m.Cfg.Hidden}
	if m.tp == nil {
		m.matmul(l, pr, out, x, w, s, true)
		return
	}
	m.matmul(l, pr, m.tp.px, x, w, s, false)
	m.addRows(out)
}
