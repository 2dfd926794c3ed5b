package parallel

import (
	"math"

	"github.com/shardline/shardline/config"
)

// Memory is the per-rank memory of a plan, in bytes, by component. Every rank of a
// plan holds the same amounts (groups are padded to equal shards and experts split
// evenly), so one Memory describes the worst-off rank.
type Memory struct {
	Weights           int64 `json:"weights"`             // compute weights held between steps
	MainWeights       int64 `json:"main_weights"`        // fp32 (or bf16) master copy, when it differs from compute
	Grads             int64 `json:"grads"`               // gradient accumulation buffers
	OptimizerState    int64 `json:"optimizer_state"`     // AdamW moments (or SGD momentum)
	GatheredUnits     int64 `json:"gathered_units"`      // all-gathered unit weights (optim_grads_params)
	GradReduceBuffers int64 `json:"grad_reduce_buffers"` // full unit grads before reduce-scatter, and the reduction's staging
	Activations       int64 `json:"activations"`         // saved for backward, one micro-batch
	MoEDispatch       int64 `json:"moe_dispatch"`        // all-to-all send+receive token buffers
	Logits            int64 `json:"logits"`              // output logits and the loss's fp32 softmax
	Scratch           int64 `json:"scratch"`             // backward's work buffers and parallelism's gather/ring buffers (the CPU engine's)
	Total             int64 `json:"total"`
}

// Static is what a rank holds whatever the batch: weights, main weights, grads and
// optimizer state.
func (m Memory) Static() int64 { return m.Weights + m.MainWeights + m.Grads + m.OptimizerState }

// Components lists (name, bytes) in print order.
func (m Memory) Components() []struct {
	Name  string
	Bytes int64
} {
	return []struct {
		Name  string
		Bytes int64
	}{
		{"weights", m.Weights}, {"main_weights", m.MainWeights}, {"grads", m.Grads},
		{"optimizer_state", m.OptimizerState}, {"gathered_units", m.GatheredUnits},
		{"grad_reduce_buffers", m.GradReduceBuffers}, {"activations", m.Activations}, {"scratch", m.Scratch},
		{"moe_dispatch", m.MoEDispatch}, {"logits", m.Logits},
	}
}

// dtypes of a recipe, in bytes per element: compute weights, main weights,
// gradients (held as reduced), optimizer state per element; and the
// activations (act).
type dtypes struct {
	compute, main, grad, optim int64
	act                        int64
	kept                       int64 // activations saved for backward (the CPU's bf16 stores)
	separateMain               bool
}

func dtypesOf(r *config.Recipe) dtypes {
	d := dtypes{compute: 4, main: 4, grad: 4, optim: 8}
	if r.Precision.BF16 {
		d.compute = 2
	}
	if r.Precision.MainParamsDtype == "bf16" {
		d.main = 2
	}
	d.separateMain = d.main != d.compute
	// Gradients are held and accumulated in the dtype they are reduced in,
	// by the engine as by Megatron-FSDP (its main_grad): bf16 with
	// grad_reduce_in_bf16, else fp32.
	if r.FSDP.GradReduceInBF16 {
		d.grad = 2
	}
	if r.Train.Optimizer == "sgd" {
		d.optim = 4 // momentum only
	}
	d.act = d.compute
	if runsEngine(r) {
		// The engine stores compute weights in bf16 when the recipe says so,
		// computes activations in fp32 and keeps what the layers save for
		// backward in bf16: docs/engine.md.
		d.act = 4
		if bf16Native(r) {
			// A GPU's engine keeps a dense model's activations and their
			// gradients in bf16 (statistics fp32): no fp32 work set, no stores.
			d.act = 2
		}
	}
	d.kept = d.act
	if runsEngine(r) && r.Precision.BF16 {
		d.kept = 2
	}
	return d
}

// bf16Native reports whether an engine run keeps its activations and their
// gradients in bf16 throughout (trainer/model's native bf16: a bf16 run on a
// backend that computes in bf16 storage, cuda.Kernels, of a dense model
// without tensor or context parallelism), where the CPU's bf16 runs, and the
// GPU's other ones, compute in an fp32 work set and keep bf16 stores
// (docs/engine.md).
func bf16Native(r *config.Recipe) bool {
	return runsEngine(r) && r.Parallel.Device == "cuda" && r.Precision.BF16 && r.Model.MoE.NumExperts == 0 &&
		r.Parallel.TensorParallel <= 1 && r.Parallel.ContextParallel <= 1
}

// runsEngine reports whether the plan's ranks run shardline's engine
// (trainer/model and the FSDP runtime), whose buffers this file counts as
// the engine holds them: every CPU run, and a cuda run that shardline carries
// out (its ranks run the engine over their GPUs' kernels). Other cuda plans
// count Megatron-FSDP's buffers (what the recipe would hold there).
func runsEngine(r *config.Recipe) bool {
	switch r.Parallel.Device {
	case "cpu":
		return true
	case "cuda":
		return len(config.NotExecuted(r)) == 0
	}
	return false
}

// staticMemory is the per-strategy table of ARCHITECTURE.md ("Strategies"): what
// each strategy keeps whole and what it shards. full and shard are summed over a
// rank's groups: full buffer lengths and shard lengths.
func staticMemory(sh Sharding, full, shard int64, d dtypes) Memory {
	var m Memory
	m.Weights = full * d.compute
	if sh.Params {
		m.Weights = shard * d.compute
	}
	owned := full // elements whose optimizer state and main weights this rank keeps
	if sh.Optim {
		owned = shard
	}
	if d.separateMain {
		m.MainWeights = owned * d.main
	}
	m.OptimizerState = owned * d.optim
	m.Grads = full * d.grad
	if sh.Grads {
		m.Grads = shard * d.grad
	}
	return m
}

// tokens describes one micro-batch on one rank.
type tokens struct {
	local   int64 // b · seq/cp: tokens whose activations this rank holds (before tp)
	routed  int64 // routed token copies an MoE layer's experts process on this rank
	worst   int64 // the most routed copies one rank can receive (no capacity limit)
	context int64 // keys each query attends to (seq)
}

// ExpertCapacity is the most routed copies one expert keeps of rows tokens:
// ⌈capacity_factor · rows · top_k / E⌉, or every copy (rows · top_k) without a
// capacity factor. The engine (trainer/model) and the plan take it from here.
func ExpertCapacity(mo config.Model, rows int64) int64 {
	k := rows * int64(mo.MoE.TopK)
	if cf := mo.MoE.CapacityFactor; cf > 0 {
		return int64(math.Ceil(cf * float64(k) / float64(mo.MoE.NumExperts)))
	}
	return k
}

// MoELayout is how the CPU engine lays an MoE layer's permuted rows out for rows
// tokens on ep expert-parallel ranks: the capacity per expert, and whether every
// expert's segment is padded to it. It pads under expert parallelism with a
// capacity factor, so the exchange's splits are static; otherwise it packs the
// kept copies.
func MoELayout(mo config.Model, rows int64, ep int) (capacity int64, padded bool) {
	return ExpertCapacity(mo, rows), mo.MoE.CapacityFactor > 0 && ep > 1
}

// RoutedRows is the permuted rows an MoE layer's buffers hold for rows tokens
// on ep ranks (MoELayout; tensor.MoEShape.Rows states the same): E · capacity
// when padded, else at most every copy, min(rows · top_k, E · capacity).
func RoutedRows(mo config.Model, rows int64, ep int) int64 {
	capacity, padded := MoELayout(mo, rows, ep)
	E := int64(mo.MoE.NumExperts)
	if padded {
		return E * capacity
	}
	return min(rows*int64(mo.MoE.TopK), E*capacity)
}

// tokensOf computes the token counts. Routing is balanced in expectation: each rank
// sends local·top_k copies and receives as many. A capacity factor bounds what one
// rank receives at capacity_factor × the balanced share. Without it the worst case
// is every source rank sending all its tokens' copies that can land here:
// ep · local · min(top_k, E/ep).
func tokensOf(r *config.Recipe, m Mesh) tokens {
	mo := r.Model
	t := tokens{local: int64(r.Train.MicroBatchSize) * int64(mo.SeqLen/m.CP), context: int64(mo.SeqLen)}
	if mo.MoE.NumExperts > 0 {
		k := int64(mo.MoE.TopK)
		// Under expert parallelism with a capacity factor every expert's segment
		// is padded to its capacity (static splits); otherwise the kept copies are
		// packed.
		t.routed = RoutedRows(mo, t.local, m.EP)
		t.worst = int64(m.EP) * t.local * min(k, int64(mo.MoE.NumExperts/m.EP))
		if cf := mo.MoE.CapacityFactor; cf > 0 {
			t.worst = t.routed
		}
	}
	return t
}

// activationBytes is the memory saved for backward over one micro-batch, per rank.
//
// Element counts per layer, for t local tokens, width h, d = h/heads, g kv heads,
// ffn f (derived from the kernels' Forward/Backward pairs, in the manner of
// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
// Models", §4, adapted to Llama: RMSNorm, SwiGLU, GQA, no dropout):
//
//	attention block: norm input, norm output, q, attention output: 4·t·h; k, v: 2·t·g·d
//	flash attention's log-sum-exps: heads·t (fp32; counted on the CPU, whose
//	  engine is the one measured against the plan); no (T,T) probabilities
//	dense MLP: norm input and output 2·t·h; w1 and w3 outputs and the SwiGLU
//	  product 3·t·f
//	MoE: norm input and output 2·t·h; router logits and probabilities 2·t·E (fp32;
//	  the CPU engine also keeps the gates, t·k); permuted
//	  tokens T·h; per routed copy 3·T·ef/etp; shared experts 3·t·ef each; combined
//	  output t·h, with T routed copies on this rank (the CPU engine: the experts'
//	  outputs T·h instead of the combined output, and under expert parallelism the
//	  received tokens T·h instead of the permuted tokens, which it only sends,
//	  from one buffer every layer shares)
//
// Everything is divided by tp (Megatron's sequence parallelism splits the h-sized
// tensors too). Full recompute keeps each layer's input (t·h) plus one layer's full
// set while that layer is recomputed. The final norm keeps 2·t·h. The router's
// outputs, flash attention's log-sum-exps and (on the CPU) the norms' reciprocal
// RMS are fp32; the rest is in the activation dtype.
//
// The CPU engine in a bf16 run (d.kept = 2) keeps what each layer saves in bf16
// stores and computes in one fp32 work set that every layer shares: the attention
// block's buffers, the dense MLP's if a layer is dense, the experts' if a layer is
// MoE, and two residual-stream buffers (a layer reads one and writes the other;
// one in a model of one layer, which writes the final norm's input);
// under full recompute the stores hold only the layers' inputs, and the work set
// is the one layer's full set recomputed (docs/engine.md). The engine on GPUs
// in a bf16 run of a dense model without tensor or context parallelism
// (bf16Native: d.act = d.kept = 2) keeps fp32's buffers with the activations
// in bf16 and the statistics in fp32.
func activationBytes(r *config.Recipe, m Mesh, t tokens, d dtypes) int64 {
	mo := r.Model
	h, f := int64(mo.Hidden), int64(mo.FFNHidden)
	g, dh := int64(mo.EffectiveKVHeads()), int64(mo.HeadSize())
	tp := int64(m.TP)
	mode := r.ActivationCheckpoint.Mode
	attn := 2*t.local*h + 2*t.local*int64(mo.Heads)*dh + 2*t.local*g*dh // resid, norm; q, output; k, v
	// The CPU's flash attention keeps each row's log-sum-exp (fp32), per layer,
	// or one layer's worth under full recompute (refilled before each layer's
	// backward). No (T,T) probabilities exist.
	var stats int64
	cpu := runsEngine(r)
	if cpu {
		stats = int64(mo.Heads) * t.local
	}
	perLayerStats := mode != "full"
	var f32Stats int64 // per layer: log-sum-exps in fp32
	if perLayerStats {
		f32Stats = stats
	}
	ef := int64(mo.MoE.ExpertFFNHidden)
	dense := 2*t.local*h + 3*t.local*f // the MLP's norm input and output; w1, w3 outputs, SwiGLU
	moe := 2*t.local*h + t.routed*h + 3*t.routed*ef/int64(m.ETP) + 3*t.local*ef*int64(mo.MoE.SharedExperts)
	var sent int64 // one buffer every MoE layer shares
	if cpu {
		// The CPU engine keeps the experts' outputs per routed copy (combined in
		// backward) and, under expert parallelism, the received tokens in local
		// expert order (the experts' inputs in backward) in place of the
		// permuted tokens, which are only sent: one buffer serves every layer.
		moe += t.routed * h
		if m.EP > 1 {
			sent = t.routed * h / tp
		}
	} else {
		moe += t.local * h // the combined output
	}
	router := 2 * t.local * int64(mo.MoE.NumExperts) // logits and probabilities, fp32
	if cpu {
		router += t.local * int64(mo.MoE.TopK) // and the chosen experts' gates
	}
	// Selective recompute remakes the norms' outputs and a dense layer's
	// SwiGLU product before each layer's backward: no layer keeps them, one
	// buffer of each serves every layer (remade).
	attnKept, denseKept, moeKept := attn, dense, moe
	var remade int64
	if mode == "selective" {
		attnKept, denseKept, moeKept = attn-t.local*h, dense-t.local*h-t.local*f, moe-t.local*h
		remade = 2 * t.local * h // ln1, ln2
	}
	// kept and f32: a layer's elements in the activation dtype and in fp32.
	perLayer := func(l int) (kept, f32 int64) {
		if !mo.IsMoELayer(l) {
			return (attnKept + denseKept) / tp, f32Stats / tp
		}
		return (attnKept + moeKept) / tp, (f32Stats + router) / tp
	}
	var keptSum, f32Sum, worst int64 // worst: the largest layer, in bytes at the activation dtype
	anyDense, anyMoE := false, false
	for l := 0; l < mo.Layers; l++ {
		k, f32 := perLayer(l)
		keptSum, f32Sum = keptSum+k, f32Sum+f32
		worst = max(worst, k*d.act+f32*4)
		anyDense, anyMoE = anyDense || !mo.IsMoELayer(l), anyMoE || mo.IsMoELayer(l)
	}
	if mode == "selective" && anyDense {
		remade += t.local * f // the SwiGLU product
	}
	inputs := int64(mo.Layers) * t.local * h / tp // every layer's input
	var bytes int64
	switch {
	case mode == "full" && d.kept != d.act:
		bytes = inputs*d.kept + worst
		if mo.Layers > 1 {
			bytes += t.local * h / tp * d.act // the second residual-stream buffer of the work set
		}
	case mode == "full" && cpu:
		// The engine's recomputed layer reads its input where it is kept:
		// the layer's set beside the inputs is the rest of worst.
		bytes = inputs*d.act + worst - t.local*h/tp*d.act
	case mode == "full":
		bytes = inputs*d.act + worst
	case d.kept != d.act:
		work := attn
		if mo.Layers > 1 {
			work += t.local * h // the second residual-stream buffer
		}
		if anyDense {
			work += dense
		}
		if anyMoE {
			work += moe
		}
		bytes = keptSum*d.kept + f32Sum*4 + work/tp*d.act
		if mode == "selective" && m.TP == 1 {
			// The remade products' inputs are rounded into one bf16 store each
			// (the attention's normed input; a dense layer's and its SwiGLU
			// product), which every layer takes in turn.
			stores := t.local * h
			if anyDense {
				stores += t.local*h + t.local*f
			}
			bytes += stores * d.kept
		}
	default:
		bytes = keptSum*d.act + f32Sum*4 + remade/tp*d.act
	}
	if !perLayerStats {
		bytes += stats / tp * 4 // one shared slot of log-sum-exps (fp32)
	}
	if anyMoE {
		bytes += sent * d.act
	}
	if cpu {
		// The CPU's norms keep each row's reciprocal RMS (fp32): two per layer
		// (one layer's under full recompute) and the final norm's.
		rows := t.local / tp
		if mode == "full" {
			bytes += 3 * rows * 4
		} else {
			bytes += (2*int64(mo.Layers) + 1) * rows * 4
		}
		if mo.QKNorm {
			// QK-norm's reciprocal RMS per row and head (fp32), of q's heads
			// and k's, per layer (one layer's under full recompute).
			qk := t.local * int64(mo.Heads+mo.EffectiveKVHeads()) / tp * 4
			if mode == "full" {
				bytes += qk
			} else {
				bytes += int64(mo.Layers) * qk
			}
		}
		bytes += 4 * cpuInts(mo, m, t, mode == "full", r.Data.ResetAttentionMask)
	}
	return bytes + 2*t.local*h/tp*d.act
}

// cpuInts is the int32 values the CPU engine keeps beside its activations: the
// micro-batch's token ids and targets (t.local each) and, with documents
// (data.reset_attention_mask), each token's document start; per MoE layer (one
// layer's under full recompute, which routes each layer again) its routing
// (each row's chosen experts, each copy's permuted row and each permuted row's
// token: rows·k each, rows = t.local/tp; the experts' offsets, E+1, and
// Dispatch's cursor, E) and under expert parallelism its local experts'
// segments (E/ep+1); and once, with padded segments, their static offsets
// (E+1).
func cpuInts(mo config.Model, m Mesh, t tokens, full, docs bool) int64 {
	n := 2 * t.local
	if docs {
		n += t.local
	}
	rows, E := t.local/int64(m.TP), int64(mo.MoE.NumExperts)
	anyMoE := false
	for l := 0; l < mo.Layers; l++ {
		if !mo.IsMoELayer(l) {
			continue
		}
		if full && anyMoE {
			continue
		}
		anyMoE = true
		n += 3*rows*int64(mo.MoE.TopK) + 2*E + 1
		if m.EP > 1 {
			n += E/int64(m.EP) + 1
		}
	}
	if _, padded := MoELayout(mo, rows, m.EP); anyMoE && padded {
		n += E + 1
	}
	return n
}

// dispatchBytes is the all-to-all send and receive buffers of one MoE layer, reused
// by every layer: 2 · T · h / tp in the compute dtype. The CPU engine has none without
// expert parallelism (nothing is exchanged).
func dispatchBytes(r *config.Recipe, m Mesh, t tokens, d dtypes) (expected, worst int64) {
	if r.Model.MoE.NumExperts == 0 || (runsEngine(r) && m.EP == 1) {
		return 0, 0
	}
	h, tp := int64(r.Model.Hidden), int64(m.TP) // sequence parallelism routes a rank's 1/tp of the tokens
	return 2 * t.routed * h * d.act / tp, 2 * t.worst * h * d.act / tp
}

// scratchBytes is what the CPU engine holds beside activations, logits and
// dispatch buffers, in fp32 (trainer/model's ScratchBytes; the activation
// gradients in bf16 where the engine's GPU ranks run bf16Native): backward's work
// buffers for one layer (the residual stream's gradient and its scratch, R·h
// each; q, attention-output, k and v gradients over the local rows' heads;
// the MLP's three ffn gradients; the per-token loss gradient, the logits'
// gradient being written over the softmax) and the RoPE tables; under tensor parallelism the sequence
// gathers (three of the local rows, one of this rank's), the replicated norm
// and router gradients and the vocabulary-parallel loss's row statistics;
// under context parallelism the ring's double K/V buffers (and their
// gradients) and a chunk's partial output and log-sum-exps; with MoE the
// router's, gates' and experts' gradients over the layer's permuted rows
// (expert parallelism's exchange of gradients reuses the dispatch buffers)
// and the shared experts' three. The ranks of a cuda run hold the same on their GPUs
// (runsEngine); 0 for other plans (Megatron's are not modelled).
func scratchBytes(r *config.Recipe, m Mesh) int64 {
	return scratchBytesAt(r, m, RoutedRows(r.Model, int64(r.Train.MicroBatchSize)*int64(r.Model.SeqLen/m.CP)/int64(m.TP), m.EP))
}

// scratchBytesAt is scratchBytes with an MoE layer's buffers holding copies
// permuted rows: RoutedRows over the rank's rows (dropless, what the buffers
// start at), or more when a rank receives more under expert parallelism.
func scratchBytesAt(r *config.Recipe, m Mesh, copies int64) int64 {
	if !runsEngine(r) {
		return 0
	}
	mo := r.Model
	b, tp, cp := int64(r.Train.MicroBatchSize), int64(m.TP), int64(m.CP)
	T := int64(mo.SeqLen) / cp
	BT := b * T  // rows attention and the MLP see (all of the rank's rows)
	R := BT / tp // rows of the residual stream (sequence parallelism)
	C, HD := int64(mo.Hidden), int64(mo.HeadSize())
	NH, NKV := int64(mo.Heads)/tp, int64(mo.EffectiveKVHeads())/tp
	FF := int64(mo.FFNHidden) / tp
	n := BT + T*HD // the loss's gradient scale, the RoPE tables: fp32
	grads := 2*R*C + 2*BT*NH*HD + 2*BT*NKV*HD + 3*BT*FF
	if mo.QKNorm {
		grads += BT * NH * HD // QK-norm's input gradient
	}
	if bf16Native(r) {
		// The activations' gradients in bf16 (nothing below is counted then:
		// no tensor or context parallelism, no MoE).
		return n*4 + grads*2 + fp8Bytes(r, m, BT, copies)
	}
	n += grads
	E := int64(mo.MoE.NumExperts)
	if tp > 1 {
		n += 3*BT*C + R*C + C + E*C + 2*BT + tp*BT
		if mo.QKNorm {
			n += HD // QK-norm's gains' gradient, summed over tp
		}
	}
	if cp > 1 {
		kv, c := BT*NKV*HD, T/2
		n += 8*kv + 2*kv + b*c*NH*HD + b*NH*c
		if r.Data.ResetAttentionMask {
			n += b * 2 * cp // each sequence chunk's last document end, summed over the ring
		}
	}
	if E > 0 {
		k, EF := int64(mo.MoE.TopK), int64(mo.MoE.ExpertFFNHidden)
		// Expert parallelism's exchange of gradients runs through the
		// dispatch buffers (MoEDispatch): nothing here.
		n += 2*R*E + R*k + 2*copies*C + 3*copies*EF
		if mo.MoE.SharedExperts > 0 {
			n += 3 * BT * (EF / tp)
		}
		if mo.MoE.ExpertBias {
			// Each MoE layer's copies counted since the last bias update, and
			// the bias as the router reads it (fp32).
			n += E
			for l := 0; l < mo.Layers; l++ {
				if mo.IsMoELayer(l) {
					n += E
				}
			}
		}
		if mo.MoE.ScoreBeforeExpert {
			n += R * k // the unit gates the experts' outputs are combined with
		}
	}
	return n*4 + fp8Bytes(r, m, BT, copies)
}

// fp8Bytes is what the engine holds for FP8 compute (trainer/model's
// fp8.go) over BT rows: one FP8 copy (a byte a value) of a product's input,
// one of its weight and one of its output gradient, which every product of
// every FP8 layer takes in turn (remade in backward, not kept), each sized
// for the largest it takes among the layers that compute in FP8 (a dense
// layer's MLP widens them to the ffn, an FP8 router to its experts), their
// three scale inverses and the scale (f32) and the amax slot (f64); 0
// without FP8. Under tensor parallelism (m.TP) the heads, the ffn and a
// shared expert's ffn are this rank's share and BT all of its rows (a
// column-parallel product's gathered input, a row-parallel product's
// gathered output gradient); under context parallelism BT is the rank's
// share of the sequence. With the MoE experts in FP8 (precision.fp8.experts,
// trainer/model's fp8experts.go) an FP8 MoE layer widens them too: the input
// and gradient copies to the layer's copies permuted rows at the hidden size
// and the expert ffn (the shared experts' B·T rows alike), the weight copy
// to every local expert's weight side by side, and one scale inverse (f32)
// per local expert follows. Delayed scaling (recipe "delayed", which FP8
// experts do not take) keeps three scale inverses and, for each of its
// tensors (DelayedFP8Tensors), the step's amax (f64, and f32 for the
// all-gather), its scale and its amax history (f32), and, with several
// ranks, every rank's amaxes of the step (f32): the world's ranks reduce
// them.
func fp8Bytes(r *config.Recipe, m Mesh, BT, copies int64) int64 {
	lo, hi := r.FP8LayerRange()
	if lo == hi {
		return 0
	}
	mo, tp := r.Model, int64(m.TP)
	C, HD := int64(mo.Hidden), int64(mo.HeadSize())
	NH, NKV, FF := int64(mo.Heads)/tp, int64(mo.EffectiveKVHeads())/tp, int64(mo.FFNHidden)/tp
	x, w, d := max(BT*C, BT*NH*HD), max(NH*HD*C, NKV*HD*C), max(BT*C, BT*NH*HD, BT*NKV*HD)
	var scales int64
	router := !r.Precision.FP8.RouterBF16
	for l := lo; l < hi; l++ {
		if !mo.IsMoELayer(l) {
			x, w, d = max(x, BT*FF), max(w, FF*C), max(d, BT*FF)
			continue
		}
		if router { // the router's weight and logits' gradient
			E := int64(mo.MoE.NumExperts)
			w, d = max(w, E*C), max(d, BT*E)
		}
		if !r.Precision.FP8.Experts {
			continue
		}
		EF, El := int64(mo.MoE.ExpertFFNHidden), int64(mo.MoE.NumExperts/m.EP)
		rows := copies * max(C, EF)
		x, w, d = max(x, rows), max(w, El*EF*C), max(d, rows)
		if mo.MoE.SharedExperts > 0 {
			SF := EF / tp // a shared expert is split over tp like the MLP
			x, w, d = max(x, BT*C, BT*SF), max(w, SF*C), max(d, BT*C, BT*SF)
		}
		scales = El
	}
	if r.Precision.FP8.Recipe != "delayed" {
		return x + w + d + (4+scales)*4 + 8
	}
	_, n := DelayedFP8Tensors(mo, lo, hi, !r.Precision.FP8.RouterBF16)
	N, H, R := int64(n), int64(r.Precision.FP8.AmaxHistoryLen), int64(r.Parallel.WorldSize)
	state := N * (8 + 4 + 4 + 4*H)
	if R > 1 {
		state += 4 * R * N
	}
	return x + w + d + 3*4 + state
}

// DelayedFP8Tensors is how many tensors delayed FP8 scaling keeps a scale
// and an amax history for in layers lo..hi−1 of model m (trainer/model's
// fp8delayed.go lays them out): 18 for a dense layer (its 4 product inputs,
// 7 weights and 7 output gradients), 10 for an MoE layer's attention (2, 4
// and 4), 13 with its router in FP8 (router: the router's input, weight and
// output gradient too). fwd of them are inputs and weights (E4M3), the rest
// output gradients.
func DelayedFP8Tensors(m config.Model, lo, hi int, router bool) (fwd, n int) {
	for l := lo; l < hi; l++ {
		switch {
		case m.IsMoELayer(l) && router:
			fwd, n = fwd+8, n+13
		case m.IsMoELayer(l):
			fwd, n = fwd+6, n+10
		default:
			fwd, n = fwd+11, n+18
		}
	}
	return fwd, n
}

// worstRoutingTotal is the memory total when dropless routing (no capacity
// factor) under expert parallelism is as unbalanced as it can be: every source
// rank sends this rank all the copies its experts can take (tokensOf's worst).
// The CPU engine's expert and exchange buffers start at the balanced share and
// grow to the most rows a layer received (trainer/model's growExchange), so the
// activations, scratch and dispatch buffers are counted at the worst case's rows:
// a bound, as the buffers on the sending side stay at the balanced share. It is
// mem.Total where routing cannot exceed the plan (a capacity factor, no expert
// parallelism, no MoE).
func worstRoutingTotal(r *config.Recipe, m Mesh, t tokens, d dtypes, mem Memory, dispatchWorst int64) int64 {
	if t.worst <= t.routed {
		return mem.Total
	}
	tw := t
	tw.routed = t.worst
	total := mem.Total - mem.Activations - mem.MoEDispatch - mem.Scratch
	total += activationBytes(r, m, tw, d) + dispatchWorst
	if mem.Scratch > 0 {
		total += scratchBytesAt(r, m, t.worst/int64(m.TP))
	}
	return total
}

// logitsBytes: the output logits of one micro-batch (vocabulary split over tp) in the
// compute dtype, plus the fp32 softmax the fused cross-entropy keeps for backward.
// The engine (runsEngine) keeps the token losses and, without tensor
// parallelism, one chunk of HeadRows rows of fp32 logits (tensor.Kernels.HeadLoss;
// on a GPU their gradient beside them, cuda.Kernels.HeadWork); under tensor
// parallelism its vocabulary rows' whole fp32 logits, the softmax and then its
// gradient written over them.
func logitsBytes(r *config.Recipe, m Mesh, t tokens, d dtypes) int64 {
	V := int64(r.Model.VocabSize / m.TP)
	if !runsEngine(r) {
		return t.local * V * (d.act + 4)
	}
	if m.TP > 1 {
		return t.local*V*d.act + t.local*4
	}
	work := HeadRows(t.local, V) * V
	if r.Parallel.Device == "cuda" {
		work *= 2
	}
	return work*4 + t.local*4
}

// HeadRows is the rows of logits the output head makes at a time, over BT rows
// and a vocabulary of V: as many whole rows as config.GPUHeadChunk values per
// row give (BT·GPUHeadChunk/V), every row where the vocabulary is no larger,
// and at least one. The logits then take at most GPUHeadChunk values per
// token (one row where a row is longer), whatever the vocabulary.
func HeadRows(BT, V int64) int64 {
	if V <= config.GPUHeadChunk {
		return max(BT, 1)
	}
	return min(max(BT*config.GPUHeadChunk/V, 1), max(BT, 1))
}
