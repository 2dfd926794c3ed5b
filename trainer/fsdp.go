package trainer

import (
	"fmt"

	"github.com/shardline/shardline/trainer/model"
)

// unitRuntime runs optim_grads_params as Megatron-FSDP does: a rank holds only its
// shards; each FSDP unit is all-gathered into a pooled buffer when a block needs it
// and released when no block holds it; in backward the unit also gets a gradient
// buffer, which is reduce-scattered into the rank's gradient shard (and released)
// as soon as the last block using the unit has run its backward. It implements
// model.Hooks.
type unitRuntime struct {
	st      *state
	m       *model.Model[float32]
	groups  [][]int   // unit → its groups
	offsets [][]int64 // unit → offset of each group in the unit's buffer
	length  []int64   // unit → buffer length
	wbuf    [][]float32
	gbuf    [][]float32
	holds   []int // blocks holding the unit's weights now
	// resident units have only unsharded groups: their views point straight at the
	// compute shard and the gradient shard (the whole group), with nothing to gather
	// or reduce.
	resident []bool
	left     []int // backward: blocks still to run that use the unit
	uses     []int // blocks that use the unit
	pool     map[int64][][]float32
	rs       [][]float32 // per group: reduce-scatter destination
	// live and peak bytes of gathered weights and of unit gradient buffers
	liveW, peakW, liveG, peakG int64
}

func newUnitRuntime(st *state, m *model.Model[float32]) *unitRuntime {
	p := st.plan
	u := &unitRuntime{st: st, m: m, pool: map[int64][][]float32{}}
	n := len(p.Units)
	u.groups, u.offsets, u.length = make([][]int, n), make([][]int64, n), make([]int64, n)
	u.wbuf, u.gbuf = make([][]float32, n), make([][]float32, n)
	u.holds, u.left, u.uses = make([]int, n), make([]int, n), make([]int, n)
	u.resident = make([]bool, n)
	for ui, unit := range p.Units {
		u.resident[ui] = true
		for _, gi := range unit.Groups {
			u.groups[ui] = append(u.groups[ui], gi)
			u.offsets[ui] = append(u.offsets[ui], u.length[ui])
			u.length[ui] += p.Groups[gi].Padded
			if p.Groups[gi].Shards > 1 && st.comms[gi].Size() > 1 {
				u.resident[ui] = false
			}
		}
		if u.resident[ui] {
			for _, gi := range unit.Groups {
				w, g := st.computeShard(gi), st.gshard[gi]
				for _, e := range p.Groups[gi].Entries {
					m.Bind(e.Param, w[e.Offset:e.Offset+e.Numel], g[e.Offset:e.Offset+e.Numel])
				}
			}
		}
	}
	for _, b := range m.Blocks() {
		for _, ui := range b {
			u.uses[ui]++
		}
	}
	copy(u.left, u.uses)
	for gi := range p.Groups {
		u.rs = append(u.rs, make([]float32, len(st.gshard[gi])))
	}
	return u
}

func (u *unitRuntime) get(n int64) []float32 {
	if free := u.pool[n]; len(free) > 0 {
		b := free[len(free)-1]
		u.pool[n] = free[:len(free)-1]
		return b
	}
	return make([]float32, n)
}

func (u *unitRuntime) put(b []float32) { u.pool[int64(len(b))] = append(u.pool[int64(len(b))], b) }

// bind points the model's views of the unit's parameters at its buffers (nil when
// a buffer is not held).
func (u *unitRuntime) bind(ui int) {
	p := u.st.plan
	for k, gi := range u.groups[ui] {
		off := u.offsets[ui][k]
		for _, e := range p.Groups[gi].Entries {
			var w, g []float32
			if b := u.wbuf[ui]; b != nil {
				w = b[off+e.Offset : off+e.Offset+e.Numel]
			}
			if b := u.gbuf[ui]; b != nil {
				g = b[off+e.Offset : off+e.Offset+e.Numel]
			}
			u.m.Bind(e.Param, w, g)
		}
	}
}

// Acquire gathers the units' weights (and, in backward, gives them zeroed gradient
// buffers) before a block runs.
func (u *unitRuntime) Acquire(units []int, backward bool) error {
	st := u.st
	for _, ui := range units {
		if u.resident[ui] {
			continue
		}
		if u.wbuf[ui] == nil {
			buf := u.get(u.length[ui])
			for k, gi := range u.groups[ui] {
				g := &st.plan.Groups[gi]
				dst := buf[u.offsets[ui][k] : u.offsets[ui][k]+g.Padded]
				if st.comms[gi].Size() == 1 || g.Shards == 1 {
					copy(dst, st.computeShard(gi))
				} else if err := st.comms[gi].AllGather(dst, st.computeShard(gi)); err != nil {
					return fmt.Errorf("gathering unit %s: %w", st.plan.Units[ui].Name, err)
				}
			}
			u.wbuf[ui] = buf
			u.liveW += int64(len(buf)) * 4
			u.peakW = max(u.peakW, u.liveW)
		}
		if backward && u.gbuf[ui] == nil {
			buf := u.get(u.length[ui])
			clear(buf)
			u.gbuf[ui] = buf
			u.liveG += int64(len(buf)) * 4
			u.peakG = max(u.peakG, u.liveG)
		}
		u.holds[ui]++
		u.bind(ui)
	}
	return nil
}

// Release ends a block's use of the units: weights no block holds are released;
// in backward, a unit whose last block has run reduce-scatters its gradients into
// the rank's shard (adding to earlier micro-batches) and releases its buffer.
func (u *unitRuntime) Release(units []int, backward bool) error {
	st := u.st
	for _, ui := range units {
		if u.resident[ui] {
			continue
		}
		u.holds[ui]--
		if backward {
			u.left[ui]--
			if u.left[ui] == 0 {
				u.left[ui] = u.uses[ui]
				buf := u.gbuf[ui]
				for k, gi := range u.groups[ui] {
					g := &st.plan.Groups[gi]
					src := buf[u.offsets[ui][k] : u.offsets[ui][k]+g.Padded]
					if err := st.reduceInto(gi, src, u.rs[gi]); err != nil {
						return fmt.Errorf("reducing unit %s: %w", st.plan.Units[ui].Name, err)
					}
				}
				u.put(buf)
				u.gbuf[ui] = nil
				u.liveG -= int64(len(buf)) * 4
			}
		}
		if u.holds[ui] == 0 && u.wbuf[ui] != nil {
			u.put(u.wbuf[ui])
			u.liveW -= int64(len(u.wbuf[ui])) * 4
			u.wbuf[ui] = nil
		}
		u.bind(ui)
	}
	return nil
}

var _ model.Hooks = (*unitRuntime)(nil)

// unitMemory is what the runtime reports beside the plan's gathered-unit and
// grad-reduce buffers.
func (u *unitRuntime) memory() (gathered, gradBuffers int64) { return u.peakW, u.peakG }
