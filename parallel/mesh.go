package parallel

import (
	"fmt"
	"slices"

	"github.com/shardline/shardline/config"
)

// Axis names a mesh axis.
type Axis string

// The axes of the dense mesh (tp, cp, dp, pp) and of the expert mesh (etp, ep, edp),
// and the dense FSDP sharding group dp×cp.
const (
	AxisTP   Axis = "tp"
	AxisCP   Axis = "cp"
	AxisDP   Axis = "dp"
	AxisPP   Axis = "pp"
	AxisDPCP Axis = "dp_cp"
	AxisETP  Axis = "etp"
	AxisEP   Axis = "ep"
	AxisEDP  Axis = "edp"
)

// GroupAxes lists every group kind, in the order plans print them.
var GroupAxes = []Axis{AxisTP, AxisCP, AxisDP, AxisDPCP, AxisEP, AxisETP, AxisEDP, AxisPP}

// Mesh is the rank layout. Dense: rank = tp + TP·(cp + CP·(dp + DP·pp)). Expert,
// inside the pipeline stage's contiguous block of ranks: local = etp + ETP·(ep +
// EP·edp). Groups are computed on demand (a 2048-rank plan does not store 2048×8
// rank lists).
type Mesh struct {
	World, TP, CP, DP, PP int
	ETP, EP, EDP          int
}

// NewMesh checks the degrees and derives dp and edp.
func NewMesh(world, tp, cp, pp, ep, etp int) (Mesh, error) {
	if tp < 1 || cp < 1 || pp < 1 || ep < 1 || etp < 1 || world < 1 {
		return Mesh{}, config.KeyProblem("parallel.world_size", "parallel degrees and world size must be ≥ 1", "")
	}
	if world%(tp*cp*pp) != 0 {
		return Mesh{}, config.KeyProblem("parallel.world_size", fmt.Sprintf("world size %d is not divisible by tp×cp×pp = %d", world, tp*cp*pp), "")
	}
	stage := world / pp
	if stage%(ep*etp) != 0 {
		return Mesh{}, config.KeyProblem("parallel.expert_parallel", fmt.Sprintf("ep×etp = %d does not divide the %d ranks of a pipeline stage", ep*etp, stage), "")
	}
	return Mesh{World: world, TP: tp, CP: cp, DP: world / (tp * cp * pp), PP: pp, ETP: etp, EP: ep, EDP: stage / (ep * etp)}, nil
}

// Coords are a rank's coordinates on every axis.
type Coords struct {
	TP, CP, DP, PP int
	ETP, EP, EDP   int
}

// Coords returns rank's coordinates.
func (m Mesh) Coords(rank int) Coords {
	c := Coords{TP: rank % m.TP, CP: rank / m.TP % m.CP, DP: rank / (m.TP * m.CP) % m.DP, PP: rank / (m.TP * m.CP * m.DP)}
	local := rank % (m.World / m.PP)
	c.ETP, c.EP, c.EDP = local%m.ETP, local/m.ETP%m.EP, local/(m.ETP*m.EP)
	return c
}

// Size is the number of ranks in a group of the axis.
func (m Mesh) Size(a Axis) int {
	switch a {
	case AxisTP:
		return m.TP
	case AxisCP:
		return m.CP
	case AxisDP:
		return m.DP
	case AxisPP:
		return m.PP
	case AxisDPCP:
		return m.DP * m.CP
	case AxisETP:
		return m.ETP
	case AxisEP:
		return m.EP
	case AxisEDP:
		return m.EDP
	}
	return 0
}

// Group returns the ranks of rank's group on the axis, ascending.
func (m Mesh) Group(a Axis, rank int) []int {
	n := m.Size(a)
	out := make([]int, 0, n)
	c := m.Coords(rank)
	dense := func(tp, cp, dp, pp int) int { return tp + m.TP*(cp+m.CP*(dp+m.DP*pp)) }
	expert := func(etp, ep, edp int) int {
		return c.PP*(m.World/m.PP) + etp + m.ETP*(ep+m.EP*edp)
	}
	switch a {
	case AxisTP:
		for i := 0; i < n; i++ {
			out = append(out, dense(i, c.CP, c.DP, c.PP))
		}
	case AxisCP:
		for i := 0; i < n; i++ {
			out = append(out, dense(c.TP, i, c.DP, c.PP))
		}
	case AxisDP:
		for i := 0; i < n; i++ {
			out = append(out, dense(c.TP, c.CP, i, c.PP))
		}
	case AxisPP:
		for i := 0; i < n; i++ {
			out = append(out, dense(c.TP, c.CP, c.DP, i))
		}
	case AxisDPCP:
		for dp := 0; dp < m.DP; dp++ {
			for cp := 0; cp < m.CP; cp++ {
				out = append(out, dense(c.TP, cp, dp, c.PP))
			}
		}
	case AxisETP:
		for i := 0; i < n; i++ {
			out = append(out, expert(i, c.EP, c.EDP))
		}
	case AxisEP:
		for i := 0; i < n; i++ {
			out = append(out, expert(c.ETP, i, c.EDP))
		}
	case AxisEDP:
		for i := 0; i < n; i++ {
			out = append(out, expert(c.ETP, c.EP, i))
		}
	}
	slices.Sort(out)
	return out
}

// SpansNodes reports whether rank's group on the axis crosses a node boundary.
// Groups are regular, so rank 0's group decides for every rank.
func (m Mesh) SpansNodes(a Axis, gpusPerNode int) bool {
	g := m.Group(a, 0)
	return len(g) > 0 && g[0]/gpusPerNode != g[len(g)-1]/gpusPerNode
}
