package parallel

import (
	"slices"

	"github.com/shardline/shardline/config"
)

// Blocks lists the FSDP units each block of the model uses, in forward order:
// block 0 the embedding, 1..L the layers, L+1 the final norm and output head (with
// the embedding's unit when tied). A block holds its units' weights while it runs;
// the trainer's model acquires and releases them block by block.
func Blocks(cfg config.Model, table []Param) [][]int {
	blocks := make([][]int, cfg.Layers+2)
	add := func(b, unit int) {
		if !slices.Contains(blocks[b], unit) {
			blocks[b] = append(blocks[b], unit)
		}
	}
	for i := range table {
		p := &table[i]
		switch {
		case p.Layer >= 0:
			add(1+p.Layer, p.Unit)
		case p.Name == "embed.weight":
			add(0, p.Unit)
			if cfg.TieEmbeddings {
				add(cfg.Layers+1, p.Unit)
			}
		default:
			add(cfg.Layers+1, p.Unit)
		}
	}
	return blocks
}

// UnitBuffers are the FSDP runtime's transient buffers, arenas the runtime
// carves unit buffers from (Arena, first fit): Gather holds all-gathered unit
// weights in the compute dtype (optim_grads_params), GatherFP8 their FP8
// compute weights (precision.fp8.param_gather: E4M3 codes, a byte each),
// Reduce a unit's gradients until its reduce-scatter has run (optim_grads and
// optim_grads_params). Their sizes, in elements, are what the runtime's
// requests over a forward and a backward pass reach (bufferPeaks). The
// trainer makes them before the first step, so a step allocates none.
type UnitBuffers struct {
	Largest   int64 `json:"largest_unit"` // the largest sharded unit's elements
	Gather    int64 `json:"gather_elems"`
	GatherFP8 int64 `json:"gather_fp8_elems,omitempty"`
	Reduce    int64 `json:"reduce_elems"`
	// GatherSlot, GatherFP8Slot and ReduceSlot are each arena's slot size
	// (Arena): the largest request it takes where slots make the arena
	// smaller, else 0.
	GatherSlot    int64 `json:"gather_slot"`
	GatherFP8Slot int64 `json:"gather_fp8_slot,omitempty"`
	ReduceSlot    int64 `json:"reduce_slot"`
	// Stage is the reduction's staging (ReduceStage).
	Stage ReduceStage `json:"reduce_stage"`
}

// ReduceStage is the scratch a rank's gradient reduction uses beside the
// gradient buffers, in elements. Every group's reduction reuses it in turn: a
// rank reduces on one stream, one group at a time. Wire holds n equal chunks
// of a whole group's bf16 gradients, padded, for the engine's bf16 all-reduce
// (a reduce-scatter into one chunk of Part and an all-gather); Part holds this
// rank's part of the sum where it cannot land in the gradient shard directly:
// it is added to earlier micro-batches' gradients (optim_grads,
// optim_grads_params). PartBF16 is Part's dtype, the gradients' (bf16 with
// grad_reduce_in_bf16).
type ReduceStage struct {
	Wire     int64 `json:"wire_elems"`
	Part     int64 `json:"part_elems"`
	PartBF16 bool  `json:"part_bf16"`
}

// Bytes is what the stage holds.
func (s ReduceStage) Bytes() int64 {
	part := int64(4)
	if s.PartBF16 {
		part = 2
	}
	return 2*s.Wire + part*s.Part
}

// reduceStage sizes the staging by the trainer's reduction rules
// (trainer/state.go: reduce, reduceInto) for groups reduced over more than one
// rank. Gradients are held in the dtype they are reduced in (bf16 with
// grad_reduce_in_bf16, else fp32) and go on the wire as they are: a sharded
// group is reduce-scattered straight into the gradient shard unless it must
// be added there (Part, its shard: optim_grads and optim_grads_params); a
// whole group is all-reduced in place in fp32, and in bf16 by the engine as a
// reduce-scatter over n equal chunks and an all-gather (Wire n chunks, Part
// one), where NCCL's bf16 all-reduce (Megatron-FSDP's plan, engine false)
// needs no stage.
func reduceStage(r *config.Recipe, p *Plan, engine bool) ReduceStage {
	bf16 := r.FSDP.GradReduceInBF16
	adds := p.Sharding.Grads
	st := ReduceStage{PartBF16: bf16}
	for i := range p.Groups {
		g := &p.Groups[i]
		n := int64(p.Mesh.Size(g.Axis))
		if n == 1 {
			continue
		}
		switch {
		case g.Shards > 1 && adds:
			st.Part = max(st.Part, g.ShardNumel())
		case g.Shards == 1 && bf16 && engine:
			L := (g.Padded + n - 1) / n
			st.Wire, st.Part = max(st.Wire, n*L), max(st.Part, L)
		}
	}
	return st
}

// unitBuffers sizes the runtime's arenas, each by plain first fit or in slots of
// the largest request it takes, whichever needs less; with fsdp_double_buffer
// the gather arenas hold at least two of their largest request. unitFull is
// each unit's sharded elements, unitFP8 the FP8 groups' part of them: a
// unit's gradients take unitFull, its gathered weights the rest in the
// compute dtype and unitFP8 in FP8.
func unitBuffers(r *config.Recipe, p *Plan, unitFull, unitFP8 []int64) UnitBuffers {
	var b UnitBuffers
	for _, n := range unitFull {
		b.Largest = max(b.Largest, n)
	}
	f := r.FSDP
	if b.Largest == 0 || !p.Sharding.Grads {
		return b
	}
	weights := p.Sharding.Params
	blocks := Blocks(r.Model, p.Params)
	unitW := make([]int64, len(unitFull))
	for u := range unitFull {
		unitW[u] = unitFull[u] - unitFP8[u]
	}
	// arena sizes one arena for requests of length (gathers: reduce false):
	// plain first fit, or slots of its largest request, whichever needs less.
	arena := func(length []int64, reduce bool) (n, slot int64) {
		var largest int64
		for _, l := range length {
			largest = max(largest, l)
		}
		if largest == 0 {
			return 0, 0
		}
		peak := func(slot int64) int64 {
			g, red := bufferPeaks(blocks, length, weights, weights && f.OverlapParamGather, f.OverlapGradReduce, 4*f.SuggestedCommunicationUnitSize, slot)
			if reduce {
				return red
			}
			return g
		}
		n = peak(0)
		if s := peak(largest); s < n {
			n, slot = s, largest
		}
		if !reduce && weights && f.FSDPDoubleBuffer {
			n = max(n, 2*largest) // room to spare: the same placement fits
		}
		return n, slot
	}
	b.Reduce, b.ReduceSlot = arena(unitFull, true)
	if weights {
		b.Gather, b.GatherSlot = arena(unitW, false)
		b.GatherFP8, b.GatherFP8Slot = arena(unitFP8, false)
	}
	return b
}

// bufferPeaks runs the trainer's FSDP unit runtime (trainer/fsdp.go) through one
// forward and one backward pass by its rules, placing its buffers in two unbounded
// arenas of the given slot size, and returns the elements each reaches. length[u] is a unit's sharded
// elements (0: nothing to gather or reduce). The rules:
//   - a block acquires its sharded units, gathering those not held (weights);
//     with prefetch it then gathers the next block's units not held;
//   - a block's release frees a unit no block holds, unless it was prefetched and
//     not yet waited on;
//   - in backward a unit gets a gradient buffer at its first block; after its last
//     block it is reduce-scattered, and the oldest reductions in flight are waited
//     on (freeing their buffers) until one is left, or (async) their bytes fit
//     capBytes (4 bytes an element);
//   - the end of a pass waits for every reduction and frees prefetched units no
//     block used.
func bufferPeaks(blocks [][]int, length []int64, weights, prefetch, async bool, capBytes, slot int64) (gather, reduce int64) {
	n := len(length)
	wa, ga := NewArena(-1, slot), NewArena(-1, slot)
	held, pending := make([]bool, n), make([]bool, n)
	woff, goff := make([]int64, n), make([]int64, n)
	holds, uses, left := make([]int, n), make([]int, n), make([]int, n)
	for _, b := range blocks {
		for _, u := range b {
			uses[u]++
		}
	}
	copy(left, uses)
	gatherAll := func(units []int, prefetched bool) {
		for _, u := range units {
			if length[u] > 0 && !held[u] {
				held[u], pending[u] = true, prefetched
				woff[u], _ = wa.Alloc(length[u])
			}
		}
	}
	hasGrad := make([]bool, n)
	var inflight []int
	pass := func(backward bool) {
		for i := range blocks {
			b := i
			if backward {
				b = len(blocks) - 1 - i
			}
			if weights {
				gatherAll(blocks[b], false)
			}
			for _, u := range blocks[b] {
				if length[u] == 0 {
					continue
				}
				pending[u] = false // waited on
				holds[u]++
				if backward && !hasGrad[u] {
					hasGrad[u] = true
					goff[u], _ = ga.Alloc(length[u])
				}
			}
			if next := b + 1 - 2*btoi(backward); weights && prefetch && next >= 0 && next < len(blocks) {
				gatherAll(blocks[next], true)
			}
			for _, u := range blocks[b] {
				if length[u] == 0 {
					continue
				}
				holds[u]--
				if backward {
					if left[u]--; left[u] == 0 {
						left[u], hasGrad[u] = uses[u], false
						inflight = append(inflight, u)
						for len(inflight) > 0 {
							var bytes int64
							for _, v := range inflight {
								bytes += 4 * length[v]
							}
							if async && (len(inflight) == 1 || bytes <= capBytes) {
								break
							}
							ga.Free(goff[inflight[0]], length[inflight[0]])
							inflight = inflight[1:]
						}
					}
				}
				if holds[u] == 0 && held[u] && !pending[u] {
					held[u] = false
					wa.Free(woff[u], length[u])
				}
			}
		}
		for _, u := range inflight { // the end of the pass
			ga.Free(goff[u], length[u])
		}
		inflight = inflight[:0]
		for u := range pending { // prefetched and unused: released
			if pending[u] && holds[u] == 0 {
				held[u], pending[u] = false, false
				wa.Free(woff[u], length[u])
			}
		}
	}
	pass(false)
	pass(true)
	return wa.High(), ga.High()
}
func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
