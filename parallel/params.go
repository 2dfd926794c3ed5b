package parallel

import (
	"fmt"
	"strconv"

	"github.com/shardline/shardline/config"
)

// Module kinds, as fsdp_unit_modules names them.
const (
	ModEmbedding = "embedding"
	ModLayer     = "transformer_layer"
	ModAttention = "attention"
	ModMLP       = "mlp"
	ModMoE       = "moe"
	ModOutput    = "output"
)

// Param is one row of the model's parameter table: the one place that names the
// model's parameters, their shapes and how they are partitioned. The trainer's model
// code builds its views from it.
type Param struct {
	Name string
	// Shape is the full shape, (out, in) for matrices as in y = x·Wᵀ.
	Shape []int
	// LocalShape is the shape one rank holds after tensor (or expert-tensor)
	// parallel partitioning, before FSDP sharding.
	LocalShape []int
	// Expert parameters belong to one routed expert (Expert ≥ 0); dense ones have -1.
	Expert int
	// Layer is the transformer layer, or -1 for the embedding and the output.
	Layer int
	// Modules are the enclosing modules, innermost first: (kind, path).
	Modules []Module
	// NoDecay marks norm gains and embeddings (no weight decay unless asked).
	NoDecay bool
	// Balance marks an MoE layer's expert bias (model.moe.expert_bias): no
	// gradient reaches it and the optimizer leaves it as it is (never
	// decayed); the trainer moves it between steps from the experts' loads.
	// It starts at zero.
	Balance bool
	// TPSplit says which dim tensor parallelism splits (-1: replicated over tp).
	TPSplit int
	// Unit is the FSDP unit (index into Plan.Units) holding the parameter; set by
	// Compile. An expert a rank does not hold has the unit of its twin on ep rank 0.
	Unit int
}

// Module is one module instance: its kind and path ("layers.3.attn").
type Module struct {
	Kind string
	Path string
}

// GlobalIndex maps element i (row-major in LocalShape) of the slice that
// tensor-parallel rank r holds to its index in the whole parameter (row-major in
// Shape): a column-parallel split (TPSplit 0) holds consecutive rows, a
// row-parallel one (TPSplit 1) a block of columns of every row.
func (p *Param) GlobalIndex(i int64, r int) int64 {
	if p.LocalNumel() == p.Numel() {
		return i
	}
	switch p.TPSplit {
	case 0:
		return int64(r)*p.LocalNumel() + i
	case 1:
		cl := int64(p.LocalShape[1])
		return i/cl*int64(p.Shape[1]) + int64(r)*cl + i%cl
	}
	return i
}

// IsExpert reports whether p is a routed-expert parameter.
func (p *Param) IsExpert() bool { return p.Expert >= 0 }

// Numel is the number of elements of the full parameter.
func (p *Param) Numel() int64 { return prod(p.Shape) }

// LocalNumel is the number of elements one rank holds before FSDP sharding.
func (p *Param) LocalNumel() int64 { return prod(p.LocalShape) }

func prod(s []int) int64 {
	n := int64(1)
	for _, d := range s {
		n *= int64(d)
	}
	return n
}

// MaxParamTensors caps the parameter table: ten times the largest public MoE
// (61 layers × 384 experts × 3 matrices ≈ 70k tensors), so that a mistyped layer or
// expert count is refused instead of filling memory.
const MaxParamTensors = 1 << 20

// ParamTable lists the model's parameters in forward order, partitioned for tensor
// parallel degree tp and expert tensor parallel degree etp. Experts are listed
// globally (expert 0..E-1); which ones a rank holds follows from its ep coordinate.
func ParamTable(m config.Model, tp, etp int) ([]Param, error) {
	h, heads, kv := m.Hidden, m.Heads, m.EffectiveKVHeads()
	if heads == 0 || (m.HeadDim == 0 && h%heads != 0) || kv == 0 || heads%kv != 0 {
		return nil, config.KeyProblem("model.heads", fmt.Sprintf("heads (%d) must divide hidden (%d) (or head_dim be set) and be a multiple of kv_heads (%d)", heads, h, kv), "")
	}
	d := m.HeadSize()
	// Size the table up front: a 600B-class MoE has ~50k rows.
	n := 3 + m.Layers*11
	for l := 0; l < m.Layers; l++ {
		if m.IsMoELayer(l) {
			n += 2 + 3*(m.MoE.SharedExperts+m.MoE.NumExperts)
		}
	}
	if n > MaxParamTensors {
		key := "model.layers"
		if m.MoE.NumExperts > 0 {
			key = "model.moe.num_experts"
		}
		return nil, config.KeyProblem(key, fmt.Sprintf("the model has %d parameter tensors (%d layers, %d experts each with 3 matrices); shardline plans at most %d", n, m.Layers, m.MoE.NumExperts, MaxParamTensors), "")
	}
	ps := make([]Param, 0, n)
	// Shapes are carved from one backing array; modules slices are shared by every
	// parameter of a module. Rows are read-only after ParamTable returns.
	dims := make([]int, 0, 4*n)
	add := func(name string, rows, cols, split, div int, expert, layer int, noDecay bool, mods []Module) {
		var shape, local []int
		if cols == 0 {
			dims = append(dims, rows, rows)
			shape, local = dims[len(dims)-2:len(dims)-1:len(dims)-1], dims[len(dims)-1:]
		} else {
			dims = append(dims, rows, cols, rows, cols)
			shape, local = dims[len(dims)-4:len(dims)-2:len(dims)-2], dims[len(dims)-2:]
		}
		if split >= 0 {
			local[split] /= div
		}
		ps = append(ps, Param{Name: name, Shape: shape, LocalShape: local, Expert: expert, Layer: layer, Modules: mods, NoDecay: noDecay, TPSplit: split})
	}
	// Vocabulary-parallel embedding: rows split over tp.
	add("embed.weight", m.VocabSize, h, 0, tp, -1, -1, true, []Module{{ModEmbedding, "embed"}})
	for l := 0; l < m.Layers; l++ {
		pre := "layers." + strconv.Itoa(l)
		layer := []Module{{ModLayer, pre}}
		attn := []Module{{ModAttention, pre + ".attn"}, layer[0]}
		add(pre+".attn_norm.weight", h, 0, -1, 1, -1, l, true, layer)
		// Column-parallel q, k, v (output rows split); row-parallel o (input split).
		add(pre+".attn.wq", heads*d, h, 0, tp, -1, l, false, attn)
		add(pre+".attn.wk", kv*d, h, 0, tp, -1, l, false, attn)
		add(pre+".attn.wv", kv*d, h, 0, tp, -1, l, false, attn)
		if m.QKNorm {
			// The per-head norms' gains: one head's size, shared by every head,
			// replicated over tp.
			add(pre+".attn.q_norm.weight", d, 0, -1, 1, -1, l, true, attn)
			add(pre+".attn.k_norm.weight", d, 0, -1, 1, -1, l, true, attn)
		}
		add(pre+".attn.wo", h, heads*d, 1, tp, -1, l, false, attn)
		add(pre+".mlp_norm.weight", h, 0, -1, 1, -1, l, true, layer)
		if !m.IsMoELayer(l) {
			mlp := []Module{{ModMLP, pre + ".mlp"}, layer[0]}
			f := m.FFNHidden
			add(pre+".mlp.w1", f, h, 0, tp, -1, l, false, mlp)
			add(pre+".mlp.w3", f, h, 0, tp, -1, l, false, mlp)
			add(pre+".mlp.w2", h, f, 1, tp, -1, l, false, mlp)
			continue
		}
		moe := []Module{{ModMoE, pre + ".moe"}, layer[0]}
		ef := m.MoE.ExpertFFNHidden
		// The router is replicated over tp: every rank routes its own tokens.
		add(pre+".moe.router", m.MoE.NumExperts, h, -1, 1, -1, l, false, moe)
		if m.MoE.ExpertBias {
			add(pre+".moe.expert_bias", m.MoE.NumExperts, 0, -1, 1, -1, l, true, moe)
			ps[len(ps)-1].Balance = true
		}
		for s := 0; s < m.MoE.SharedExperts; s++ {
			sp := pre + ".moe.shared." + strconv.Itoa(s)
			add(sp+".w1", ef, h, 0, tp, -1, l, false, moe)
			add(sp+".w3", ef, h, 0, tp, -1, l, false, moe)
			add(sp+".w2", h, ef, 1, tp, -1, l, false, moe)
		}
		// Each routed expert's three matrices are adjacent, so an expert's weights stay
		// contiguous in its group's flat buffer.
		for e := 0; e < m.MoE.NumExperts; e++ {
			ep := pre + ".moe.experts." + strconv.Itoa(e)
			add(ep+".w1", ef, h, 0, etp, e, l, false, moe)
			add(ep+".w3", ef, h, 0, etp, e, l, false, moe)
			add(ep+".w2", h, ef, 1, etp, e, l, false, moe)
		}
	}
	out := []Module{{ModOutput, "output"}}
	add("norm.weight", h, 0, -1, 1, -1, -1, true, out)
	if !m.TieEmbeddings {
		add("output.weight", m.VocabSize, h, 0, tp, -1, -1, false, out)
	}
	return ps, nil
}

// ParamCount sums the full parameters: total, and those active per token (routed
// experts count top_k of num_experts).
func ParamCount(ps []Param, m config.Model) (total, active int64) {
	for i := range ps {
		n := ps[i].Numel()
		total += n
		if !ps[i].IsExpert() || ps[i].Expert < m.MoE.TopK {
			active += n
		}
	}
	return total, active
}
