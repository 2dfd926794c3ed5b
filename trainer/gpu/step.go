//go:build cuda || cudaemu

package gpu

import (
	"fmt"

	"github.com/shardline/shardline/cuda"
	"github.com/shardline/shardline/trainer/model"
)

// Metrics are what a step leaves on the device, read back together.
type Metrics struct {
	LossSum  float64 // Σ token losses of the last Forward
	GradNorm float64 // global L2 norm of the gradients before clipping
	Clip     float64 // the factor they were scaled by (1: not clipped)
	AuxLoss  float64 // load-balancing loss over MoE layers times aux_loss_coeff, the mean over the step's forwards
	Dropped  int     // routed copies the step's forwards dropped past expert capacity
}

// Forward runs the model on tokens and targets (B·T each, host memory: they are
// uploaded, nothing is read back) and leaves Σ token losses on the device, added
// to the previous Forward's when accumulate is set (micro-batches of a step).
// Targets < 0 are ignored. It returns the number of tokens counted; a token or
// target outside the vocabulary is an error and runs nothing.
func (m *Model) Forward(tokens, targets []int32, accumulate bool) (count int, err error) {
	if count, err = m.forwardLayers(tokens, targets, accumulate); err != nil {
		return 0, err
	}
	d, a, w := m.d, &m.acts, &m.w
	BT, C, _, _, _, _, V := m.dims()
	d.HeadCrossEntropy(a.losses, a.headLse, a.lnf, w.output, m.targets, cuda.HeadShape{BT: BT, C: C, V: V, Chunk: m.opt.HeadChunk}, m.head)
	d.Sum(m.stats.Slice(0, 1), a.losses, accumulate)
	return count, nil
}

// ForwardBackward is Forward then Backward(scale, accumulate) with the output
// head's loss and gradient made in one pass (cuda.HeadCrossEntropyTrain): the
// training step's path.
func (m *Model) ForwardBackward(tokens, targets []int32, scale float64, accumulate bool) (count int, err error) {
	if count, err = m.forwardLayers(tokens, targets, accumulate); err != nil {
		return 0, err
	}
	d, a, w, g, s := m.d, &m.acts, &m.w, &m.g, &m.scratch
	BT, C, _, _, _, _, V := m.dims()
	if !accumulate {
		d.Zero(m.grads)
	}
	d.Fill(s.dloss, float32(scale))
	d.HeadCrossEntropyTrain(a.losses, a.headLse, s.dx, g.output, a.lnf, w.output, m.targets, s.dloss,
		cuda.HeadShape{BT: BT, C: C, V: V, Chunk: m.opt.HeadChunk}, m.head, false)
	d.Sum(m.stats.Slice(0, 1), a.losses, accumulate)
	m.backwardLayers(scale)
	return count, nil
}

// forwardLayers checks and uploads the batch and runs the model up to the final
// norm (acts.lnf).
func (m *Model) forwardLayers(tokens, targets []int32, accumulate bool) (count int, err error) {
	d, a, w := m.d, &m.acts, &m.w
	BT, C, _, _, _, _, V := m.dims()
	if accumulate && m.micro == 0 {
		return 0, fmt.Errorf("gpu: Forward accumulating onto no earlier Forward")
	}
	if len(tokens) != BT || len(targets) != BT {
		return 0, fmt.Errorf("gpu: a batch of %d tokens and %d targets for B·T = %d", len(tokens), len(targets), BT)
	}
	for i, t := range tokens {
		if t < 0 || int(t) >= V || int(targets[i]) >= V {
			return 0, fmt.Errorf("gpu: token %d (target %d) at position %d is outside the vocabulary of %d", t, targets[i], i, V)
		}
	}
	if accumulate { // before the layers: moeForward adds to the statistics from the second on
		m.micro++
	} else {
		m.micro = 1
	}
	d.Upload(m.tokens, tokens)
	doc := m.opt.Documents
	copy(m.hostTargets, targets)
	if doc.MaskLoss {
		for i, t := range tokens {
			if t == doc.EOS {
				m.hostTargets[i] = -1
			}
		}
	}
	d.Upload(m.targets, m.hostTargets)
	if doc.ResetAttention {
		model.DocumentStarts(m.hostStarts, tokens, m.B, m.T, doc.EOS)
		d.Upload(m.starts, m.hostStarts)
	}
	for _, t := range m.hostTargets {
		if t >= 0 {
			count++
		}
	}
	// the embedding's backward sums rows per token: group them here, on the host
	// the tokens come from, and upload the grouping with the batch.
	hr := &m.hostRows
	u := cuda.SortEmbeddingRows(hr.order, hr.seg, hr.tok, hr.count, tokens)
	m.embRows.U = u
	d.Upload(m.embRows.Order, hr.order)
	d.Upload(m.embRows.Seg.Slice(0, u+1), hr.seg[:u+1])
	d.Upload(m.embRows.Tok.Slice(0, u), hr.tok[:u])
	x := a.final
	if m.Cfg.Layers > 0 {
		x = a.resid[0]
	}
	d.Embedding(x, m.tokens, w.embed, BT, C)
	for l := range w.layers {
		next := a.final
		if l+1 < len(w.layers) {
			next = a.resid[l+1]
		}
		m.layerForward(l, x, next)
		x = next
	}
	d.RMSNorm(a.lnf, a.rstdf, a.final, w.norm, BT, C, m.Cfg.NormEps)
	return count, nil
}

// layerForward: next = mid + MLP(norm(mid)), mid = x + attention(norm(x)), as
// trainer/model's layer.
func (m *Model) layerForward(l int, x, next cuda.Buffer) {
	d, a, lw := m.d, &m.acts, m.w.layers[l]
	BT, C, NH, NKV, HD, FF, _ := m.dims()
	d.RMSNorm(a.ln1[l], a.rstd1[l], x, lw.attnNorm, BT, C, m.Cfg.NormEps)
	d.Matmul(a.q[l], a.ln1[l], lw.wq, cuda.MatmulShape{BT: BT, C: C, OC: NH * HD}, false)
	d.Matmul(a.k[l], a.ln1[l], lw.wk, cuda.MatmulShape{BT: BT, C: C, OC: NKV * HD}, false)
	d.Matmul(a.v[l], a.ln1[l], lw.wv, cuda.MatmulShape{BT: BT, C: C, OC: NKV * HD}, false)
	d.Rope(a.q[l], m.cos, m.sin, cuda.RopeShape{B: m.B, T: m.T, NH: NH, HD: HD}, false)
	d.Rope(a.k[l], m.cos, m.sin, cuda.RopeShape{B: m.B, T: m.T, NH: NKV, HD: HD}, false)
	d.FlashAttentionMasked(a.atty[l], a.lse[l], a.q[l], a.k[l], a.v[l], m.starts, m.attn())
	d.Copy(a.mid[l], x)
	d.Matmul(a.mid[l], a.atty[l], lw.wo, cuda.MatmulShape{BT: BT, C: NH * HD, OC: C}, true)
	d.RMSNorm(a.ln2[l], a.rstd2[l], a.mid[l], lw.mlpNorm, BT, C, m.Cfg.NormEps)
	d.Copy(next, a.mid[l])
	if lw.moe != nil {
		m.moeForward(l, next, a.ln2[l], lw.moe, a.moe[l]) // next = mid + MoE
		return
	}
	d.Matmul(a.gate[l], a.ln2[l], lw.w1, cuda.MatmulShape{BT: BT, C: C, OC: FF}, false)
	d.Matmul(a.up[l], a.ln2[l], lw.w3, cuda.MatmulShape{BT: BT, C: C, OC: FF}, false)
	d.SwiGLU(a.sw[l], a.gate[l], a.up[l])
	d.Matmul(next, a.sw[l], lw.w2, cuda.MatmulShape{BT: BT, C: FF, OC: C}, true)
}

// attn is the model's causal self-attention, within chunks of
// model.attention_chunk_size positions where it is set (and within documents:
// m.starts, which the flash calls take).
func (m *Model) attn() cuda.AttentionShape {
	_, _, NH, NKV, HD, _, _ := m.dims()
	return cuda.AttentionShape{B: m.B, Tq: m.T, Tk: m.T, NH: NH, NKV: NKV, HD: HD, Causal: true, Chunk: m.Cfg.AttentionChunkSize}
}

// Backward sets the gradients (fp32) of scale · Σ token losses of the last Forward
// (scale = 1/token count gives the mean), or adds them to the gradients held when
// accumulate is set (micro-batches of a step).
func (m *Model) Backward(scale float64, accumulate bool) {
	d, a, w, g, s := m.d, &m.acts, &m.w, &m.g, &m.scratch
	BT, C, _, _, _, _, V := m.dims()
	if !accumulate {
		d.Zero(m.grads)
	}
	d.Fill(s.dloss, float32(scale))
	d.HeadCrossEntropyBackward(s.dx, g.output, a.lnf, w.output, m.targets, s.dloss, a.headLse,
		cuda.HeadShape{BT: BT, C: C, V: V, Chunk: m.opt.HeadChunk}, m.head, false)
	m.backwardLayers(scale)
}

// backwardLayers runs backward from the final norm (its output's gradient in
// scratch.dx) down to the embedding.
func (m *Model) backwardLayers(scale float64) {
	d, a, w, g, s := m.d, &m.acts, &m.w, &m.g, &m.scratch
	BT, C, NH, NKV, HD, FF, _ := m.dims()
	dres := s.dres
	d.RMSNormBackward(dres, g.norm, s.dx, a.final, w.norm, a.rstdf, BT, C, false)
	for l := len(w.layers) - 1; l >= 0; l-- {
		lw, lg := w.layers[l], g.layers[l]
		if lw.moe != nil {
			// the aux loss of this micro-batch is weighted by its share of the
			// step's tokens (scale·BT), as trainer/model's
			m.moeBackward(l, s.dx, dres, a.ln2[l], lw.moe, lg.moe, a.moe[l], scale*float64(BT))
		} else {
			d.MatmulBackward(s.dsw, lg.w2, dres, a.sw[l], lw.w2, cuda.MatmulShape{BT: BT, C: FF, OC: C}, false)
			d.SwiGLUBackward(s.dff1, s.dff2, s.dsw, a.gate[l], a.up[l], false)
			d.MatmulBackward(s.dx, lg.w1, s.dff1, a.ln2[l], lw.w1, cuda.MatmulShape{BT: BT, C: C, OC: FF}, false)
			d.MatmulBackward(s.dx, lg.w3, s.dff2, a.ln2[l], lw.w3, cuda.MatmulShape{BT: BT, C: C, OC: FF}, true)
		}
		d.RMSNormBackward(dres, lg.mlpNorm, s.dx, a.mid[l], lw.mlpNorm, a.rstd2[l], BT, C, true)
		d.MatmulBackward(s.datty, lg.wo, dres, a.atty[l], lw.wo, cuda.MatmulShape{BT: BT, C: NH * HD, OC: C}, false)
		d.FlashAttentionBackwardMasked(s.dq, s.dk, s.dv, s.datty, a.atty[l], a.lse[l], a.q[l], a.k[l], a.v[l], m.starts, m.attn(), false)
		d.Rope(s.dq, m.cos, m.sin, cuda.RopeShape{B: m.B, T: m.T, NH: NH, HD: HD}, true)
		d.Rope(s.dk, m.cos, m.sin, cuda.RopeShape{B: m.B, T: m.T, NH: NKV, HD: HD}, true)
		d.MatmulBackward(s.dx, lg.wq, s.dq, a.ln1[l], lw.wq, cuda.MatmulShape{BT: BT, C: C, OC: NH * HD}, false)
		d.MatmulBackward(s.dx, lg.wk, s.dk, a.ln1[l], lw.wk, cuda.MatmulShape{BT: BT, C: C, OC: NKV * HD}, true)
		d.MatmulBackward(s.dx, lg.wv, s.dv, a.ln1[l], lw.wv, cuda.MatmulShape{BT: BT, C: C, OC: NKV * HD}, true)
		d.RMSNormBackward(dres, lg.attnNorm, s.dx, a.resid[l], lw.attnNorm, a.rstd1[l], BT, C, true)
	}
	d.EmbeddingBackward(g.embed, dres, m.embRows, C)
}

// Update is ClipNorm and Apply: clip the gradients to o.ClipGrad and take one
// AdamW step at lr.
func (m *Model) Update(lr float64, o Optimizer) {
	m.ClipNorm(o.ClipGrad)
	m.Apply(lr, o)
}

// ClipNorm computes the gradients' global L2 norm and the factor that clips it to
// maxNorm (0: off), both kept on the device for Apply and Metrics.
func (m *Model) ClipNorm(maxNorm float64) {
	sumsq, norm, factor := m.stats.Slice(1, 2), m.stats.Slice(2, 3), m.stats.Slice(3, 4)
	m.d.SumSquares(sumsq, m.grads, false)
	m.d.ClipFactor(factor, norm, sumsq, maxNorm)
}

// Apply takes one AdamW step at learning rate lr with the gradients scaled by
// ClipNorm's factor, writing the fp32 master weights and, in bf16 runs, the bf16
// compute weights in the same pass. Norm gains and embeddings (NoDecay) get no
// weight decay.
func (m *Model) Apply(lr float64, o Optimizer) {
	d := m.d
	m.step++
	factor := m.stats.Slice(3, 4)
	for i := range m.table {
		lo, hi := m.offsets[i], m.offsets[i]+int(m.table[i].LocalNumel())
		wd := o.WeightDecay
		if m.table[i].NoDecay {
			wd = 0
		}
		comp := cuda.Buffer{DType: cuda.BF16}
		if m.opt.Compute == cuda.BF16 {
			comp = m.compute.Slice(lo, hi)
		}
		d.AdamW(m.master.Slice(lo, hi), comp, m.grads.Slice(lo, hi), m.m.Slice(lo, hi), m.v.Slice(lo, hi), factor,
			cuda.AdamWConfig{LR: lr, Beta1: o.Beta1, Beta2: o.Beta2, Eps: o.Eps, WeightDecay: wd, Step: m.step})
	}
}

// Metrics reads the last step's loss sum, gradient norm and clip factor back (one
// synchronisation) and returns the step's device error, if any. A non-finite loss
// or norm is reported as it is: the caller decides.
func (m *Model) Metrics() (Metrics, error) {
	host := m.hostStats
	m.d.Download(host, m.stats)
	if err := m.d.Err(); err != nil {
		return Metrics{}, err
	}
	r := Metrics{LossSum: float64(host[0]), GradNorm: float64(host[2]), Clip: float64(host[3])}
	if m.Cfg.MoE.NumExperts > 0 {
		BT, k := m.B*m.T, m.Cfg.MoE.TopK
		for l := range m.Cfg.Layers {
			if m.Cfg.IsMoELayer(l) {
				r.AuxLoss += float64(host[4+2*l]) * m.Cfg.MoE.AuxLossCoeff / float64(m.micro)
				r.Dropped += m.micro*BT*k - int(host[5+2*l])
			}
		}
	}
	return r, nil
}

// Logits runs the model on tokens (B·T; no loss is counted) and returns the
// logits (V, fp32) at flat position pos, read back: for sampling.
func (m *Model) Logits(tokens []int32, pos int) ([]float32, error) {
	BT, C, _, _, _, _, V := m.dims()
	if pos < 0 || pos >= BT {
		return nil, fmt.Errorf("gpu: position %d outside the batch of %d", pos, BT)
	}
	if m.head.Logits.N < V {
		return nil, fmt.Errorf("gpu: the head's buffer (%d values) is smaller than the vocabulary (%d)", m.head.Logits.N, V)
	}
	ignore := make([]int32, BT)
	for i := range ignore {
		ignore[i] = -1
	}
	if _, err := m.Forward(tokens, ignore, false); err != nil {
		return nil, err
	}
	out := m.head.Logits.Slice(0, V)
	m.d.Matmul(out, m.acts.lnf.Slice(pos*C, (pos+1)*C), m.w.output, cuda.MatmulShape{BT: 1, C: C, OC: V}, false)
	host := make([]float32, V)
	m.d.Download(host, out)
	return host, m.d.Err()
}

// Grads downloads the fp32 gradients, one slice per parameter (table order).
func (m *Model) Grads() [][]float32 { return m.perParam(m.grads) }

// Weights downloads the fp32 master weights, one slice per parameter (table order).
func (m *Model) Weights() [][]float32 { return m.perParam(m.master) }

// State downloads the optimizer's state into main, mom and vel (one fp32 slice
// per parameter, table order, each as long as the parameter): the master
// weights and AdamW's first and second moments, and returns the updates taken
// (the bias corrections' step count): what a checkpoint holds.
func (m *Model) State(main, mom, vel [][]float32) (steps int, err error) {
	for k, b := range []cuda.Buffer{m.master, m.m, m.v} {
		if err := m.download([][][]float32{main, mom, vel}[k], b); err != nil {
			return 0, err
		}
	}
	return m.step, m.d.Err()
}

// ReadWeights downloads the fp32 master weights into dst (one slice per
// parameter, table order, each as long as the parameter).
func (m *Model) ReadWeights(dst [][]float32) error {
	if err := m.download(dst, m.master); err != nil {
		return err
	}
	return m.d.Err()
}

// download reads a flat fp32 buffer's parameters straight into dst's slices
// (no model-sized host copy).
func (m *Model) download(dst [][]float32, b cuda.Buffer) error {
	if len(dst) != len(m.table) {
		return fmt.Errorf("gpu: %d slices for %d parameters", len(dst), len(m.table))
	}
	for i := range m.table {
		n := int(m.table[i].LocalNumel())
		if len(dst[i]) != n {
			return fmt.Errorf("gpu: %s: %d values for %d", m.table[i].Name, len(dst[i]), n)
		}
		m.d.Download(dst[i], b.Slice(m.offsets[i], m.offsets[i]+n))
	}
	return nil
}

// SetState uploads AdamW's moments (table order, as State returns them) and
// the updates taken so far, continuing a run from a checkpoint: its master
// weights came to New.
func (m *Model) SetState(mom, vel [][]float32, steps int) error {
	for k, b := range []cuda.Buffer{m.m, m.v} {
		src := [][][]float32{mom, vel}[k]
		if len(src) != len(m.table) {
			return fmt.Errorf("gpu: %d slices for %d parameters", len(src), len(m.table))
		}
		for i := range m.table {
			if n := int(m.table[i].LocalNumel()); len(src[i]) != n {
				return fmt.Errorf("gpu: %s: %d values for %d", m.table[i].Name, len(src[i]), n)
			}
		}
		for i, v := range src {
			m.d.Upload(b.Slice(m.offsets[i], m.offsets[i]+len(v)), v)
		}
	}
	m.step = steps
	return m.d.Err()
}

// perParam downloads an fp32 flat buffer and splits it by parameter.
func (m *Model) perParam(b cuda.Buffer) [][]float32 {
	host := make([]float32, b.N)
	m.d.Download(host, b)
	out := make([][]float32, len(m.table))
	for i := range m.table {
		out[i] = host[m.offsets[i] : m.offsets[i]+int(m.table[i].LocalNumel())]
	}
	return out
}

// moeForward adds layer l's MoE block for input x (BT,C) into out (BT,C): router,
// top-k, dispatch into padded segments, every expert's SwiGLU as strided batches,
// the gated combination, the shared experts; the aux loss and the copies kept go
// to the layer's statistics slot. Nothing is read back.
func (m *Model) moeForward(l int, out, x cuda.Buffer, p *moeParams, a *moeActs) {
	d, s := m.d, m.moeShape()
	C, EF, R := m.Cfg.Hidden, m.Cfg.MoE.ExpertFFNHidden, s.Rows()
	d.Matmul(a.logits, x, p.router, cuda.MatmulShape{BT: s.BT, C: C, OC: s.E}, false)
	d.Router(a.rt, a.logits, s)
	d.Dispatch(a.x, a.rt, x, s)
	up := cuda.ExpertsShape{E: s.E, Rows: s.Capacity, C: C, OC: EF, WStride: p.stride}
	down := cuda.ExpertsShape{E: s.E, Rows: s.Capacity, C: EF, OC: C, WStride: p.stride}
	d.ExpertsMatmul(a.gate, a.x, p.experts[0], up, false)
	d.ExpertsMatmul(a.up, a.x, p.experts[1], up, false)
	d.SwiGLU(a.sw.Slice(0, R*EF), a.gate.Slice(0, R*EF), a.up.Slice(0, R*EF))
	d.ExpertsMatmul(a.y, a.sw, p.experts[2], down, false)
	d.Combine(out, a.y, a.rt, s)
	for i, w := range p.shared {
		d.Matmul(a.sgate[i], x, w[0], cuda.MatmulShape{BT: s.BT, C: C, OC: EF}, false)
		d.Matmul(a.sup[i], x, w[1], cuda.MatmulShape{BT: s.BT, C: C, OC: EF}, false)
		d.SwiGLU(a.ssw[i], a.sgate[i], a.sup[i])
		d.Matmul(out, a.ssw[i], w[2], cuda.MatmulShape{BT: s.BT, C: EF, OC: C}, true)
	}
	d.AuxLoss(m.stats.Slice(4+2*l, 6+2*l), cuda.Buffer{DType: cuda.F32}, a.rt, s, 0, m.micro > 1)
}

// moeBackward sets dx (BT,C) to the gradient of dout·out + auxScale·aux_loss_coeff·aux
// through the MoE block (the router's and experts' weight gradients accumulate).
func (m *Model) moeBackward(l int, dx, dout, x cuda.Buffer, p, g *moeParams, a *moeActs, auxScale float64) {
	d, s, sc := m.d, m.moeShape(), &m.scratch
	C, EF, R := m.Cfg.Hidden, m.Cfg.MoE.ExpertFFNHidden, s.Rows()
	dy, dxp := sc.moeDy.Slice(0, R*C), sc.moeDx.Slice(0, R*C)
	d.Zero(dy) // rows no copy uses stay zero, so the padded products add nothing
	d.CombineBackward(dy, sc.moeDgates, dout, a.y, a.rt, s)
	daux := cuda.Buffer{DType: cuda.F32}
	if coeff := auxScale * m.Cfg.MoE.AuxLossCoeff; coeff != 0 {
		daux = sc.moeDaux
		d.AuxLoss(sc.moeAux, daux, a.rt, s, coeff, false) // the value went to the statistics in forward
	}
	d.RouterBackward(sc.moeDlogits, sc.moeDgates, daux, a.rt, s)
	d.MatmulBackward(dx, g.router, sc.moeDlogits, x, p.router, cuda.MatmulShape{BT: s.BT, C: C, OC: s.E}, false)
	up := cuda.ExpertsShape{E: s.E, Rows: s.Capacity, C: C, OC: EF, WStride: p.stride}
	down := cuda.ExpertsShape{E: s.E, Rows: s.Capacity, C: EF, OC: C, WStride: p.stride}
	dsw, dg, du := sc.moeDsw.Slice(0, R*EF), sc.moeDg.Slice(0, R*EF), sc.moeDu.Slice(0, R*EF)
	d.ExpertsMatmulBackward(dsw, g.experts[2], dy, a.sw, p.experts[2], down, false)
	d.SwiGLUBackward(dg, du, dsw, a.gate, a.up, false)
	d.ExpertsMatmulBackward(dxp, g.experts[0], dg, a.x, p.experts[0], up, false)
	d.ExpertsMatmulBackward(dxp, g.experts[1], du, a.x, p.experts[1], up, true)
	d.DispatchBackward(dx, dxp, a.rt, s, true)
	for i, w := range p.shared {
		gw := g.shared[i]
		h, hg, hu := sc.moeSh, sc.moeSg, sc.moeSu
		d.MatmulBackward(h, gw[2], dout, a.ssw[i], w[2], cuda.MatmulShape{BT: s.BT, C: EF, OC: C}, false)
		d.SwiGLUBackward(hg, hu, h, a.sgate[i], a.sup[i], false)
		d.MatmulBackward(dx, gw[0], hg, x, w[0], cuda.MatmulShape{BT: s.BT, C: C, OC: EF}, true)
		d.MatmulBackward(dx, gw[1], hu, x, w[1], cuda.MatmulShape{BT: s.BT, C: C, OC: EF}, true)
	}
}
