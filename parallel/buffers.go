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

// UnitBuffers are the FSDP runtime's transient buffers, each the size of the
// largest sharded unit: Gather hold all-gathered unit weights
// (optim_grads_params), Reduce hold a unit's gradients until its reduce-scatter
// has run (optim_grads and optim_grads_params). The trainer makes them before the
// first step and hands them out and back, so a step allocates none.
type UnitBuffers struct {
	Elems  int64 `json:"elems"` // the largest sharded unit's elements
	Gather int   `json:"gather"`
	Reduce int   `json:"reduce"`
}

// unitBuffers counts the buffers the runtime needs: the most in use at once in a
// forward and a backward pass (bufferPeaks), and at least two gather buffers with
// fsdp_double_buffer.
func unitBuffers(r *config.Recipe, p *Plan, unitFull []int64) UnitBuffers {
	var b UnitBuffers
	for _, n := range unitFull {
		b.Elems = max(b.Elems, n)
	}
	f := r.FSDP
	s := f.DataParallelShardingStrategy
	if b.Elems == 0 || (s != "optim_grads" && s != "optim_grads_params") {
		return b
	}
	sharded := make([]bool, len(unitFull))
	for u, n := range unitFull {
		sharded[u] = n > 0
	}
	weights := s == "optim_grads_params"
	b.Gather, b.Reduce = bufferPeaks(Blocks(r.Model, p.Params), sharded, unitFull, weights, weights && f.OverlapParamGather,
		f.OverlapGradReduce, 4*f.SuggestedCommunicationUnitSize)
	if weights && f.FSDPDoubleBuffer {
		b.Gather = max(b.Gather, 2)
	}
	return b
}

// bufferPeaks runs the trainer's FSDP unit runtime (trainer/fsdp.go) through one
// forward and one backward pass by its rules and returns the most gather and
// reduce buffers in use at once:
//   - a block acquires its sharded units, gathering those not held (weights);
//     with prefetch it then gathers the next block's units not held;
//   - a block's release frees a unit no block holds, unless it was prefetched and
//     not yet waited on;
//   - in backward a unit gets a gradient buffer at its first block; after its last
//     block it is reduce-scattered, and the oldest reductions in flight are waited
//     on (freeing their buffers) until one is left, or (async) their bytes fit
//     capBytes (4 bytes an element).
func bufferPeaks(blocks [][]int, sharded []bool, length []int64, weights, prefetch, async bool, capBytes int64) (gather, reduce int) {
	n := len(sharded)
	held, pending := make([]bool, n), make([]bool, n)
	holds, uses, left := make([]int, n), make([]int, n), make([]int, n)
	for _, b := range blocks {
		for _, u := range b {
			uses[u]++
		}
	}
	copy(left, uses)
	live := 0
	gatherAll := func(units []int, prefetched bool) {
		for _, u := range units {
			if sharded[u] && !held[u] {
				held[u], pending[u] = true, prefetched
				live++
			}
		}
		gather = max(gather, live)
	}
	hasGrad := make([]bool, n)
	var inflight []int
	liveG := 0
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
				if !sharded[u] {
					continue
				}
				pending[u] = false // waited on
				holds[u]++
				if backward && !hasGrad[u] {
					hasGrad[u] = true
					liveG++
				}
			}
			reduce = max(reduce, liveG)
			if next := b + 1 - 2*btoi(backward); weights && prefetch && next >= 0 && next < len(blocks) {
				gatherAll(blocks[next], true)
			}
			for _, u := range blocks[b] {
				if !sharded[u] {
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
							inflight, liveG = inflight[1:], liveG-1
						}
					}
				}
				if holds[u] == 0 && held[u] && !pending[u] {
					held[u] = false
					live--
				}
			}
		}
		liveG -= len(inflight) // flush
		inflight = inflight[:0]
		for u := range pending { // prefetched and unused: released by the flush
			if pending[u] && holds[u] == 0 {
				held[u], pending[u] = false, false
				live--
			}
		}
	}
	pass(false)
	pass(true)
	return gather, reduce
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
