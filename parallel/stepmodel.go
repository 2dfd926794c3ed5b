package parallel

import (
	"github.com/shardline/shardline/config"
)

// StepBreakdown is the per-operation model's account of one rank's step, in
// seconds, by kind of work.
type StepBreakdown struct {
	GEMM, Attention, Stream, Optimizer, Comm float64
	// Stall is the routed experts' products waiting on their operands
	// (Calibration.InStepExpertsStall and its slope over the routed rows):
	// time off the cores, which ranks sharing them neither divide nor
	// lengthen (not scaled by HostShare or the ring's efficiency).
	Stall float64
	// HostShare is how many ranks share one host's cores (in-process or local
	// ranks on the CPU): each rank's kernels take HostShare times as long as on
	// the machine the calibration measured alone, times the efficiency measured
	// for that many ranks.
	HostShare int
}

// stepModel predicts one rank's step on a calibrated device from the operations the
// engine runs (trainer/model: per layer RMSNorm, the q/k/v projections, RoPE,
// causal flash attention, the output projection, RMSNorm, the SwiGLU MLP or the MoE layer's
// router, dispatch, experts and combine; the embedding, the final norm, the output
// head and cross-entropy; each with its backward; recomputation as it repeats
// work), each timed by the calibration at its shape: matmuls by the throughput
// measured at the neighbouring shapes, attention by (length, head size), memory-bound
// kernels by their fitted per-call and per-element cost. The optimizer step and the
// gradient norm stream over the rank's shard; collectives cost their calibrated
// per-call and per-byte time and are not overlapped (on the CPU the copies run on
// the cores the compute needs). Ranks sharing a host divide its throughput, at the
// efficiency the calibration measured for that many ranks (Calibration.HostShare),
// and ranks in a context-parallel ring take as much longer as the calibration
// measured for rings of that size (Calibration.RingShare); the experts'
// products' stall on their operands (Stall) is each rank's own, not shared.
func stepModel(r *config.Recipe, p *Plan, c *Calibration) StepBreakdown {
	m := p.Mesh
	mo := r.Model
	var b StepBreakdown
	b.HostShare = max(p.Topology.GPUsPerNode, 1) // ranks per node, at most the world
	mt := microCompute(mo, microShapeOf(r, p, r.Precision.BF16 && r.Parallel.Device == "cpu"), c)
	g, gb := mt.Products()
	a, s := mt.Attention, mt.Stream
	gf, gPerByte := c.inStepGEMM(r.Precision.BF16)
	if gf > 0 {
		g *= gf
	}
	g += gPerByte * gb // and their operands' traffic
	af := c.InStep
	if c.InStepAttention > 0 {
		af = c.InStepAttention // attention by its own in-step factor
	}
	if af > 0 {
		a *= af
	}
	if f := c.InStep; f > 0 {
		s *= f
	}
	s += mt.Calls * c.PerCall // waking the workers for each kernel, inside a step
	micro := float64(p.MicroBatches)
	b.GEMM, b.Attention, b.Stream = g*micro, a*micro, s*micro
	b.Stall = c.expertsStallOf(r.Precision.BF16, mt.Routed) * mt.ExpertBytes * micro
	stream, opt := stepStreams(r, p, c, false)
	if f := c.InStepOptimizer; f > 0 {
		stream, opt = stream*f, opt*f
	}
	b.Stream += stream
	b.Optimizer = opt
	for _, col := range p.Collectives {
		size := m.Size(col.Axis)
		if size <= 1 {
			continue
		}
		cost, ok := c.collective(col.Kind, size)
		if !ok {
			continue
		}
		b.Comm += float64(col.Calls)*cost.Fixed + cost.PerUnit*col.rankBytes(size) // rankBytes: the whole step's
	}
	share := float64(b.HostShare) * c.shareEfficiency(b.HostShare)
	b.GEMM, b.Attention, b.Stream, b.Optimizer = b.GEMM*share, b.Attention*share, b.Stream*share, b.Optimizer*share
	if m.CP > 1 {
		// A context-parallel ring's steps wait for its slowest rank.
		ring := c.ringEfficiency(m.CP)
		b.GEMM, b.Attention, b.Stream = b.GEMM*ring, b.Attention*ring, b.Stream*ring
	}
	return b
}

// microShapeOf is one rank's share of r's micro-batch under p's mesh; stash says
// whether the engine keeps saved activations in bf16 stores (the CPU's bf16
// runs).
func microShapeOf(r *config.Recipe, p *Plan, stash bool) microShape {
	m, mo := p.Mesh, r.Model
	lo, hi := r.FP8LayerRange()
	return microShape{B: r.Train.MicroBatchSize, T: mo.SeqLen / m.CP, CP: m.CP, TP: m.TP, EP: m.EP, ETP: m.ETP,
		Routed: int(tokensOf(r, m).routed), Mode: r.ActivationCheckpoint.Mode, BF16: r.Precision.BF16, Stash: stash, FP8Lo: lo, FP8Hi: hi}
}

// StepTail is the tables' time of a step's own memory-bound work over n
// parameters, held whole on one rank in one micro-batch: the gradients'
// square sum and AdamW (what stepStreams gives such a plan), before any
// in-step factor.
func (c *Calibration) StepTail(n float64) float64 {
	return c.stream(StreamSumSquares, n) + c.stream(StreamAdamW, n)
}

// stepStreams is the once-a-step memory-bound work by c's costs: the gradient
// norm over the gradients the rank holds, their accumulation over the
// micro-batches after the first, and the optimizer over the rank's shard of the
// main weights. Costs per element of fp32 gradients (byBytes: a GPU's, whose
// kernels move bytes) count bf16 gradients as half the elements; the CPU's
// tables, whose bf16 gradients are widened a tile at a time, count every
// element.
func stepStreams(r *config.Recipe, p *Plan, c opCosts, byBytes bool) (stream, optimizer float64) {
	var owned, grads float64
	for i := range p.Groups {
		owned += float64(p.Groups[i].ShardNumel())
		grads += float64(p.Groups[i].Padded)
	}
	held := float64(dtypesOf(r).grad) // bytes a gradient is held in
	if p.Memory.Grads > 0 {
		grads = float64(p.Memory.Grads) / held
	}
	if byBytes {
		grads *= held / 4
	}
	stream = c.stream(StreamSumSquares, grads)
	if micro := float64(p.MicroBatches); micro > 1 {
		stream += (micro - 1) * c.stream(StreamAdd, grads) // accumulating micro-batches' gradients
	}
	return stream, c.stream(StreamAdamW, owned)
}

// microShape is one rank's share of a micro-batch: B sequences of T tokens (T/cp
// of each sequence under context parallelism), the context, tensor, expert and
// expert-tensor parallel degrees, the routed copies the rank sends (and,
// balanced, receives), the recompute mode, whether the weights are bf16 (every
// matmul then times from the bf16-weight table), and whether the engine converts
// saved activations to and from bf16 stores (the CPU's bf16 runs).
type microShape struct {
	B, T, CP, TP, EP, ETP int
	Routed                int
	Mode                  string
	BF16                  bool
	Stash                 bool
	// FP8Lo..FP8Hi−1 are the layers whose linear products compute in FP8
	// (config.Recipe.FP8LayerRange; none when equal): q, k, v and o, and a
	// dense layer's w1, w3 and w2 (an MoE layer's router and experts stay
	// as they were), each quantising its operands first (trainer/model's
	// fp8.go).
	FP8Lo, FP8Hi int
}

// MicroTimes is the kernel time of one micro-batch's forward and backward on
// one rank, by a cost table (a calibration's tables, or a GPU's roofline),
// before a calibration's in-step factors: seconds of the dense matmuls, of the
// routed experts' products (apart: inside a step they stall on their operands
// as the dense ones do not, Calibration.InStepExpertsStall), of attention and of
// the memory-bound kernels; the kernels launched; and the bytes of the
// matmuls' operands (inputs and output of every product, forward and backward,
// recomputation included), the dense ones' and the experts'.
type MicroTimes struct {
	GEMM, Experts, Attention, Stream float64
	Calls                            float64
	GEMMBytes, ExpertBytes           float64
	// Routed is the rows each MoE layer's local experts process (0 for a
	// dense model).
	Routed float64
}

// Tables is the whole micro-batch's kernel time.
func (t MicroTimes) Tables() float64 { return t.GEMM + t.Experts + t.Attention + t.Stream }

// Products is every matmul's time, the experts' among them, and their
// operand bytes.
func (t MicroTimes) Products() (seconds, bytes float64) {
	return t.GEMM + t.Experts, t.GEMMBytes + t.ExpertBytes
}

// microCompute is MicroTimes of one micro-batch of shape sh by c's costs.
func microCompute(mo config.Model, sh microShape, c opCosts) MicroTimes {
	var g, a, s, calls, gb, eg, egb float64
	BT, B, T := sh.B*sh.T, sh.B, sh.T
	C, HD := mo.Hidden, mo.HeadSize()
	NH, NKV := mo.Heads/sh.TP, mo.EffectiveKVHeads()/sh.TP
	Q, KV := NH*HD, NKV*HD
	FF, V := mo.FFNHidden/sh.TP, mo.VocabSize/sh.TP
	// calls counts the kernels launched, for the per-call cost a step adds (workers
	// woken for each kernel); each helper counts its own.
	// A product's operands: forward reads x (rows,k) and W (n,k) and writes
	// (rows,n); backward's two products move as much each.
	opBytes := func(rows, k, n int) float64 { return 4 * float64(rows*k+k*n+rows*n) }
	gemm := func(rows, k, n int) float64 {
		calls += 2
		gb += 3 * opBytes(rows, k, n)
		return c.gemmTimeOf(sh.BF16, rows, k, n, false) + c.gemmTimeOf(sh.BF16, rows, k, n, true)
	}
	var fgb float64 // the current layer's forward matmul bytes, which full recompute repeats
	fwd := func(rows, k, n int) float64 {
		fgb += opBytes(rows, k, n)
		return c.gemmTimeOf(sh.BF16, rows, k, n, false)
	}
	stream := func(kind string, n float64) float64 { calls++; return c.stream(kind, n) }
	// An FP8 layer's products (trainer/model's fp8.go): each reads its
	// operands' E4M3 or E5M2 codes, timed by c.fp8GEMMTime, and each
	// operand is quantised first (Amax, FP8Scale, Quantize: quant); forward
	// quantises the layer's inputs and the products' weights, backward
	// quantises them again and the output gradients.
	quant0 := func(n int) float64 { return c.stream(StreamAmax, float64(n)) + c.stream(StreamQuantize, float64(n)) }
	quant := func(times, n int) float64 { // times tensors of n values
		calls += 3 * float64(times) // Amax, FP8Scale, Quantize each
		return float64(times) * quant0(n)
	}
	gemm8 := func(rows, k, n int) float64 {
		calls += 2
		gb += 3 * opBytes(rows, k, n)
		return c.fp8GEMMTime(rows, k, n, false) + c.fp8GEMMTime(rows, k, n, true)
	}
	attnFwd := c.attentionTime(B*NH, T, HD, false)
	attnBwd := c.attentionTime(B*NH, T, HD, true)
	attnCalls := 2.0
	if P := sh.CP; P > 1 {
		// Ring attention (trainer/model/cp.go): the rank's two chunks of T/2 queries
		// meet 2P+1 key chunks of T/2, each pair one kernel over the micro-batch: 2
		// causal blocks on the diagonal and 2P−1 full ones (all keys before the
		// queries). Forward merges each block's result into the running output;
		// backward adds each block's dK/dV into the accumulator that travels with
		// it (P times, 2·B·T·KV values: dK and dV of the rank's tokens) and the
		// accumulator home into dK and dV.
		half, pairs := T/2, float64(2*P+1)
		attnFwd = 2*c.attentionTime(B*NH, half, HD, false) + float64(2*P-1)*c.attentionFullTime(B*NH, half, HD, false)
		attnBwd = 2*c.attentionTime(B*NH, half, HD, true) + float64(2*P-1)*c.attentionFullTime(B*NH, half, HD, true)
		attnFwd += pairs * c.stream(StreamAttnMerge, float64(B*half*Q))
		attnBwd += float64(P)*c.stream(StreamAdd, float64(2*B*T*KV)) + 2*c.stream(StreamAdd, float64(B*T*KV))
		attnCalls = 2*pairs + pairs + float64(P) + 2
	}
	// A chunked layer's attention (config.Model.AttentionChunk), by chunk size.
	chunked := map[int][3]float64{}
	s += stream(StreamEmbedding, float64(BT*C)) + stream(StreamEmbeddingBwd, float64(BT*C))
	R := BT / sh.TP // the rows of the residual stream (sequence parallelism splits them over tp)
	s += stream(StreamRMSNorm, float64(R*C)) + stream(StreamRMSNormBwd, float64(R*C))
	g += gemm(BT, C, V)
	s += stream(StreamCrossEntropy, float64(BT*V)) + stream(StreamCrossEntropyBw, float64(BT*V))
	for l := 0; l < mo.Layers; l++ {
		var lg, la, ls float64
		ls += 2 * (stream(StreamRMSNorm, float64(R*C)) + stream(StreamRMSNormBwd, float64(R*C)))
		fp8 := l >= sh.FP8Lo && l < sh.FP8Hi
		lgemm, lfwd := gemm, fwd
		if fp8 {
			lgemm = gemm8
			lfwd = func(rows, k, n int) float64 {
				fgb += opBytes(rows, k, n)
				return c.fp8GEMMTime(rows, k, n, false)
			}
			// The inputs (normed input, attention output) and the four
			// weights, forward and again in backward; the output gradients
			// of q, k, v and o.
			ls += quant(2, BT*C) + quant(2, BT*Q) + quant(2, Q*C) + quant(4, KV*C) + quant(2, C*Q)
			ls += quant(1, BT*Q) + quant(2, BT*KV) + quant(1, BT*C)
			if !mo.IsMoELayer(l) {
				// The MLP's input and SwiGLU product, its three weights;
				// the output gradients of w1, w3 and w2.
				ls += quant(2, BT*C) + quant(2, BT*FF) + quant(6, FF*C)
				ls += quant(2, BT*FF) + quant(1, BT*C)
			}
		}
		lg += lgemm(BT, C, Q) + lgemm(BT, C, KV) + lgemm(BT, C, KV) + lgemm(BT, Q, C)
		nope := mo.IsNoPELayer(l) // no rotary embedding
		if !nope {
			ls += stream(StreamRope, float64(BT*Q)) + stream(StreamRope, float64(BT*KV))
			ls += stream(StreamRopeBwd, float64(BT*Q)) + stream(StreamRopeBwd, float64(BT*KV))
		}
		if mo.QKNorm {
			// QK-norm: the per-head norms and their backward, which makes the
			// norms' inputs again (the q and k products' forward).
			ls += stream(StreamRMSNorm, float64(BT*(Q+KV))) + stream(StreamRMSNormBwd, float64(BT*(Q+KV)))
			if fp8 { // the remade products quantise their weights again
				lg += c.fp8GEMMTime(BT, C, Q, false) + c.fp8GEMMTime(BT, C, KV, false)
				ls += quant(1, Q*C) + quant(1, KV*C)
			} else {
				lg += c.gemmTimeOf(sh.BF16, BT, C, Q, false) + c.gemmTimeOf(sh.BF16, BT, C, KV, false)
			}
			gb += opBytes(BT, C, Q) + opBytes(BT, C, KV)
			calls += 2
		}
		lf, lb, lc := attnFwd, attnBwd, attnCalls
		if chunk := mo.AttentionChunk(l); chunk > 0 && chunk < mo.SeqLen {
			if _, ok := chunked[chunk]; !ok {
				f, b, n := chunkedAttention(c, sh, NH, HD, Q, KV, chunk)
				chunked[chunk] = [3]float64{f, b, n}
			}
			lf, lb, lc = chunked[chunk][0], chunked[chunk][1], chunked[chunk][2]
		}
		la += lf + lb
		calls += lc
		// What recomputation repeats in backward.
		fa := lf // (its launch is counted with the recompute below)
		fgb = 0
		fg := lfwd(BT, C, Q) + lfwd(BT, C, KV) + lfwd(BT, C, KV) + lfwd(BT, Q, C)
		fs := 2 * c.stream(StreamRMSNorm, float64(R*C))
		if fp8 { // full recompute's forward quantises its inputs and weights again
			fs += quant0(BT*C) + quant0(BT*Q) + quant0(Q*C) + 2*quant0(KV*C) + quant0(C*Q)
			if !mo.IsMoELayer(l) {
				fs += quant0(BT*C) + quant0(BT*FF) + 3*quant0(FF*C)
			}
		}
		if !nope {
			fs += c.stream(StreamRope, float64(BT*Q)) + c.stream(StreamRope, float64(BT*KV))
		}
		if mo.QKNorm {
			fs += c.stream(StreamRMSNorm, float64(BT*(Q+KV)))
		}
		if mo.IsMoELayer(l) {
			E, EF := mo.MoE.NumExperts, mo.MoE.ExpertFFNHidden/sh.ETP
			lg += gemm(BT, C, E)
			fg += fwd(BT, C, E)
			ls += stream(StreamRouter, float64(BT*E)) + stream(StreamRouterBwd, float64(BT*E))
			fs += c.stream(StreamRouter, float64(BT*E))
			rc := float64(sh.Routed * C)
			ls += stream(StreamDispatch, rc) + stream(StreamDispatchBwd, rc) + stream(StreamCombine, rc) + stream(StreamCombineBwd, rc)
			fs += c.stream(StreamDispatch, rc) + c.stream(StreamCombine, rc)
			if mo.MoE.ScoreBeforeExpert {
				// Each copy scaled by its gate, and the backward's dot products:
				// a pass over the copies each way, as the combination's.
				ls += stream(StreamCombine, rc) + stream(StreamCombineBwd, rc)
				fs += c.stream(StreamCombine, rc)
			}
			local := max(E/sh.EP, 1)
			rows := (sh.Routed + local - 1) / local // per local expert, balanced
			// Each local expert launches its own kernels; balanced, they are alike,
			// so one is timed and counted, times the local experts.
			before, beforeB, beforeF := calls, gb, fgb
			one := gemm(rows, C, EF) + gemm(rows, C, EF) + gemm(rows, EF, C)
			es := stream(StreamSwiGLU, float64(rows*EF)) + stream(StreamSwiGLUBwd, float64(rows*EF))
			efg := fwd(rows, C, EF) + fwd(rows, C, EF) + fwd(rows, EF, C)
			calls = before + float64(local)*(calls-before)
			// The experts' products and their bytes are counted apart from the
			// dense ones (full recompute repeats their forward).
			eb, efb := float64(local)*(gb-beforeB), float64(local)*(fgb-beforeF)
			gb, fgb = beforeB, beforeF
			eg += float64(local) * one
			egb += eb
			ls += float64(local) * es
			if sh.Mode == "full" {
				eg += float64(local) * efg
				egb += efb
			}
			fs += float64(local) * c.stream(StreamSwiGLU, float64(rows*EF))
			if k := float64(mo.MoE.SharedExperts); k > 0 {
				SF := mo.MoE.ExpertFFNHidden / sh.TP
				before, beforeB, beforeF := calls, gb, fgb
				lg += k * (gemm(BT, C, SF) + gemm(BT, C, SF) + gemm(BT, SF, C))
				fg += k * (fwd(BT, C, SF) + fwd(BT, C, SF) + fwd(BT, SF, C))
				ls += k * (stream(StreamSwiGLU, float64(BT*SF)) + stream(StreamSwiGLUBwd, float64(BT*SF)))
				calls, gb, fgb = before+k*(calls-before), beforeB+k*(gb-beforeB), beforeF+k*(fgb-beforeF)
				fs += k * c.stream(StreamSwiGLU, float64(BT*SF))
			}
		} else {
			lg += lgemm(BT, C, FF) + lgemm(BT, C, FF) + lgemm(BT, FF, C)
			fg += lfwd(BT, C, FF) + lfwd(BT, C, FF) + lfwd(BT, FF, C)
			ls += stream(StreamSwiGLU, float64(BT*FF)) + stream(StreamSwiGLUBwd, float64(BT*FF))
			fs += c.stream(StreamSwiGLU, float64(BT*FF))
		}
		dense := !mo.IsMoELayer(l)
		switch sh.Mode {
		case "full":
			lg, la, ls = lg+fg, la+fa, ls+fs
			gb += fgb
		case "selective": // the norms' outputs and a dense layer's SwiGLU product remade
			ls += 2 * stream(StreamRMSNorm, float64(R*C))
			if dense {
				ls += stream(StreamSwiGLU, float64(BT*FF))
			}
		}
		if sh.Stash {
			// bf16 stores (trainer/model/stash.go): the layer's input is rounded in
			// place (to and from bf16) and widened again before its backward; unless
			// full recompute remakes them, what the layer keeps goes into its stores
			// once, one call each, and comes back before the backward, except what
			// the products read from the stores (without tensor parallelism: the
			// normed inputs of a dense layer and its SwiGLU product; the experts'
			// inputs and SwiGLU products; the attention output comes back, for
			// attention's backward reads it).
			ls += stream(StreamToBF16, float64(R*C)) + 2*stream(StreamFromBF16, float64(R*C))
			if sh.Mode != "full" {
				moe := mo.IsMoELayer(l)
				kept := 3*R*C + BT*(2*Q+2*KV) // norms' outputs, mid; q, attention output; k, v
				slots := 7
				var direct, directSlots int
				if sh.TP == 1 {
					direct, directSlots = R*C, 1 // the attention's normed input
				}
				if sh.Mode == "selective" {
					// No stores for what is remade; the products' inputs among them
					// are rounded into shared ones in the forward and again after the
					// remake, and what they are remade from is rounded in place
					// (mid; a dense layer's gate and up).
					kept, slots, direct, directSlots = kept-2*R*C, slots-2, 0, 0
					ls += stream(StreamToBF16, float64(R*C)) + stream(StreamFromBF16, float64(R*C))
					if sh.TP == 1 {
						ls += 2 * stream(StreamToBF16, float64(R*C))
						if dense {
							ls += 2 * (stream(StreamToBF16, float64(R*C)) + stream(StreamToBF16, float64(BT*FF)))
						}
					}
					if dense {
						ls += 2 * (stream(StreamToBF16, float64(BT*FF)) + stream(StreamFromBF16, float64(BT*FF)))
					}
				}
				if moe {
					EF := mo.MoE.ExpertFFNHidden / sh.ETP
					kept += 2*sh.Routed*C + 3*sh.Routed*EF // the experts' inputs (permuted or received) and outputs; intermediates
					slots += 5
					direct, directSlots = direct+sh.Routed*(C+EF), directSlots+2 // the experts' products read their inputs and SwiGLU products
					k := mo.MoE.SharedExperts
					kept += 3 * k * BT * (mo.MoE.ExpertFFNHidden / sh.TP)
					slots += 3 * k
				} else if sh.Mode == "selective" {
					kept += 2 * BT * FF // gate and up (the SwiGLU product is remade)
					slots += 2
				} else {
					kept += 3 * BT * FF
					slots += 3
					if sh.TP == 1 {
						direct, directSlots = direct+R*C+BT*FF, directSlots+2 // the MLP's normed input, the SwiGLU product
					}
				}
				ls += float64(slots) * c.stream(StreamToBF16, float64(kept)/float64(slots)) // timed at the mean size
				if back := slots - directSlots; back > 0 {
					ls += float64(back) * c.stream(StreamFromBF16, float64(kept-direct)/float64(back))
				}
				calls += float64(2*slots - directSlots)
			}
		}
		g, a, s = g+lg, a+la, s+ls
	}
	mt := MicroTimes{GEMM: g, Experts: eg, Attention: a, Stream: s, Calls: calls, GEMMBytes: gb, ExpertBytes: egb}
	if egb > 0 {
		mt.Routed = float64(sh.Routed)
	}
	return mt
}

// MicroCompute is microCompute for one rank holding the whole model (no tensor or
// expert parallelism), in fp32 or in bf16 (bf16 weights, and the CPU's bf16
// stores of saved activations): what the calibration's in-step factors and
// per-call cost are fitted against.
func MicroCompute(mo config.Model, batch int, mode string, bf16 bool, c *Calibration) MicroTimes {
	routed := 0
	if mo.MoE.NumExperts > 0 {
		routed = batch * mo.SeqLen * mo.MoE.TopK
	}
	return microCompute(mo, microShape{B: batch, T: mo.SeqLen, TP: 1, EP: 1, ETP: 1, Routed: routed, Mode: mode, BF16: bf16, Stash: bf16}, c)
}
