package parallel

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"slices"
	"sort"
	"sync"
)

// shipped are the CPU engine's tables measured by `shardline calibrate`, each on
// the machine named inside (its host, date and version): calibration/cpu.json
// stands for "cpu" by default, and a table measured on this machine's kind of
// CPU stands instead (ShippedCalibrations), unless the user's own replaces it
// (Calibrations.With).
//
//go:embed calibration/*.json
var shipped embed.FS

// shippedCPU is the default table's file.
var shippedCPU = func() []byte {
	b, _ := shipped.ReadFile("calibration/cpu.json")
	return b
}()

// Calibrations are the measured tables plans time the CPU engine with, by
// device profile. A plan takes them as an argument (TopologyOf, Check): the
// CLI makes them once per command from the tables shardline ships and the
// user's own (ShippedCalibrations, With); nil stands for the shipped ones.
type Calibrations map[string]*Calibration

// shippedTables are the embedded tables, parsed once (the default first).
var shippedTables = sync.OnceValue(func() []*Calibration {
	var out []*Calibration
	if c, err := ParseCalibration(shippedCPU); err == nil {
		out = append(out, c)
	}
	names, _ := fs.Glob(shipped, "calibration/*.json")
	for _, name := range names {
		if name == "calibration/cpu.json" {
			continue
		}
		b, _ := shipped.ReadFile(name)
		if c, err := ParseCalibration(b); err == nil {
			out = append(out, c)
		}
	}
	return out
})

// ShippedCalibrations are the tables shardline ships: calibration/cpu.json
// for "cpu", or, where one was measured on host's kind of CPU (as
// trainer.CalibrationHost names a machine), that one instead ("" prefers
// none).
func ShippedCalibrations(host string) Calibrations {
	cals := Calibrations{}
	for i, c := range shippedTables() {
		if i == 0 || (host != "" && c.Host == host) {
			cals[c.Profile] = c
		}
	}
	return cals
}

// With is c with cal the table of its profile (the user's calibration
// setting); c itself is unchanged.
func (c Calibrations) With(cal *Calibration) Calibrations {
	out := maps.Clone(c)
	if out == nil {
		out = ShippedCalibrations("")
	}
	out[cal.Profile] = cal
	return out
}

// For is the table of a device profile (nil: none, the plan times the step
// from the profile's peak); nil Calibrations are the shipped ones.
func (c Calibrations) For(profile string) *Calibration {
	if c == nil {
		c = ShippedCalibrations("")
	}
	return c[profile]
}

// Calibration is what `shardline calibrate` measured on one device: the time the
// engine's own kernels take at a grid of shapes. The plan's per-operation time
// model (stepModel) reads its figures from here instead of assuming a fraction of
// the data-sheet peak. Every figure is a measurement; Host, Threads, Date and
// Source say where and when it was taken.
type Calibration struct {
	// Profile is the device profile the figures apply to ("cpu").
	Profile string `json:"profile"`
	Host    string `json:"host"`    // the machine: CPU model and instruction set
	Threads int    `json:"threads"` // the worker threads the kernels ran on (GOMAXPROCS)
	Date    string `json:"date"`    // when it was measured (RFC 3339)
	Source  string `json:"source"`  // the command and version that measured it
	// Machine is the key of the machine that measured it (trainer.MachineKey:
	// Host, GOMAXPROCS, host name and machine id, hashed): a table whose key is
	// this machine's describes it; any other, or one without a key (tables
	// measured before 2026-11-27, and the ones shardline ships), is scaled to
	// this machine by a probe before it times a plan (docs/plan.md).
	Machine string `json:"machine,omitempty"`
	// GEMM is Matmul and MatmulBackward at (M rows, K inputs, N outputs): the
	// grid's M, K and N values are each sorted powers of two.
	GEMM []GEMMPoint `json:"gemm"`
	// GEMMBF16 is the same grid with the weight in bf16 (precision.bf16): the
	// forward product and the input gradient read it as the CPU does by default
	// (bf16 pairs by AVX-512 BF16 where it has them, BF16Matmul "dot"; widened
	// to fp32 elsewhere, "widened"), the weight gradient stays fp32. Tables
	// measured before 2026-11-24 lack it, and plan bf16 runs' matmuls from GEMM.
	GEMMBF16   []GEMMPoint `json:"gemm_bf16,omitempty"`
	BF16Matmul string      `json:"bf16_matmul,omitempty"`
	// GEMMFP8 is Matmul and MatmulBackward on FP8 operands (an FP8 layer's
	// products: the input and weight in E4M3, the output gradient in E5M2,
	// each with its scale inverse; the CPU widens the codes to fp32 and runs
	// its fp32 product), at a sub-grid of GEMM's shapes: an FP8 product is
	// timed as the fp32 one at its shape times their ratio interpolated over
	// this grid (gemmFP8Ratio). Tables measured before 2026-11-28 lack it, and
	// time an FP8 product as the fp32 one plus a pass widening its codes
	// (from_bf16's cost per element), which the plan's time model says.
	GEMMFP8 []GEMMPoint `json:"gemm_fp8,omitempty"`
	// Attention is flash attention forward and backward at (T, head size), causal
	// and (Full) without the mask. Tables measured before 2026-11-25 also hold the
	// materialised kernel's points (Flash false), which the engine no longer runs:
	// the plan reads only the flash points.
	Attention []AttentionPoint `json:"attention"`
	// Stream is the memory-bound kernels: seconds per call plus seconds per element.
	Stream map[string]Linear `json:"stream"`
	// Collectives are the in-process collectives by kind and group size: seconds
	// per call plus seconds per byte one rank sends.
	Collectives map[string]Linear `json:"collectives"`
	// InStep and PerCall say how kernels behave inside a training step rather
	// than alone: InStep scales their time (operands come from memory the other
	// kernels filled, not from a cache the previous call warmed) and PerCall adds
	// seconds per kernel launched (the workers wake for each). Both are fitted by
	// least squares to whole forward and backward passes (InStepSamples):
	// measured ≈ InStep·tables + PerCall·calls.
	InStep        float64        `json:"in_step_factor"`
	PerCall       float64        `json:"per_call_s"`
	InStepSamples []InStepSample `json:"in_step_samples"`
	// InStepGEMM, when set, scales the matmuls' table time instead of InStep: the
	// matmuls' own time inside the samples' passes (timed kernel by kernel) over
	// what the tables predict for them. InStep and PerCall are then fitted to the
	// rest of each pass.
	InStepGEMM float64 `json:"in_step_gemm_factor,omitempty"`
	// InStepGEMMPerByte, when set, adds seconds per byte of the matmuls' operands
	// (both inputs and the output, each product of forward and backward) to their
	// time inside a step: the tables time each shape called again and again, its
	// operands warm in cache, while inside a step they come from memory, which
	// costs small and skinny products (few FLOPs per byte) most. With it,
	// InStepGEMM is the least-squares α of matmuls ≈ α·tables + β·bytes over the
	// samples (relative errors); without it, the pooled ratio alone.
	InStepGEMMPerByte float64 `json:"in_step_gemm_s_per_byte,omitempty"`
	// InStepGEMMBF16 and InStepGEMMPerByteBF16 are InStepGEMM and
	// InStepGEMMPerByte for matmuls with bf16 weights (GEMMBF16), fitted to the
	// samples run with bf16 weights: inside a step those products also round
	// their cold activations to bf16, which the tables' warm calls hide. A table
	// without them times bf16 matmuls by the fp32 figures.
	InStepGEMMBF16        float64 `json:"in_step_gemm_bf16_factor,omitempty"`
	InStepGEMMPerByteBF16 float64 `json:"in_step_gemm_bf16_s_per_byte,omitempty"`
	// InStepAttention, when set, scales attention's table time the same way:
	// attention's own time inside the passes over what the tables predict for it.
	InStepAttention float64 `json:"in_step_attention_factor,omitempty"`
	// InStepOptimizer, when set, scales the step's own memory-bound work (the
	// gradients' square sum, the micro-batches' accumulation and AdamW) the
	// same way: that work's time after the samples' passes, a call per
	// parameter group as the trainer makes them, their operands cold as a
	// step leaves them, over the tables' time for it (StepTail). A table
	// without it times that work as measured warm, which a step's cold
	// operands and mid-sized calls made 2 to 5 times too fast on this
	// project's development host.
	InStepOptimizer float64 `json:"in_step_optimizer_factor,omitempty"`
	// InStepExpertsStall, when set, adds seconds per byte of the routed
	// experts' operands to their products inside a step, beyond what the
	// matmuls' factor and traffic term give them: many mid-sized products,
	// each over its own slice of rows, wait on memory where the dense
	// products stream through it (on the development host moe-tiny's
	// experts took 2.1 times their tables inside a pass and 1.2 times warm,
	// where its dense products took 1.15 times). The wait per byte grows
	// with the rows the layer routes (moe-tiny's shape at 1,024, 2,048 and
	// 4,096 routed rows: 37, 59 and 82 ps a byte), so the stall per byte is
	// InStepExpertsStall + InStepExpertsStallSlope·log2(routed rows/1024),
	// at least 0, fitted by least squares to the samples' experts' measured
	// time less the matmuls' fit for them, per byte, over the samples run
	// with fp32 weights (the ...BF16 figures: with bf16 weights, whose
	// products convert their operands as they read them and stall less).
	// The stall is time off the cores: ranks sharing them each wait their
	// own, not HostShare times as long (StepBreakdown.Stall). A table
	// without it times the experts as the other matmuls.
	InStepExpertsStall          float64 `json:"in_step_experts_stall_s_per_byte,omitempty"`
	InStepExpertsStallSlope     float64 `json:"in_step_experts_stall_slope,omitempty"`
	InStepExpertsStallBF16      float64 `json:"in_step_experts_bf16_stall_s_per_byte,omitempty"`
	InStepExpertsStallSlopeBF16 float64 `json:"in_step_experts_bf16_stall_slope,omitempty"`
	// Drift is the fp32 matmuls timed again right after the in-step passes
	// over their table's time (the median over a few grid points, forward and
	// backward). Far from 1, the machine's speed changed while it was
	// calibrated, and the in-step factors, which relate those passes to the
	// tables, carry the change. Tables measured before 2026-11-27 lack it.
	Drift float64 `json:"drift,omitempty"`
	// HostShare says how ranks that share the cores (in-process or local ranks)
	// divide them. The plan used to give each of S such ranks 1/S of the machine,
	// so a step S times as long as alone; but one rank alone leaves cores idle
	// (kernels too small to split, the join at the end of each parallel region,
	// the other core descheduled by the hypervisor), and other ranks' kernels fill
	// that time. A point says that a rank among Ranks takes Ranks·Efficiency times
	// its time alone in compute; FitHostShare fits them to HostShareSamples, steps
	// of calibration models trained by in-process ranks. Without points the plan
	// keeps Efficiency 1.
	HostShare        []HostSharePoint  `json:"host_share,omitempty"`
	HostShareSamples []HostShareSample `json:"host_share_samples,omitempty"`
	// RingShare says how much longer ranks take in compute when they split every
	// sequence over a context-parallel ring of Ranks (the points' rank count is
	// the cp degree) than the same number of ranks splitting the batch: every ring
	// step waits for the slowest rank of the ring, and ranks sharing the cores
	// reach the steps unevenly. A point's Efficiency multiplies such a step's
	// compute; FitHostShare fits it to HostShareSamples with CP set, over the same
	// model at as many data-parallel ranks. Without points the plan keeps 1.
	RingShare []HostSharePoint `json:"ring_share,omitempty"`
	// Probe, when set, is the probe of another machine that scaled these
	// figures to its speed (Scaled), and Unscaled the table it scaled: the
	// figures are then estimates for that machine, not its measurements.
	Probe    *Probe    `json:"probe,omitempty"`
	Unscaled *Unscaled `json:"unscaled,omitempty"`

	idx *calIndex // the grids, built by Index
}

// calIndex is the tables arranged for lookup.
type calIndex struct {
	gemm [3]gemmIndex // fp32 weights, bf16 weights, FP8 operands
	attn [2]attnIndex // flash, flash without the causal mask
}

// gemmIndex is one matmul grid: its axes' values, its points by shape, and how
// many points the table gave (more than len(at) where one repeats).
type gemmIndex struct {
	ms, ks, ns []int
	at         map[[3]int]GEMMPoint
	points     int
}

// attnIndex is gemmIndex's twin for one kind of flash attention (calIndex.attn).
type attnIndex struct {
	ts, hs []int
	at     map[[2]int]AttentionPoint
	points int
}

// Index arranges the tables for lookup; ParseCalibration calls it, and so must
// whoever fills a Calibration in code before timing with it.
func (c *Calibration) Index() {
	x := &calIndex{}
	for i, pts := range [][]GEMMPoint{c.GEMM, c.GEMMBF16, c.GEMMFP8} {
		g := gemmIndex{at: map[[3]int]GEMMPoint{}, points: len(pts)}
		g.ms, g.ks, g.ns = axis(pts, func(p GEMMPoint) int { return p.M }), axis(pts, func(p GEMMPoint) int { return p.K }), axis(pts, func(p GEMMPoint) int { return p.N })
		for _, p := range pts {
			g.at[[3]int{p.M, p.K, p.N}] = p
		}
		x.gemm[i] = g
	}
	for i, full := range []bool{false, true} {
		var pts []AttentionPoint
		for _, p := range c.Attention {
			if p.Flash && p.Full == full {
				pts = append(pts, p)
			}
		}
		a := attnIndex{at: map[[2]int]AttentionPoint{}, points: len(pts)}
		a.ts, a.hs = axis(pts, func(p AttentionPoint) int { return p.T }), axis(pts, func(p AttentionPoint) int { return p.HD })
		for _, p := range pts {
			a.at[[2]int{p.T, p.HD}] = p
		}
		x.attn[i] = a
	}
	c.idx = x
}

func (c *Calibration) index() *calIndex {
	if c.idx == nil {
		c.Index()
	}
	return c.idx
}

// InStepSample is one model step measured whole beside the tables' prediction;
// with GEMMTables set, also the matmuls' part of both (GEMMMeasured is their
// time inside the pass, kernel by kernel), and with AttnTables set attention's.
type InStepSample struct {
	Model        string  `json:"model"`
	BF16         bool    `json:"bf16,omitempty"` // the pass ran with bf16 weights
	Measured     float64 `json:"measured_s"`
	Tables       float64 `json:"tables_s"`
	Calls        float64 `json:"kernel_calls"`
	GEMMMeasured float64 `json:"gemm_measured_s,omitempty"`
	GEMMTables   float64 `json:"gemm_tables_s,omitempty"`
	AttnMeasured float64 `json:"attention_measured_s,omitempty"`
	AttnTables   float64 `json:"attention_tables_s,omitempty"`
	// GEMMBytes is the operand bytes of the pass's matmuls (MicroCompute): a
	// property of the model's shapes, not a measurement.
	GEMMBytes float64 `json:"gemm_bytes,omitempty"`
	// OptMeasured is the time of the step's tail after the pass (square sum
	// and AdamW over every parameter group), OptTables what StepTail says of
	// it.
	OptMeasured float64 `json:"optimizer_measured_s,omitempty"`
	OptTables   float64 `json:"optimizer_tables_s,omitempty"`
	// ExpertsMeasured is the routed experts' products' part of GEMMMeasured;
	// ExpertsTables and ExpertsBytes their part of GEMMTables and GEMMBytes.
	// A sample of an MoE model measured before 2026-11-27 has ExpertsTables
	// but no ExpertsMeasured: its GEMMMeasured then holds the dense products
	// alone, the experts' time being in the rest of its pass.
	ExpertsMeasured float64 `json:"experts_measured_s,omitempty"`
	ExpertsTables   float64 `json:"experts_tables_s,omitempty"`
	ExpertsBytes    float64 `json:"experts_bytes,omitempty"`
	// RoutedRows is the rows each MoE layer's experts process in the pass (a
	// property of the model, like ExpertsTables).
	RoutedRows float64 `json:"routed_rows,omitempty"`
	// Disturbed marks a pass FitInStep left out: its time over its tables'
	// lies beyond disturbedLimit either way of the median of the passes of its
	// dtype, which on a quiet machine lie within 1.35 of it; such a pass ran
	// beside other work (on this project's shared VM one pass of five took
	// 3.5 times its tables where the others took 1.1 to 1.6 times, and fitted
	// factors 1.2 to 1.6 times too large). Set by FitInStep, on every round
	// of the model's passes.
	Disturbed bool `json:"disturbed,omitempty"`
}

// expertsUntimed says the sample's MoE pass was measured before its experts'
// products were timed (InStepSample.ExpertsMeasured).
func (s InStepSample) expertsUntimed() bool { return s.ExpertsTables > 0 && s.ExpertsMeasured <= 0 }

// dense is the sample's dense matmuls: their measured time, the tables' and
// their operand bytes.
func (s InStepSample) dense() gemmSample {
	m := s.GEMMMeasured
	if !s.expertsUntimed() {
		m -= s.ExpertsMeasured
	}
	return gemmSample{measured: m, tables: s.GEMMTables - s.ExpertsTables, bytes: s.GEMMBytes - s.ExpertsBytes}
}

// gemmSample is matmuls' time in a pass, measured and by the tables, and their
// operands' bytes.
type gemmSample struct{ measured, tables, bytes float64 }

// disturbedLimit is how far (either way) a model's pass may lie from the
// median of its dtype's passes, in measured time over the tables', before
// FitInStep takes it for one that other work slowed (or, below, for a
// mismeasured one) and leaves it out. On this project's development hosts,
// quiet, the calibration models' passes took 1.06 to 1.40 times their tables
// (AMD, Intel), within 1.35 of their median; a pass disturbed by other work
// took 2 to 4 times as long.
const disturbedLimit = 1.5

// InStepModels is the in-step passes with each model's rounds (samples of
// the same model and dtype, which Calibrate measures interleaved) made one:
// the round whose whole pass is the median, with the median of the rounds'
// step tails (a disturbance that slows one round is left out, as stepTime
// leaves out a slow pass), in the order the models first appear. A table
// measured before 2026-11-28 holds one round a model.
func (c *Calibration) InStepModels() []InStepSample {
	type key struct {
		model string
		bf16  bool
	}
	var order []key
	rounds := map[key][]InStepSample{}
	for _, s := range c.InStepSamples {
		k := key{s.Model, s.BF16}
		if _, ok := rounds[k]; !ok {
			order = append(order, k)
		}
		rounds[k] = append(rounds[k], s)
	}
	out := make([]InStepSample, 0, len(order))
	for _, k := range order {
		rs := slices.Clone(rounds[k])
		tails := make([]float64, len(rs))
		for i, r := range rs {
			tails[i] = r.OptMeasured
		}
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].Measured < rs[j].Measured })
		m := rs[len(rs)/2]
		m.OptMeasured = Median(tails)
		out = append(out, m)
	}
	return out
}

// undisturbed marks (Disturbed) and leaves out the samples whose measured
// time over their tables' lies beyond disturbedLimit of their median; with
// fewer than three samples nothing can be told apart, and all are kept.
func undisturbed(samples []InStepSample) []InStepSample {
	if len(samples) < 3 {
		return samples
	}
	var ratios []float64
	for _, s := range samples {
		if s.Measured > 0 && s.Tables > 0 {
			ratios = append(ratios, s.Measured/s.Tables)
		}
	}
	if len(ratios) < 3 {
		return samples
	}
	med := Median(ratios)
	var out []InStepSample
	for _, s := range samples {
		if r := s.Measured / s.Tables; s.Measured > 0 && s.Tables > 0 && (r > med*disturbedLimit || r < med/disturbedLimit) {
			continue
		}
		out = append(out, s)
	}
	return out
}

// FitInStep fits the in-step figures to the passes: each model's rounds
// made one (InStepModels), and of those, each dtype's passes that other work
// disturbed (undisturbed) marked Disturbed and left out. Over what remains
// it sets InStepGEMM and InStepAttention (each kind's measured time in the
// passes over its tables' time, pooled over the samples; for the matmuls, with
// every sample's operand bytes known, α and β of matmuls ≈ α·tables + β·bytes
// instead, fitted to relative errors, when both come out positive), then InStep
// and PerCall from the rest of the passes by least squares (both at least 0;
// with one sample, or a negative per-call cost, the factor alone), all over the
// samples run with fp32 weights; then InStepGEMMBF16 and InStepGEMMPerByteBF16
// the same way from the matmuls of the samples run with bf16 weights; then
// the experts' stall (InStepExpertsStall and its slope over the routed rows,
// and their BF16 figures), the experts' products' measured time beyond what
// those fits give them, per byte, over the samples of each dtype that timed
// them (expertsStall); and InStepOptimizer, the step tails' measured time over
// their tables', pooled over every sample. The matmuls' fits read the dense
// products alone; a sample measured before the experts were timed
// (InStepSample.ExpertsMeasured) gives its dense products to them and
// nothing to the rest's fit, whose measured time holds its experts.
func (c *Calibration) FitInStep() {
	var fp32, bf16 []InStepSample
	for _, s := range c.InStepModels() {
		if s.BF16 {
			bf16 = append(bf16, s)
		} else {
			fp32 = append(fp32, s)
		}
	}
	fp32, bf16 = undisturbed(fp32), undisturbed(bf16)
	type key struct {
		model string
		bf16  bool
	}
	kept := map[key]bool{}
	for _, s := range append(slices.Clone(fp32), bf16...) {
		kept[key{s.Model, s.BF16}] = true
	}
	for i := range c.InStepSamples {
		s := &c.InStepSamples[i]
		s.Disturbed = !kept[key{s.Model, s.BF16}]
	}
	c.fitInStep(fp32)
	var om, ot float64
	for _, s := range append(slices.Clone(fp32), bf16...) {
		om, ot = om+s.OptMeasured, ot+s.OptTables
	}
	c.InStepOptimizer = 0
	if om > 0 && ot > 0 {
		c.InStepOptimizer = om / ot
	}
	c.InStepGEMMBF16, c.InStepGEMMPerByteBF16 = 0, 0
	if len(bf16) > 0 {
		var gm, gt float64
		for _, s := range bf16 {
			d := s.dense()
			gm, gt = gm+d.measured, gt+d.tables
		}
		if gm > 0 && gt > 0 {
			c.InStepGEMMBF16 = gm / gt
			if a, b, ok := fitGEMMTraffic(denseOf(bf16)); ok {
				c.InStepGEMMBF16, c.InStepGEMMPerByteBF16 = a, b
			}
		}
	}
	c.InStepExpertsStall, c.InStepExpertsStallSlope = c.expertsStall(fp32)
	c.InStepExpertsStallBF16, c.InStepExpertsStallSlopeBF16 = c.expertsStall(bf16)
}

// expertsStall fits the experts' stall per byte at 1,024 routed rows and its
// slope per doubling of them: each sample's experts' measured time less the
// matmuls' fit for them, per byte of their operands, by least squares on
// log2(routed rows/1024), weighted by the bytes. With the samples at one
// routed-row count, a slope below 0, or a line at or below 0 up to 2^20
// routed rows, the pooled figure alone; (0, 0) unless that is above 0.
func (c *Calibration) expertsStall(samples []InStepSample) (perByte, slope float64) {
	var sw, sx, sy, sxx, sxy float64
	for _, s := range samples {
		if s.ExpertsMeasured > 0 && s.ExpertsBytes > 0 && s.RoutedRows > 0 {
			a, b := c.inStepGEMM(s.BF16)
			w := s.ExpertsBytes
			y := (s.ExpertsMeasured - (a*s.ExpertsTables + b*s.ExpertsBytes)) / w
			x := math.Log2(s.RoutedRows / 1024)
			sw, sx, sy, sxx, sxy = sw+w, sx+w*x, sy+w*y, sxx+w*x*x, sxy+w*x*y
		}
	}
	if sw == 0 {
		return 0, 0
	}
	if det := sw*sxx - sx*sx; det > 1e-9*sw*sw {
		slope = (sw*sxy - sx*sy) / det
		perByte = (sy - slope*sx) / sw
		if slope >= 0 && perByte+slope*math.Log2(1<<20/1024.0) > 0 {
			return perByte, slope
		}
	}
	if sy > 0 {
		return sy / sw, 0
	}
	return 0, 0
}

// expertsStallOf is the experts' stall per byte with bf16 weights or fp32 at
// rows routed rows a layer (the fp32 figures for bf16 from a table without
// its own), at least 0.
func (c *Calibration) expertsStallOf(bf16 bool, rows float64) float64 {
	perByte, slope := c.InStepExpertsStall, c.InStepExpertsStallSlope
	if bf16 && (c.InStepExpertsStallBF16 != 0 || c.InStepExpertsStallSlopeBF16 != 0) {
		perByte, slope = c.InStepExpertsStallBF16, c.InStepExpertsStallSlopeBF16
	}
	if rows <= 0 {
		return 0
	}
	return max(0, perByte+slope*math.Log2(rows/1024))
}

// denseOf is the samples' dense matmuls.
func denseOf(samples []InStepSample) []gemmSample {
	out := make([]gemmSample, len(samples))
	for i, s := range samples {
		out[i] = s.dense()
	}
	return out
}

// inStepGEMM is the matmuls' in-step factor and seconds per operand byte, for
// bf16 weights where the table fitted them, else the fp32 ones (InStep when the
// matmuls have no factor of their own).
func (c *Calibration) inStepGEMM(bf16 bool) (factor, perByte float64) {
	if bf16 && c.InStepGEMMBF16 > 0 {
		return c.InStepGEMMBF16, c.InStepGEMMPerByteBF16
	}
	if c.InStepGEMM > 0 {
		return c.InStepGEMM, c.InStepGEMMPerByte
	}
	return c.InStep, c.InStepGEMMPerByte
}

// fitInStep is FitInStep over the fp32 samples.
func (c *Calibration) fitInStep(samples []InStepSample) {
	var gm, gt, am, at float64
	for _, s := range samples {
		d := s.dense()
		gm, gt = gm+d.measured, gt+d.tables
		am, at = am+s.AttnMeasured, at+s.AttnTables
	}
	c.InStepGEMM, c.InStepGEMMPerByte, c.InStepAttention = 0, 0, 0
	if gm > 0 && gt > 0 {
		c.InStepGEMM = gm / gt
		if a, b, ok := fitGEMMTraffic(denseOf(samples)); ok {
			c.InStepGEMM, c.InStepGEMMPerByte = a, b
		}
	}
	if am > 0 && at > 0 {
		c.InStepAttention = am / at
	}
	var stt, stc, scc, smt, smc float64
	var rest int
	for _, s := range samples {
		if s.expertsUntimed() && c.InStepGEMM > 0 {
			continue // the rest of its pass holds its experts' products
		}
		rest++
		tables, measured := s.Tables, s.Measured
		if c.InStepGEMM > 0 { // the rest of the pass
			tables, measured = tables-s.GEMMTables, measured-s.GEMMMeasured
		}
		if c.InStepAttention > 0 {
			tables, measured = tables-s.AttnTables, measured-s.AttnMeasured
		}
		stt += tables * tables
		stc += tables * s.Calls
		scc += s.Calls * s.Calls
		smt += measured * tables
		smc += measured * s.Calls
	}
	det := stt*scc - stc*stc
	if rest >= 2 && det > 0 {
		k := (smt*scc - smc*stc) / det
		l := (stt*smc - stc*smt) / det
		if k > 0 && l >= 0 {
			c.InStep, c.PerCall = k, l
			return
		}
	}
	if stt > 0 {
		c.InStep, c.PerCall = smt/stt, 0
	}
}

// HostSharePoint is the fitted efficiency of Ranks ranks sharing one host's cores
// (HostShare).
type HostSharePoint struct {
	Ranks      int     `json:"ranks"`
	Efficiency float64 `json:"efficiency"`
}

// HostShareSample is one calibration model trained for a few steps by Ranks
// in-process ranks, each a micro-batch of the model's batch: the median step
// time measured, and what the plan (with Efficiency 1) puts in compute (kernels
// and optimizer, less the experts' stall), in exposed communication and in the
// experts' stall for that run.
type HostShareSample struct {
	Model    string  `json:"model"`
	Ranks    int     `json:"ranks"`
	CP       int     `json:"cp,omitempty"` // the ranks split every sequence over a ring of CP (= Ranks); else the batch
	Measured float64 `json:"measured_s"`
	Compute  float64 `json:"planned_compute_s"`
	Comm     float64 `json:"planned_comm_s"`
	// Stall is the experts' stall the plan puts in the run (StepBreakdown.Stall),
	// which sharing the cores does not scale: left out of Compute, and taken
	// from the measured step beside Comm.
	Stall float64 `json:"planned_stall_s,omitempty"`
}

// FitHostShare sets HostShare from HostShareSamples. A sample's ratio is its
// measured step less the planned communication and experts' stall, over the planned compute; a
// model's ratio at a rank count is the median of its samples' there. A rank
// count's efficiency is the median over models of their ratio there over their
// ratio at 1 rank (so each model's own error at one rank cancels). A model
// without a 1-rank sample, or a non-positive ratio, is left out; a rank count no
// model measured gets no point. RingShare is fitted the same way from the
// samples with CP set, each model's ratio over a ring of cp ranks over its ratio
// at cp data-parallel ranks.
func (c *Calibration) FitHostShare() {
	type key struct {
		model     string
		ranks, cp int
	}
	ratios := map[key][]float64{}
	for _, s := range c.HostShareSamples {
		if s.Compute > 0 && s.Measured > s.Comm+s.Stall {
			k := key{s.Model, s.Ranks, max(s.CP, 1)}
			ratios[k] = append(ratios[k], (s.Measured-s.Comm-s.Stall)/s.Compute)
		}
	}
	share, ring := map[int][]float64{}, map[int][]float64{}
	for k, rs := range ratios {
		switch {
		case k.cp > 1:
			if dp, ok := ratios[key{k.model, k.ranks, 1}]; ok {
				ring[k.cp] = append(ring[k.cp], Median(rs)/Median(dp))
			}
		case k.ranks > 1:
			if alone, ok := ratios[key{k.model, 1, 1}]; ok {
				share[k.ranks] = append(share[k.ranks], Median(rs)/Median(alone))
			}
		}
	}
	c.HostShare, c.RingShare = points(share), points(ring)
}

// points are the medians of effs by rank count, in rank order.
func points(effs map[int][]float64) []HostSharePoint {
	var out []HostSharePoint
	for ranks, e := range effs {
		out = append(out, HostSharePoint{Ranks: ranks, Efficiency: Median(e)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ranks < out[j].Ranks })
	return out
}

// Median is the median of xs (the mean of the middle two for an even count),
// sorting xs in place; xs is not empty.
func Median(xs []float64) float64 {
	sort.Float64s(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// shareEfficiency is the efficiency of ranks ranks sharing a host (HostShare):
// 1 for one rank, interpolated linearly in the rank count between measured
// points (from 1 at one rank), the largest measured point's beyond it, and 1
// without points.
func (c *Calibration) shareEfficiency(ranks int) float64 { return interpolate(c.HostShare, ranks) }

// ringEfficiency is RingShare's factor on the compute of ranks in a
// context-parallel ring of cp, interpolated as shareEfficiency is.
func (c *Calibration) ringEfficiency(cp int) float64 { return interpolate(c.RingShare, cp) }

// interpolate is 1 at one rank, linear in the rank count between pts (from 1 at
// one rank), the largest point's beyond it, and 1 without points.
func interpolate(pts []HostSharePoint, ranks int) float64 {
	lo, elo := 1, 1.0
	for _, p := range pts {
		if p.Ranks <= lo {
			continue
		}
		if ranks <= p.Ranks {
			f := float64(ranks-lo) / float64(p.Ranks-lo)
			return elo + f*(p.Efficiency-elo)
		}
		lo, elo = p.Ranks, p.Efficiency
	}
	return elo
}

// fitGEMMTraffic fits measured ≈ a·tables + b·bytes to the samples' matmuls,
// each sample weighted by 1/measured² (so relative errors count alike for small
// and large models). ok is false with fewer than two samples, a sample without
// its bytes or matmul times, or a fit with a ≤ 0 or b < 0.
func fitGEMMTraffic(samples []gemmSample) (a, b float64, ok bool) {
	if len(samples) < 2 {
		return 0, 0, false
	}
	var stt, stb, sbb, syt, syb float64
	for _, s := range samples {
		if s.bytes <= 0 || s.measured <= 0 || s.tables <= 0 {
			return 0, 0, false
		}
		w := 1 / (s.measured * s.measured)
		t, x, y := s.tables, s.bytes, s.measured
		stt, stb, sbb, syt, syb = stt+w*t*t, stb+w*t*x, sbb+w*x*x, syt+w*y*t, syb+w*y*x
	}
	det := stt*sbb - stb*stb
	if det <= 0 {
		return 0, 0, false
	}
	a, b = (syt*sbb-syb*stb)/det, (stt*syb-stb*syt)/det
	return a, b, a > 0 && b >= 0
}

// GEMMPoint is one measured matmul shape: seconds per call, forward and backward
// (the backward computes both the input and the weight gradient).
type GEMMPoint struct {
	M, K, N  int
	Fwd, Bwd float64
}

// AttentionPoint is causal attention over one (batch, head) pair of length T and
// head size HD: seconds per (batch, head), forward and backward. Flash marks the
// flash kernel (the plan reads only its points); Full marks it without the causal mask (T queries over T keys that all precede
// them: the off-diagonal blocks of context parallelism's ring); tables measured
// before 2026-11-24 lack it, and a full block is then timed as two causal ones.
type AttentionPoint struct {
	Flash    bool
	Full     bool `json:",omitempty"`
	T, HD    int
	Fwd, Bwd float64
}

// Linear is a fitted cost: Fixed seconds per call plus PerUnit seconds per element
// (or byte).
type Linear struct {
	Fixed   float64 `json:"fixed_s"`
	PerUnit float64 `json:"per_unit_s"`
}

// Time is the cost of one call over n units.
func (l Linear) Time(n float64) float64 { return l.Fixed + l.PerUnit*n }

// Stream kernel kinds, each counted in the elements its doc names.
const (
	StreamRMSNorm        = "rmsnorm"          // rows × width
	StreamRMSNormBwd     = "rmsnorm_bwd"      // rows × width
	StreamRope           = "rope"             // rows × heads × head size
	StreamRopeBwd        = "rope_bwd"         // rows × heads × head size
	StreamSwiGLU         = "swiglu"           // rows × ffn
	StreamSwiGLUBwd      = "swiglu_bwd"       // rows × ffn
	StreamEmbedding      = "embedding"        // rows × width
	StreamEmbeddingBwd   = "embedding_bwd"    // rows × width
	StreamCrossEntropy   = "crossentropy"     // rows × vocabulary
	StreamCrossEntropyBw = "crossentropy_bwd" // rows × vocabulary
	StreamAdamW          = "adamw"            // parameters
	StreamSumSquares     = "sumsquares"       // elements
	StreamAdd            = "add"              // elements (gradient accumulation, residuals)
	StreamCopy           = "copy"             // elements (gathers and scatters of token rows)
	StreamRouter         = "router"           // rows × experts
	StreamRouterBwd      = "router_bwd"       // rows × experts
	StreamDispatch       = "dispatch"         // routed copies × width
	StreamDispatchBwd    = "dispatch_bwd"     // routed copies × width
	StreamCombine        = "combine"          // routed copies × width
	StreamCombineBwd     = "combine_bwd"      // routed copies × width
	StreamAttnMerge      = "attention_merge"  // rows × heads × head size (a ring block's output)
	StreamToBF16         = "to_bf16"          // elements (a layer's saved activations into bf16 stores)
	StreamFromBF16       = "from_bf16"        // elements (the stores back into the work set)
	StreamAmax           = "amax"             // elements (an FP8 operand's largest magnitude)
	StreamQuantize       = "quantize"         // elements (an FP8 operand's codes from its values)
)

// StreamKinds lists the kinds a calibration must measure.
var StreamKinds = []string{StreamRMSNorm, StreamRMSNormBwd, StreamRope, StreamRopeBwd, StreamSwiGLU, StreamSwiGLUBwd,
	StreamEmbedding, StreamEmbeddingBwd, StreamCrossEntropy, StreamCrossEntropyBw, StreamAdamW, StreamSumSquares, StreamAdd, StreamCopy,
	StreamRouter, StreamRouterBwd}

// LaterStreamKinds are kinds calibrate measures that tables written before them
// lack: the MoE permutation kernels and the bf16 conversions of saved
// activations, timed as plain copies (StreamCopy) from such a table, the
// ring's merge of a block's attention into the running output, timed as an
// addition (StreamAdd), and FP8's amax and quantisation (2026-11-28), timed
// as a square sum (a reduction over the tensor) and as a conversion to bf16
// stores (a pass writing a narrower copy).
var LaterStreamKinds = []string{StreamDispatch, StreamDispatchBwd, StreamCombine, StreamCombineBwd, StreamAttnMerge, StreamToBF16, StreamFromBF16,
	StreamAmax, StreamQuantize}

// CollectiveKey names a calibrated collective: its kind and group size.
func CollectiveKey(kind string, size int) string { return fmt.Sprintf("%s/%d", kind, size) }

// ParseCalibration reads a calibration file and checks it is complete.
func ParseCalibration(b []byte) (*Calibration, error) {
	var c Calibration
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("not a calibration file: %w", err)
	}
	switch {
	case c.Profile == "" || c.Date == "" || c.Source == "":
		return nil, fmt.Errorf("a calibration names its profile, date and source")
	case len(c.GEMM) == 0 || !slices.ContainsFunc(c.Attention, func(p AttentionPoint) bool { return p.Flash && !p.Full }):
		return nil, fmt.Errorf("a calibration has GEMM and (causal, flash) attention measurements")
	}
	for _, k := range StreamKinds {
		if _, ok := c.Stream[k]; !ok {
			return nil, fmt.Errorf("a calibration measures every stream kernel: %s is missing", k)
		}
	}
	for _, p := range append(slices.Clone(c.GEMM), c.GEMMBF16...) {
		if !shape(p.M) || !shape(p.K) || !shape(p.N) || !measured(p.Fwd) || !measured(p.Bwd) {
			return nil, fmt.Errorf("GEMM point %+v: %s", p, plausible)
		}
	}
	if len(c.GEMMBF16) > 0 && len(c.GEMMBF16) != len(c.GEMM) {
		return nil, fmt.Errorf("gemm_bf16 has %d points and gemm %d: a calibration measures both over one grid", len(c.GEMMBF16), len(c.GEMM))
	}
	for _, p := range c.GEMMFP8 {
		if !shape(p.M) || !shape(p.K) || !shape(p.N) || !measured(p.Fwd) || !measured(p.Bwd) {
			return nil, fmt.Errorf("gemm_fp8 point %+v: %s", p, plausible)
		}
		if !slices.ContainsFunc(c.GEMM, func(q GEMMPoint) bool { return q.M == p.M && q.K == p.K && q.N == p.N }) {
			return nil, fmt.Errorf("gemm_fp8 point %+v: not a shape of the gemm grid; a calibration times its FP8 products at some of the fp32 grid's shapes", p)
		}
	}
	for _, p := range c.Attention {
		if !shape(p.T) || !shape(p.HD) || !measured(p.Fwd) || !measured(p.Bwd) {
			return nil, fmt.Errorf("attention point %+v: %s", p, plausible)
		}
	}
	// The fitted figures scale or add to times: a negative one (a hand-edited
	// file) would plan negative steps, a huge one infinite steps. 0 means not
	// fitted.
	for name, v := range map[string]float64{"in_step_factor": c.InStep, "per_call_s": c.PerCall, "in_step_gemm_factor": c.InStepGEMM,
		"in_step_gemm_s_per_byte": c.InStepGEMMPerByte, "in_step_attention_factor": c.InStepAttention,
		"in_step_gemm_bf16_factor": c.InStepGEMMBF16, "in_step_gemm_bf16_s_per_byte": c.InStepGEMMPerByteBF16,
		"in_step_experts_stall_slope": c.InStepExpertsStallSlope, "in_step_experts_bf16_stall_slope": c.InStepExpertsStallSlopeBF16,
		"drift": c.Drift} {
		if !(v >= 0 && v <= maxFigure) {
			return nil, fmt.Errorf("%s is %v: fitted figures lie in [0, %g]", name, v, maxFigure)
		}
	}
	// The experts' stall at 1,024 routed rows may lie below 0 where its slope
	// lifts it above 0 at more rows (expertsStallOf clamps it).
	for name, v := range map[string]float64{"in_step_experts_stall_s_per_byte": c.InStepExpertsStall, "in_step_experts_bf16_stall_s_per_byte": c.InStepExpertsStallBF16} {
		if !(v >= -maxFigure && v <= maxFigure) {
			return nil, fmt.Errorf("%s is %v: it lies in [-%g, %g]", name, v, maxFigure, maxFigure)
		}
	}
	for name, pts := range map[string][]HostSharePoint{"host_share": c.HostShare, "ring_share": c.RingShare} {
		for _, p := range pts {
			if p.Ranks < 2 || p.Ranks > 1<<20 || !(p.Efficiency > 0 && p.Efficiency <= maxFigure) {
				return nil, fmt.Errorf("%s point %+v: a rank count from 2 to 2^20 and an efficiency in (0, %g]", name, p, maxFigure)
			}
		}
	}
	for _, costs := range []map[string]Linear{c.Stream, c.Collectives} {
		for k, l := range costs {
			if !(l.Fixed >= 0 && l.Fixed <= maxFigure) || !(l.PerUnit >= 0 && l.PerUnit <= maxFigure) {
				return nil, fmt.Errorf("cost %s %+v: seconds per call and per unit lie in [0, %g]", k, l, maxFigure)
			}
		}
	}
	c.Index()
	// The lookups interpolate between neighbours on every axis, so a grid must
	// hold each combination of its axes' values once: a point missing (or one
	// moved off the grid) would time some shape as NaN.
	for i, name := range []string{"gemm", "gemm_bf16", "gemm_fp8"} {
		if g := c.idx.gemm[i]; g.points > 0 {
			if err := wholeGrid(name, g.points, len(g.at), len(g.ms), len(g.ks), len(g.ns)); err != nil {
				return nil, err
			}
		}
	}
	for i, name := range []string{"causal flash attention", "unmasked flash attention"} {
		if a := c.idx.attn[i]; a.points > 0 {
			if err := wholeGrid(name, a.points, len(a.at), len(a.ts), len(a.hs)); err != nil {
				return nil, err
			}
		}
	}
	return &c, nil
}

// wholeGrid checks that points measurements, distinct of them, cover every
// combination of the axes' values (axes: each axis's count of distinct values)
// once.
func wholeGrid(name string, points, distinct int, axes ...int) error {
	want := 1
	for _, a := range axes {
		want = min(want*a, 1<<40) // each axis has at most points values: no overflow
	}
	if points == distinct && distinct == want {
		return nil
	}
	return fmt.Errorf("the %s grid has %d points, %d of them distinct, over axes of %v values: a calibration measures every combination of its axes' values once (%d points)", name, points, distinct, axes, want)
}

// What ParseCalibration takes as plausible: a measured kernel call between a
// picosecond and maxFigure seconds, at a shape of 1 to 2^24 in each dimension;
// fitted factors, costs and efficiencies up to maxFigure. Beyond these a
// hand-edited or corrupt table would plan zero or infinite steps.
const (
	maxFigure = 1e3
	plausible = "shapes lie in [1, 2^24] and times in [1e-12, 1000] seconds"
)

func measured(s float64) bool { return s >= 1e-12 && s <= maxFigure }
func shape(n int) bool        { return n >= 1 && n <= 1<<24 }

// gemmTime predicts Matmul (bwd false) or MatmulBackward at (m, k, n) with fp32
// weights: the measured throughput (FLOP/s) interpolated between the grid's
// neighbours in log2 of each dimension, clamped at the grid's edges, times this
// call's FLOPs.
func (c *Calibration) gemmTime(m, k, n int, bwd bool) float64 {
	return c.gemmTimeOf(false, m, k, n, bwd)
}

// gemmTimeOf is gemmTime with bf16 weights when bf16 is set, from GEMMBF16, or
// from GEMM for a table without it.
func (c *Calibration) gemmTimeOf(bf16 bool, m, k, n int, bwd bool) float64 {
	if m <= 0 || k <= 0 || n <= 0 {
		return 0
	}
	x := c.index().gemm[0]
	if bf16 && len(c.index().gemm[1].ms) > 0 {
		x = c.index().gemm[1]
	}
	rate := func(p GEMMPoint) float64 {
		f := 2 * float64(p.M) * float64(p.K) * float64(p.N)
		if bwd {
			return 2 * f / p.Bwd
		}
		return f / p.Fwd
	}
	logRate, ok := x.interpolate(m, k, n, func(sh [3]int, p GEMMPoint) (float64, bool) { return math.Log(rate(p)), true })
	if !ok {
		return math.NaN() // an incomplete grid: ParseCalibration's callers measured it whole
	}
	flops := 2 * float64(m) * float64(k) * float64(n)
	if bwd {
		flops *= 2
	}
	return flops / math.Exp(logRate)
}

// interpolate is the weighted sum, over the (up to eight) grid points that
// bracket (m, k, n) in log2 of each dimension (clamped at the grid's edges),
// of f at each point: the trilinear interpolation of f in log2 of the
// shape. ok is false where a bracketing point is not in the grid or f has no
// value there.
func (x gemmIndex) interpolate(m, k, n int, f func(shape [3]int, p GEMMPoint) (float64, bool)) (sum float64, ok bool) {
	mi, mf := bracket(x.ms, m)
	ki, kf := bracket(x.ks, k)
	ni, nf := bracket(x.ns, n)
	for dm := 0; dm < 2; dm++ {
		for dk := 0; dk < 2; dk++ {
			for dn := 0; dn < 2; dn++ {
				w := weight(mf, dm) * weight(kf, dk) * weight(nf, dn)
				if w == 0 {
					continue
				}
				sh := [3]int{x.ms[min(mi+dm, len(x.ms)-1)], x.ks[min(ki+dk, len(x.ks)-1)], x.ns[min(ni+dn, len(x.ns)-1)]}
				p, ok := x.at[sh]
				if !ok {
					return 0, false
				}
				v, ok := f(sh, p)
				if !ok {
					return 0, false
				}
				sum += w * v
			}
		}
	}
	return sum, true
}

// fp8GEMMTime predicts an FP8 layer's product (Matmul, or MatmulBackward
// with bwd) at (m, k, n): the fp32 product's time at that shape times the
// FP8 products' time over the fp32 ones' at GEMMFP8's shapes, interpolated
// in log2 of each dimension (clamped at that grid's edges); from a table
// without GEMMFP8, the fp32 product plus a pass widening the codes the
// product reads whole (forward the input's m·k, backward the output
// gradient's m·n; the other operand is widened as it is packed, inside the
// product), at from_bf16's cost per element.
func (c *Calibration) fp8GEMMTime(m, k, n int, bwd bool) float64 {
	t := c.gemmTime(m, k, n, bwd)
	if m <= 0 || k <= 0 || n <= 0 {
		return 0
	}
	x := c.index().gemm[2]
	if len(x.ms) == 0 {
		if bwd {
			return t + c.stream(StreamFromBF16, float64(m*n))
		}
		return t + c.stream(StreamFromBF16, float64(m*k))
	}
	logRatio, ok := x.interpolate(m, k, n, func(sh [3]int, p GEMMPoint) (float64, bool) {
		q, ok := c.index().gemm[0].at[sh]
		if !ok {
			return 0, false
		}
		if bwd {
			return math.Log(p.Bwd / q.Bwd), true
		}
		return math.Log(p.Fwd / q.Fwd), true
	})
	if !ok {
		return math.NaN() // an incomplete grid: ParseCalibration refuses it
	}
	return t * math.Exp(logRatio)
}

// FP8Timed says whether the table times FP8 products itself (GEMMFP8) and
// FP8's amax and quantisation; a table without them times FP8 layers from
// its fp32 products and other kernels (fp8GEMMTime, stream).
func (c *Calibration) FP8Timed() bool {
	_, amax := c.Stream[StreamAmax]
	_, quant := c.Stream[StreamQuantize]
	return len(c.GEMMFP8) > 0 && amax && quant
}

// attentionTime predicts causal flash attention over bh (batch, head) pairs of
// length t and head size hd: seconds per pair interpolated in log2 of t and hd
// (per-pair time scaled by the measured rate, which holds T²·HD work), clamped at
// the grid.
func (c *Calibration) attentionTime(bh, t, hd int, bwd bool) float64 {
	return c.attentionKindTime(0, bh, t, hd, bwd)
}

// attentionFullTime is attentionTime for the flash kernel without the causal
// mask (t queries over t keys that all precede them), from its own table, or as
// two causal blocks from a table without one.
func (c *Calibration) attentionFullTime(bh, t, hd int, bwd bool) float64 {
	if len(c.index().attn[1].ts) == 0 {
		return 2 * c.attentionTime(bh, t, hd, bwd)
	}
	return c.attentionKindTime(1, bh, t, hd, bwd)
}

// attentionKindTime is attentionTime over the table of kind (calIndex.attn).
func (c *Calibration) attentionKindTime(kind, bh, t, hd int, bwd bool) float64 {
	x := c.index().attn[kind]
	if len(x.ts) == 0 || bh <= 0 || t <= 0 {
		return 0
	}
	rate := func(p AttentionPoint) float64 {
		s := p.Fwd
		if bwd {
			s = p.Bwd
		}
		return float64(p.T) * float64(p.T) * float64(p.HD) / s
	}
	ts, hs, at := x.ts, x.hs, x.at
	ti, tf := bracket(ts, t)
	hi, hf := bracket(hs, hd)
	var logRate float64
	for dt := 0; dt < 2; dt++ {
		for dh := 0; dh < 2; dh++ {
			w := weight(tf, dt) * weight(hf, dh)
			if w == 0 {
				continue
			}
			p, ok := at[[2]int{ts[min(ti+dt, len(ts)-1)], hs[min(hi+dh, len(hs)-1)]}]
			if !ok {
				return math.NaN()
			}
			logRate += w * math.Log(rate(p))
		}
	}
	return float64(bh) * float64(t) * float64(t) * float64(hd) / math.Exp(logRate)
}

// collective is the calibrated cost of a collective kind in a group of size
// ranks: the size measured, else the nearest larger one measured, else the
// largest (false when the kind was not measured at all).
func (c *Calibration) collective(kind string, size int) (Linear, bool) {
	best, bestSize := Linear{}, 0
	for s := 2; s <= 1<<20; s *= 2 {
		l, ok := c.Collectives[CollectiveKey(kind, s)]
		if !ok {
			continue
		}
		best, bestSize = l, s
		if s >= size {
			break
		}
	}
	if l, ok := c.Collectives[CollectiveKey(kind, size)]; ok {
		return l, true
	}
	if bestSize == 0 && kind == SendRecv {
		// A table from before send/recv was measured: a ring step moves, per rank,
		// what a two-rank all-gather does (one block out, one in).
		return c.collective(AllGather, 2)
	}
	return best, bestSize > 0
}

// stream is a memory-bound kernel's time over n elements.
func (c *Calibration) stream(kind string, n float64) float64 {
	if n <= 0 {
		return 0
	}
	l, ok := c.Stream[kind]
	if !ok && slices.Contains(LaterStreamKinds, kind) {
		l = c.Stream[StreamCopy] // a table from before the kind was measured
		switch kind {
		case StreamAttnMerge:
			l = c.Stream[StreamAdd]
		case StreamAmax:
			l = c.Stream[StreamSumSquares]
		case StreamQuantize:
			l = c.stream1(StreamToBF16)
		}
	}
	return l.Time(n)
}

// stream1 is kind's cost, or a copy's from a table without it.
func (c *Calibration) stream1(kind string) Linear {
	if l, ok := c.Stream[kind]; ok {
		return l
	}
	return c.Stream[StreamCopy]
}

// axis is the sorted distinct values of one coordinate.
func axis[P any](ps []P, f func(P) int) []int {
	seen := map[int]bool{}
	var out []int
	for _, p := range ps {
		if v := f(p); !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	sort.Ints(out)
	return out
}

// bracket finds v between grid[i] and grid[i+1], and the fraction of the way (in
// log2) from the first to the second; outside the grid it clamps (fraction 0 at
// the nearest end).
func bracket(grid []int, v int) (int, float64) {
	if v <= grid[0] {
		return 0, 0
	}
	last := len(grid) - 1
	if v >= grid[last] {
		return last, 0
	}
	i := sort.SearchInts(grid, v) - 1
	lo, hi := math.Log2(float64(grid[i])), math.Log2(float64(grid[i+1]))
	return i, (math.Log2(float64(v)) - lo) / (hi - lo)
}

// weight is the linear-interpolation weight of the lower (d = 0) or upper (d = 1)
// neighbour at fraction f.
func weight(f float64, d int) float64 {
	if d == 0 {
		return 1 - f
	}
	return f
}
