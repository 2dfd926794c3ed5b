package parallel

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// FormatBytes prints bytes in binary units with one decimal: "1.5 GiB".
func FormatBytes(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	v, i := float64(b), -1
	for v >= unit && i < 4 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTP"[i])
}

// formatCount prints an integer with thousands separators.
func formatCount(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func formatSeconds(s float64) string {
	switch {
	case s >= 1:
		return fmt.Sprintf("%.2f s", s)
	case s >= 1e-3:
		return fmt.Sprintf("%.2f ms", s*1e3)
	default:
		return fmt.Sprintf("%.1f µs", s*1e6)
	}
}

// unitRow is a run of identical consecutive units, printed as one row.
type unitRow struct {
	first, last  string
	kind         string
	count        int
	dense, exprt *Group
	fp8          *Group // the FP8 compute weights' group (precision.fp8.param_gather)
}

func (p *Plan) unitRows() []unitRow {
	var rows []unitRow
	for _, u := range p.Units {
		var dense, exprt, fp8 *Group
		for _, gi := range u.Groups {
			switch g := &p.Groups[gi]; {
			case g.Expert:
				exprt = g
			case g.FP8:
				fp8 = g
			default:
				dense = g
			}
		}
		if n := len(rows); n > 0 {
			r := &rows[n-1]
			if r.kind == u.Kind && sameGroup(r.dense, dense) && sameGroup(r.exprt, exprt) && sameGroup(r.fp8, fp8) {
				r.last, r.count = u.Name, r.count+1
				continue
			}
		}
		rows = append(rows, unitRow{first: u.Name, last: u.Name, kind: u.Kind, count: 1, dense: dense, exprt: exprt, fp8: fp8})
	}
	return rows
}

func sameGroup(a, b *Group) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Numel == b.Numel && a.Padded == b.Padded && a.Shards == b.Shards
}

func groupCell(g *Group) string {
	if g == nil {
		return "-"
	}
	return fmt.Sprintf("%s /%d %s (+%s pad)", formatCount(g.Numel), g.Shards, g.Axis, formatCount(g.AlignPad+g.TailPad))
}

// WriteTable prints the plan for a person: topology, mesh, units, memory per rank
// against the device, communication per step by group, and the step-time estimate.
func (p *Plan) WriteTable(w io.Writer) error {
	var b strings.Builder
	t := p.Topology
	m := p.Mesh
	fmt.Fprintf(&b, "plan %s: %s on %d rank(s) (%d node(s) × %d), device %s\n", p.Name, p.Strategy, m.World, t.Nodes(), t.GPUsPerNode, t.Device.Name)
	fmt.Fprintf(&b, "fingerprint %s\n", p.Fingerprint)
	fmt.Fprintf(&b, "mesh: tp %d × cp %d × dp %d × pp %d; experts: etp %d × ep %d × edp %d\n", m.TP, m.CP, m.DP, m.PP, m.ETP, m.EP, m.EDP)
	fmt.Fprintf(&b, "parameters: %s total, %s active per token; padding %s elements per rank's buffers; %d micro-batch(es) per step\n\n",
		formatCount(p.ParamsTotal), formatCount(p.ParamsActive), formatCount(p.Padding), p.MicroBatches)

	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "FSDP units (%d)\tkind\tdense elements /shards group\texpert elements /shards group\n", len(p.Units))
	for _, r := range p.unitRows() {
		name := r.first
		if r.count > 1 {
			name = fmt.Sprintf("%s … %s (×%d)", r.first, r.last, r.count)
		}
		dense := groupCell(r.dense)
		if r.fp8 != nil { // FP8 compute weights beside the dense group, sharded alike
			dense = fmt.Sprintf("%s + FP8 %s", dense, groupCell(r.fp8))
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", name, r.kind, dense, groupCell(r.exprt))
	}
	tw.Flush()

	fmt.Fprintf(&b, "\nmemory per rank (%s of %s)\n", FormatBytes(p.Memory.Total), FormatBytes(t.Device.MemoryBytes))
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, c := range p.Memory.Components() {
		fmt.Fprintf(tw, "  %s\t%s\t%.1f%%\t\n", c.Name, FormatBytes(c.Bytes), 100*float64(c.Bytes)/float64(max(p.Memory.Total, 1)))
	}
	fmt.Fprintf(tw, "  total\t%s\t%.1f%% of device\t\n", FormatBytes(p.Memory.Total), 100*float64(p.Memory.Total)/float64(t.Device.MemoryBytes))
	tw.Flush()
	if p.MemoryWorstTotal > p.Memory.Total {
		fmt.Fprintf(&b, "  (dropless routing at its most unbalanced, every rank's token copies sent to this rank's experts:\n    MoE dispatch %s, total at most %s (%.1f%% of device); a capacity factor bounds it)\n",
			FormatBytes(p.MoEDispatchWorst), FormatBytes(p.MemoryWorstTotal), 100*float64(p.MemoryWorstTotal)/float64(t.Device.MemoryBytes))
	}
	if u := p.Buffers; u.Gather+u.Reduce > 0 {
		fp8 := ""
		if u.GatherFP8 > 0 {
			fp8 = fmt.Sprintf(", FP8 gather %s", formatCount(u.GatherFP8))
		}
		fmt.Fprintf(&b, "  (FSDP buffer arenas: gather %s%s, gradient %s elements; the largest unit %s)\n",
			formatCount(u.Gather), fp8, formatCount(u.Reduce), formatCount(u.Largest))
	}
	if st := p.Buffers.Stage; st.Wire+st.Part > 0 {
		dt := "fp32"
		if st.PartBF16 {
			dt = "bf16"
		}
		wire := ""
		if st.Wire > 0 {
			wire = fmt.Sprintf("%s bf16 elements for the wire, ", formatCount(st.Wire))
		}
		fmt.Fprintf(&b, "  (gradient reduction staging: %s%s %s elements for this rank's part of the sum)\n", wire, formatCount(st.Part), dt)
	}

	b.WriteString("\ncommunication per step\n")
	if len(p.Collectives) == 0 {
		b.WriteString("  none (one rank)\n")
	} else {
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "  group\tcollective\twhat\tdtype\tcalls\tbytes/step\n")
		for _, c := range aggregate(p.Collectives) {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%s\n", c.Axis, c.Kind, c.What, c.Dtype, c.Calls, FormatBytes(c.Bytes))
		}
		tw.Flush()
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "  group\tsize\tlink\tsent per rank\ttime\toverlappable\n")
		for _, a := range p.Comm {
			link := "intra-node"
			if a.SpansNodes {
				link = "inter-node"
			}
			fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\n", a.Axis, a.Size, link, FormatBytes(a.RankBytes), formatSeconds(a.TimeS), formatSeconds(a.OverlapS))
		}
		tw.Flush()
	}
	fmt.Fprintf(&b, "\nstep: compute %s + optimizer %s + exposed communication %s = %s; %.0f tokens/s per device; MFU %.1f%%\n",
		formatSeconds(p.ComputeS), formatSeconds(p.OptimizerS), formatSeconds(p.ExposedCommS), formatSeconds(p.StepTimeS), p.TokensPerSPerDevice, 100*p.MFU)
	if p.StallS > 0 {
		fmt.Fprintf(&b, "  (of compute, %s is the experts' products waiting on memory: each rank waits its own, not scaled by the ranks sharing a host's cores)\n", formatSeconds(p.StallS))
	}
	fmt.Fprintf(&b, "time model: %s\n", p.TimeModel)
	_, err := io.WriteString(w, b.String())
	return err
}

// JSONPlan is the --format json shape of a plan.
type JSONPlan struct {
	Fingerprint string `json:"fingerprint"`
	Name        string `json:"name"`
	Strategy    string `json:"strategy"`
	Device      string `json:"device"`
	WorldSize   int    `json:"world_size"`
	GPUsPerNode int    `json:"gpus_per_node"`
	Mesh        struct {
		TP, CP, DP, PP, ETP, EP, EDP int
	} `json:"mesh"`
	Parameters struct {
		Total   int64 `json:"total"`
		Active  int64 `json:"active"`
		Padding int64 `json:"padding"`
	} `json:"parameters"`
	MicroBatches int        `json:"micro_batches"`
	Units        []JSONUnit `json:"units"`
	// Buffers are the FSDP runtime's unit buffers the memory counts.
	Buffers UnitBuffers `json:"buffers"`
	Memory  struct {
		Memory
		Device         int64 `json:"device"`
		Fits           bool  `json:"fits"`
		MoEDispatchMax int64 `json:"moe_dispatch_worst_case"`
		// TotalWorst is the total at dropless routing's most unbalanced
		// (Plan.MemoryWorstTotal): total where routing cannot exceed the plan.
		TotalWorst int64 `json:"total_worst_case"`
	} `json:"memory"`
	Communication map[Axis]AxisComm `json:"communication"`
	Collectives   []Collective      `json:"collectives"`
	ComputeS      float64           `json:"compute_s"`
	StallS        float64           `json:"experts_stall_s,omitempty"` // of compute_s
	OptimizerS    float64           `json:"optimizer_s"`
	ExposedCommS  float64           `json:"exposed_comm_s"`
	StepTimeS     float64           `json:"step_time_s"`
	TimeModel     string            `json:"time_model"`
	TokensPerS    float64           `json:"tokens_per_s_per_device"`
	MFU           float64           `json:"mfu"`
	Rank          *JSONRank         `json:"rank,omitempty"`
}

// JSONUnit is one FSDP unit and its groups.
type JSONUnit struct {
	Name   string      `json:"name"`
	Kind   string      `json:"kind"`
	Groups []JSONGroup `json:"groups"`
}

// JSONGroup is one parameter group's buffer.
type JSONGroup struct {
	Expert  bool   `json:"expert"`
	Group   Axis   `json:"group"`
	Shards  int    `json:"shards"`
	Numel   int64  `json:"numel"`
	Padded  int64  `json:"padded"`
	Padding int64  `json:"padding"`
	Dtype   string `json:"dtype"`
}

// JSONRank is one rank's coordinates and groups.
type JSONRank struct {
	Rank   int            `json:"rank"`
	Coords Coords         `json:"coords"`
	Groups map[Axis][]int `json:"groups"`
}

// JSON returns the plan's JSON form; rank ≥ 0 adds that rank's coordinates and
// groups (memory is the same on every rank).
func (p *Plan) JSON(rank int) (*JSONPlan, error) {
	if rank >= p.Mesh.World {
		return nil, fmt.Errorf("rank %d is outside the world of %d ranks (0..%d)", rank, p.Mesh.World, p.Mesh.World-1)
	}
	j := &JSONPlan{Fingerprint: p.Fingerprint, Name: p.Name, Strategy: p.Strategy, Device: p.Topology.Device.Name,
		WorldSize: p.Mesh.World, GPUsPerNode: p.Topology.GPUsPerNode, MicroBatches: p.MicroBatches,
		ComputeS: p.ComputeS, StallS: p.StallS, OptimizerS: p.OptimizerS, ExposedCommS: p.ExposedCommS, StepTimeS: p.StepTimeS, TimeModel: p.TimeModel, TokensPerS: p.TokensPerSPerDevice, MFU: p.MFU,
		Collectives: p.Collectives, Communication: map[Axis]AxisComm{}}
	m := p.Mesh
	j.Mesh.TP, j.Mesh.CP, j.Mesh.DP, j.Mesh.PP, j.Mesh.ETP, j.Mesh.EP, j.Mesh.EDP = m.TP, m.CP, m.DP, m.PP, m.ETP, m.EP, m.EDP
	j.Parameters.Total, j.Parameters.Active, j.Parameters.Padding = p.ParamsTotal, p.ParamsActive, p.Padding
	for _, u := range p.Units {
		ju := JSONUnit{Name: u.Name, Kind: u.Kind}
		for _, gi := range u.Groups {
			g := &p.Groups[gi]
			ju.Groups = append(ju.Groups, JSONGroup{g.Expert, g.Axis, g.Shards, g.Numel, g.Padded, g.AlignPad + g.TailPad, g.Dtype})
		}
		j.Units = append(j.Units, ju)
	}
	j.Memory.Memory = p.Memory
	j.Buffers = p.Buffers
	j.Memory.Device = p.Topology.Device.MemoryBytes
	j.Memory.Fits = p.Fits()
	j.Memory.MoEDispatchMax = p.MoEDispatchWorst
	j.Memory.TotalWorst = p.MemoryWorstTotal
	for _, a := range p.Comm {
		j.Communication[a.Axis] = a
	}
	if rank >= 0 {
		jr := &JSONRank{Rank: rank, Coords: m.Coords(rank), Groups: map[Axis][]int{}}
		for _, a := range GroupAxes {
			jr.Groups[a] = m.Group(a, rank)
		}
		j.Rank = jr
	}
	return j, nil
}

// WriteJSON writes the plan as indented JSON.
func (p *Plan) WriteJSON(w io.Writer, rank int) error {
	j, err := p.JSON(rank)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(j)
}

// Fits reports whether the predicted memory fits the device.
func (p *Plan) Fits() bool { return p.Memory.Total <= p.Topology.Device.MemoryBytes }

// aggregate sums collectives that differ only in size (one per unit) into one row
// per group, kind, purpose and dtype; Bytes becomes the step's total.
func aggregate(cs []Collective) []Collective {
	var out []Collective
	idx := map[[4]string]int{}
	for _, c := range cs {
		k := [4]string{string(c.Axis), c.Kind, c.What, c.Dtype}
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, Collective{Kind: c.Kind, Axis: c.Axis, What: c.What, Dtype: c.Dtype, Overlap: c.Overlap})
		}
		out[i].Calls += c.Calls
		out[i].Bytes += c.StepBytes()
	}
	return out
}
