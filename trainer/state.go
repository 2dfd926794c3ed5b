package trainer

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/parallel/collective"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/trainer/model"
)

// state is one rank's training state, laid out by the plan. Per parameter group:
// the full compute weights and gradients (the model's views), this rank's shard of
// the fp32 main weights, of the reduced gradients and of the optimizer moments.
// Under no_shard the shard is the whole group.
//
// Megatron-FSDP's strategies, as executed here:
//
//	no_shard            all-reduce gradients; every rank updates the whole group
//	optim, optim_grads,  reduce-scatter gradients; each rank updates its shard of the
//	optim_grads_params   main weights; all-gather the updated compute weights
//
// optim_grads_params holds no full buffers: unitRuntime gathers each unit before
// the blocks that use it and releases it after, and reduce-scatters each unit's
// gradients as soon as its backward ends.
type state struct {
	plan    *parallel.Plan
	rank    int
	sharded bool
	// perUnit (optim_grads_params): no full weights; unitRuntime gathers units on
	// demand. unitGrads (optim_grads too): no full gradients; unitRuntime gives each
	// unit a gradient buffer in backward and reduces it into the shard.
	perUnit    bool
	unitGrads  bool
	bf16       bool
	reduceBF16 bool
	be         tensor.Backend

	// weights are the full compute weights per group (Padded; empty under
	// optim_grads_params): fp32, or bf16 storage in a bf16 run.
	weights []tensor.Buffer
	grads   []tensor.Buffer // per group: full gradients (Padded), fp32 (empty under optim_grads, optim_grads_params)
	main    [][]float32     // per group: this rank's shard of the fp32 main weights, on the host (initialisation, checkpoints)
	wshardB []tensor.Buffer // per group: this rank's bf16 compute shard, to gather (bf16 only; its part of weights unless optim_grads_params)
	// The optimizer's operands (mainB, the main weights, gshardB, this rank's
	// shard of the reduced gradients, and the moments mB, vB, which nothing else
	// reads), and the gradient components whole (gradsAll without unit
	// gradients, whose part each gshardB then is; gshardAll with them), which a
	// step zeroes.
	mainB, gshardB, mB, vB []tensor.Buffer
	gradsAll, gshardAll    tensor.Buffer
	// sqDense and sqExpert list the gradient shards the norm sums
	// (squaredBuffers), built at the first step.
	sqDense, sqExpert []tensor.Buffer
	// wireStage and partStage are the gradient reduction's staging
	// (parallel.ReduceStage), which every group's reduction reuses in turn.
	wireStage, partStage tensor.Buffer
	lo                   []int64 // per group: start of this rank's shard
	segs                 [][]segment
	comms                []collective.Group // per group: its dp×cp or edp group, on buffers
	// groupOf is the collectives made per communicator (nativeOf: the
	// device's, per axis: NCCL's, whose collectives must be issued from one
	// goroutine in program order, comm.InlineStream); closers release those;
	// collectives says what each group runs on, for the log.
	groupOf     map[comm.Communicator]collective.Group
	nativeOf    map[string]collective.Group // the device's groups, by axis
	closers     []func()
	userBuffers bool // use_nccl_ub: the runtime's arenas are NCCL user buffers
	// abortable are the device's groups (NCCL), which watch gives up when the
	// job is lost; lostWorld is set when it did so because the world aborted.
	abortable   []collective.Abortable
	lostWorld   atomic.Bool
	collectives []string
	// world is the world's communicator, for the host's exchanges (checkpoints,
	// evaluation), and worldG its collectives on buffers (the step's statistics).
	world  comm.Communicator
	worldG collective.Group
	// mem is the backend's memory of this rank; stats is the step's statistics
	// buffer there (tensor.NumStats, f64: loss and token sums, square sums,
	// norm, clip factor, whether the update applies, optimizer steps), written
	// and read by kernels so that a step reads nothing back; wire is the f32
	// buffer statistics are all-reduced through.
	mem tensor.Memory
	// host is mem as host memory, whose buffers the collectives view in place
	// (collective.OnHost), or nil for a device's memory: the collectives then
	// copy through the host (collective.Staged) and the weights are uploaded
	// and read back where the host makes or reads them.
	host  tensor.HostMemory
	stats tensor.Buffer
	wire  tensor.Buffer
	// Expert parallelism: this rank's ep coordinate and the ep group (nil
	// when ep = 1), with its collectives on buffers (epG); the plan places
	// the experts (Plan.ExpertParam).
	epRank int
	epComm comm.Communicator
	epG    collective.Group
	// Context parallelism: this rank's cp coordinate and the cp group (nil when
	// cp = 1).
	cpRank int
	cpComm comm.Communicator
	cpG    collective.Group
	// Tensor parallelism: this rank's tp coordinate and the tp group (nil when
	// tp = 1). Parameters are this rank's tp slices (the plan's local shapes).
	tpRank int
	tpComm comm.Communicator
	tpG    collective.Group
	// counted are the model's communicators (ep, cp, tp), counting what this rank
	// sends on each.
	counted []countedComm

	wviews []tensor.Buffer // per parameter (table order): the compute weights' buffers, what the model binds
	gviews []tensor.Buffer // and the gradients'

	// fp8 is the FP8 compute weights' scales (precision.fp8.param_gather:
	// the plan's FP8 groups; fp8weights.go), nil without them.
	fp8 *fp8Scales
}

// countedComm is one model-parallel group's communicator, counting bytes sent;
// train is what it sent in training steps (evaluation excluded), from mark, the
// count when the current step began.
type countedComm struct {
	axis        parallel.Axis
	c           *comm.Counted
	mark, train int64
}

// count wraps a model-parallel communicator so that what it sends is counted.
func (s *state) count(axis parallel.Axis, c comm.Communicator) comm.Communicator {
	cc := comm.NewCounted(c)
	s.counted = append(s.counted, countedComm{axis: axis, c: cc})
	return cc
}

// stepStarts and stepEnds bracket a training step's passes: what each
// model-parallel group sends in between is added to its training count.
func (s *state) stepStarts() {
	for i := range s.counted {
		s.counted[i].mark = s.counted[i].c.Sent()
	}
}

func (s *state) stepEnds() {
	for i := range s.counted {
		c := &s.counted[i]
		c.train += c.c.Sent() - c.mark
	}
}

// segment is a parameter's part of a rank's shard: [lo, hi) relative to the shard.
type segment struct {
	param  int
	lo, hi int64
	start  int64 // index of element lo within the parameter
	decay  bool
}

// groupsFor returns the communicators of every plan group for a rank.
type groupsFor func(rank int, axis parallel.Axis) (comm.Communicator, error)

func newState(p *parallel.Plan, r *config.Recipe, be tensor.Backend, rank int, world comm.Communicator, groups groupsFor) (*state, error) {
	s := &state{plan: p, rank: rank, bf16: r.Precision.BF16, reduceBF16: r.FSDP.GradReduceInBF16, be: be, world: world,
		sharded: p.Sharding.Optim, userBuffers: r.FSDP.UseNCCLUB, perUnit: p.Sharding.Params, unitGrads: p.Sharding.Grads,
		wviews: make([]tensor.Buffer, len(p.Params)), gviews: make([]tensor.Buffer, len(p.Params))}
	if err := s.openMemory(); err != nil {
		return nil, err
	}
	c := p.Mesh.Coords(rank)
	if p.Mesh.EP > 1 {
		var err error
		if s.epComm, err = groups(rank, parallel.AxisEP); err != nil {
			return nil, err
		}
		s.epComm = s.count(parallel.AxisEP, s.epComm)
		s.epRank = c.EP
	}
	if p.Mesh.CP > 1 {
		var err error
		if s.cpComm, err = groups(rank, parallel.AxisCP); err != nil {
			return nil, err
		}
		s.cpComm = s.count(parallel.AxisCP, s.cpComm)
		s.cpRank = c.CP
	}
	if p.Mesh.TP > 1 {
		var err error
		if s.tpComm, err = groups(rank, parallel.AxisTP); err != nil {
			return nil, err
		}
		s.tpComm = s.count(parallel.AxisTP, s.tpComm)
		s.tpRank = c.TP
	}
	var err error
	for _, g := range []struct {
		dst  *collective.Group
		c    comm.Communicator
		name string
	}{{&s.worldG, world, "world"}, {&s.epG, s.epComm, "ep"}, {&s.cpG, s.cpComm, "cp"}, {&s.tpG, s.tpComm, "tp"}} {
		if *g.dst, err = s.onBuffers(g.c, g.name); err != nil {
			s.close()
			return nil, err
		}
	}
	if err := s.allocate(r); err != nil {
		s.close()
		return nil, err
	}
	for gi := range p.Groups {
		cm, err := groups(rank, p.Groups[gi].Axis)
		if err == nil {
			var g collective.Group
			if g, err = s.onBuffers(cm, string(p.Groups[gi].Axis)); err == nil {
				s.comms = append(s.comms, g)
				continue
			}
		}
		s.close()
		return nil, err
	}
	s.watch()
	return s, nil
}

// watchInterval is how often watch asks the device's groups for failures of
// their own.
const watchInterval = 500 * time.Millisecond

// watch gives the device's groups up (NCCL's abort) when the job is lost:
// the world aborted (a rank of this process failed; a collective of this
// process failed, over TCP) or a group reports a failure of its own (a peer
// process gone). Without it, collectives waiting on a lost rank would hold
// the GPU, and this rank's next read-back, forever. close stops it first.
func (s *state) watch() {
	if len(s.abortable) == 0 {
		return
	}
	var aborted <-chan struct{}
	if a, ok := s.world.(comm.Aborting); ok {
		aborted = a.Aborted()
	}
	stop, done := make(chan struct{}), make(chan struct{})
	giveUp := func() {
		for _, a := range s.abortable {
			a.Abort()
		}
	}
	go func() {
		defer close(done)
		tick := time.NewTicker(watchInterval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-aborted:
				s.lostWorld.Store(true)
				giveUp()
				return
			case <-tick.C:
				for _, a := range s.abortable {
					if a.AsyncErr() != nil {
						giveUp()
						return
					}
				}
			}
		}
	}()
	s.closers = append([]func(){func() { close(stop); <-done }}, s.closers...)
}

// onBuffers is c's collectives on the rank's buffers (nil for nil): in place
// on host memory; on a device's, the device's own (NCCL, where every member
// of c has a GPU of its own: collective.Native), or else staged through the
// host. It is collective (every rank makes its groups in the same order). A
// communicator asked for twice, or a device group of an axis (name) asked
// for again, gets the group made the first time. What each
// group runs on is noted in s.collectives, for the log.
func (s *state) onBuffers(c comm.Communicator, name string) (collective.Group, error) {
	if c == nil {
		return nil, nil
	}
	if g, ok := s.groupOf[c]; ok {
		return g, nil
	}
	if g, ok := s.nativeOf[name]; ok {
		return g, nil // one NCCL communicator per axis (each holds device memory of its own)
	}
	var g collective.Group
	switch nat, isNative := s.mem.(collective.Native); {
	case s.host != nil:
		g = collective.OnHost(c, s.host)
	case isNative:
		ng, closeG, why, err := nat.Collectives(c)
		if err != nil {
			return nil, fmt.Errorf("the %s group's collectives on the device: %w", name, err)
		}
		if ng == nil {
			g = collective.Staged(c, s.mem)
			s.collectives = append(s.collectives, fmt.Sprintf("%s: staged through the host (%s)", name, why))
			break
		}
		s.closers = append(s.closers, closeG)
		if a, ok := ng.(collective.Abortable); ok {
			s.abortable = append(s.abortable, a)
		}
		if cc, ok := c.(*comm.Counted); ok {
			ng = collective.Counting(ng, cc) // the model's groups report what they send
		}
		g = ng
		s.collectives = append(s.collectives, name+": the device's (NCCL)")
		if s.nativeOf == nil {
			s.nativeOf = map[string]collective.Group{}
		}
		s.nativeOf[name] = g
	default:
		g = collective.Staged(c, s.mem)
		s.collectives = append(s.collectives, name+": staged through the host")
	}
	if s.groupOf == nil {
		s.groupOf = map[comm.Communicator]collective.Group{}
	}
	s.groupOf[c] = g
	return g, nil
}

// nativeGroups reports whether some of the rank's groups run on the device's
// collectives (NCCL).
func (s *state) nativeGroups() bool { return len(s.nativeOf) > 0 }

// isNative reports whether g runs on the device's collectives (NCCL).
func (s *state) isNative(g collective.Group) bool {
	for _, n := range s.nativeOf {
		if n == g {
			return true
		}
	}
	return false
}

// close releases the device's communicators (NCCL), if any.
func (s *state) close() {
	for _, c := range s.closers {
		c()
	}
	s.closers = nil
}

// openMemory makes the rank's backend memory and its statistics buffers.
func (s *state) openMemory() error {
	s.mem = s.be.NewMemory()
	s.stats, s.wire = s.mem.Alloc(tensor.Float64, tensor.NumStats), s.mem.Alloc(tensor.Float32, wireLen)
	s.host, _ = s.mem.(tensor.HostMemory)
	return s.mem.Err()
}

// allocate lays out the rank's state in its backend memory: one allocation per
// plan memory component (compute weights, gradients, main weights, gradient
// shards, optimizer state), made before the first step and carved into the
// groups' buffers, so the steady state allocates nothing and what the state
// holds is what the backend holds. The model and the FSDP runtime take the
// weights' and gradients' buffers (the runtime's collectives reach them
// through host views, HostMemory), the optimizer too.
func (s *state) allocate(r *config.Recipe) error {
	p := s.plan
	var full, shard int64 // Σ over groups of padded lengths and of this rank's shard lengths
	var gradShards int64
	for gi := range p.Groups {
		g := &p.Groups[gi]
		lo, hi := shardOf(p, s.rank, gi)
		full, shard = full+g.Padded, shard+hi-lo
		if s.unitGrads {
			gradShards += hi - lo
		}
	}
	// FP8 groups hold their compute weights as E4M3 codes, apart from the
	// others' (full8 and shard8 of full and shard).
	var full8, shard8 int64
	for gi := range p.Groups {
		if p.Groups[gi].FP8 {
			lo, hi := shardOf(p, s.rank, gi)
			full8, shard8 = full8+p.Groups[gi].Padded, shard8+hi-lo
		}
	}
	var weights, weights8, grads, main, wshard, wshard8 tensor.Buffer
	if !s.perUnit {
		weights = s.newWeights(full - full8)
		weights8 = s.mem.Alloc(tensor.Float8E4M3, int(full8))
	}
	gdt := s.gradDType()
	if !s.unitGrads {
		grads = s.mem.Alloc(gdt, int(full))
	}
	if s.bf16 || s.perUnit { // otherwise the main weights are the fp32 compute weights
		main = s.mem.Alloc(tensor.Float32, int(shard))
	}
	if s.bf16 && s.perUnit {
		wshard = s.mem.Alloc(tensor.BFloat16, int(shard-shard8))
		wshard8 = s.mem.Alloc(tensor.Float8E4M3, int(shard8))
	}
	gshard := s.mem.Alloc(gdt, int(gradShards))
	opt := s.mem.Alloc(tensor.Float32, 2*int(shard))
	if st := p.Buffers.Stage; st.Wire+st.Part > 0 {
		pdt := tensor.Float32
		if st.PartBF16 {
			pdt = tensor.BFloat16
		}
		s.wireStage, s.partStage = s.mem.Alloc(tensor.BFloat16, int(st.Wire)), s.mem.Alloc(pdt, int(st.Part))
	}
	if err := s.mem.Err(); err != nil {
		return fmt.Errorf("allocating rank %d's state (%d parameters, %d in its shards): %w", s.rank, full, shard, err)
	}
	s.gradsAll, s.gshardAll = grads, gshard
	// Offsets into the full, shard and gradient-shard components, and into
	// the compute weights (whole and shards) of the groups in the compute
	// dtype (wo, wso) and of the FP8 groups (w8o, w8so).
	var fo, so, gso, wo, wso, w8o, w8so int
	for gi := range p.Groups {
		g := &p.Groups[gi]
		lo, hi := shardOf(p, s.rank, gi)
		n := int(hi - lo)
		var w, grB tensor.Buffer
		wAll, wShards, wOff, wsOff := weights, wshard, &wo, &wso
		if g.FP8 {
			wAll, wShards, wOff, wsOff = weights8, wshard8, &w8o, &w8so
		}
		if !s.perUnit {
			w = wAll.Slice(*wOff, *wOff+int(g.Padded))
			*wOff += int(g.Padded)
		}
		if !s.unitGrads {
			grB = grads.Slice(fo, fo+int(g.Padded))
		}
		s.weights, s.grads = append(s.weights, w), append(s.grads, grB)
		s.lo = append(s.lo, lo)
		var mainB tensor.Buffer
		switch {
		case s.bf16 && s.perUnit:
			mainB = main.Slice(so, so+n)
			s.wshardB = append(s.wshardB, wShards.Slice(*wsOff, *wsOff+n))
			*wsOff += n
		case s.bf16:
			// The rank's bf16 shard is its part of the full compute weights, as
			// Megatron-FSDP's parameter buffer holds it: rounded there in place,
			// then gathered around it.
			mainB = main.Slice(so, so+n)
			s.wshardB = append(s.wshardB, w.Slice(int(lo), int(hi)))
		case s.perUnit:
			mainB = main.Slice(so, so+n)
		default:
			mainB = w.Slice(int(lo), int(hi)) // fp32 compute: the main weights are the weights themselves
		}
		s.mainB = append(s.mainB, mainB)
		if s.host != nil {
			s.main = append(s.main, s.host.Float32s(mainB))
		}
		// The reduced gradient shard: its own buffer under unit gradients (no
		// full gradients are held); otherwise the rank's part of the full
		// gradients, which the reduce-scatter fills in place (or, unsharded, the
		// all-reduced gradients themselves), as Megatron's distributed optimizer
		// keeps it: no memory beyond the plan's whole gradients.
		var gsB tensor.Buffer
		if s.unitGrads {
			gsB = gshard.Slice(gso, gso+n)
			gso += n
		} else {
			gsB = grB.Slice(int(lo), int(hi))
		}
		s.gshardB = append(s.gshardB, gsB)
		mB, vB := opt.Slice(2*so, 2*so+n), opt.Slice(2*so+n, 2*so+2*n)
		s.mB, s.vB = append(s.mB, mB), append(s.vB, vB)
		for _, e := range g.Entries {
			if !s.perUnit {
				s.wviews[e.Param] = w.Slice(int(e.Offset), int(e.Offset+e.Numel))
			}
			if !s.unitGrads {
				s.gviews[e.Param] = grB.Slice(int(e.Offset), int(e.Offset+e.Numel))
			}
		}
		s.segs = append(s.segs, segmentsOf(p, gi, lo, hi, r.Train.DecayNormsAndEmbeddings))
		fo, so = fo+int(g.Padded), so+n
	}
	if full8 > 0 {
		var err error
		if s.fp8, err = s.newFP8Scales(); err != nil {
			return fmt.Errorf("allocating rank %d's FP8 compute weights' scales: %w", s.rank, err)
		}
	}
	return s.mem.Err()
}

// weightsView is the compute weights' view of b (bf16 or fp32 values): in
// place on host memory, read back into fp32 values from a device's.
func (s *state) weightsView(b tensor.Buffer) tensor.Weights[float32] {
	if s.host == nil {
		w := make([]float32, b.Len())
		s.mem.Read(w, b)
		return tensor.FloatWeights(w)
	}
	if b.DType() == tensor.BFloat16 {
		return tensor.BF16Weights[float32](s.host.BF16s(b))
	}
	return tensor.FloatWeights(s.host.Float32s(b))
}

// mainHost is group gi's shard of the main weights as host values to fill:
// the buffer's own elements on host memory, a staging slice otherwise, which
// uploadMain writes to the device.
func (s *state) mainHost(gi int) []float32 {
	if s.host != nil {
		return s.main[gi]
	}
	return make([]float32, s.mainB[gi].Len())
}

// uploadMain writes a staging slice mainHost gave into group gi's main
// weights (nothing on host memory, where it is their own elements).
func (s *state) uploadMain(gi int, vals []float32) {
	if s.host == nil {
		s.mem.Write(s.mainB[gi], vals)
	}
}

// wireLen is the most statistics one all-reduce carries (loss, tokens, aux,
// dropped).
const wireLen = 4

// allReduceStats sums stats elements [lo, hi) over c's ranks through the f32
// wire buffer (nothing when c is nil: the values keep their float64 precision).
func (s *state) allReduceStats(c collective.Group, lo, hi int) error {
	if c == nil {
		return nil
	}
	n := hi - lo
	s.mem.Copy(s.wire.Slice(0, n), s.stats.Slice(lo, hi))
	if err := s.mem.Err(); err != nil {
		return err
	}
	if err := c.AllReduce(s.wire.Slice(0, n)); err != nil {
		return err
	}
	s.mem.Copy(s.stats.Slice(lo, hi), s.wire.Slice(0, n))
	return nil
}

// shardIndex is rank's index in group gi's sharding axis (dp×cp for dense
// groups, edp for expert groups).
func shardIndex(p *parallel.Plan, rank, gi int) int {
	c := p.Mesh.Coords(rank)
	if p.Groups[gi].Axis == parallel.AxisEDP {
		return c.EDP
	}
	return c.DP*p.Mesh.CP + c.CP
}

// shardOf is the element range [lo, hi) of group gi that rank owns: its shard, or
// the whole group when the group is not sharded. A pure function of the plan, so
// any rank can tell what any other holds (checkpoints rely on it).
func shardOf(p *parallel.Plan, rank, gi int) (lo, hi int64) {
	g := &p.Groups[gi]
	if g.Shards > 1 {
		return g.Shard(shardIndex(p, rank, gi))
	}
	return 0, g.Padded
}

// segmentsOf lists the parameters' parts that fall in [lo, hi) of group gi.
func segmentsOf(p *parallel.Plan, gi int, lo, hi int64, decayAll bool) []segment {
	var segs []segment
	for _, e := range p.Groups[gi].Entries {
		a, b := max(e.Offset, lo), min(e.Offset+e.Numel, hi)
		if a < b {
			segs = append(segs, segment{param: e.Param, lo: a - lo, hi: b - lo, start: a - e.Offset,
				decay: (!p.Params[e.Param].NoDecay || decayAll) && !p.Params[e.Param].Balance})
		}
	}
	return segs
}

// init fills this rank's shard of every parameter from (seed, name, index) (no rank
// ever initialises more than its shard; a tensor-parallel slice takes the values
// of its places in the whole parameter), then gathers the compute weights.
func (s *state) init(r *config.Recipe) error {
	for gi := range s.plan.Groups {
		main := s.mainHost(gi)
		for _, sg := range s.segs[gi] {
			p := s.global(sg.param)
			model.InitParamTP(main[sg.lo:sg.hi], &s.plan.Params[p], sg.start, s.tpRank, r.Run.Seed, r.Model.InitStd, r.Model.Layers)
		}
		s.uploadMain(gi, main)
	}
	return s.gather()
}

// initFrom replaces this rank's shard of the main weights with the given whole
// parameters (table order, global experts), then gathers the compute weights.
func (s *state) initFrom(vals [][]float32) error {
	for gi := range s.plan.Groups {
		main := s.mainHost(gi)
		if s.host == nil {
			s.mem.Read(main, s.mainB[gi]) // the parts no parameter covers keep their values
		}
		for _, sg := range s.segs[gi] {
			p := s.global(sg.param)
			dst, src := main[sg.lo:sg.hi], vals[p]
			for _, r := range tpRuns(&s.plan.Params[p], sg.start, sg.hi-sg.lo, s.tpRank) {
				copy(dst[r.local:r.local+r.n], src[r.global:r.global+r.n])
			}
		}
		s.uploadMain(gi, main)
	}
	return s.gather()
}

// floatViews returns the compute weights' views (wviews) as fp32 values: the
// views themselves in an fp32 run, widened copies of the bf16 values otherwise.
func (s *state) floatViews() [][]float32 {
	out := make([][]float32, len(s.wviews))
	for i, b := range s.wviews {
		out[i] = s.hostValues(i, b)
	}
	return out
}

// global maps a parameter of this rank's expert groups (laid out as the ep-rank-0
// experts 0..local−1) to the table index of the global expert it holds: the
// routed experts of a layer are consecutive in the table, three parameters each.
func (s *state) global(i int) int {
	if s.epComm == nil || s.plan.Params[i].Expert < 0 {
		return i
	}
	return s.plan.ExpertParam(i, s.epRank)
}

// finalWeights hands rank 0 the final compute weights of the whole model, a
// parameter at a time, so that no rank holds the whole model for it: put
// (called on rank 0 only) takes a parameter's index in the table without
// tensor parallelism and its whole values in fp32 (bf16 ones widened), valid
// only during the call. Group by group: a group whose weights are not whole
// here (optim_grads_params, where the group is sharded) is gathered into
// scratch (n elements of the group's compute dtype, E4M3 for an FP8 group;
// release gives them back before the next group); rank 0's ep group then passes every ep rank's experts over the
// host, and its tp group every tp rank's slices, a parameter at a time; other
// ranks have nothing more to do. A collective: every rank calls it, and its
// errors are the collectives' (put keeps its own, so that rank 0 still takes
// part in every collective).
func (s *state) finalWeights(scratch func(n int64, t tensor.DType) (b tensor.Buffer, release func()), put func(i int, v []float32)) error {
	lead := s.rank == 0
	withLead := func(a parallel.Axis) bool { return s.plan.Mesh.Group(a, s.rank)[0] == 0 }
	epLead := s.epComm != nil && withLead(parallel.AxisEP)
	tpLead := s.tpComm != nil && withLead(parallel.AxisTP)
	keep := func(i int, v []float32) {
		if lead {
			put(i, v)
		}
	}
	for gi := range s.plan.Groups {
		g := &s.plan.Groups[gi]
		full, release := s.weights[gi], func() {}
		if s.heldWhole(gi) && full.Len() == 0 {
			full = s.computeShardBuffer(gi) // the group is this rank's alone
		} else if full.Len() == 0 {
			full, release = scratch(g.Padded, s.weightDType(gi))
			if err := s.gatherGroup(gi, full); err != nil {
				release()
				return fmt.Errorf("gathering group %d for the final weights: %w", gi, err)
			}
		}
		for _, e := range g.Entries {
			p := &s.plan.Params[e.Param]
			view := full.Slice(int(e.Offset), int(e.Offset+e.Numel))
			var err error
			switch {
			case g.Expert && s.epComm != nil: // every ep rank holds other experts at these places
				if !epLead {
					continue
				}
				v, ep := s.hostValues(e.Param, view), s.epComm.Size()
				all := make([]float32, ep*len(v))
				if err = s.epComm.AllGather(all, v); err == nil {
					for j := 0; j < ep; j++ {
						keep(s.plan.ExpertParam(e.Param, j), all[j*len(v):(j+1)*len(v)])
					}
				}
			case s.tpComm != nil && p.LocalNumel() != p.Numel():
				if !tpLead {
					continue
				}
				v, tp := s.hostValues(e.Param, view), s.tpComm.Size()
				all := make([]float32, tp*len(v))
				if err = s.tpComm.AllGather(all, v); err == nil && lead {
					whole := make([]float32, p.Numel())
					n := int64(len(v))
					for r := 0; r < tp; r++ {
						slice := all[int64(r)*n : int64(r+1)*n]
						for _, run := range tpRuns(p, 0, n, r) {
							copy(whole[run.global:run.global+run.n], slice[run.local:run.local+run.n])
						}
					}
					keep(e.Param, whole)
				}
			case lead:
				keep(e.Param, s.hostValues(e.Param, view))
			}
			if err != nil {
				release()
				return fmt.Errorf("collecting %s for the final weights: %w", p.Name, err)
			}
		}
		release()
	}
	return s.mem.Err()
}

// hostValues are b's values (parameter i's compute weights) in fp32 on the
// host: b's own elements on host memory in an fp32 run, a widened or
// read-back copy otherwise, an FP8 compute weight's dequantised (fp8Values).
func (s *state) hostValues(i int, b tensor.Buffer) []float32 {
	if b.DType() == tensor.Float8E4M3 {
		return s.fp8Values(i, b)
	}
	w := s.weightsView(b)
	if w.BF16 == nil {
		return w.F
	}
	out := make([]float32, w.Len())
	w.Widen(out, 0)
	return out
}

// gather refreshes the full compute weights from every rank's main shard: in a
// bf16 run each rank rounds its shard to bf16 storage and the bf16 values are
// gathered (2 bytes a value).
func (s *state) gather() error {
	if s.bf16 {
		for gi := range s.plan.Groups {
			if !s.plan.Groups[gi].FP8 {
				s.mem.Copy(s.wshardB[gi], s.mainB[gi]) // rounded to nearest, ties to even
			}
		}
	}
	if err := s.quantizeFP8(); err != nil {
		return err
	}
	return s.gatherShards()
}

// gatherShards gathers the full compute weights from every rank's compute
// shard, as they are (the optimizer's step wrote a bf16 run's).
func (s *state) gatherShards() error {
	if s.perUnit {
		return nil // units are gathered when blocks need them
	}
	for gi := range s.plan.Groups {
		if err := s.gatherGroup(gi, s.weights[gi]); err != nil {
			return fmt.Errorf("all-gathering group %d: %w", gi, err)
		}
	}
	return nil
}

// weightDType is group gi's compute dtype: E4M3 for an FP8 group, else the
// run's (bf16 or fp32).
func (s *state) weightDType(gi int) tensor.DType {
	switch {
	case s.plan.Groups[gi].FP8:
		return tensor.Float8E4M3
	case s.bf16:
		return tensor.BFloat16
	}
	return tensor.Float32
}

// newWeights makes n compute-weight elements in the run's compute dtype (in the
// backend's memory).
func (s *state) newWeights(n int64) tensor.Buffer {
	if s.bf16 {
		return s.mem.Alloc(tensor.BFloat16, int(n))
	}
	return s.mem.Alloc(tensor.Float32, int(n))
}

// gatherGroup fills dst (group gi's padded length, in the compute dtype) with
// every rank's compute shard of the group: an all-gather over the group's
// ranks, or, where one rank holds the group whole (no_shard, or a group of
// one), a copy of its shard, which is nothing in an fp32 run whose compute
// weights are that shard.
func (s *state) gatherGroup(gi int, dst tensor.Buffer) error {
	src := s.computeShardBuffer(gi)
	if s.heldWhole(gi) {
		s.copyBuffer(dst, src)
		return nil
	}
	return s.comms[gi].AllGather(dst, src)
}

// heldWhole reports whether this rank holds group gi whole (no_shard, or a
// group of one): its compute shard is the whole group.
func (s *state) heldWhole(gi int) bool {
	return s.comms[gi].Size() == 1 || s.plan.Groups[gi].Shards == 1
}

// copyBuffer copies src into dst (same dtype and length); nothing when they are
// the same memory (an fp32 run's unsharded main weights are its compute
// weights; an unsharded group's gradient shard is its gradients).
func (s *state) copyBuffer(dst, src tensor.Buffer) {
	if dst.Storage() == src.Storage() && dst.Offset() == src.Offset() {
		return
	}
	s.mem.Copy(dst, src)
}

func (s *state) zeroGrads() {
	if s.unitGrads {
		s.mem.Zero(s.gshardAll)
		return
	}
	s.mem.Zero(s.gradsAll) // the gradient shards are views of it
}

// computeShard is the shard of group gi's compute weights other ranks gather:
// the bf16 shard in a bf16 run, the main weights otherwise.
func (s *state) computeShard(gi int) tensor.Weights[float32] {
	return s.weightsView(s.computeShardBuffer(gi))
}

// computeShardBuffer is computeShard's buffer.
func (s *state) computeShardBuffer(gi int) tensor.Buffer {
	if s.bf16 {
		return s.wshardB[gi]
	}
	return s.mainB[gi]
}

// gradDType is the dtype the rank holds its gradients in: bf16 with
// grad_reduce_in_bf16 (full gradients, unit gradient buffers and the reduced
// shards alike, as Megatron-FSDP's main gradients are then), else fp32.
func (s *state) gradDType() tensor.DType {
	if s.reduceBF16 {
		return tensor.BFloat16
	}
	return tensor.Float32
}

// reduceInto reduce-scatters one unit's full gradients of group gi (src, in
// the gradients' dtype) and adds this rank's shard of the sum to its gradient
// shard, through the part stage (in the same dtype: a bf16 sum is
// accumulated in fp32 and rounded once by the host's communicators, at each
// hop by NCCL's ring, and rounded again as it is added).
// Only the runtime's stream calls it, one group at a time, so the stage is
// never in use twice.
func (s *state) reduceInto(gi int, src tensor.Buffer) error {
	dst, n := s.gshardB[gi], s.gshardB[gi].Len()
	part := s.partStage.Slice(0, n)
	if err := s.comms[gi].ReduceScatter(part, src); err != nil {
		return err
	}
	s.be.AddInto(dst, part, n)
	return nil
}

// gatherFull all-gathers every group's compute weights into full buffers and
// points the parameter views at them (a collective: every rank calls it). A
// device engine's run (one rank) starts with it under optim_grads_params, to
// hand the engine the whole model; the end of an engine run never gathers
// the whole model (finalWeights).
func (s *state) gatherFull() error {
	for gi := range s.plan.Groups {
		g := &s.plan.Groups[gi]
		if s.weights[gi].Len() == 0 {
			s.weights[gi] = s.mem.Alloc(s.weightDType(gi), int(g.Padded))
		}
		if err := s.gatherGroup(gi, s.weights[gi]); err != nil {
			return err
		}
		for _, e := range g.Entries {
			s.wviews[e.Param] = s.weights[gi].Slice(int(e.Offset), int(e.Offset+e.Numel))
		}
	}
	return nil
}

// allReduceBF16 sums group gi's whole bf16 gradients over its ranks (in fp32
// in rank order and rounded once by the host's communicators; NCCL's ring
// rounds at each hop): a bf16 reduce-scatter over n equal chunks (the wire
// stage, padded to a multiple of n with zeros) and a bf16 all-gather, as a
// ring all-reduce runs.
func (s *state) allReduceBF16(gi int) error {
	g, c := s.grads[gi], s.comms[gi]
	n := c.Size()
	L := (g.Len() + n - 1) / n
	wire, part := s.wireStage.Slice(0, n*L), s.partStage.Slice(0, L)
	s.mem.Copy(wire.Slice(0, g.Len()), g)
	s.mem.Zero(wire.Slice(g.Len(), n*L))
	if err := c.ReduceScatter(part, wire); err != nil {
		return err
	}
	if err := c.AllGather(wire, part); err != nil {
		return err
	}
	s.mem.Copy(g, wire.Slice(0, g.Len()))
	return nil
}

// reduce sums the gradients over each group's ranks: all-reduce under no_shard,
// reduce-scatter into this rank's shard otherwise (in place), in the
// gradients' dtype; bf16 ones (inBF16) sum in fp32 and round once, and are
// all-reduced through the reduction's staging.
func (s *state) reduce(inBF16 bool) error {
	if s.unitGrads {
		return nil // reduced per unit during backward
	}
	for gi := range s.plan.Groups {
		g := &s.plan.Groups[gi]
		if s.comms[gi].Size() == 1 {
			if g.Shards == 1 {
				s.copyBuffer(s.gshardB[gi], s.grads[gi])
			}
			continue
		}
		var err error
		switch {
		case (!s.sharded || g.Shards == 1) && inBF16:
			err = s.allReduceBF16(gi)
		case !s.sharded || g.Shards == 1:
			err = s.comms[gi].AllReduce(s.grads[gi])
		default:
			err = s.comms[gi].ReduceScatter(s.gshardB[gi], s.grads[gi])
		}
		if err != nil {
			return fmt.Errorf("reducing group %d's gradients: %w", gi, err)
		}
	}
	return nil
}

// sumSquares leaves in the statistics buffer the squares of the reduced
// gradients, summed so that CloseStep's norm is their global L2 norm. Sharded,
// each rank's shards are disjoint over the world, so one sum is all-reduced over
// the world. Under no_shard every rank holds all dense gradients, but only its
// own ep rank's experts: the experts' squares are summed apart, over the ep
// group, the dense ones over the tp group. Every rank then has the same norm,
// so replicas clip alike.
func (s *state) sumSquares() error {
	s.mem.Zero(s.stats.Slice(tensor.StatSumSq, tensor.StatExpertSumSq+1))
	oneSum := s.sharded && s.world.Size() > 1
	if s.sqDense == nil {
		s.sqDense, s.sqExpert = s.squaredBuffers(oneSum)
	}
	s.be.SumSquares(s.stats.At(tensor.StatSumSq), true, s.sqDense...)
	if len(s.sqExpert) > 0 {
		s.be.SumSquares(s.stats.At(tensor.StatExpertSumSq), true, s.sqExpert...)
	}
	switch {
	case oneSum:
		return s.allReduceStats(s.worldG, tensor.StatSumSq, tensor.StatSumSq+1)
	case !s.sharded:
		// Every rank holds its groups whole: the experts of its ep rank and the
		// dense weights of its tp rank.
		if err := s.allReduceStats(s.epG, tensor.StatExpertSumSq, tensor.StatExpertSumSq+1); err != nil {
			return err
		}
		return s.allReduceStats(s.tpG, tensor.StatSumSq, tensor.StatSumSq+1)
	}
	return nil
}

// squaredBuffers lists, in group order, the gradient shards whose squares sum
// into StatSumSq (dense) and StatExpertSumSq (expert; none when oneSum puts
// every group in the one sum). A parameter that every tensor-parallel rank
// holds whole (a norm gain) is listed on tp rank 0 only, so that sums over
// ranks count each gradient element once. One list is one SumSquares call:
// the shards of one allocation lie end to end, and a GPU sums them as one.
func (s *state) squaredBuffers(oneSum bool) (dense, expert []tensor.Buffer) {
	dense, expert = []tensor.Buffer{}, []tensor.Buffer{}
	for gi, g := range s.gshardB {
		switch {
		case s.plan.Groups[gi].Expert && !oneSum:
			expert = append(expert, g)
		case s.plan.Groups[gi].Expert || s.tpComm == nil:
			dense = append(dense, g)
		default:
			for _, sg := range s.segs[gi] {
				if p := &s.plan.Params[sg.param]; p.TPSplit < 0 && s.tpRank > 0 {
					continue
				}
				dense = append(dense, g.Slice(int(sg.lo), int(sg.hi)))
			}
		}
	}
	return dense, expert
}

// step applies the optimizer to this rank's shard and gathers the compute
// weights; the kernels update only when the statistics say the step applies, at
// the optimizer step they count, and read the gradients clipped by the factor
// CloseStep left there: train.optimizer adamw or adam (Megatron's adam is
// AdamW with decoupled weight decay) runs AdamW, sgd runs SGD with momentum
// train.beta1 (its buffer is the first-moment buffer). In a bf16 run the
// optimizer also writes the bf16 compute shard from the updated main weights,
// in the same pass (the parts of a shard no parameter covers never change, so
// the shard rounded at init or load stays right there). Each segment's update
// runs on every core (the kernels split it): each element's update depends
// only on its own values, so the split changes no bit of the result.
func (s *state) step(tr config.Train, lr float64) error {
	for gi := range s.segs {
		for _, sg := range s.segs[gi] {
			wd := tr.WeightDecay
			if !sg.decay {
				wd = 0
			}
			lo, hi := int(sg.lo), int(sg.hi)
			p, g, m, v := s.mainB[gi].Slice(lo, hi), s.gshardB[gi].Slice(lo, hi), s.mB[gi].Slice(lo, hi), s.vB[gi].Slice(lo, hi)
			var c tensor.Buffer                   // the compute weights are the main weights in an fp32 run
			if s.bf16 && !s.plan.Groups[gi].FP8 { // FP8 ones are quantised below
				c = s.wshardB[gi].Slice(lo, hi)
			}
			if tr.Optimizer == "sgd" {
				s.be.SGD(p, c, g, m, lr, tr.Beta1, wd, s.stats)
			} else {
				s.be.AdamW(p, c, g, m, v, lr, tr.Beta1, tr.Beta2, tr.Eps, wd, s.stats)
			}
		}
	}
	if err := s.quantizeFP8(); err != nil {
		return err
	}
	return s.gatherShards()
}

// stageBytes is what the gradient reduction's staging holds (the plan counts
// it in grad_reduce_buffers).
func (s *state) stageBytes() int64 { return s.wireStage.Bytes() + s.partStage.Bytes() }

// bytes reports what the state holds, by plan memory component.
func (s *state) bytes() (weights, main, grads, optState int64) {
	for gi := range s.weights {
		if s.perUnit {
			weights += s.computeShardBuffer(gi).Bytes() // the shard; gathered units are counted apart
		} else {
			weights += s.weights[gi].Bytes()
		}
		if s.unitGrads {
			grads += s.gshardB[gi].Bytes() // unit gradient buffers are counted apart
		} else {
			grads += s.grads[gi].Bytes()
			if gs := s.gshardB[gi]; gs.Storage() != s.grads[gi].Storage() {
				grads += gs.Bytes()
			}
		}
		optState += s.mB[gi].Bytes() + s.vB[gi].Bytes()
		if s.bf16 {
			main += s.mainB[gi].Bytes()
		}
	}
	weights += s.fp8.bytes()
	return
}
