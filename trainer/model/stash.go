package model

import "github.com/shardline/shardline/tensor"

// bf16 activation storage (WithBF16Activations). A bf16 run keeps what each layer
// saves for its backward in bf16: the layer's input (the residual stream), its
// norms' outputs, q, k, v, the attention output, the residual after attention,
// the MLP's gate, up and product, attention probabilities where they are kept,
// and an MoE layer's permuted inputs, expert intermediates and outputs. The
// kernels still compute in F: one layer's set of F buffers (the work set) serves
// every layer, the layer's forward writes into it, and right after the layer the
// set is rounded into that layer's bf16 store; before the layer's backward the
// store is widened back into the work set. What stays in F, per layer: the
// norms' reciprocal RMS, flash attention's log-sum-exps (a bf16 log-sum-exp
// would move every remade probability by up to 2⁻⁸ of its logit), the MoE
// router's logits, probabilities and gates. The residual stream a layer reads is
// itself rounded to bf16 before the layer runs, so a layer's backward sees the
// input its forward saw; within a layer, a kernel reads the F values the kernel
// before it wrote (the stores hold those values rounded).
//
// Under full recompute only the residual stream is stored (in bf16); everything
// else is remade from it, in F, as without bf16 storage.

// stashSlot is one saved activation of one layer: its F buffer in the work set
// (through a pointer: expert parallelism may grow a buffer) and its bf16 store.
type stashSlot[F tensor.Float] struct {
	work  *[]F
	store []tensor.BF16
}

// stash holds every layer's bf16 stores: resid[l] is layer l's input, slots[l]
// the rest of what it keeps.
type stash[F tensor.Float] struct {
	resid [][]tensor.BF16
	slots [][]stashSlot[F]
}

// WithBF16Activations keeps each layer's saved activations in bf16 storage (see
// the comment at the top of stash.go). It needs float32.
func WithBF16Activations() Option { return func(o *options) { o.bf16Acts = true } }

// allocStash makes the bf16 stores of every layer's input and, unless full
// recompute remakes them, of what the layer keeps.
func (m *Model[F]) allocStash() {
	a, L := &m.a, m.Cfg.Layers
	s := m.st
	s.resid, s.slots = make([][]tensor.BF16, L), make([][]stashSlot[F], L)
	for l := 0; l < L; l++ {
		s.resid[l] = make([]tensor.BF16, len(a.resid[l]))
		if m.recompute == "full" {
			continue
		}
		for _, w := range []*[]F{&a.ln1[l], &a.q[l], &a.k[l], &a.v[l], &a.atty[l], &a.mid[l], &a.ln2[l], &a.gate[l], &a.up[l], &a.sw[l]} {
			if len(*w) > 0 { // an MoE layer has no MLP buffers
				s.keep(l, w)
			}
		}
		if !m.flash && m.recompute == "none" {
			s.keep(l, &a.att[l]) // the attention probabilities
		}
		if ma := a.moe[l]; ma != nil {
			for _, w := range ma.kept() {
				s.keep(l, w)
			}
		}
	}
}

// keep adds work (layer l's buffer) to the layer's slots, with a store of its length.
func (s *stash[F]) keep(l int, work *[]F) {
	s.slots[l] = append(s.slots[l], stashSlot[F]{work: work, store: make([]tensor.BF16, len(*work))})
}

// roundInput rounds x, layer l's input, to bf16 in place and keeps it in the
// layer's store.
func (m *Model[F]) roundInput(l int, x []F) {
	h := m.st.resid[l]
	m.be.ToBF16(h, x)
	m.be.FromBF16(x, h)
}

// pack rounds layer l's saved activations into its stores (after its forward).
func (m *Model[F]) pack(l int) {
	for i := range m.st.slots[l] {
		sl := &m.st.slots[l][i]
		w := *sl.work
		if len(w) > len(sl.store) {
			sl.store = make([]tensor.BF16, len(w)) // an expert buffer grown past its start
		}
		m.be.ToBF16(sl.store[:len(w)], w)
	}
}

// unpack widens layer l's stores into the work set (before its backward); x is
// the layer's input buffer.
func (m *Model[F]) unpack(l int, x []F) {
	m.be.FromBF16(x, m.st.resid[l])
	for _, sl := range m.st.slots[l] {
		w := *sl.work
		m.be.FromBF16(w, sl.store[:len(w)])
	}
}

// stashBytes is what the stores hold, in bytes.
func (s *stash[F]) bytes() int64 {
	var n int64
	for l := range s.resid {
		n += int64(len(s.resid[l]))
		for _, sl := range s.slots[l] {
			n += int64(len(sl.store))
		}
	}
	return 2 * n
}
