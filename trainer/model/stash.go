package model

import "github.com/shardline/shardline/tensor"

// bf16 activation storage (WithBF16Activations). A bf16 run keeps what each layer
// saves for its backward in bf16: the layer's input (the residual stream), its
// norms' outputs, q, k, v, the attention output, the residual after attention,
// the MLP's gate, up and product, attention probabilities where they are kept,
// and an MoE layer's experts' inputs (permuted or received tokens),
// intermediates and outputs. The kernels still compute in F: one layer's set of
// F buffers (the work set) serves every layer and the layer's forward writes
// into it. The inputs of the layer's products (input, expertIn) are rounded into
// their stores as soon as they are made and the products read the stores, in
// forward and in backward; the rest of the set is rounded into the layer's
// stores right after its forward (pack) and widened back into the work set
// before its backward (unpack). What stays in F, per layer: the norms'
// reciprocal RMS, flash attention's log-sum-exps (a bf16 log-sum-exp would move
// every remade probability by up to 2⁻⁸ of its logit), the MoE router's logits,
// probabilities and gates. The residual stream a layer reads is itself rounded
// to bf16 before the layer runs, so a layer's backward sees the input its
// forward saw.
//
// Under full recompute only the residual stream is stored (in bf16); everything
// else is remade from it, in F, as without bf16 storage.

// stashSlot is one saved activation of one layer: its F buffer in the work set
// (through a pointer: expert parallelism may grow a buffer) and its bf16 store.
// An early slot is a matmul's input, rounded into its store as soon as it is
// made so that the products read the store (input); a direct one is read from
// its store in backward too (by the weight gradient's product) and never
// widened back.
type stashSlot struct {
	work          *tensor.Buffer
	store         tensor.Buffer
	early, direct bool
}

// stash holds every layer's bf16 stores, bf16 buffers of the model's memory:
// resid[l] is layer l's input, slots[l] the rest of what it keeps, in[l] the
// stores its products read (empty where the products read F buffers).
type stash struct {
	resid []tensor.Buffer
	slots [][]stashSlot
	in    [][numInputs]tensor.Buffer
	// shared are the stores of the products' inputs that selective
	// recompute remakes (normed inputs, SwiGLU product): one each, which
	// every layer's in takes in turn.
	shared [numInputs]tensor.Buffer
}

// The saved activations a dense layer's products read: the attention's input
// (normed), the attention output, the MLP's input (normed), the SwiGLU product.
const (
	inLn1 = iota
	inAtty
	inLn2
	inSw
	numInputs
)

// input is what layer l's products read for activation x (its input of kind
// which): without bf16 stores x itself, gathered over the tensor-parallel group
// where it is row-sharded (the normed inputs); with them its store, which
// fresh (in the forward) rounds x into first.
func (m *Model[F]) input(l, which int, x tensor.Buffer, fresh bool) tensor.Buffer {
	if m.st != nil && m.st.in[l][which].Storage() != nil {
		h := m.st.in[l][which]
		if fresh {
			m.mem.Copy(h, x)
		}
		return h
	}
	if which == inLn1 || which == inLn2 {
		x = m.gather(x)
	}
	return x
}

// WithBF16Activations keeps each layer's saved activations in bf16 storage (see
// the comment at the top of stash.go), or, where the backend computes in bf16
// storage and the model runs only kernels that take bf16 activations
// (nativeBF16), every activation and activation gradient in bf16 buffers with
// no stores (BF16Native). It needs float32.
func WithBF16Activations() Option { return func(o *options) { o.bf16Acts = true } }

// allocStash makes the bf16 stores of every layer's input and, unless full
// recompute remakes them, of what the layer keeps.
func (m *Model[F]) allocStash() {
	a, L := &m.a, m.Cfg.Layers
	s := m.st
	s.resid, s.slots, s.in = make([]tensor.Buffer, L), make([][]stashSlot, L), make([][numInputs]tensor.Buffer, L)
	for l := 0; l < L; l++ {
		s.resid[l] = m.mem.Alloc(tensor.BFloat16, a.resid[l].Len())
		if m.recompute == "full" {
			continue
		}
		for _, w := range []*tensor.Buffer{&a.q[l], &a.k[l], &a.v[l], &a.mid[l], &a.gate[l], &a.up[l]} {
			if w.Len() > 0 { // an MoE layer has no MLP buffers
				m.keep(l, w)
			}
		}
		// The products read their inputs from the stores, except under tensor
		// parallelism (the normed inputs are gathered) and in an MoE layer's
		// block (its input is dispatched). Backward widens the attention output
		// all the same: attention's backward reads it (flash, the ring).
		direct := m.tp == nil
		for which, w := range [numInputs]*tensor.Buffer{inLn1: &a.ln1[l], inAtty: &a.atty[l], inLn2: &a.ln2[l], inSw: &a.sw[l]} {
			if w.Len() == 0 {
				continue
			}
			d := direct && !(which == inLn2 && a.moe[l] != nil)
			if which != inAtty && m.recompute == "selective" {
				// Remade before the layer's backward (remake): no store of its
				// own; a product's input is rounded into one every layer shares.
				if d {
					if s.shared[which].Storage() == nil {
						s.shared[which] = m.mem.Alloc(tensor.BFloat16, w.Len())
					}
					s.in[l][which] = s.shared[which]
				}
				continue
			}
			m.keep(l, w)
			sl := &s.slots[l][len(s.slots[l])-1]
			sl.early, sl.direct = d, d && which != inAtty
			if d {
				s.in[l][which] = sl.store
			}
		}
		if ma := a.moe[l]; ma != nil {
			for _, w := range ma.kept() {
				m.keep(l, w)
			}
			// The experts' products read their inputs and SwiGLU products from the
			// stores (expertIn), rounded as they are made; nothing widens them back.
			in := &ma.x
			if ma.xloc.Storage() != nil {
				in = &ma.xloc
			}
			for i := range s.slots[l] {
				switch sl := &s.slots[l][i]; sl.work {
				case in:
					sl.early, sl.direct, ma.xs = true, true, sl
				case &ma.sw:
					sl.early, sl.direct, ma.sws = true, true, sl
				}
			}
		}
	}
}

// roundKept rounds layer l's kept activation *w to bf16 in place (through its
// store, which pack fills again later), under selective recompute with bf16
// stores: what the remade activations are made from must hold in the forward
// the values the backward widens from the stores (remake).
func (m *Model[F]) roundKept(l int, w *tensor.Buffer) {
	if m.st == nil || m.recompute != "selective" {
		return
	}
	for _, sl := range m.st.slots[l] {
		if sl.work == w {
			h := sl.store.Slice(0, w.Len())
			m.mem.Copy(h, *w)
			m.mem.Copy(*w, h)
			return
		}
	}
}

// keep adds work (layer l's buffer) to the layer's slots, with a store of its length.
func (m *Model[F]) keep(l int, work *tensor.Buffer) {
	m.st.slots[l] = append(m.st.slots[l], stashSlot{work: work, store: m.mem.Alloc(tensor.BFloat16, work.Len())})
}

// fit makes sl's store hold n values (a new store in place of the old: an
// expert buffer grown with the tokens received under expert parallelism).
func (m *Model[F]) fit(sl *stashSlot, n int) {
	if sl.store.Len() < n {
		m.mem.Free(sl.store)
		sl.store = m.mem.Alloc(tensor.BFloat16, n)
	}
}

// expertIn is what an expert's product reads for elements [lo, hi) of x (the
// experts' inputs or SwiGLU products, whose slot is sl): x itself without bf16
// stores, else the slot's store, into which fresh first rounds those elements.
func (m *Model[F]) expertIn(sl *stashSlot, x tensor.Buffer, lo, hi int, fresh bool) tensor.Buffer {
	if sl == nil {
		return x.Slice(lo, hi)
	}
	m.fit(sl, x.Len())
	h := sl.store.Slice(lo, hi)
	if fresh {
		m.mem.Copy(h, x.Slice(lo, hi))
	}
	return h
}

// roundInput rounds x, layer l's input, to bf16 in place and keeps it in the
// layer's store.
func (m *Model[F]) roundInput(l int, x tensor.Buffer) {
	h := m.st.resid[l]
	m.mem.Copy(h, x)
	m.mem.Copy(x, h)
}

// pack rounds layer l's saved activations into its stores (after its forward).
func (m *Model[F]) pack(l int) {
	for i := range m.st.slots[l] {
		sl := &m.st.slots[l][i]
		if sl.early {
			continue // rounded into its store when it was made
		}
		w := *sl.work
		m.fit(sl, w.Len())
		m.mem.Copy(sl.store.Slice(0, w.Len()), w)
	}
}

// unpack widens layer l's stores into the work set (before its backward); x is
// the layer's input buffer. A work buffer that grew after the layer's forward
// (expert parallelism: a later layer received more tokens) is longer than the
// layer's store, whose values it takes from the start.
func (m *Model[F]) unpack(l int, x tensor.Buffer) {
	m.mem.Copy(x, m.st.resid[l])
	for _, sl := range m.st.slots[l] {
		if sl.direct {
			continue // backward reads the store
		}
		n := min(sl.work.Len(), sl.store.Len())
		m.mem.Copy(sl.work.Slice(0, n), sl.store.Slice(0, n))
	}
}

// bytes is what the stores hold, in bytes.
func (s *stash) bytes() int64 {
	var n int64
	for l := range s.resid {
		n += int64(s.resid[l].Len())
		for _, sl := range s.slots[l] {
			n += int64(sl.store.Len())
		}
	}
	for _, b := range s.shared {
		n += int64(b.Len())
	}
	return 2 * n
}
