package trainer

import (
	"fmt"

	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/trainer/model"
)

// FP8 compute weights (precision.fp8.param_gather; docs/engine.md, "FP8
// parameters"). The plan's FP8 groups (parallel.FP8Weight) hold the weights
// of the FP8 products as E4M3 codes: a rank's compute shard of such a group
// is its fp32 main shard quantised with each tensor's whole scale, and the
// group is all-gathered as codes, a byte a value. After every optimizer
// step (and after init and load, gather) quantizeFP8 sets them: each rank
// takes the amax of its part of each tensor, one all-reduce over the FP8
// groups' dp×cp group makes them the whole tensors' (each rank's amax in a
// place of its own, the others zero, so the sum moves them exactly; the
// maximum is then taken on the backend, as torchtitan's
// precompute_float8_dynamic_scale_for_fsdp all-reduces the amaxes), and each
// tensor's scale (tensorwise current scaling, FP8Scale) quantises its
// segments and sets its scale inverse, which the model's products read
// (model.SetFP8Weights). Nothing is read back. The codes are a function of
// the main weights: checkpoints keep the main weights, and a resumed run
// quantises them again.

// fp8Scales are the FP8 compute weights' scales on a rank, laid out as
// parallel.FP8ScaleBytes counts them.
type fp8Scales struct {
	params []int       // tensor k → its parameter (table order)
	index  map[int]int // parameter → k
	// ranks is the FP8 groups' dp×cp size; slot this rank's place among
	// them (its shard index).
	ranks, slot int
	// Per tensor: inv its scale inverse and scale its scale (f32), amax its
	// amax (f64); amaxes holds each rank's amax of its part (f64, ranks a
	// tensor: k·ranks + slot), summed over the ranks through wire (f32, when
	// ranks > 1).
	inv, scale, amax, amaxes, wire tensor.Buffer
	// held says whether this rank holds an element of tensor k; one that it
	// does not gets its scale inverse from quantising zero (f32) into code.
	held       []bool
	code, zero tensor.Buffer
}

// newFP8Scales lays out the scales of the plan's FP8 groups (allocate,
// after the groups' segments).
func (s *state) newFP8Scales() (*fp8Scales, error) {
	p := s.plan
	if !s.bf16 {
		return nil, fmt.Errorf("FP8 compute weights (precision.fp8.param_gather) need precision.bf16 = true")
	}
	f := &fp8Scales{index: map[int]int{}, ranks: p.Mesh.Size(parallel.AxisDPCP)}
	for gi := range p.Groups {
		g := &p.Groups[gi]
		if !g.FP8 {
			continue
		}
		if g.Shards > 1 {
			f.slot = shardIndex(p, s.rank, gi)
		}
		for _, e := range g.Entries {
			f.index[e.Param] = len(f.params)
			f.params = append(f.params, e.Param)
		}
	}
	n := len(f.params)
	f.held = make([]bool, n)
	for gi := range p.Groups {
		if p.Groups[gi].FP8 {
			for _, sg := range s.segs[gi] {
				f.held[f.index[sg.param]] = true
			}
		}
	}
	f.inv, f.scale = s.mem.Alloc(tensor.Float32, n), s.mem.Alloc(tensor.Float32, n)
	f.amax, f.amaxes = s.mem.Alloc(tensor.Float64, n), s.mem.Alloc(tensor.Float64, n*f.ranks)
	if f.ranks > 1 {
		f.wire = s.mem.Alloc(tensor.Float32, n*f.ranks)
	}
	f.code, f.zero = s.mem.Alloc(tensor.Float8E4M3, 1), s.mem.Alloc(tensor.Float32, 1)
	return f, s.mem.Err()
}

// bytes is what the scales hold (parallel.FP8ScaleBytes); 0 without FP8
// compute weights.
func (f *fp8Scales) bytes() int64 {
	if f == nil {
		return 0
	}
	var b int64
	for _, x := range []tensor.Buffer{f.inv, f.scale, f.amax, f.amaxes, f.wire, f.code, f.zero} {
		b += x.Bytes()
	}
	return b
}

// quantizeFP8 sets the FP8 groups' compute shards from the main weights and
// every FP8 tensor's scale inverse (see above): a collective over the FP8
// groups' ranks; nothing without FP8 compute weights.
func (s *state) quantizeFP8() error {
	f := s.fp8
	if f == nil {
		return nil
	}
	p, R := s.plan, f.ranks
	s.mem.Zero(f.amaxes)
	group := -1 // an FP8 group sharded over R ranks: its communicator sums the amaxes
	for gi := range p.Groups {
		if !p.Groups[gi].FP8 {
			continue
		}
		if !s.heldWhole(gi) {
			group = gi
		}
		for _, sg := range s.segs[gi] {
			k := f.index[sg.param]
			s.be.Amax(f.amaxes.At(k*R+f.slot), s.mainB[gi].Slice(int(sg.lo), int(sg.hi)), false)
		}
	}
	n := len(f.params)
	amax := f.amaxes // one rank: its own
	if R > 1 {
		if group < 0 {
			return fmt.Errorf("FP8 compute weights: %d ranks share them, but no FP8 group is sharded", R)
		}
		s.mem.Copy(f.wire, f.amaxes)
		if err := s.mem.Err(); err != nil {
			return fmt.Errorf("quantising the FP8 compute weights: %w", err)
		}
		if err := s.comms[group].AllReduce(f.wire); err != nil {
			return fmt.Errorf("all-reducing the FP8 compute weights' amaxes: %w", err)
		}
		for k := range n {
			s.be.Amax(f.amax.At(k), f.wire.Slice(k*R, (k+1)*R), false)
		}
		amax = f.amax
	}
	for k := range n {
		s.be.FP8Scale(f.scale.At(k), amax.At(k), tensor.E4M3, 0)
		if !f.held[k] {
			s.be.Quantize(f.code, f.inv.At(k), f.zero, f.scale.At(k))
		}
	}
	for gi := range p.Groups {
		if !p.Groups[gi].FP8 {
			continue
		}
		for _, sg := range s.segs[gi] {
			k, lo, hi := f.index[sg.param], int(sg.lo), int(sg.hi)
			s.be.Quantize(s.wshardB[gi].Slice(lo, hi), f.inv.At(k), s.mainB[gi].Slice(lo, hi), f.scale.At(k))
		}
	}
	if err := s.mem.Err(); err != nil {
		return fmt.Errorf("quantising the FP8 compute weights: %w", err)
	}
	return nil
}

// bindFP8 hands the model its FP8 compute weights' scale inverses
// (model.SetFP8Weights); nothing without them.
func (s *state) bindFP8(m *model.Model[float32]) error {
	f := s.fp8
	if f == nil {
		return nil
	}
	inv := make([]tensor.Buffer, len(s.plan.Params))
	for k, i := range f.params {
		inv[i] = f.inv.At(k)
	}
	return m.SetFP8Weights(inv)
}

// fp8Values are parameter i's FP8 compute weight b dequantised (code · scale
// inverse) on the host: the values the products compute with (read back).
func (s *state) fp8Values(i int, b tensor.Buffer) []float32 {
	codes := make([]tensor.F8E4M3, b.Len())
	s.mem.Read(codes, b)
	inv := make([]float32, 1)
	s.mem.Read(inv, s.fp8.inv.At(s.fp8.index[i]))
	out := make([]float32, len(codes))
	for j, c := range codes {
		out[j] = c.Float32() * inv[0]
	}
	return out
}
