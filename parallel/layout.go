package parallel

import (
	"fmt"

	"github.com/shardline/shardline/config"
)

// Align is the element alignment of every parameter's offset and of every shard in
// a flat buffer: 16 elements is 64 bytes in fp32, one AVX-512 vector or cache line.
const Align = 16

// Unit is an FSDP unit: the parameters gathered and reduced together.
type Unit struct {
	Index int
	// Name is the module path ("embed", "layers.3", "layers.3.attn", "output"), or
	// "root" for parameters no listed module kind encloses.
	Name string
	Kind string
	// Groups are indices into Plan.Groups: the unit's dense group, then its FP8
	// group when it has FP8 compute weights (FP8Weight), then its expert group
	// when it has routed experts.
	Groups []int
}

// Group is a parameter group: the parameters of one unit that share a sharding
// group and dtype, laid out in one flat buffer. Dense groups shard over dp×cp;
// expert groups over edp only.
type Group struct {
	Index  int
	Unit   int
	Expert bool
	// FP8 marks a dense group of FP8 compute weights (precision.fp8.param_gather:
	// FP8Weight), E4M3 codes a byte each, sharded over dp×cp as the dense group.
	FP8   bool
	Dtype string // compute dtype of the buffer: "bf16", "fp32", or "e4m3" (FP8)
	Axis  Axis   // AxisDPCP or AxisEDP
	// Shards is how many ways the buffer is split: the group's size, or 1 under
	// no_shard.
	Shards int
	// Entries in buffer order. An expert group lists the experts of ep rank 0
	// (experts 0..E/ep-1); ep rank r holds experts r·E/ep.. at the same offsets.
	Entries []Entry
	// Numel is the sum of the entries' elements; Padded the buffer length, a
	// multiple of Shards·Align; AlignPad + TailPad = Padded - Numel.
	Numel, Padded, AlignPad, TailPad int64
}

// Entry places one parameter (by index into the parameter table) in a buffer.
type Entry struct {
	Param  int
	Offset int64
	Numel  int64 // local elements (after tensor parallelism)
}

// ShardNumel is the length of one rank's shard.
func (g *Group) ShardNumel() int64 { return g.Padded / int64(g.Shards) }

// Shard returns the [start, end) element range shard i owns.
func (g *Group) Shard(i int) (int64, int64) {
	s := g.ShardNumel()
	return int64(i) * s, int64(i+1) * s
}

// ExpertsPerRank is how many experts each ep rank holds.
func expertsPerRank(numExperts, ep int) int { return numExperts / ep }

// buildUnits assigns every parameter to the innermost enclosing module whose kind
// fsdp_unit_modules lists, or to "root", and returns units in forward order with
// each parameter's unit index.
func buildUnits(ps []Param, unitModules []string) ([]Unit, []int, error) {
	kinds := map[string]bool{}
	for _, name := range unitModules {
		k, ok := config.UnitKind(name)
		if !ok {
			return nil, nil, config.KeyProblem("fsdp.fsdp_unit_modules", fmt.Sprintf("%q is not a module kind", name), "")
		}
		kinds[k] = true
	}
	var units []Unit
	index := map[string]int{}
	of := make([]int, len(ps))
	for i := range ps {
		name, kind := "root", "root"
		for _, m := range ps[i].Modules {
			if kinds[m.Kind] {
				name, kind = m.Path, m.Kind
				break
			}
		}
		u, ok := index[name]
		if !ok {
			u = len(units)
			index[name] = u
			units = append(units, Unit{Index: u, Name: name, Kind: kind})
		}
		of[i] = u
	}
	return units, of, nil
}

// layoutGroups builds every unit's dense, FP8 and expert groups; fp8 says
// which dense parameters are FP8 compute weights (nil: none).
func layoutGroups(ps []Param, units []Unit, unitOf []int, m Mesh, numExperts int, dtype string, shard bool, fp8 func(*Param) bool) []Group {
	perRank := 0
	if numExperts > 0 {
		perRank = expertsPerRank(numExperts, m.EP)
	}
	// Each unit's parameters, in table order: one pass over the table, so the
	// layout is linear in the number of parameters whatever the number of units.
	members := make([][]int, len(units))
	for i := range ps {
		members[unitOf[i]] = append(members[unitOf[i]], i)
	}
	var groups []Group
	isFP8 := func(p *Param) bool { return fp8 != nil && fp8(p) }
	for u := range units {
		for kind := range 3 { // dense, FP8, expert
			expert, f8 := kind == 2, kind == 1
			g := Group{Unit: u, Expert: expert, FP8: f8, Dtype: dtype, Axis: AxisDPCP, Shards: 1}
			if expert {
				g.Axis = AxisEDP
			}
			if f8 {
				g.Dtype = "e4m3"
			}
			if shard {
				g.Shards = m.Size(g.Axis)
			}
			var off int64
			for _, i := range members[u] {
				p := &ps[i]
				if p.IsExpert() != expert || (expert && p.Expert >= perRank) || (!expert && isFP8(p) != f8) {
					continue
				}
				aligned := roundUp(off, Align)
				g.AlignPad += aligned - off
				n := p.LocalNumel()
				g.Entries = append(g.Entries, Entry{Param: i, Offset: aligned, Numel: n})
				g.Numel += n
				off = aligned + n
			}
			if len(g.Entries) == 0 {
				continue
			}
			g.Padded = roundUp(off, int64(g.Shards)*Align)
			g.TailPad = g.Padded - off
			g.Index = len(groups)
			units[u].Groups = append(units[u].Groups, g.Index)
			groups = append(groups, g)
		}
	}
	return groups
}

func roundUp(x, m int64) int64 { return (x + m - 1) / m * m }

// verifyLayout checks the layout invariants: entries are aligned, in bounds and
// disjoint; padding is accounted for exactly; shards are equal and cover the buffer;
// expert parameters live only in expert groups sharded over edp, dense ones only in
// dense groups over dp×cp; and every parameter is placed exactly once (each expert
// once per ep rank).
func verifyLayout(ps []Param, groups []Group, numExperts, ep int) error {
	placed := make([]int, len(ps))
	for gi := range groups {
		g := &groups[gi]
		var end, sum int64
		for _, e := range g.Entries {
			p := &ps[e.Param]
			if e.Offset%Align != 0 || e.Offset < end || e.Numel != p.LocalNumel() {
				return fmt.Errorf("group %d: %s misplaced at offset %d (previous end %d)", gi, p.Name, e.Offset, end)
			}
			if p.IsExpert() != g.Expert || (g.Expert && g.Axis != AxisEDP) || (!g.Expert && g.Axis != AxisDPCP) {
				return fmt.Errorf("group %d (%s, expert=%v): holds %s of the wrong kind", gi, g.Axis, g.Expert, p.Name)
			}
			end = e.Offset + e.Numel
			sum += e.Numel
			placed[e.Param]++
		}
		if sum != g.Numel || end > g.Padded || g.Padded%int64(g.Shards) != 0 || g.AlignPad+g.TailPad != g.Padded-g.Numel {
			return fmt.Errorf("group %d: numel %d, padded %d, padding %d+%d do not add up over %d shards", gi, g.Numel, g.Padded, g.AlignPad, g.TailPad, g.Shards)
		}
		// Shard(i) is i·ShardNumel: consecutive equal ranges, so the first and the
		// last shard settle coverage (a loop over every shard would cost the world
		// size per group).
		first, _ := g.Shard(0)
		_, last := g.Shard(g.Shards - 1)
		if first != 0 || last != g.Padded || g.ShardNumel()*int64(g.Shards) != g.Padded {
			return fmt.Errorf("group %d: %d shards of %d cover [%d, %d) of %d elements", gi, g.Shards, g.ShardNumel(), first, last, g.Padded)
		}
	}
	perRank := 0
	if numExperts > 0 {
		perRank = numExperts / ep
	}
	for i := range ps {
		want := 1
		if ps[i].IsExpert() && ps[i].Expert >= perRank {
			want = 0 // held by another ep rank, at the offsets of its ep-rank-0 twin
		}
		if placed[i] != want {
			return fmt.Errorf("%s placed %d times, want %d", ps[i].Name, placed[i], want)
		}
	}
	return nil
}
