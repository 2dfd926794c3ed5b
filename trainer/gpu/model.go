//go:build cuda || cudaemu

package gpu

import (
	"fmt"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/cuda"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
)

// Optimizer is one AdamW step's settings (the learning rate comes per step).
type Optimizer struct {
	Beta1, Beta2, Eps, WeightDecay, ClipGrad float64
}

// Options configure a model: Compute is the storage dtype of weights and
// activations (cuda.F32 or cuda.BF16; master weights, gradients and optimizer state
// are fp32 always); HeadChunk is the vocabulary columns the output head makes at a
// time (0: config.GPUHeadChunk).
type Options struct {
	Compute   cuda.DType
	HeadChunk int
}

type layer struct {
	attnNorm, wq, wk, wv, wo, mlpNorm, w1, w3, w2 cuda.Buffer
	moe                                           *moeParams // MoE layers; w1, w3, w2 are then empty
}

// moeParams are one MoE layer's views: the router, each shared expert's w1, w3,
// w2, and the routed experts' w1, w3, w2 as strided batches (expert e's matrix at
// e·stride elements from expert 0's: the flat buffer lays each expert's three
// matrices out together).
type moeParams struct {
	router  cuda.Buffer
	shared  [][3]cuda.Buffer
	experts [3]cuda.Buffer
	stride  int
}

type params struct {
	embed, norm, output cuda.Buffer
	layers              []layer
}

// Model is a dense decoder bound to a batch shape on one device. Its methods run
// on the device's goroutine (inside Device.Do).
type Model struct {
	d         *cuda.Device
	Cfg       config.Model
	B, T      int
	opt       Options
	table     []parallel.Param
	offsets   []int // each parameter's first element in the flat buffers
	master    cuda.Buffer
	compute   cuda.Buffer // bf16 copy of master, or master itself in fp32 runs
	grads     cuda.Buffer
	m, v      cuda.Buffer
	w, g      params
	cos, sin  cuda.Buffer
	tokens    cuda.Buffer
	targets   cuda.Buffer
	embRows   cuda.EmbeddingRows
	hostRows  struct{ order, seg, tok, count []int32 } // the batch's rows grouped by token
	acts      acts
	scratch   scratch
	head      cuda.HeadScratch
	stats     cuda.Buffer // [loss sum, grad sum of squares, grad norm, clip factor, then (aux, copies kept) per layer]
	hostStats []float32
	held      map[string]int64
	allocated []cuda.Buffer
	step      int
	micro     int // forwards accumulated into the step's statistics
}

type acts struct {
	resid, ln1, q, k, v, atty, mid, ln2, gate, up, sw, rstd1, rstd2, lse []cuda.Buffer
	final, lnf, rstdf, losses, headLse                                   cuda.Buffer
	moe                                                                  []*moeActs // per layer; nil for dense layers
}

// moeActs are one MoE layer's saved activations: router logits, the routing state
// (all on the device), the permuted inputs (padded segments: expert e at rows
// e·capacity), the experts' SwiGLU intermediates and outputs, the shared experts'.
type moeActs struct {
	logits             cuda.Buffer
	rt                 cuda.MoERouting
	x, gate, up, sw, y cuda.Buffer
	sgate, sup, ssw    []cuda.Buffer
}

type scratch struct {
	dres, dx, dq, dk, dv, datty, dff1, dff2, dsw, dloss cuda.Buffer
	// MoE backward, sized for one layer (Rows permuted rows)
	moeDy, moeDx, moeDsw, moeDg, moeDu, moeDlogits, moeDgates, moeDaux, moeAux, moeSh, moeSg, moeSu cuda.Buffer
}

// New allocates everything a step needs (once: steps allocate nothing) and uploads
// the initial weights, one fp32 slice per parameter in table order.
func New(d *cuda.Device, cfg config.Model, table []parallel.Param, weights [][]float32, B, T int, opt Options) (*Model, error) {
	switch {
	case cfg.MoE.NumExperts > 1024 || cfg.MoE.TopK > 32:
		return nil, fmt.Errorf("gpu: %d experts, top %d: the routing kernels take up to 1024 experts and top 32", cfg.MoE.NumExperts, cfg.MoE.TopK)
	case T > cfg.SeqLen:
		return nil, fmt.Errorf("gpu: sequence of %d tokens is longer than model.seq_len (%d)", T, cfg.SeqLen)
	case opt.Compute != cuda.F32 && opt.Compute != cuda.BF16:
		return nil, fmt.Errorf("gpu: compute dtype %s (fp32 or bf16)", opt.Compute)
	case len(weights) != len(table):
		return nil, fmt.Errorf("gpu: %d weight slices for %d parameters", len(weights), len(table))
	}
	if moe := cfg.MoE; cfg.QKNorm || cfg.NoPEInterval > 0 || moe.NumExperts > 0 && (moe.ScoreFunction != "softmax" || !moe.NormTopK || moe.TopKScale != 1 ||
		moe.ScoreBeforeExpert || moe.ExpertBias || moe.NumGroups > 0) {
		return nil, fmt.Errorf("gpu: QK-norm, NoPE layers and routers other than softmax with renormalised, unscaled gates after the experts run on the engine of several GPUs, not on the one-GPU engine (config.NotExecuted says so)")
	}
	if hd := cfg.HeadSize(); hd != 32 && hd != 64 && hd != 128 {
		return nil, fmt.Errorf("gpu: head size %d (model.head_dim, or model.hidden %d / model.heads %d): the attention kernels take 32, 64 or 128", hd, cfg.Hidden, cfg.Heads)
	}
	if opt.HeadChunk <= 0 {
		opt.HeadChunk = config.GPUHeadChunk
	}
	m := &Model{d: d, Cfg: cfg, B: B, T: T, opt: opt, table: table, held: map[string]int64{}}
	var err error
	d.Do(func() { err = m.alloc(weights) })
	if err != nil {
		d.Do(m.free)
		return nil, err
	}
	return m, nil
}

// flat lays per-parameter values (table order) out as the model's flat
// buffers of n values hold them: each parameter at its offset, the padding
// zero.
func (m *Model) flat(vals [][]float32, n int) []float32 {
	host := make([]float32, n)
	for i := range m.table {
		copy(host[m.offsets[i]:], vals[i])
	}
	return host
}

func (m *Model) buf(component string, t cuda.DType, n int) (cuda.Buffer, error) {
	b, err := m.d.Alloc(t, n)
	if err != nil {
		return b, fmt.Errorf("gpu: %s: %w", component, err)
	}
	m.held[component] += b.Bytes()
	m.allocated = append(m.allocated, b)
	return b, nil
}

func (m *Model) free() {
	for _, b := range m.allocated {
		m.d.Free(b)
	}
	m.allocated = nil
}

// Close frees the model's device memory.
func (m *Model) Close() { m.d.Do(m.free) }

// HeldBytes reports the device bytes the model holds per component: main_weights
// (fp32), weights (the bf16 compute copy; absent in fp32 runs, where the main
// weights serve), grads, optimizer_state, activations, logits (the head's chunk
// buffers), scratch (backward's reused buffers and step statistics) and inputs.
func (m *Model) HeldBytes() map[string]int64 { return m.held }

func (m *Model) dims() (BT, C, NH, NKV, HD, FF, V int) {
	c := m.Cfg
	return m.B * m.T, c.Hidden, c.Heads, c.EffectiveKVHeads(), c.HeadSize(), c.FFNHidden, c.VocabSize
}

func (m *Model) alloc(weights [][]float32) error {
	BT, C, NH, NKV, HD, FF, V := m.dims()
	total := 0
	m.offsets = make([]int, len(m.table))
	for i := range m.table {
		m.offsets[i] = total
		n := int(m.table[i].LocalNumel())
		if len(weights[i]) != n {
			return fmt.Errorf("gpu: %s has %d elements, its initial weights %d", m.table[i].Name, n, len(weights[i]))
		}
		total += n + (8-n%8)%8 // every parameter starts 16-byte aligned in bf16
	}
	var err error
	alloc := func(dst *cuda.Buffer, component string, t cuda.DType, n int) {
		if err == nil {
			*dst, err = m.buf(component, t, n)
		}
	}
	alloc(&m.master, "main_weights", cuda.F32, total)
	if m.opt.Compute == cuda.BF16 {
		alloc(&m.compute, "weights", cuda.BF16, total)
	}
	alloc(&m.grads, "grads", cuda.F32, total)
	alloc(&m.m, "optimizer_state", cuda.F32, total)
	alloc(&m.v, "optimizer_state", cuda.F32, total)
	if err != nil {
		return err
	}
	if m.opt.Compute != cuda.BF16 {
		m.compute = m.master
	}
	m.d.Upload(m.master, m.flat(weights, total))
	m.d.Zero(m.m)
	m.d.Zero(m.v)
	m.d.Cast(m.compute, m.master)
	if err := m.bind(); err != nil {
		return err
	}
	dt := m.opt.Compute
	L := m.Cfg.Layers
	a := &m.acts
	per := func(dst *[]cuda.Buffer, t cuda.DType, n int) {
		*dst = make([]cuda.Buffer, L)
		for l := range *dst {
			alloc(&(*dst)[l], "activations", t, n)
		}
	}
	per(&a.resid, dt, BT*C)
	per(&a.ln1, dt, BT*C)
	per(&a.q, dt, BT*NH*HD)
	per(&a.k, dt, BT*NKV*HD)
	per(&a.v, dt, BT*NKV*HD)
	per(&a.atty, dt, BT*NH*HD)
	per(&a.lse, cuda.F32, m.B*NH*m.T)
	per(&a.mid, dt, BT*C)
	per(&a.ln2, dt, BT*C)
	mlp := func(dst *[]cuda.Buffer) { // the dense layers' MLP buffers
		*dst = make([]cuda.Buffer, L)
		for l := range *dst {
			if !m.Cfg.IsMoELayer(l) {
				alloc(&(*dst)[l], "activations", dt, BT*FF)
			}
		}
	}
	mlp(&a.gate)
	mlp(&a.up)
	mlp(&a.sw)
	a.moe = make([]*moeActs, L)
	s := &m.scratch
	if m.Cfg.MoE.NumExperts > 0 {
		ms := m.moeShape()
		E, K, EF, R := ms.E, ms.K, m.Cfg.MoE.ExpertFFNHidden, ms.Rows()
		for l := 0; l < L; l++ {
			if !m.Cfg.IsMoELayer(l) {
				continue
			}
			ma := &moeActs{}
			alloc(&ma.logits, "activations", dt, BT*E)
			rt := &ma.rt
			alloc(&rt.Probs, "activations", cuda.F32, BT*E)
			alloc(&rt.Gates, "activations", cuda.F32, BT*K)
			for _, b := range []*cuda.Buffer{&rt.Idx, &rt.Row, &rt.Rank} {
				alloc(b, "activations", cuda.I32, BT*K)
			}
			alloc(&rt.Tok, "activations", cuda.I32, R)
			alloc(&rt.Counts, "activations", cuda.I32, E)
			alloc(&rt.Offsets, "activations", cuda.I32, E+1)
			alloc(&ma.x, "activations", dt, R*C)
			alloc(&ma.y, "activations", dt, R*C)
			for _, b := range []*cuda.Buffer{&ma.gate, &ma.up, &ma.sw} {
				alloc(b, "activations", dt, R*EF)
			}
			for range m.Cfg.MoE.SharedExperts {
				var g, u, w cuda.Buffer
				alloc(&g, "activations", dt, BT*EF)
				alloc(&u, "activations", dt, BT*EF)
				alloc(&w, "activations", dt, BT*EF)
				ma.sgate, ma.sup, ma.ssw = append(ma.sgate, g), append(ma.sup, u), append(ma.ssw, w)
			}
			a.moe[l] = ma
		}
		alloc(&s.moeDy, "scratch", dt, R*C)
		alloc(&s.moeDx, "scratch", dt, R*C)
		for _, b := range []*cuda.Buffer{&s.moeDsw, &s.moeDg, &s.moeDu} {
			alloc(b, "scratch", dt, R*EF)
		}
		alloc(&s.moeDlogits, "scratch", dt, BT*E)
		alloc(&s.moeDgates, "scratch", cuda.F32, BT*K)
		alloc(&s.moeDaux, "scratch", cuda.F32, E)
		alloc(&s.moeAux, "scratch", cuda.F32, 2)
		if m.Cfg.MoE.SharedExperts > 0 {
			for _, b := range []*cuda.Buffer{&s.moeSh, &s.moeSg, &s.moeSu} {
				alloc(b, "scratch", dt, BT*EF)
			}
		}
	}
	per(&a.rstd1, cuda.F32, BT)
	per(&a.rstd2, cuda.F32, BT)
	alloc(&a.final, "activations", dt, BT*C)
	alloc(&a.lnf, "activations", dt, BT*C)
	alloc(&a.rstdf, "activations", cuda.F32, BT)
	alloc(&a.losses, "activations", cuda.F32, BT)
	alloc(&a.headLse, "activations", cuda.F32, BT)
	chunk := min(m.opt.HeadChunk, V)
	h := &m.head
	alloc(&h.Logits, "logits", cuda.F32, BT*chunk)
	alloc(&h.DLogits, "logits", dt, BT*chunk)
	alloc(&h.M, "logits", cuda.F32, BT)
	alloc(&h.S, "logits", cuda.F32, BT)
	alloc(&h.Z, "logits", cuda.F32, BT)
	alloc(&s.dres, "scratch", dt, BT*C)
	alloc(&s.dx, "scratch", dt, BT*C)
	alloc(&s.dq, "scratch", dt, BT*NH*HD)
	alloc(&s.datty, "scratch", dt, BT*NH*HD)
	alloc(&s.dk, "scratch", dt, BT*NKV*HD)
	alloc(&s.dv, "scratch", dt, BT*NKV*HD)
	if m.anyDense() {
		alloc(&s.dff1, "scratch", dt, BT*FF)
		alloc(&s.dff2, "scratch", dt, BT*FF)
		alloc(&s.dsw, "scratch", dt, BT*FF)
	}
	alloc(&s.dloss, "scratch", cuda.F32, BT)
	alloc(&m.stats, "scratch", cuda.F32, 4+2*L)
	m.hostStats = make([]float32, 4+2*L)
	alloc(&m.cos, "inputs", cuda.F32, m.T*HD/2)
	alloc(&m.sin, "inputs", cuda.F32, m.T*HD/2)
	alloc(&m.tokens, "inputs", cuda.I32, BT)
	alloc(&m.targets, "inputs", cuda.I32, BT)
	alloc(&m.embRows.Order, "inputs", cuda.I32, BT)
	alloc(&m.embRows.Seg, "inputs", cuda.I32, BT+1)
	alloc(&m.embRows.Tok, "inputs", cuda.I32, BT)
	hr := &m.hostRows
	hr.order, hr.seg, hr.tok, hr.count = make([]int32, BT), make([]int32, BT+1), make([]int32, BT), make([]int32, V)
	if err != nil {
		return err
	}
	m.d.RopeTables(m.cos, m.sin, m.T, tensor.RopeInvFreq(HD, m.Cfg.RopeTheta, m.Cfg.RopeScaling, m.Cfg.RopeScalingFactor))
	return m.d.Err()
}

// bind points the parameter views at the flat buffers.
func (m *Model) bind() error {
	byName := map[string]int{}
	for i := range m.table {
		byName[m.table[i].Name] = i
	}
	view := func(b cuda.Buffer, name string) cuda.Buffer {
		i, ok := byName[name]
		if !ok {
			return cuda.Buffer{DType: b.DType}
		}
		return b.Slice(m.offsets[i], m.offsets[i]+int(m.table[i].LocalNumel()))
	}
	fill := func(p *params, b cuda.Buffer) error {
		p.embed, p.norm, p.output = view(b, "embed.weight"), view(b, "norm.weight"), view(b, "output.weight")
		if m.Cfg.TieEmbeddings {
			p.output = p.embed
		}
		p.layers = make([]layer, m.Cfg.Layers)
		for l := range p.layers {
			pre := fmt.Sprintf("layers.%d.", l)
			p.layers[l] = layer{attnNorm: view(b, pre+"attn_norm.weight"), wq: view(b, pre+"attn.wq"), wk: view(b, pre+"attn.wk"),
				wv: view(b, pre+"attn.wv"), wo: view(b, pre+"attn.wo"), mlpNorm: view(b, pre+"mlp_norm.weight"),
				w1: view(b, pre+"mlp.w1"), w3: view(b, pre+"mlp.w3"), w2: view(b, pre+"mlp.w2")}
			need := []cuda.Buffer{p.layers[l].wq, p.layers[l].w1, p.layers[l].w2}
			if m.Cfg.IsMoELayer(l) {
				mp, err := m.bindMoE(b, pre, byName)
				if err != nil {
					return err
				}
				p.layers[l].moe = mp
				need = need[:1]
			}
			for _, x := range need {
				if x.N == 0 {
					return fmt.Errorf("gpu: layer %d lacks a parameter of the dense layout", l)
				}
			}
		}
		if p.embed.N == 0 || p.norm.N == 0 || p.output.N == 0 {
			return fmt.Errorf("gpu: the parameter table lacks the embedding, final norm or output head")
		}
		return nil
	}
	if err := fill(&m.w, m.compute); err != nil {
		return err
	}
	return fill(&m.g, m.grads)
}

// bindMoE makes a MoE layer's views over b: the routed experts' matrices must lie
// one constant stride apart (the parameter table keeps each expert's w1, w3, w2
// together, and all experts have one shape).
func (m *Model) bindMoE(b cuda.Buffer, pre string, byName map[string]int) (*moeParams, error) {
	c := m.Cfg.MoE
	at := func(name string) (int, int, error) {
		i, ok := byName[name]
		if !ok {
			return 0, 0, fmt.Errorf("gpu: the parameter table lacks %s", name)
		}
		return m.offsets[i], int(m.table[i].LocalNumel()), nil
	}
	mp := &moeParams{}
	off, n, err := at(pre + "moe.router")
	if err != nil {
		return nil, err
	}
	mp.router = b.Slice(off, off+n)
	for s := 0; s < c.SharedExperts; s++ {
		var three [3]cuda.Buffer
		for k, w := range []string{"w1", "w3", "w2"} {
			off, n, err := at(fmt.Sprintf("%smoe.shared.%d.%s", pre, s, w))
			if err != nil {
				return nil, err
			}
			three[k] = b.Slice(off, off+n)
		}
		mp.shared = append(mp.shared, three)
	}
	first, _, err := at(pre + "moe.experts.0.w1")
	if err != nil {
		return nil, err
	}
	if c.NumExperts > 1 {
		next, _, err := at(pre + "moe.experts.1.w1")
		if err != nil {
			return nil, err
		}
		mp.stride = next - first
	}
	for k, w := range []string{"w1", "w3", "w2"} {
		var base, size int
		for e := 0; e < c.NumExperts; e++ {
			off, n, err := at(fmt.Sprintf("%smoe.experts.%d.%s", pre, e, w))
			if err != nil {
				return nil, err
			}
			if e == 0 {
				base, size = off, n
			} else if off != base+e*mp.stride || n != size {
				return nil, fmt.Errorf("gpu: %smoe.experts.%d.%s is not one stride (%d values) after expert %d's", pre, e, w, mp.stride, e-1)
			}
		}
		mp.experts[k] = b.Slice(base, base+(c.NumExperts-1)*mp.stride+size)
	}
	return mp, nil
}

// anyDense says whether some layer has a dense MLP (and needs its scratch).
func (m *Model) anyDense() bool {
	for l := range m.Cfg.Layers {
		if !m.Cfg.IsMoELayer(l) {
			return true
		}
	}
	return false
}

// moeShape is the routing of every MoE layer: capacity ceil(capacity_factor·BT·k/E)
// copies per expert, or BT·k (nothing dropped) without a capacity factor, in
// padded segments so the experts run as one strided batch.
func (m *Model) moeShape() cuda.MoEShape {
	c := m.Cfg.MoE
	BT := m.B * m.T
	capacity := int(parallel.ExpertCapacity(m.Cfg, int64(BT)))
	return tensor.MoEShape{BT: BT, E: c.NumExperts, K: c.TopK, C: m.Cfg.Hidden, Capacity: capacity, Padded: true}
}
