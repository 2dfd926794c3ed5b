package model

import (
	"fmt"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
)

// layerParams are one layer's weight or gradient buffers (the trainer's
// views of its memory: weights in F or bf16, gradients in F).
type layerParams[S any] struct {
	attnNorm, wq, wk, wv, wo, mlpNorm, w1, w3, w2 S
	qNorm, kNorm                                  S             // QK-norm's per-head gains (model.qk_norm); empty otherwise
	moe                                           *moeParams[S] // MoE layers; w1, w3, w2 are then empty
}

// params are the buffers of every parameter, in the model's own terms.
type params[S any] struct {
	embed, norm, output S // output aliases embed when embeddings are tied
	layers              []layerParams[S]
}

// acts are the activations of one forward pass kept for backward, buffers of the
// model's memory. Shapes per layer: (BT,C) for residuals and norms, (BT,NH·HD)
// for q and the attention output, (BT,NKV·HD) for k and v, (B,NH,T) for flash
// attention's rows' log-sum-exps (no (T,T) probabilities exist), (BT,F) for the
// MLP's gate, up and product. Layers that share a slot (recompute, the bf16 work
// set) hold the same buffer.
type acts[F tensor.Float] struct {
	resid, ln1, q, k, v, att, atty, mid, ln2, gate, up, sw []tensor.Buffer
	rstd1, rstd2                                           []tensor.Buffer
	rstdq, rstdk                                           []tensor.Buffer // QK-norm's reciprocal RMS per row and head (model.qk_norm)
	final, lnf, rstdf, logits, probs, losses               tensor.Buffer
	// head is the output head's work (tensor.Kernels.HeadLoss: a chunk of
	// rows' logits) without tensor parallelism, which keeps whole logits of
	// its vocabulary rows in logits (probs the same buffer) instead.
	head tensor.Buffer
	moe  []*moeActs[F] // per layer; nil for dense layers
}

// Model is a decoder bound to a batch shape (B sequences of T tokens).
type Model[F tensor.Float] struct {
	Cfg  config.Model
	B, T int
	be   tensor.Kernels[F]
	w    params[tensor.Buffer]
	g    params[tensor.Buffer]
	a    acts[F]
	cos  tensor.Buffer // RoPE tables (T, HD/2)
	// wptr and gptr point at each parameter's weight and gradient buffer (table
	// order), so a runtime that gathers units into changing buffers can rebind them.
	wptr      []*tensor.Buffer
	gptr      []*tensor.Buffer
	embedIdx  int // table index of embed.weight
	hooks     Hooks
	recompute string // none, selective or full
	ep        ExpertParallel
	cp        *cpState[F] // nil without context parallelism
	docs      *docState   // nil without document masks
	tp        *tpState[F] // nil without tensor parallelism
	fp8       *fp8State   // nil without FP8 compute (fp8.go)
	fp8w      *fp8Weights // nil without FP8 compute weights (fp8param.go)
	st        *stash      // bf16 stores of saved activations; nil without WithBF16Activations, and in a bf16-native run
	// act is the dtype of the activations and their gradients: F, or bf16
	// in a bf16-native run (WithBF16Activations on a backend that computes
	// in bf16 storage, tensor.BF16Storage).
	act     tensor.DType
	blocks  [][]int // FSDP units of each block, in forward order
	hookErr error
	// mem is the memory of the model's stream (WithMemory, or a new one of the
	// backend's), which holds every buffer of the model's (buffers.go);
	// moeSums its buffer of the last forward's MoE sums (MoESums);
	// moeLayersRun counts the MoE layers the current forward has run, and
	// recomputing is set while backward runs a layer's forward again.
	mem          tensor.Memory
	moeSums      tensor.Buffer
	moeLayersRun int
	recomputing  bool
	// logitRows are the rows whose logits a forward without targets makes in
	// the head's work (ForwardLogits); fused is set while ForwardBackward's
	// forward runs, which leaves the head to the backward.
	logitRows [2]int
	fused     bool
	padSeg    tensor.Buffer // the padded experts' static segments (E+1, int32), with a capacity factor
	// load is each MoE layer's routed copies counted since the last bias
	// update (E each, by layer, slices of loads; nil for dense layers and
	// without model.moe.expert_bias) and biasF the layer's expert bias as the
	// router reads it (in F: the weights may be bf16); ones is the unit gates
	// the experts' outputs are combined with when each token is scaled before
	// its expert (model.moe.score_before_expert; empty otherwise).
	load         []tensor.Buffer
	loads, biasF tensor.Buffer
	ones         tensor.Buffer
	// tok and tgt are the micro-batch's token ids and targets (int32, B·T
	// each) in the model's memory, uploaded by Forward from tokHost and
	// tgtHost through tokAny and tgtAny (the host slices made interfaces
	// once: Memory.Write takes any, and converting a slice per call would
	// allocate).
	tok, tgt         tensor.Buffer
	tokHost, tgtHost []int32
	tokAny, tgtAny   any
	sin              tensor.Buffer
	scratch          struct {
		dres, dx, dq, dk, dv, datty, dff1, dff2, dsw, dloss tensor.Buffer
		// dqk is QK-norm's input gradient (q's, then k's), the norms' inputs
		// being made again in datty (model.qk_norm).
		dqk tensor.Buffer
		// MoE backward (sized for the largest MoE layer)
		moeDlogits, moeDprobs, moeDgates, moeDy, moeDx, moeDh, moeDg, moeDu, moeSh, moeSg, moeSu tensor.Buffer
		moeRecv, moeYloc                                                                         tensor.Buffer      // the exchange's arrival-order rows and local-order outputs (their gradients in backward), every layer's
		expertW, expertG                                                                         [3][]tensor.Buffer // the routed experts' buffers, as the grouped kernels take them
		expertQ                                                                                  []tensor.Buffer    // the routed experts' FP8 weights' views (fp8experts.go)
	}
}

// Option adjusts a Model at construction.
type Option func(*options)

type options struct {
	recompute string
	ep        *ExpertParallel
	cp        *ContextParallel
	tp        *TensorParallel
	bf16Acts  bool
	mem       tensor.Memory
	docs      DocumentMasks
	fp8       *FP8
}

// AllToAll is the collective expert parallelism needs (collective.Group has
// it): the exchange of token rows, on f32 buffers of the model's memory, and
// without a capacity factor the exchange of the split sizes, host values the
// model reads back by design (one synchronisation per MoE layer and forward).
type AllToAll interface {
	AllToAll(dst, src tensor.Buffer, send, recv []int) error
	AllToAllHost(dst, src []float32, send, recv []int) error
}

// ExpertParallel places the model's routed experts on Size ranks: this rank holds
// experts Rank·E/Size .. (Rank+1)·E/Size−1 and exchanges tokens with the others of
// its expert-parallel group through Comm. It needs float32.
type ExpertParallel struct {
	Comm       AllToAll
	Rank, Size int
}

// WithExpertParallel spreads the experts over an expert-parallel group.
func WithExpertParallel(ep ExpertParallel) Option { return func(o *options) { o.ep = &ep } }

// WithMemory names the backend memory whose stream the model's work is on (the
// rank's): the model's buffers are allocated there, so that its bytes and its
// read-backs and synchronisations (expert parallelism's split sizes) are
// counted with the trainer's. Without it the model makes a memory of its
// backend's. The model reaches its buffers only through the memory, its
// kernels and its collectives, so any backend's memory serves.
func WithMemory(mem tensor.Memory) Option { return func(o *options) { o.mem = mem } }

// WithRecompute sets activation recomputation: "none" keeps every activation;
// "full" keeps only each layer's input and recomputes the whole layer in backward
// (one set of intermediates serves every layer); "selective" keeps what the
// layer's products make (q, k, v, the attention output, the residual after
// attention, the MLP's gate and up) and remakes the cheap rest before the
// layer's backward: the two norms' outputs and the SwiGLU product, from the
// kept input, residual, gate and up (torchtitan's operator-level selective
// checkpointing: products saved, elementwise work redone). Megatron's
// selective remakes the attention core's probabilities, which flash attention
// never keeps.
func WithRecompute(mode string) Option { return func(o *options) { o.recompute = mode } }

// New binds a model to its parameter and gradient buffers, of mem's
// (WithMemory): weights[i] and grads[i] hold parameter table[i] whole (weights
// in F or bf16, gradients in F; the trainer gathers sharded units before use).
// The table must come from parallel.ParamTable with etp = 1 and tp = 1, or the
// tensor-parallel degree under WithTensorParallel (then the views are this rank's
// slices). The model runs
// B sequences of T tokens; under context parallelism it holds T/cp tokens of
// each (LocalTokens picks them) and Forward and Backward take those.
func New[F tensor.Float](cfg config.Model, table []parallel.Param, weights, grads []tensor.Buffer, be tensor.Kernels[F], B, T int, opt ...Option) (*Model[F], error) {
	if T > cfg.SeqLen {
		return nil, fmt.Errorf("model: sequence of %d tokens is longer than model.seq_len (%d)", T, cfg.SeqLen)
	}
	m := &Model[F]{Cfg: cfg, B: B, T: T, be: be, act: dtypeOf[F]()}
	o := options{recompute: "none"}
	for _, f := range opt {
		f(&o)
	}
	if m.mem = o.mem; m.mem == nil {
		m.mem = be.NewMemory()
	}
	if cfg.MoE.NumExperts > 0 {
		m.moeSums = m.mem.Alloc(tensor.Float64, 2)
	}
	switch o.recompute {
	case "none", "selective", "full":
		m.recompute = o.recompute
	default:
		return nil, fmt.Errorf("model: recompute mode %q is not none, selective or full", o.recompute)
	}
	if o.cp != nil && o.cp.Size > 1 {
		if err := m.setupCP(*o.cp, T); err != nil {
			return nil, err
		}
	}
	if o.tp != nil && o.tp.Size > 1 {
		if err := m.setupTP(*o.tp, B, m.T); err != nil {
			return nil, err
		}
		if B*m.T%o.tp.Size != 0 {
			return nil, fmt.Errorf("model: %d token rows per micro-batch (per rank) do not split over tp %d", B*m.T, o.tp.Size)
		}
	}
	if o.fp8 != nil {
		if err := m.setupFP8(*o.fp8, o); err != nil {
			return nil, err
		}
	}
	if err := m.setupDocs(o.docs); err != nil {
		return nil, err
	}
	m.tok, m.tgt = m.allocInt(B*m.T), m.allocInt(B*m.T)
	m.tokHost, m.tgtHost = make([]int32, B*m.T), make([]int32, B*m.T)
	m.tokAny, m.tgtAny = m.tokHost, m.tgtHost
	if o.bf16Acts {
		var z F
		if _, ok := any(z).(float32); !ok {
			return nil, fmt.Errorf("model: bf16 activations need float32")
		}
		if m.nativeBF16() {
			m.act = tensor.BFloat16
		} else {
			m.st = &stash{}
		}
	}
	m.ep = ExpertParallel{Size: 1}
	if o.ep != nil && o.ep.Size > 1 {
		var z F
		if _, ok := any(z).(float32); !ok || cfg.MoE.NumExperts%o.ep.Size != 0 || o.ep.Comm == nil {
			return nil, fmt.Errorf("model: expert parallelism needs float32, a communicator, and %d experts divisible by %d ranks", cfg.MoE.NumExperts, o.ep.Size)
		}
		m.ep = *o.ep
	}
	var err error
	local := cfg.MoE.NumExperts / m.ep.Size
	if m.wptr, err = bind(&m.w, cfg, table, weights, tensor.Buffer.Len, local); err != nil {
		return nil, err
	}
	if m.gptr, err = bind(&m.g, cfg, table, grads, tensor.Buffer.Len, local); err != nil {
		return nil, err
	}
	m.blocks = parallel.Blocks(cfg, table)
	for i := range table {
		if table[i].Name == "embed.weight" {
			m.embedIdx = i
		}
	}
	if err := m.alloc(); err != nil {
		return nil, err
	}
	return m, nil
}

// nativeBF16 reports whether a bf16 run keeps its activations and their
// gradients in bf16 buffers that every kernel reads and writes (no fp32 work
// set, no stores): where the backend computes in bf16 storage
// (tensor.BF16Storage) and the model runs only the kernels that covers: dense
// layers, without tensor or context parallelism (their gathers, reductions
// and ring run on fp32 buffers) and without MoE layers (the experts' kernels
// take fp32 activations). Elsewhere a bf16 run keeps the stores (stash.go).
func (m *Model[F]) nativeBF16() bool {
	return tensor.ComputesInBF16(m.be) && m.tp == nil && m.cp == nil && m.Cfg.MoE.NumExperts == 0
}

// BF16Native reports whether the model keeps its activations and their
// gradients in bf16 (nativeBF16's conditions, with WithBF16Activations).
func (m *Model[F]) BF16Native() bool { return m.act == tensor.BFloat16 }

// Hooks let a runtime hold parameters only while a block needs them. Acquire runs
// before block b of Blocks() (the embedding, one transformer layer, or the final
// norm and head) with the FSDP units its parameters belong to; Release runs after
// it. Blocks run 0..len−1 in forward and back down in backward, so a runtime can
// prefetch the next block's units. In backward,
// Release also says that block's gradient contributions to those units are
// complete. A hook's error is kept and returned by Err; the pass goes on with
// whatever the views hold, and the caller must check Err.
type Hooks interface {
	Acquire(block int, units []int, backward bool) error
	Release(block int, units []int, backward bool) error
}

// SetHooks installs hooks (nil removes them).
func (m *Model[F]) SetHooks(h Hooks) { m.hooks = h }

// Blocks lists the FSDP units of each block in forward order: the embedding, each
// layer, then the final norm and output head (with the embedding's unit when tied).
func (m *Model[F]) Blocks() [][]int { return m.blocks }

// Err returns the first hook error of the last pass, and clears it.
func (m *Model[F]) Err() error {
	err := m.hookErr
	m.hookErr = nil
	return err
}

func (m *Model[F]) acquire(block int, backward bool) {
	if m.hooks != nil {
		if err := m.hooks.Acquire(block, m.blocks[block], backward); err != nil && m.hookErr == nil {
			m.hookErr = err
		}
	}
}

func (m *Model[F]) release(block int, backward bool) {
	if m.hooks != nil {
		if err := m.hooks.Release(block, m.blocks[block], backward); err != nil && m.hookErr == nil {
			m.hookErr = err
		}
	}
}

// Bind points parameter i (table order) at new weight and gradient buffers (the
// empty Buffer: not held now); a tied output head follows the embedding.
func (m *Model[F]) Bind(i int, w, g tensor.Buffer) {
	if m.wptr[i] == nil {
		return // an expert of another expert-parallel rank
	}
	*m.wptr[i], *m.gptr[i] = w, g
	m.noteFP8(i, w)
	if i == m.embedIdx && m.Cfg.TieEmbeddings {
		m.w.output, m.g.output = w, g
	}
}

// bind fills p from views (table order; size counts a view's elements) and
// returns a pointer to each parameter's view inside p. An empty view is allowed:
// a runtime with hooks binds it later. Only the first local experts have places:
// the plan lays out an expert-parallel rank's experts as experts 0..local−1 of
// its expert groups.
func bind[S any](p *params[S], cfg config.Model, table []parallel.Param, views []S, size func(S) int, local int) ([]*S, error) {
	if len(views) != len(table) {
		return nil, fmt.Errorf("model: %d views for %d parameters", len(views), len(table))
	}
	byName := make(map[string]S, len(table))
	for i := range table {
		if n := int64(size(views[i])); n != table[i].LocalNumel() && n != 0 {
			return nil, fmt.Errorf("model: %s has %d elements, its view %d", table[i].Name, table[i].LocalNumel(), n)
		}
		byName[table[i].Name] = views[i]
	}
	get := func(name string) S { return byName[name] }
	p.embed, p.norm = get("embed.weight"), get("norm.weight")
	p.output = get("output.weight")
	if cfg.TieEmbeddings {
		p.output = p.embed
	}
	for l := 0; l < cfg.Layers; l++ {
		pre := fmt.Sprintf("layers.%d.", l)
		lp := layerParams[S]{
			attnNorm: get(pre + "attn_norm.weight"), wq: get(pre + "attn.wq"), wk: get(pre + "attn.wk"), wv: get(pre + "attn.wv"),
			wo: get(pre + "attn.wo"), mlpNorm: get(pre + "mlp_norm.weight"), w1: get(pre + "mlp.w1"), w3: get(pre + "mlp.w3"), w2: get(pre + "mlp.w2"),
			qNorm: get(pre + "attn.q_norm.weight"), kNorm: get(pre + "attn.k_norm.weight"),
		}
		if cfg.IsMoELayer(l) {
			mp := &moeParams[S]{router: get(pre + "moe.router"), bias: get(pre + "moe.expert_bias")}
			three := func(q string) [3]S { return [3]S{get(q + ".w1"), get(q + ".w3"), get(q + ".w2")} }
			for s := 0; s < cfg.MoE.SharedExperts; s++ {
				mp.shared = append(mp.shared, three(fmt.Sprintf("%smoe.shared.%d", pre, s)))
			}
			for e := 0; e < local; e++ {
				mp.experts = append(mp.experts, three(fmt.Sprintf("%smoe.experts.%d", pre, e)))
			}
			lp.moe = mp
		}
		p.layers = append(p.layers, lp)
	}
	ptrs := map[string]*S{"embed.weight": &p.embed, "norm.weight": &p.norm}
	if !cfg.TieEmbeddings {
		ptrs["output.weight"] = &p.output
	}
	for l := range p.layers {
		lp := &p.layers[l]
		pre := fmt.Sprintf("layers.%d.", l)
		for name, ptr := range map[string]*S{"attn_norm.weight": &lp.attnNorm, "attn.wq": &lp.wq, "attn.wk": &lp.wk, "attn.wv": &lp.wv,
			"attn.wo": &lp.wo, "mlp_norm.weight": &lp.mlpNorm, "mlp.w1": &lp.w1, "mlp.w3": &lp.w3, "mlp.w2": &lp.w2} {
			ptrs[pre+name] = ptr
		}
		if cfg.QKNorm {
			ptrs[pre+"attn.q_norm.weight"], ptrs[pre+"attn.k_norm.weight"] = &lp.qNorm, &lp.kNorm
		}
		if mp := lp.moe; mp != nil {
			ptrs[pre+"moe.router"] = &mp.router
			if cfg.MoE.ExpertBias {
				ptrs[pre+"moe.expert_bias"] = &mp.bias
			}
			for s := range mp.shared {
				for k, w := range []string{"w1", "w3", "w2"} {
					ptrs[fmt.Sprintf("%smoe.shared.%d.%s", pre, s, w)] = &mp.shared[s][k]
				}
			}
			for e := range mp.experts {
				for k, w := range []string{"w1", "w3", "w2"} {
					ptrs[fmt.Sprintf("%smoe.experts.%d.%s", pre, e, w)] = &mp.experts[e][k]
				}
			}
		}
	}
	out := make([]*S, len(table))
	for i := range table {
		out[i] = ptrs[table[i].Name]
		if out[i] == nil && table[i].Expert >= local {
			continue // held by another expert-parallel rank
		}
		if out[i] == nil {
			return nil, fmt.Errorf("model: parameter %s has no place in the model", table[i].Name)
		}
	}
	return out, nil
}

// dims are the micro-batch's token rows on this rank and the widths this rank
// computes: heads, kv heads, ffn and vocabulary are this rank's share under tensor
// parallelism.
func (m *Model[F]) dims() (BT, C, NH, NKV, HD, FF, V int) {
	c, tp := m.Cfg, m.tpSize()
	return m.B * m.T, c.Hidden, c.Heads / tp, c.EffectiveKVHeads() / tp, c.HeadSize(), c.FFNHidden / tp, c.VocabSize / tp
}

// alloc makes the model's buffers in its memory: a failure (an allocation the
// backend cannot make) is the memory's kept error, returned.
func (m *Model[F]) alloc() error {
	BT, C, NH, NKV, HD, FF, V := m.dims()
	L := m.Cfg.Layers
	// mk is one buffer a layer of n elements; shared layers' buffers alias
	// one slot: recomputed in backward, not kept. Activations are of m.act,
	// statistics of F (mkF, sharedF).
	mkOf := func(t tensor.DType) func(n int) []tensor.Buffer {
		return func(n int) []tensor.Buffer {
			out := make([]tensor.Buffer, L)
			for i := range out {
				out[i] = m.mem.Alloc(t, n)
			}
			return out
		}
	}
	sharedOf := func(t tensor.DType) func(n int) []tensor.Buffer {
		return func(n int) []tensor.Buffer {
			out := make([]tensor.Buffer, L)
			if L > 0 {
				one := m.mem.Alloc(t, n)
				for i := range out {
					out[i] = one
				}
			}
			return out
		}
	}
	mk, shared := mkOf(m.act), sharedOf(m.act)
	// per: what a layer keeps for backward; stats: its F statistics (reciprocal
	// RMS, log-sum-exps), F in a bf16-native run too. Under full recompute one
	// layer's set serves all; with bf16 stores one set of F buffers is the
	// work set and each layer keeps bf16 stores (stash.go).
	per, stats := mk, mkOf(dtypeOf[F]())
	if m.recompute == "full" {
		per, stats = shared, sharedOf(dtypeOf[F]())
	}
	if m.st != nil {
		per = shared
	}
	a := &m.a
	R := m.rows() // rows of the residual stream (B·T/tp under tensor parallelism)
	if m.st != nil {
		// Layer l reads resid[l] and writes resid[l+1]: two F buffers take turns
		// (one with a single layer, which writes the final norm's input), every
		// layer's input is kept in its bf16 store.
		two := m.allocN(min(2, L), R*C)
		a.resid = make([]tensor.Buffer, L)
		for l := range a.resid {
			a.resid[l] = two[l%2]
		}
	} else {
		a.resid = mk(R * C) // every layer's input is always kept
	}
	norms := per // the norms' outputs: remade before each layer's backward under selective recompute
	if m.recompute == "selective" {
		norms = shared
	}
	a.ln1, a.mid, a.ln2 = norms(R*C), per(R*C), norms(R*C)
	a.q, a.atty = per(BT*NH*HD), per(BT*NH*HD)
	a.k, a.v = per(BT*NKV*HD), per(BT*NKV*HD)
	a.att = stats(m.B * NH * m.T) // log-sum-exps: remade only with the whole layer
	// dense is the MLP's buffers (the experts' replace them in MoE layers);
	// remade ones (the SwiGLU product) are one under selective recompute.
	dense := func(n int, remade bool) []tensor.Buffer {
		out := make([]tensor.Buffer, L)
		var one tensor.Buffer
		for l := range out {
			switch {
			case m.Cfg.IsMoELayer(l):
			case m.recompute == "full" || m.st != nil || (remade && m.recompute == "selective"):
				if one.Storage() == nil {
					one = m.allocAct(n)
				}
				out[l] = one
			default:
				out[l] = m.allocAct(n)
			}
		}
		return out
	}
	a.gate, a.up, a.sw = dense(BT*FF, false), dense(BT*FF, false), dense(BT*FF, true)
	a.moe = make([]*moeActs[F], L)
	var moeSlot *moeActs[F]
	var sent tensor.Buffer
	for l := 0; l < L; l++ {
		if m.Cfg.IsMoELayer(l) {
			switch {
			case m.recompute == "full" && moeSlot != nil:
			case m.st != nil && moeSlot != nil:
				// The layer's own routing and statistics; the work set's F buffers.
				a.moe[l] = m.newMoEActs(R, BT, moeSlot)
				continue
			default:
				moeSlot = m.newMoEActs(R, BT, nil)
				if m.ep.Size > 1 {
					// Under expert parallelism the permuted tokens are only sent (the
					// experts' inputs in backward are the received tokens): one
					// buffer serves every layer.
					if sent.Storage() == nil {
						sent = moeSlot.x
					} else {
						m.mem.Free(moeSlot.x)
					}
					moeSlot.x = sent
				}
			}
			a.moe[l] = moeSlot
		}
	}
	if m.Cfg.MoE.NumExperts > 0 {
		E, k, EF := m.Cfg.MoE.NumExperts, m.Cfg.MoE.TopK, m.Cfg.MoE.ExpertFFNHidden
		s := &m.scratch
		// The router and the routed experts see this rank's rows of the residual
		// stream; the shared experts, split like the MLP, all rows.
		s.moeDlogits, s.moeDprobs, s.moeDgates = m.alloc1(R*E), m.alloc1(R*E), m.alloc1(R*k)
		copies := moeShape(m.Cfg, R, m.ep.Size).Rows() // dropless, grown with the exchange buffers under expert parallelism
		s.moeDy, s.moeDx = m.alloc1(copies*C), m.alloc1(copies*C)
		if sh := moeShape(m.Cfg, R, m.ep.Size); sh.Padded {
			seg := make([]int32, E+1)
			for e := range seg {
				seg[e] = int32(e * sh.Capacity)
			}
			m.padSeg = m.allocInt(E + 1)
			m.mem.Write(m.padSeg, seg)
		}
		s.moeDh, s.moeDg, s.moeDu = m.alloc1(copies*EF), m.alloc1(copies*EF), m.alloc1(copies*EF)
		if m.Cfg.MoE.ExpertBias {
			// The loads lie in one buffer, which the trainer sums over the ranks
			// in one all-reduce.
			m.load = make([]tensor.Buffer, L)
			n := 0
			for l := 0; l < L; l++ {
				if m.Cfg.IsMoELayer(l) {
					n++
				}
			}
			m.loads, m.biasF = m.alloc1(n*E), m.alloc1(E)
			m.mem.Zero(m.loads)
			i := 0
			for l := 0; l < L; l++ {
				if m.Cfg.IsMoELayer(l) {
					m.load[l] = m.loads.Slice(i*E, (i+1)*E)
					i++
				}
			}
		}
		if m.Cfg.MoE.ScoreBeforeExpert {
			m.ones = m.alloc1(R * k)
			m.mem.Fill(m.ones, 1)
		}
		if m.ep.Size > 1 {
			s.moeRecv, s.moeYloc = m.alloc1(copies*C), m.alloc1(copies*C)
		}
		if m.Cfg.MoE.SharedExperts > 0 {
			SF := EF / m.tpSize()
			s.moeSh, s.moeSg, s.moeSu = m.alloc1(BT*SF), m.alloc1(BT*SF), m.alloc1(BT*SF)
		}
	}
	a.rstd1, a.rstd2 = stats(R), stats(R)
	if m.Cfg.QKNorm {
		a.rstdq, a.rstdk = stats(BT*NH), stats(BT*NKV)
	}
	if m.st != nil {
		m.allocStash()
	}
	a.final, a.lnf, a.rstdf = m.allocAct(R*C), m.allocAct(R*C), m.alloc1(R)
	a.losses = m.alloc1(BT)
	if m.tp == nil {
		// The head makes its logits a chunk of rows at a time (HeadLoss): no
		// (BT,V) buffer.
		a.head = m.alloc1(m.be.HeadWork(m.headShape()))
	} else {
		// The loss writes the softmax over the logits, and backward the logits'
		// gradient over the softmax (the kernels allow both): a forward with
		// targets leaves probabilities there, one without (sampling) the logits.
		a.logits = m.alloc1(BT * V)
		a.probs = a.logits
	}
	s := &m.scratch
	s.dres, s.dx = m.allocAct(R*C), m.allocAct(R*C)
	if m.tp != nil {
		m.allocTP()
	}
	s.dq, s.datty = m.allocAct(BT*NH*HD), m.allocAct(BT*NH*HD)
	if m.Cfg.QKNorm {
		s.dqk = m.allocAct(BT * NH * HD)
	}
	s.dk, s.dv = m.allocAct(BT*NKV*HD), m.allocAct(BT*NKV*HD)
	s.dff1, s.dff2, s.dsw = m.allocAct(BT*FF), m.allocAct(BT*FF), m.allocAct(BT*FF)
	s.dloss = m.alloc1(BT) // the logits' gradient is written over the probabilities (Backward)
	m.cos, m.sin = m.alloc1(m.T*HD/2), m.alloc1(m.T*HD/2)
	invFreq := tensor.RopeInvFreq(HD, m.Cfg.RopeTheta, RopeScaling(m.Cfg))
	if m.cp != nil {
		m.allocCP()
		m.ropeTablesCP(invFreq)
	} else {
		m.be.RopeTables(m.cos, m.sin, m.T, invFreq)
	}
	m.allocDocs()
	m.allocFP8()
	if err := m.mem.Err(); err != nil {
		return fmt.Errorf("model: allocating its buffers: %w", err)
	}
	return nil
}

// Forward runs the model on tokens (B·T) and, when targets is non-nil, the loss:
// it sets loss[0], an f64 buffer of the backend's, to the sum of the token
// losses (adds it with accumulate: micro-batches, evaluation batches), and
// returns the number of tokens counted (targets < 0 are ignored; the count
// comes from the host's targets, the sum stays in the backend's buffer). Under
// tensor parallelism every rank of the tp group writes the same sum. Logits stay
// in Logits() for sampling (this rank's vocabulary rows under tensor
// parallelism).
func (m *Model[F]) Forward(tokens, targets []int32, loss tensor.Buffer, accumulate bool) (count int) {
	be, a, w := m.be, &m.a, &m.w
	BT, C, _, _, _, _, V := m.dims()
	eps := m.Cfg.NormEps
	x := a.final
	if len(w.layers) > 0 {
		x = a.resid[0]
	}
	if !m.upload(tokens, targets) {
		return 0
	}
	m.uploadStarts()
	m.moeLayersRun = 0
	m.acquire(0, false)
	m.embed(x, m.tok)
	m.release(0, false)
	for l := range w.layers {
		m.acquire(1+l, false)
		next := a.final
		if l+1 < len(w.layers) {
			next = a.resid[l+1]
		}
		if m.st != nil {
			m.roundInput(l, x)
		}
		m.layerForward(l, x, next)
		if m.st != nil {
			m.pack(l)
		}
		x = next
		m.release(1+l, false)
	}
	last := len(m.blocks) - 1
	m.acquire(last, false)
	be.RMSNorm(a.lnf, a.rstdf, a.final, w.norm, m.rows(), C, eps)
	switch {
	case m.tp != nil:
		be.Matmul(a.logits, m.gather(a.lnf), w.output, tensor.MatmulShape{BT: BT, C: C, OC: V}, false)
	case targets == nil:
		m.headLogits()
	case !m.fused: // the loss alone; ForwardBackward's backward makes it with the gradient
		be.HeadLoss(a.losses, tensor.Buffer{}, tensor.Buffer{}, a.head, a.lnf, w.output, m.tgt, tensor.Buffer{}, m.headShape())
	}
	m.release(last, false)
	if targets == nil {
		return 0
	}
	if m.tp != nil {
		m.crossEntropy(a.losses, a.probs, a.logits, m.tgt)
	}
	if !m.fused {
		be.LossSum(loss, a.losses, m.tgt, accumulate)
	}
	for _, t := range m.tgtHost { // the targets as uploaded: document masks may ignore some
		if t >= 0 {
			count++
		}
	}
	return count
}

// upload writes a micro-batch's token ids and targets (nil: none) into the
// model's int32 buffers, which the kernels read; false, with the error kept
// for Err, when their lengths are not the model's B·T.
func (m *Model[F]) upload(tokens, targets []int32) bool {
	n := len(m.tokHost)
	if len(tokens) != n || (targets != nil && len(targets) != n) {
		if m.hookErr == nil {
			m.hookErr = fmt.Errorf("model: a micro-batch of %d tokens and %d targets where the model runs %d (B·T per rank)", len(tokens), len(targets), n)
		}
		return false
	}
	copy(m.tokHost, tokens)
	m.mem.Write(m.tok, m.tokAny)
	if targets != nil {
		copy(m.tgtHost, targets)
		m.maskLoss()
		m.mem.Write(m.tgt, m.tgtAny)
	}
	return true
}

// Loss runs Forward on tokens and targets and reads the loss sum back from a
// buffer of the model's memory (a counted read-back): the sum and the tokens
// counted, for code that wants one batch's loss on the host (tests, checks
// against another engine), not for training steps.
func (m *Model[F]) Loss(tokens, targets []int32) (sum float64, count int) {
	buf := m.mem.Alloc(tensor.Float64, 1)
	defer m.mem.Free(buf)
	count = m.Forward(tokens, targets, buf, false)
	var s [1]float64
	m.mem.Read(s[:], buf)
	return s[0], count
}

// ActivationBytes is what the model holds for backward (per layer activations, the
// final norm, with bf16 storage the work set and the layers' bf16 stores, and
// the int32 token ids, targets and MoE routing) and for the output (logits and
// probabilities), in bytes.
func (m *Model[F]) ActivationBytes() (activations, logits int64) {
	a := &m.a
	seen := map[tensor.Storage]bool{} // buffers shared by layers (recompute, the bf16 work set) count once
	var n int64
	for _, set := range [][]tensor.Buffer{a.resid, a.ln1, a.q, a.k, a.v, a.att, a.atty, a.mid, a.ln2, a.gate, a.up, a.sw, a.rstd1, a.rstd2, a.rstdq, a.rstdk} {
		n += held(seen, set...)
	}
	n += held(seen, a.final, a.lnf, a.rstdf)
	for _, ma := range a.moe {
		if ma != nil {
			n += held(seen, ma.floats()...)
		}
	}
	activations = n
	if m.st != nil {
		activations += m.st.bytes()
	}
	// int32: the micro-batch's token ids and targets, each MoE layer's routing
	// and local segments, the padded experts' static segments.
	ints := held(seen, m.tok, m.tgt, m.padSeg, m.startsBuf())
	for _, ma := range a.moe {
		if ma != nil {
			ints += held(seen, ma.ints()...)
		}
	}
	activations += ints
	return activations, held(seen, a.logits, a.probs, a.head, a.losses)
}

// elemBytes is the size of one F.
func elemBytes[F tensor.Float]() int64 {
	var zero F
	if any(zero) == any(float64(0)) {
		return 8
	}
	return 4
}

// ScratchBytes is what the model holds beside its activations, logits and
// dispatch buffers: backward's work buffers (one layer's activation gradients,
// the per-token loss gradient; the logits' gradient is written over the
// probabilities), tensor and context parallelism's gather and ring
// buffers, and the RoPE tables, in bytes (parallel's scratch component).
func (m *Model[F]) ScratchBytes() int64 {
	s := &m.scratch
	bufs := []tensor.Buffer{s.dres, s.dx, s.dq, s.dk, s.dv, s.datty, s.dff1, s.dff2, s.dsw, s.dloss, s.dqk,
		s.moeDlogits, s.moeDprobs, s.moeDgates, s.moeDy, s.moeDx, s.moeDh, s.moeDg, s.moeDu, s.moeSh, s.moeSg, s.moeSu,
		m.cos, m.sin, m.ones}
	bufs = append(bufs, m.loads, m.biasF)
	bufs = append(bufs, m.fp8Buffers()...)
	if p := m.tp; p != nil {
		bufs = append(bufs, p.gx, p.gd, p.px, p.red, p.gnorm, p.grouter, p.lse, p.lseAll, p.tlogit, p.gqk)
	}
	if p := m.cp; p != nil {
		bufs = append(bufs, p.ring[0], p.ring[1], p.pd, p.out, p.lse)
	}
	if p := m.docs; p != nil {
		bufs = append(bufs, p.ends)
	}
	return held(map[tensor.Storage]bool{}, bufs...)
}

// DispatchBytes is what expert parallelism's token exchange holds beside the
// layers' activations: the rows received in arrival order and the experts'
// outputs before they go back (one pair, shared by every MoE layer; the
// backward's exchange of gradients runs through the same pair), in bytes.
func (m *Model[F]) DispatchBytes() int64 {
	return held(map[tensor.Storage]bool{}, m.scratch.moeRecv, m.scratch.moeYloc)
}

// MoESums is the f64 buffer (2 values) where the last forward pass left, summed
// over its MoE layers, the load-balancing loss (without model.moe.aux_loss_coeff)
// and the routed copies dropped past expert capacity; the empty Buffer for a
// dense model. The trainer adds it into its step statistics on the backend.
func (m *Model[F]) MoESums() tensor.Buffer { return m.moeSums }

// AuxLoss reads back the load-balancing loss of the last forward pass, summed
// over MoE layers and multiplied by model.moe.aux_loss_coeff (0 for dense
// models): one counted read-back, for checks and tests (training adds MoESums
// on the backend instead).
func (m *Model[F]) AuxLoss() float64 { return m.readMoESums()[0] * m.Cfg.MoE.AuxLossCoeff }

// Dropped reads back the routed token copies the last forward dropped past
// expert capacity, over all MoE layers (as AuxLoss).
func (m *Model[F]) Dropped() int { return int(m.readMoESums()[1]) }

func (m *Model[F]) readMoESums() (v [2]float64) {
	if m.moeSums.Len() == 2 {
		m.mem.Read(v[:], m.moeSums)
	}
	return v
}

// layerForward runs layer l from its input x into next (the next layer's input):
// next = mid + MLP(norm(mid)), mid = x + attention(norm(x)).
func (m *Model[F]) layerForward(l int, x, next tensor.Buffer) {
	be, a := m.be, &m.a
	lw := m.w.layers[l]
	BT, C, NH, NKV, HD, FF, _ := m.dims()
	eps := m.Cfg.NormEps
	be.RMSNorm(a.ln1[l], a.rstd1[l], x, lw.attnNorm, m.rows(), C, eps)
	ln1 := m.fp8Input(l, inLn1, m.input(l, inLn1, a.ln1[l], true))
	if m.Cfg.QKNorm {
		// QK-norm: the projections go to scratch (backward makes them again
		// from ln1), their per-head RMSNorm into q and k.
		raw := m.scratch.datty
		m.matmul(l, pQ, raw, ln1, lw.wq, tensor.MatmulShape{BT: BT, C: C, OC: NH * HD}, false)
		be.RMSNorm(a.q[l], a.rstdq[l], raw, lw.qNorm, BT*NH, HD, eps)
		raw = raw.Slice(0, BT*NKV*HD)
		m.matmul(l, pK, raw, ln1, lw.wk, tensor.MatmulShape{BT: BT, C: C, OC: NKV * HD}, false)
		be.RMSNorm(a.k[l], a.rstdk[l], raw, lw.kNorm, BT*NKV, HD, eps)
	} else {
		m.matmul(l, pQ, a.q[l], ln1, lw.wq, tensor.MatmulShape{BT: BT, C: C, OC: NH * HD}, false)
		m.matmul(l, pK, a.k[l], ln1, lw.wk, tensor.MatmulShape{BT: BT, C: C, OC: NKV * HD}, false)
	}
	m.matmul(l, pV, a.v[l], ln1, lw.wv, tensor.MatmulShape{BT: BT, C: C, OC: NKV * HD}, false)
	switch {
	case m.Cfg.IsNoPELayer(l): // NoPE: no rotary embedding
	case m.cp != nil:
		m.rope(a.q[l], NH, false)
		m.rope(a.k[l], NKV, false)
	default:
		be.Rope(a.q[l], m.cos, m.sin, tensor.RopeShape{B: m.B, T: m.T, NH: NH, HD: HD})
		be.Rope(a.k[l], m.cos, m.sin, tensor.RopeShape{B: m.B, T: m.T, NH: NKV, HD: HD})
	}
	if m.cp != nil {
		m.ringAttention(l, a.atty[l], a.att[l], a.q[l], a.k[l], a.v[l])
	} else {
		be.FlashAttention(a.atty[l], a.att[l], a.q[l], a.k[l], a.v[l], m.attnShape(l))
	}
	m.mem.Copy(a.mid[l], x)
	m.rowProduct(l, pO, a.mid[l], m.fp8Input(l, inAtty, m.input(l, inAtty, a.atty[l], true)), lw.wo, NH*HD) // mid = x + attention
	m.roundKept(l, &a.mid[l])
	be.RMSNorm(a.ln2[l], a.rstd2[l], a.mid[l], lw.mlpNorm, m.rows(), C, eps)
	m.mem.Copy(next, a.mid[l])
	if lw.moe != nil {
		m.moeForward(l, next, a.ln2[l], *lw.moe, a.moe[l]) // next = mid + MoE
		return
	}
	ln2 := m.fp8Input(l, inLn2, m.input(l, inLn2, a.ln2[l], true))
	m.matmul(l, pW1, a.gate[l], ln2, lw.w1, tensor.MatmulShape{BT: BT, C: C, OC: FF}, false)
	m.matmul(l, pW3, a.up[l], ln2, lw.w3, tensor.MatmulShape{BT: BT, C: C, OC: FF}, false)
	m.roundKept(l, &a.gate[l])
	m.roundKept(l, &a.up[l])
	be.SwiGLU(a.sw[l], a.gate[l], a.up[l], BT*FF)
	m.rowProduct(l, pW2, next, m.fp8Input(l, inSw, m.input(l, inSw, a.sw[l], true)), lw.w2, FF) // next = mid + MLP
}

// remake redoes, before layer l's backward under selective recompute, what
// the layer did not keep: the norms' outputs (from its input and the residual
// after attention, with their reciprocal RMS, the same values again) and a
// dense layer's SwiGLU product, into the buffers every layer shares; with
// bf16 stores the products' inputs are rounded into theirs again. What they
// are remade from holds the values the forward read (roundKept), so the
// remade activations equal the forward's bit for bit.
func (m *Model[F]) remake(l int, x tensor.Buffer) {
	be, a := m.be, &m.a
	lw := m.w.layers[l]
	BT, C, _, _, _, FF, _ := m.dims()
	be.RMSNorm(a.ln1[l], a.rstd1[l], x, lw.attnNorm, m.rows(), C, m.Cfg.NormEps)
	be.RMSNorm(a.ln2[l], a.rstd2[l], a.mid[l], lw.mlpNorm, m.rows(), C, m.Cfg.NormEps)
	if lw.moe == nil {
		be.SwiGLU(a.sw[l], a.gate[l], a.up[l], BT*FF)
	}
	if m.st == nil {
		return // the products read the remade buffers (gathered under tensor parallelism)
	}
	for _, in := range [...]struct {
		which int
		x     tensor.Buffer
	}{{inLn1, a.ln1[l]}, {inLn2, a.ln2[l]}, {inSw, a.sw[l]}} {
		if m.st.in[l][in.which].Storage() != nil {
			m.input(l, in.which, in.x, true)
		}
	}
}

// ForwardLogits runs Forward on tokens without targets and makes the logits
// of rows lo..hi−1 of the micro-batch (this rank's vocabulary rows under
// tensor parallelism), while the output head is held, for ReadLogits: at most
// LogitRows rows. Every rank of a group runs it together (a rank that wants
// no row passes lo = hi).
func (m *Model[F]) ForwardLogits(tokens []int32, lo, hi int) {
	if lo < 0 || hi < lo || hi > m.B*m.T || hi-lo > m.LogitRows() {
		if m.hookErr == nil {
			m.hookErr = fmt.Errorf("model: logits of rows %d..%d of %d, at most %d at a time", lo, hi, m.B*m.T, m.LogitRows())
		}
		return
	}
	m.logitRows = [2]int{lo, hi}
	m.Forward(tokens, nil, tensor.Buffer{}, false)
}

// LogitRows is how many rows' logits ForwardLogits makes at a time: the
// output head's chunk (parallel.HeadRows), or every row under tensor
// parallelism, which keeps whole logits.
func (m *Model[F]) LogitRows() int {
	if m.tp != nil {
		return m.B * m.T
	}
	return m.headShape().Rows
}

// headShape is the output head over this rank's rows.
func (m *Model[F]) headShape() tensor.HeadShape {
	BT, C, _, _, _, _, V := m.dims()
	return tensor.HeadShape{BT: BT, C: C, V: V, Rows: int(parallel.HeadRows(int64(BT), int64(V)))}
}

// headLogits makes the logits of ForwardLogits' rows in the head's work.
func (m *Model[F]) headLogits() {
	lo, hi := m.logitRows[0], m.logitRows[1]
	if hi > lo {
		C, V := m.Cfg.Hidden, m.Cfg.VocabSize
		m.be.Matmul(m.a.head.Slice(0, (hi-lo)*V), m.a.lnf.Slice(lo*C, hi*C), m.w.output, tensor.MatmulShape{BT: hi - lo, C: C, OC: V}, false)
	}
}

// ReadLogits reads back len(dst) of the logits ForwardLogits made, from
// element off of its rows (row lo's first entry is 0): a counted read-back,
// for sampling and checks, not for training steps.
func (m *Model[F]) ReadLogits(dst []F, off int) {
	if m.tp != nil {
		off += m.logitRows[0] * m.Cfg.VocabSize / m.tp.Size
		m.mem.Read(dst, m.a.logits.Slice(off, off+len(dst)))
		return
	}
	m.mem.Read(dst, m.a.head.Slice(off, off+len(dst)))
}

// ForwardBackward is Forward (with targets) then Backward(tokens, targets,
// scale) with the output head's loss and gradient made together, a chunk of
// rows at a time (tensor.Kernels.HeadLoss): the training step's path, one
// product and one pass over the logits fewer than the two apart. It returns
// Forward's token count; the loss sum is added to loss as Forward's.
func (m *Model[F]) ForwardBackward(tokens, targets []int32, loss tensor.Buffer, accumulate bool, scale float64) (count int) {
	m.recordFP8(true) // a training pass: delayed scaling records its casts' amaxes (backward ends it)
	if m.tp != nil || targets == nil {
		count = m.Forward(tokens, targets, loss, accumulate)
		m.Backward(tokens, targets, scale)
		return count
	}
	m.fused = true
	count = m.Forward(tokens, targets, loss, accumulate)
	m.fused = false
	m.backward(tokens, targets, scale, loss, accumulate, true)
	return count
}

// Backward accumulates into the gradient views the gradient of scale · Σ token
// losses of the last Forward (scale = 1/global token count gives the per-token
// mean over the whole global batch). Forward must have run with the same
// tokens and targets; they are uploaded again (the embedding's and the loss's
// backward read them), and a misfit batch runs nothing (Err says why).
func (m *Model[F]) Backward(tokens, targets []int32, scale float64) {
	m.backward(tokens, targets, scale, tensor.Buffer{}, false, false)
}

// backward is Backward; with fused (ForwardBackward) the output head's loss is
// made here with its gradient and added to loss as Forward adds it.
func (m *Model[F]) backward(tokens, targets []int32, scale float64, loss tensor.Buffer, accumulate, fused bool) {
	m.recordFP8(true)
	m.fp8Backward(true)
	defer func() { m.recordFP8(false); m.fp8Backward(false) }()
	if !m.upload(tokens, targets) {
		return
	}
	be, a, w, g, s := m.be, &m.a, &m.w, &m.g, &m.scratch
	BT, C, NH, NKV, HD, FF, V := m.dims()
	m.mem.Fill(s.dloss, scale)
	last := len(m.blocks) - 1
	if m.tp != nil {
		dlogits := a.probs // the logits' gradient, written over the probabilities it is made from
		m.crossEntropyBackward(dlogits, s.dloss, a.probs, m.tgt)
		m.acquire(last, true)
		be.MatmulBackward(m.inputGrad(s.dx), g.output, dlogits, m.gather(a.lnf), w.output, tensor.MatmulShape{BT: BT, C: C, OC: V}, false)
	} else {
		// The logits are made again, a chunk of rows at a time, with their
		// loss (again, or for the first time when fused) and gradient.
		m.acquire(last, true)
		be.HeadLoss(a.losses, s.dx, g.output, a.head, a.lnf, w.output, m.tgt, s.dloss, m.headShape())
		if fused {
			be.LossSum(loss, a.losses, m.tgt, accumulate)
		}
	}
	dres := s.dres // gradient of the residual stream entering the current point
	m.normBackward(dres, g.norm, m.scatterGrad(s.dx), a.final, w.norm, a.rstdf, false)
	m.release(last, true)
	for l := len(w.layers) - 1; l >= 0; l-- {
		m.acquire(1+l, true) // one gather serves the recompute and the backward
		if m.st != nil {
			m.unpack(l, a.resid[l])
		}
		if m.recompute == "selective" {
			m.remake(l, a.resid[l])
		}
		if m.recompute == "full" {
			// Rebuild the layer's intermediates from its saved input. Writing its
			// output again is harmless: the next layer's backward has run.
			next := a.final
			if l+1 < len(w.layers) {
				next = a.resid[l+1]
			}
			m.recomputing = true // the MoE sums keep the forward's
			m.layerForward(l, a.resid[l], next)
			m.recomputing = false
		}
		lw, lg := w.layers[l], g.layers[l]
		if lw.moe != nil {
			m.mem.Zero(s.dx)
			// next = mid + MoE(ln2); the aux loss of this micro-batch is weighted by its
			// share of the global batch's tokens (scale·BT, BT counting the whole
			// sequences under context parallelism).
			m.moeBackward(l, s.dx, dres, a.ln2[l], *lw.moe, *lg.moe, a.moe[l], scale*float64(BT*m.cpSize()))
		} else {
			// MLP: next = mid + w2·swiglu(w1·ln2, w3·ln2); dres flows to mid unchanged.
			m.matmulBackward(l, pW2, s.dsw, lg.w2, m.gatherGrad(dres), m.fp8Input(l, inSw, m.input(l, inSw, a.sw[l], false)), lw.w2, tensor.MatmulShape{BT: BT, C: FF, OC: C}, false)
			be.SwiGLUBackward(s.dff1, s.dff2, s.dsw, a.gate[l], a.up[l], BT*FF, false)
			ln2, dx := m.fp8Input(l, inLn2, m.input(l, inLn2, a.ln2[l], false)), m.inputGrad(s.dx)
			m.matmulBackward(l, pW1, dx, lg.w1, s.dff1, ln2, lw.w1, tensor.MatmulShape{BT: BT, C: C, OC: FF}, false)
			m.matmulBackward(l, pW3, dx, lg.w3, s.dff2, ln2, lw.w3, tensor.MatmulShape{BT: BT, C: C, OC: FF}, true)
			m.scatterGrad(s.dx)
		}
		m.normBackward(dres, lg.mlpNorm, s.dx, a.mid[l], lw.mlpNorm, a.rstd2[l], true)
		// Attention: mid = x + wo·attention(rope(wq·ln1), rope(wk·ln1), wv·ln1).
		m.matmulBackward(l, pO, s.datty, lg.wo, m.gatherGrad(dres), m.fp8Input(l, inAtty, m.input(l, inAtty, a.atty[l], false)), lw.wo, tensor.MatmulShape{BT: BT, C: NH * HD, OC: C}, false)
		if m.cp != nil {
			// The ring adds each key block's share into dq, dk and dv.
			m.mem.Zero(s.dq)
			m.mem.Zero(s.dk)
			m.mem.Zero(s.dv)
			m.ringAttentionBackward(l, s.dq, s.dk, s.dv, s.datty, a.atty[l], a.att[l], a.q[l], a.k[l], a.v[l])
		} else {
			be.FlashAttentionBackward(s.dq, s.dk, s.dv, s.datty, a.atty[l], a.att[l], a.q[l], a.k[l], a.v[l], m.attnShape(l), false)
		}
		switch {
		case m.Cfg.IsNoPELayer(l):
		case m.cp != nil:
			m.rope(s.dq, NH, true)
			m.rope(s.dk, NKV, true)
		default:
			be.RopeBackward(s.dq, m.cos, m.sin, tensor.RopeShape{B: m.B, T: m.T, NH: NH, HD: HD})
			be.RopeBackward(s.dk, m.cos, m.sin, tensor.RopeShape{B: m.B, T: m.T, NH: NKV, HD: HD})
		}
		ln1, dx := m.fp8Input(l, inLn1, m.input(l, inLn1, a.ln1[l], false)), m.inputGrad(s.dx)
		if m.Cfg.QKNorm {
			// Through QK-norm: its inputs made again in datty (free once
			// attention's backward has run), its input gradient in dqk.
			raw, d := s.datty, s.dqk
			m.matmul(l, pQ, raw, ln1, lw.wq, tensor.MatmulShape{BT: BT, C: C, OC: NH * HD}, false)
			m.headNormBackward(d, lg.qNorm, s.dq, raw, lw.qNorm, a.rstdq[l], BT*NH)
			m.matmulBackward(l, pQ, dx, lg.wq, d, ln1, lw.wq, tensor.MatmulShape{BT: BT, C: C, OC: NH * HD}, false)
			raw, d = raw.Slice(0, BT*NKV*HD), d.Slice(0, BT*NKV*HD)
			m.matmul(l, pK, raw, ln1, lw.wk, tensor.MatmulShape{BT: BT, C: C, OC: NKV * HD}, false)
			m.headNormBackward(d, lg.kNorm, s.dk, raw, lw.kNorm, a.rstdk[l], BT*NKV)
			m.matmulBackward(l, pK, dx, lg.wk, d, ln1, lw.wk, tensor.MatmulShape{BT: BT, C: C, OC: NKV * HD}, true)
		} else {
			m.matmulBackward(l, pQ, dx, lg.wq, s.dq, ln1, lw.wq, tensor.MatmulShape{BT: BT, C: C, OC: NH * HD}, false)
			m.matmulBackward(l, pK, dx, lg.wk, s.dk, ln1, lw.wk, tensor.MatmulShape{BT: BT, C: C, OC: NKV * HD}, true)
		}
		m.matmulBackward(l, pV, dx, lg.wv, s.dv, ln1, lw.wv, tensor.MatmulShape{BT: BT, C: C, OC: NKV * HD}, true)
		m.normBackward(dres, lg.attnNorm, m.scatterGrad(s.dx), a.resid[l], lw.attnNorm, a.rstd1[l], true)
		m.release(1+l, true)
	}
	m.acquire(0, true)
	m.embedBackward(dres, m.tok)
	m.release(0, true)
}

// attnShape is layer l's causal self-attention for flash attention, within
// chunks (model.attention_chunk_size, on rotary layers only when the model has
// NoPE layers: config.Model.AttentionChunk) and documents (document masks)
// where those are set.
func (m *Model[F]) attnShape(l int) tensor.AttentionShape {
	_, _, NH, NKV, HD, _, _ := m.dims()
	return tensor.AttentionShape{B: m.B, Tq: m.T, Tk: m.T, NH: NH, NKV: NKV, HD: HD, Causal: true,
		Chunk: m.Cfg.AttentionChunk(l), Starts: m.startsBuf()}
}

// RopeScaling is the model's RoPE frequency scaling (model.rope_scaling and
// its four numbers) as tensor.RopeInvFreq takes it: the inverse frequencies
// every backend's RopeTables turns into the cos and sin tables.
func RopeScaling(c config.Model) tensor.RopeScaling {
	return tensor.RopeScaling{Type: c.RopeScaling, Factor: c.RopeScalingFactor, LowFreqFactor: c.RopeScalingLowFreqFactor,
		HighFreqFactor: c.RopeScalingHighFreqFactor, OriginalMaxPositions: float64(c.RopeScalingOriginalMaxPositionEmbeddings)}
}
