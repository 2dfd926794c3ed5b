package parallel

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"math"

	"github.com/shardline/shardline/config"
)

// Plan is a compiled recipe: everything the trainer needs to lay out and run a step,
// and the cost model's prediction of what it will take.
type Plan struct {
	Name string
	// Strategy is fsdp.data_parallel_sharding_strategy as the recipe names it
	// (for display and checkpoints), Sharding what it shards.
	Strategy string
	Sharding Sharding
	Topology Topology
	Mesh     Mesh
	// Params is the parameter table; Units and Groups the FSDP layout over it.
	Params []Param
	Units  []Unit
	Groups []Group
	// MicroBatches is the number of micro-batches per step on each dp rank.
	MicroBatches int
	// ParamsTotal and ParamsActive count the full model (active: per token).
	ParamsTotal, ParamsActive int64
	// Padding is the elements added to this rank's buffers for alignment and equal
	// shards, summed over groups (full buffers, before sharding).
	Padding int64
	// Buffers are the FSDP runtime's unit buffers, made before the first step.
	Buffers UnitBuffers
	Memory  Memory
	// MoEDispatchWorst is the dispatch buffers' worst case when no capacity factor
	// bounds routing (every token's copies landing on one rank), and
	// MemoryWorstTotal the whole memory total then (worstRoutingTotal; Memory.Total
	// where routing cannot exceed the balanced share).
	MoEDispatchWorst int64
	MemoryWorstTotal int64
	Collectives      []Collective
	Comm             []AxisComm
	// FLOPs per step over all ranks: the model's (for MFU) and what is executed
	// (recompute included).
	ModelFLOPs, ExecFLOPs float64
	ComputeS              float64
	// StallS is the part of ComputeS the routed experts' products spend waiting
	// on their operands (StepBreakdown.Stall; calibrated plans only).
	StallS float64
	// OptimizerS is the optimizer step, memory-bound: every owned element's main
	// weight, moments and gradient read and written once, at HBM bandwidth.
	OptimizerS   float64
	ExposedCommS float64
	StepTimeS    float64
	// TimeModel says how the step was timed: per operation from a calibration
	// (the CPU), per operation by a GPU's roofline (gpucost.go), or, for a CPU
	// a recipe describes by its peak, FLOPs at a fraction of it.
	TimeModel           string
	TokensPerSPerDevice float64
	MFU                 float64
	Fingerprint         string
	// expertsPerRank and paramsPerExpert place a routed expert's parameters
	// (ExpertParam): the routed experts an ep rank holds in each layer, and
	// each expert's parameters in the table.
	expertsPerRank, paramsPerExpert int
}

// Compile turns a recipe and a topology into a Plan. It is pure: no device, no I/O.
// Errors are *config.Diagnostic problems (config.KeyProblem) naming the
// recipe key that caused them.
func Compile(r *config.Recipe, topo Topology) (*Plan, error) {
	par := r.Parallel
	m, err := NewMesh(topo.WorldSize, par.TensorParallel, par.ContextParallel, par.PipelineParallel, par.ExpertParallel, par.ExpertTensorParallel)
	if err != nil {
		return nil, err
	}
	if err := checkShapes(r); err != nil {
		return nil, err
	}
	if err := checkSizes(r, m); err != nil {
		return nil, err
	}
	ps, err := ParamTable(r.Model, m.TP, m.ETP)
	if err != nil {
		return nil, err
	}
	units, unitOf, err := buildUnits(ps, r.FSDP.FSDPUnitModules)
	if err != nil {
		return nil, err
	}
	d := dtypesOf(r)
	strategy := r.FSDP.DataParallelShardingStrategy
	sh := ShardingOf(strategy)
	groups := layoutGroups(ps, units, unitOf, m, r.Model.MoE.NumExperts, dtypeName(d.compute), sh.Optim, func(p *Param) bool { return FP8Weight(r, p) })
	if err := verifyLayout(ps, groups, r.Model.MoE.NumExperts, m.EP); err != nil {
		return nil, fmt.Errorf("parallel: layout invariant broken (a shardline bug): %w", err)
	}
	p := &Plan{Name: r.Run.Name, Strategy: strategy, Sharding: sh, Topology: topo, Mesh: m, Params: ps, Units: units, Groups: groups}
	p.ParamsTotal, p.ParamsActive = ParamCount(ps, r.Model)
	if E := r.Model.MoE.NumExperts; E > 0 {
		p.expertsPerRank = E / m.EP
		layer := ps[firstExpert(ps)].Layer
		for i := range ps {
			if ps[i].Expert == 0 && ps[i].Layer == layer {
				p.paramsPerExpert++
			}
		}
	}
	dp := int64(m.DP)
	p.MicroBatches = int(int64(r.Train.GlobalBatchSize) / (int64(r.Train.MicroBatchSize) * dp))
	if p.MicroBatches < 1 {
		return nil, config.KeyProblem("train.global_batch_size", fmt.Sprintf("global batch %d is smaller than micro batch × dp = %d", r.Train.GlobalBatchSize, int64(r.Train.MicroBatchSize)*dp), "")
	}
	for i := range ps { // an expert this rank does not hold has its twins' unit
		ps[i].Unit = unitOf[i]
	}
	p.memory(r, d)
	// Owned elements: the main weights and moments this rank updates.
	owned := (p.Memory.OptimizerState / d.optim)
	p.OptimizerS = float64(2*owned*(d.main+d.optim+d.grad+d.compute)) / topo.Device.HBMBandwidth
	p.Collectives = append(fsdpCollectives(r, sh, groups, m, int64(p.MicroBatches), d), modelCollectives(r, m, tokensOf(r, m), int64(p.MicroBatches), d)...)
	p.Comm = summarize(p.Collectives, m, topo)
	p.timing(r)
	p.Fingerprint = p.fingerprint()
	return p, nil
}

// checkShapes refuses a shape the layout cannot represent by the first of
// config.ShapeProblems (the rules lint reports), naming its key and the fix.
func checkShapes(r *config.Recipe) error {
	if ps := config.ShapeProblems(r); len(ps) > 0 {
		return config.KeyProblem(ps[0].Keys[0], ps[0].Msg, ps[0].Help)
	}
	return nil
}

func (p *Plan) memory(r *config.Recipe, d dtypes) {
	var full, shard, full8, shard8 int64
	unitFull := make([]int64, len(p.Units))
	unitFP8 := make([]int64, len(p.Units)) // the FP8 groups' part of unitFull
	for i := range p.Groups {
		g := &p.Groups[i]
		full += g.Padded
		shard += g.ShardNumel()
		p.Padding += g.AlignPad + g.TailPad
		if g.FP8 {
			full8, shard8 = full8+g.Padded, shard8+g.ShardNumel()
		}
		if g.Shards > 1 { // a group held whole needs no gather or reduce buffer
			unitFull[g.Unit] += g.Padded
			if g.FP8 {
				unitFP8[g.Unit] += g.Padded
			}
		}
	}
	mem := staticMemory(p.Sharding, full, shard, d)
	if full8 > 0 {
		// FP8 compute weights take a byte a value where the others take the
		// compute dtype's, beside their scales.
		w8 := full8
		if p.Sharding.Params {
			w8 = shard8
		}
		mem.Weights += FP8ScaleBytes(fp8Tensors(p.Groups), int64(p.Mesh.Size(AxisDPCP))) - w8*(d.compute-1)
	}
	p.Buffers = unitBuffers(r, p, unitFull, unitFP8)
	mem.GatheredUnits = p.Buffers.Gather*d.compute + p.Buffers.GatherFP8
	p.Buffers.Stage = reduceStage(r, p, runsEngine(r))
	mem.GradReduceBuffers = p.Buffers.Reduce*d.grad + p.Buffers.Stage.Bytes()
	t := tokensOf(r, p.Mesh)
	mem.Activations = activationBytes(r, p.Mesh, t, d)
	mem.MoEDispatch, p.MoEDispatchWorst = dispatchBytes(r, p.Mesh, t, d)
	mem.Logits = logitsBytes(r, p.Mesh, t, d)
	mem.Scratch = scratchBytes(r, p.Mesh)
	for _, c := range mem.Components() {
		mem.Total += c.Bytes
	}
	p.Memory = mem
	p.MemoryWorstTotal = worstRoutingTotal(r, p.Mesh, t, d, mem, p.MoEDispatchWorst)
}

// timing estimates a step. FLOPs per token, forward: 2 per weight a token passes
// through in a matmul (the embedding lookup is no matmul; a tied output head is),
// plus causal attention's 2·seq·w per layer, w = heads·head size, the attention
// width (hidden unless head_dim decouples it) (QKᵀ and PV, each 2·seq·w, halved by the
// causal mask); a layer that attends in chunks (model.attention_chunk_size)
// counts its chunks' causal attention instead, 2·(n·chunk² + r²)/seq·w for n
// whole chunks and a last one of r positions (attentionPairs). Document masks
// depend on the data and count as whole-sequence causal attention. A step is 3× forward (backward is twice forward); full recompute
// adds a forward of the layers (selective remakes elementwise work only,
// which the step model times); the engine's QK-norm, the q and k products
// again in backward. Compute time is the
// executed FLOPs of one rank (all ranks share the work evenly) over the achievable
// throughput. Communication on tp/cp/ep/etp is exposed; FSDP's overlappable part
// hides behind compute, except what exceeds it.
func (p *Plan) timing(r *config.Recipe) {
	mo := r.Model
	width, seq := float64(mo.Heads*mo.HeadSize()), float64(mo.SeqLen) // the attention width
	var matmul float64
	for i := range p.Params {
		q := &p.Params[i]
		if len(q.Shape) < 2 || (q.IsExpert() && q.Expert >= mo.MoE.TopK) {
			continue
		}
		if q.Name == "embed.weight" && !mo.TieEmbeddings {
			continue
		}
		matmul += float64(q.Numel())
	}
	attn := 2 * width * attentionLength(mo)
	fwd := 2*matmul + attn
	tokens := float64(r.Train.GlobalBatchSize) * seq
	p.ModelFLOPs = 3 * fwd * tokens
	exec := 3 * fwd
	// Full recompute runs each layer's forward again; selective remakes only
	// elementwise work (norms, SwiGLU), which counts no FLOPs here (the step
	// model times it).
	if r.ActivationCheckpoint.Mode == "full" {
		exec += fwd
	}
	if mo.QKNorm && runsEngine(r) {
		// The engine's QK-norm backward makes the norms' inputs again: the q and
		// k products' forward, per layer.
		exec += 2 * float64(mo.Hidden*(mo.Heads+mo.EffectiveKVHeads())*mo.HeadSize()*mo.Layers)
	}
	p.ExecFLOPs = exec * tokens
	dev := p.Topology.Device
	if cal := p.Topology.Calibration; cal != nil {
		b := stepModel(r, p, cal)
		p.TimeModel = fmt.Sprintf("per operation, calibrated on %s (%s)%s", cal.Host, cal.Date, cal.timeModelProbe())
		if lo, hi := r.FP8LayerRange(); hi > lo && !cal.FP8Timed() {
			p.TimeModel += "; its FP8 products timed as fp32 ones plus a pass widening their codes, and their amax and quantisation as a square sum and a bf16 conversion (the table predates FP8's timing: shardline calibrate measures them)"
		}
		p.ComputeS, p.OptimizerS, p.ExposedCommS = b.GEMM+b.Attention+b.Stream+b.Stall, b.Optimizer, b.Comm
		p.StallS = b.Stall
	} else if dev.Name != "cpu" {
		b := gpuStepModel(r, p)
		p.TimeModel = fmt.Sprintf("per operation on %s: efficiencies measured on an H100, figures assumed elsewhere (docs/plan.md)", dev.Name)
		if lo, hi := r.FP8LayerRange(); hi > lo {
			if dev.FP8FLOPS > 0 {
				p.TimeModel += fmt.Sprintf("; FP8 layers' products at the FP8 peak (%.0f TFLOP/s dense)", dev.FP8FLOPS/1e12)
			} else {
				p.TimeModel += fmt.Sprintf("; FP8 layers' products at the bf16 peak: %s has no FP8 tensor cores", dev.Name)
			}
		}
		p.ComputeS, p.OptimizerS, p.ExposedCommS = b.GEMM+b.Attention+b.Stream, b.Optimizer, b.Comm
	} else {
		p.TimeModel = fmt.Sprintf("FLOPs at %.0f%% of %s's peak", 100*dev.Achievable, dev.Name)
		p.ComputeS = p.ExecFLOPs / float64(p.Mesh.World) / (dev.PeakFLOPS * dev.Achievable)
		var exposed, overlappable float64
		for _, c := range p.Comm {
			exposed += c.TimeS - c.OverlapS
			overlappable += c.OverlapS
		}
		p.ExposedCommS = exposed + math.Max(0, overlappable-p.ComputeS)
	}
	p.StepTimeS = p.ComputeS + p.OptimizerS + p.ExposedCommS
	p.TokensPerSPerDevice = tokens / p.StepTimeS / float64(p.Mesh.World)
	p.MFU = p.ModelFLOPs / float64(p.Mesh.World) / (p.StepTimeS * dev.PeakFLOPS)
}

// fingerprint hashes everything that decides the layout and the schedule, in a
// fixed order, so it is stable across runs and machines.
func (p *Plan) fingerprint() string {
	hs := sha256.New()
	w := func(vals ...any) {
		for _, v := range vals {
			writeHash(hs, v)
		}
	}
	w("shardline-plan-v1", p.Strategy, p.Mesh.World, p.Mesh.TP, p.Mesh.CP, p.Mesh.DP, p.Mesh.PP, p.Mesh.ETP, p.Mesh.EP, p.Mesh.EDP,
		p.Topology.GPUsPerNode, p.Topology.Device.Name, p.Topology.Device.MemoryBytes, p.MicroBatches)
	for _, u := range p.Units {
		w(u.Name, u.Kind, len(u.Groups))
	}
	for i := range p.Groups {
		g := &p.Groups[i]
		w(g.Unit, g.Expert, g.Dtype, string(g.Axis), g.Shards, g.Padded, len(g.Entries))
		for _, e := range g.Entries {
			w(p.Params[e.Param].Name, e.Offset, e.Numel)
		}
	}
	for _, c := range p.Memory.Components() {
		w(c.Name, c.Bytes)
	}
	for _, c := range p.Collectives {
		w(c.Kind, string(c.Axis), c.What, c.Dtype, c.Bytes, c.Calls, c.Overlap)
	}
	return "sha256:" + hex.EncodeToString(hs.Sum(nil))
}

func writeHash(h hash.Hash, v any) {
	var buf [8]byte
	switch x := v.(type) {
	case string:
		binary.LittleEndian.PutUint64(buf[:], uint64(len(x)))
		h.Write(buf[:])
		h.Write([]byte(x))
	case int:
		binary.LittleEndian.PutUint64(buf[:], uint64(x))
		h.Write(buf[:])
	case int64:
		binary.LittleEndian.PutUint64(buf[:], uint64(x))
		h.Write(buf[:])
	case bool:
		if x {
			buf[0] = 1
		}
		h.Write(buf[:1])
	default:
		panic(fmt.Sprintf("writeHash: unsupported %T", v)) // a programming error in fingerprint, never input
	}
}
