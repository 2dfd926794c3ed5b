package parallel

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// Probe is a short measurement of a machine's kernels beside a calibration's
// tables (trainer.ProbeSpeed): a few of the table's matmuls and one
// memory-bound kernel timed on the machine, each over what the table says of
// it. A table measured on another machine, or on one of the same name that
// runs slower, times the step by its own machine's speed; Scaled brings its
// figures to the probed machine's.
type Probe struct {
	Host    string `json:"host"`    // the machine probed, as a calibration names its host
	Threads int    `json:"threads"` // GOMAXPROCS when it was probed
	Date    string `json:"date"`    // when it was probed (RFC 3339)
	Version string `json:"version"` // the shardline that probed it
	// Table is the digest of the table the kernels were compared with
	// (Calibration.Digest): a probe scales only that table.
	Table string `json:"table"`
	// GEMM is the matmuls' time here over the table's: the median over the
	// probe's shapes, forward and backward. Stream is the memory-bound
	// kernel's (ProbeStreamKind) time here over the table's.
	GEMM   float64 `json:"gemm_factor"`
	Stream float64 `json:"stream_factor"`
	// Seconds is how long the probe took.
	Seconds float64 `json:"seconds"`
}

// ProbeStreamKind is the memory-bound kernel a probe times, at
// ProbeStreamElements elements: an elementwise sum streams two operands in
// and one out, as most of the step's memory-bound kernels do.
const (
	ProbeStreamKind     = StreamAdd
	ProbeStreamElements = 1 << 22
)

// Factors in [minProbeFactor, maxProbeFactor] are taken: beyond them a probe
// measured something other than the kernels' speed (a machine stalled, a
// clock that jumped).
const (
	minProbeFactor = 1.0 / 64
	maxProbeFactor = 64
)

// Check says why p cannot scale c (nil when it can): its factors must be
// finite and within a factor of 64 either way, and it must have been compared
// with c's own tables.
func (p Probe) Check(c *Calibration) error {
	for name, f := range map[string]float64{"gemm_factor": p.GEMM, "stream_factor": p.Stream} {
		if !(f >= minProbeFactor && f <= maxProbeFactor) {
			return fmt.Errorf("probe %s is %v: a probe's factors lie in [1/64, 64]", name, f)
		}
	}
	if d := c.Digest(); p.Table != d {
		return fmt.Errorf("the probe was compared with the table %.12s, not with this one (%.12s)", p.Table, d)
	}
	return nil
}

// Digest is the sha256 of c's figures (its JSON, without a probe that scaled
// it): what a probe of c records, so that a probe of another table, or of
// this one before it changed, is not applied to it.
func (c *Calibration) Digest() string {
	plain := *c
	plain.Probe, plain.Unscaled = nil, nil
	b, _ := json.Marshal(&plain)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Scaled is c with its figures brought to the probed machine's speed: every
// matmul and attention time (fp32 and bf16 weights), and the seconds per call
// the step adds for each kernel, times p.GEMM (both are the cores'
// arithmetic); every memory-bound kernel's and collective's costs (in-process
// collectives are copies), and the seconds per byte the matmuls and the
// experts add inside a step for their operands' traffic, times p.Stream. The
// in-step factors and the host-share and ring efficiencies are ratios of
// times on one machine and stay. The result records p (Probe) and c's digest
// (Unscaled); c itself is unchanged. An error says why p does not apply
// (Probe.Check).
func (c *Calibration) Scaled(p Probe) (*Calibration, error) {
	if err := p.Check(c); err != nil {
		return nil, err
	}
	out := *c
	out.idx = nil
	g, s := p.GEMM, p.Stream
	scaleGEMM := func(pts []GEMMPoint) []GEMMPoint {
		pts = slices.Clone(pts)
		for i := range pts {
			pts[i].Fwd, pts[i].Bwd = pts[i].Fwd*g, pts[i].Bwd*g
		}
		return pts
	}
	out.GEMM, out.GEMMBF16 = scaleGEMM(c.GEMM), scaleGEMM(c.GEMMBF16)
	out.Attention = slices.Clone(c.Attention)
	for i := range out.Attention {
		out.Attention[i].Fwd, out.Attention[i].Bwd = out.Attention[i].Fwd*g, out.Attention[i].Bwd*g
	}
	scaleCosts := func(m map[string]Linear) map[string]Linear {
		m = maps.Clone(m)
		for k, l := range m {
			m[k] = Linear{Fixed: l.Fixed * s, PerUnit: l.PerUnit * s}
		}
		return m
	}
	out.Stream, out.Collectives = scaleCosts(c.Stream), scaleCosts(c.Collectives)
	out.PerCall *= g
	out.InStepGEMMPerByte *= s
	out.InStepGEMMPerByteBF16 *= s
	out.InStepExpertsStall *= s
	out.InStepExpertsStallSlope *= s
	out.InStepExpertsStallBF16 *= s
	out.InStepExpertsStallSlopeBF16 *= s
	pc := p
	out.Probe = &pc
	out.Unscaled = &Unscaled{Host: c.Host, Threads: c.Threads, Digest: c.Digest()}
	out.Index()
	return &out, nil
}

// Unscaled describes the table a probe scaled (Calibration.Scaled): its
// machine and digest.
type Unscaled struct {
	Host    string `json:"host"`
	Threads int    `json:"threads"`
	Digest  string `json:"digest"`
}

// timeModelProbe is what the plan's time-model line adds for a scaled table.
func (c *Calibration) timeModelProbe() string {
	p := c.Probe
	if p == nil {
		return ""
	}
	return fmt.Sprintf(", scaled to %s by a probe (matmuls ×%.2f, memory-bound kernels ×%.2f; %s)", p.Host, p.GEMM, p.Stream, p.Date)
}
