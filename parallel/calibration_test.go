package parallel

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestShippedCalibration: the CPU table shardline ships says where, when and by
// what it was measured, and is complete.
func TestShippedCalibration(t *testing.T) {
	c := Calibrations(nil).For("cpu")
	require.NotNil(t, c)
	assert.NotEmpty(t, c.Host)
	assert.NotEmpty(t, c.Date)
	assert.True(t, strings.HasPrefix(c.Source, "shardline calibrate"), c.Source)
	assert.Greater(t, c.InStep, 0.0)
	assert.Contains(t, []int{5, 10, 14}, len(c.InStepModels()), "five models (seven since 2026-11-28), in fp32 (and in bf16 since 2026-11-24)")
	assert.Nil(t, Calibrations(nil).For("h100-80gb"), "GPU profiles are timed from their peak until measured")

	// An incomplete file is refused, naming what is missing.
	err := parseEdited(t, func(raw map[string]any) { delete(raw["stream"].(map[string]any), StreamAdamW) })
	require.ErrorContains(t, err, "adamw is missing")
	_, err = ParseCalibration([]byte("{"))
	require.ErrorContains(t, err, "not a calibration file")
	// Fitted figures and costs below 0 (a hand-edited file) are refused by name.
	for key, val := range map[string]any{"in_step_gemm_s_per_byte": -1e-11, "per_call_s": -1.0, "in_step_factor": -0.5} {
		err = parseEdited(t, func(raw map[string]any) { raw[key] = val })
		require.ErrorContains(t, err, key+" is ", key)
	}
	err = parseEdited(t, func(raw map[string]any) {
		raw["stream"].(map[string]any)[StreamAdamW] = map[string]any{"fixed_s": 1e-6, "per_unit_s": -1e-9}
	})
	require.ErrorContains(t, err, "cost adamw")
	// Implausibly large figures would plan infinite steps (a GEMM point of 1e308
	// seconds did), and zero or denormal times infinite throughputs: refused.
	for name, edit := range map[string]func(raw map[string]any){
		"huge gemm time": func(raw map[string]any) { raw["gemm"].([]any)[0].(map[string]any)["Fwd"] = 1e308 },
		"zero attention": func(raw map[string]any) { raw["attention"].([]any)[0].(map[string]any)["Bwd"] = 0 },
		"denormal time":  func(raw map[string]any) { raw["gemm"].([]any)[0].(map[string]any)["Bwd"] = 5e-324 },
		"huge shape":     func(raw map[string]any) { raw["gemm"].([]any)[0].(map[string]any)["M"] = 1 << 40 },
		"huge factor":    func(raw map[string]any) { raw["in_step_factor"] = 1e9 },
		"huge cost": func(raw map[string]any) {
			raw["stream"].(map[string]any)[StreamAdamW] = map[string]any{"fixed_s": 1e300}
		},
		"huge share": func(raw map[string]any) { raw["host_share"] = []any{map[string]any{"ranks": 2, "efficiency": 1e300}} },
	} {
		require.Error(t, parseEdited(t, edit), name)
	}

	// Every shipped table parses and names its machine; one measured on this
	// machine's kind of CPU stands in for the default.
	names, err := fs.Glob(shipped, "calibration/*.json")
	require.NoError(t, err)
	require.Greater(t, len(names), 1)
	for _, name := range names {
		b, err := shipped.ReadFile(name)
		require.NoError(t, err)
		other, err := ParseCalibration(b)
		require.NoError(t, err, name)
		require.NotEmpty(t, other.Host, name)
		assert.Equal(t, other.Host, ShippedCalibrations(other.Host).For("cpu").Host, name)
	}
	assert.Equal(t, c.Host, ShippedCalibrations("a machine nobody measured").For("cpu").Host, "the default stands")
}

// TestCalibrationInterpolation: at a measured shape the model gives the
// measurement back (to 1e-9 relative: exp(log(x)) rounding); between two measured
// row counts the throughput lies between theirs; outside the grid it is the edge's.
func TestCalibrationInterpolation(t *testing.T) {
	c := Calibrations(nil).For("cpu")
	for _, p := range c.GEMM[:20] {
		assert.InEpsilon(t, p.Fwd, c.gemmTime(p.M, p.K, p.N, false), 1e-9)
		assert.InEpsilon(t, p.Bwd, c.gemmTime(p.M, p.K, p.N, true), 1e-9)
	}
	rate := func(m int) float64 { return 2 * float64(m) * 256 * 256 / c.gemmTime(m, 256, 256, false) }
	lo, hi := rate(1024), rate(4096)
	mid := rate(2048)
	assert.GreaterOrEqual(t, mid, math.Min(lo, hi))
	assert.LessOrEqual(t, mid, math.Max(lo, hi))
	assert.InEpsilon(t, rate(8192), rate(1<<20), 1e-9, "clamped at the largest row count")
	checked := 0
	for _, p := range c.Attention {
		if p.Flash && !p.Full && checked < 4 { // the plan reads only the flash kernel's points
			assert.InEpsilon(t, p.Fwd*3, c.attentionTime(3, p.T, p.HD, false), 1e-9)
			checked++
		}
	}
	require.Equal(t, 4, checked)
	// Flash without the causal mask (the ring's off-diagonal blocks): from its own
	// table where the calibration has one, else two causal blocks.
	var full *AttentionPoint
	for i := range c.Attention {
		if c.Attention[i].Full {
			full = &c.Attention[i]
		}
	}
	if full == nil {
		assert.InEpsilon(t, 2*c.attentionTime(3, 64, 32, true), c.attentionFullTime(3, 64, 32, true), 1e-12)
		with := *c
		with.Attention = append(slices.Clone(c.Attention), AttentionPoint{Flash: true, Full: true, T: 64, HD: 32, Fwd: 1e-5, Bwd: 3e-5})
		with.Index()
		full = &with.Attention[len(with.Attention)-1]
		c = &with
	}
	assert.InEpsilon(t, 5*full.Bwd, c.attentionFullTime(5, full.T, full.HD, true), 1e-9)
	assert.InEpsilon(t, 5*full.Fwd, c.attentionFullTime(5, full.T, full.HD, false), 1e-9)
}

// TestCalibratedStep: on the CPU the plan times a step operation by operation
// from the calibration; ranks on one host share its cores; a recipe that describes
// another device, or a GPU, is timed from the peak.
func TestCalibratedStep(t *testing.T) {
	one := compile(t, &load(t, "../recipes/tiny.toml").Recipe)
	c := Calibrations(nil).For("cpu")
	require.True(t, strings.HasPrefix(one.TimeModel, "per operation, calibrated on "+c.Host), one.TimeModel)
	res := load(t, "../recipes/tiny.toml")
	mt := MicroCompute(res.Recipe.Model, res.Recipe.Train.MicroBatchSize, "none", false, c)
	tables, gemm, attn, calls, gemmBytes := mt.Tables(), mt.GEMM, mt.Attention, mt.Calls, mt.GEMMBytes
	require.Zero(t, mt.Experts, "a dense model")
	gf, af := c.InStep, c.InStep
	if c.InStepGEMM > 0 {
		gf = c.InStepGEMM
	}
	if c.InStepAttention > 0 {
		af = c.InStepAttention
	}
	want := gf*gemm + c.InStepGEMMPerByte*gemmBytes + af*attn + c.InStep*(tables-gemm-attn) + c.PerCall*calls
	tail := c.stream(StreamSumSquares, float64(one.Memory.Grads)/4)
	require.Greater(t, c.InStepOptimizer, 1.0, "the shipped table's step tail runs slower inside a step than warm")
	assert.InEpsilon(t, want, one.ComputeS-c.InStepOptimizer*tail, 1e-9,
		"compute is the micro-batch's matmuls × their in-step factor plus their operands' traffic, attention × its factor, the other kernels × theirs, their launches, and the gradient norm × the step tail's factor")
	var owned float64
	for i := range one.Groups {
		owned += float64(one.Groups[i].ShardNumel())
	}
	assert.InEpsilon(t, c.InStepOptimizer*c.stream(StreamAdamW, owned), one.OptimizerS, 1e-9, "AdamW × the step tail's factor")
	// The tiny recipe's matmuls: per layer q, k, v, o (128×128) and the MLP
	// (128×384 twice, 384×128) on 16·128 rows, and the head (128×256); each
	// product's operands counted once forward and twice backward.
	BT := 16 * 128.0
	op := func(k, n float64) float64 { return 3 * 4 * (BT*k + k*n + BT*n) }
	assert.InEpsilon(t, 4*(4*op(128, 128)+2*op(128, 384)+op(384, 128))+op(128, 256), gemmBytes, 1e-12)
	assert.InEpsilon(t, one.ComputeS+one.OptimizerS+one.ExposedCommS, one.StepTimeS, 1e-12)

	four := compile(t, &load(t, "../recipes/tiny.toml", "parallel.world_size=4", "train.global_batch_size=64").Recipe)
	// Four ranks with a micro-batch each share one host's cores: four times the
	// kernels at the table's efficiency for four ranks, but for the gradient
	// norm, which each rank then runs over a quarter of the gradients: the two
	// differ by less than the four ranks' whole-model norms.
	eff := c.shareEfficiency(4)
	assert.InDelta(t, 4*eff*one.ComputeS, four.ComputeS, 4*eff*c.InStepOptimizer*tail)
	assert.Less(t, four.ComputeS, 4*eff*one.ComputeS, "each rank's norm runs over less than the whole model's gradients")
	// With a measured efficiency, the ranks' compute scales by it.
	shared := *c
	shared.HostShare = []HostSharePoint{{Ranks: 2, Efficiency: 1.1}, {Ranks: 4, Efficiency: 0.8}}
	fourRecipe := load(t, "../recipes/tiny.toml", "parallel.world_size=4", "train.global_batch_size=64").Recipe
	topo, err := TopologyOf(fourRecipe.Parallel, Calibrations(nil).With(&shared))
	require.NoError(t, err)
	fourShared, err := Compile(&fourRecipe, topo)
	require.NoError(t, err)
	assert.InEpsilon(t, 0.8/c.shareEfficiency(4)*(four.ComputeS+four.OptimizerS), fourShared.ComputeS+fourShared.OptimizerS, 1e-9)
	assert.InEpsilon(t, four.ExposedCommS, fourShared.ExposedCommS, 1e-12, "communication is not shared compute")
	assert.Greater(t, four.ExposedCommS, 0.0)

	other := compile(t, &load(t, "../recipes/tiny.toml", "parallel.device_peak_tflops=1").Recipe)
	assert.True(t, strings.HasPrefix(other.TimeModel, "FLOPs at"), other.TimeModel)
	gpu := compile(t, &load(t, "../recipes/tiny.toml", "parallel.device=cuda").Recipe)
	assert.True(t, strings.HasPrefix(gpu.TimeModel, "per operation on h100-80gb"), gpu.TimeModel)
}

// TestFitInStepSplitsTheMatmuls: with the matmuls and attention timed inside the
// passes, each one's factor is its measured time over the tables' (pooled), and
// the in-step factor and per-call cost are fitted to the rest: samples built from
// known factors give them back.
func TestFitInStepSplitsTheMatmuls(t *testing.T) {
	const gemmF, attnF, restF, perCall = 1.5, 1.3, 1.1, 2e-5
	c := &Calibration{}
	for i, s := range []struct{ gemm, attn, rest, calls float64 }{{0.02, 0.004, 0.01, 50}, {0.1, 0.01, 0.03, 60}, {0.005, 0.003, 0.004, 200}, {0.05, 0.02, 0.05, 100}} {
		c.InStepSamples = append(c.InStepSamples, InStepSample{Model: fmt.Sprint(i), Tables: s.gemm + s.attn + s.rest, GEMMTables: s.gemm, AttnTables: s.attn,
			Calls: s.calls, GEMMMeasured: gemmF * s.gemm, AttnMeasured: attnF * s.attn, Measured: gemmF*s.gemm + attnF*s.attn + restF*s.rest + perCall*s.calls})
	}
	c.FitInStep()
	assert.InDelta(t, gemmF, c.InStepGEMM, 1e-9)
	assert.InDelta(t, attnF, c.InStepAttention, 1e-9)
	assert.InDelta(t, restF, c.InStep, 1e-9)
	assert.InDelta(t, perCall, c.PerCall, 1e-12)
	assert.Zero(t, c.InStepGEMMPerByte, "no operand bytes in the samples: the pooled factor alone")
}

// TestFitInStepLeavesOutDisturbed: a model's pass that other work slowed (all
// its figures 3.5 times as long, as one of the AMD table's five passes was on
// 2026-11-27) is marked Disturbed and left out of the fit, which then gives
// back the factors the other passes were made from; one slowed or sped beyond
// disturbedLimit the other way alike; within it a pass is kept. With three
// rounds of every model (calibrate's interleaved rounds), each model's
// median round stands for it: one round of each model disturbed leaves the
// fit exact, and no pass is marked.
func TestFitInStepLeavesOutDisturbed(t *testing.T) {
	const gemmF, attnF, restF, perCall, optF = 1.2, 1.3, 1.1, 2e-5, 1.5
	shapes := []struct{ gemm, attn, rest, calls, opt float64 }{{0.02, 0.004, 0.01, 50, 4e-4}, {0.1, 0.01, 0.03, 60, 1e-3},
		{0.005, 0.003, 0.004, 200, 2e-4}, {0.05, 0.02, 0.05, 100, 8e-4}, {0.01, 0.002, 0.006, 80, 3e-4}}
	sample := func(i int, slow float64) InStepSample {
		s := shapes[i]
		return InStepSample{Model: fmt.Sprint(i), Tables: s.gemm + s.attn + s.rest, GEMMTables: s.gemm, AttnTables: s.attn, Calls: s.calls,
			GEMMMeasured: slow * gemmF * s.gemm, AttnMeasured: slow * attnF * s.attn, Measured: slow * (gemmF*s.gemm + attnF*s.attn + restF*s.rest + perCall*s.calls),
			OptTables: s.opt, OptMeasured: slow * optF * s.opt}
	}
	exact := func(c *Calibration) {
		t.Helper()
		assert.InDelta(t, gemmF, c.InStepGEMM, 1e-9)
		assert.InDelta(t, attnF, c.InStepAttention, 1e-9)
		assert.InDelta(t, restF, c.InStep, 1e-9)
		assert.InDelta(t, perCall, c.PerCall, 1e-12)
		assert.InDelta(t, optF, c.InStepOptimizer, 1e-9)
	}
	for _, slow := range []float64{3.5, 0.5} {
		c := &Calibration{}
		for i := range shapes {
			c.InStepSamples = append(c.InStepSamples, sample(i, map[bool]float64{true: slow, false: 1}[i == 1]))
		}
		c.FitInStep()
		exact(c)
		for i, smp := range c.InStepSamples {
			assert.Equal(t, i == 1, smp.Disturbed, "pass %d, slowed %v", i, slow)
		}
	}
	// 1.4 times as long: within disturbedLimit of the median, kept (the fit
	// then carries it).
	c := &Calibration{}
	for i := range shapes {
		c.InStepSamples = append(c.InStepSamples, sample(i, map[bool]float64{true: 1.4, false: 1}[i == 1]))
	}
	c.FitInStep()
	for _, smp := range c.InStepSamples {
		assert.False(t, smp.Disturbed)
	}
	assert.Greater(t, c.InStepGEMM, gemmF)

	// Three rounds, interleaved; in each model's, one round 3 times as long.
	c = &Calibration{}
	for round := 0; round < 3; round++ {
		for i := range shapes {
			c.InStepSamples = append(c.InStepSamples, sample(i, map[bool]float64{true: 3, false: 1}[round == i%3]))
		}
	}
	c.FitInStep()
	exact(c)
	models := c.InStepModels()
	require.Len(t, models, len(shapes), "a model's rounds made one")
	for i, smp := range models {
		assert.Equal(t, fmt.Sprint(i), smp.Model, "in the models' order")
		assert.InDelta(t, sample(i, 1).Measured, smp.Measured, 1e-15, "the median round")
		assert.InDelta(t, sample(i, 1).OptMeasured, smp.OptMeasured, 1e-15, "the median tail")
	}
	for _, smp := range c.InStepSamples {
		assert.False(t, smp.Disturbed, "a model's median round is undisturbed")
	}
	// Two passes of a dtype cannot tell which is disturbed: both kept.
	c = &Calibration{InStepSamples: []InStepSample{sample(0, 1), sample(1, 3.5)}}
	c.FitInStep()
	assert.False(t, c.InStepSamples[1].Disturbed)
}

// TestFitInStepTraffic: with each sample's matmul operand bytes known, the
// matmuls' in-step time is fitted as α·tables + β·bytes: samples made from known
// α and β (small models moving many bytes per FLOP, large ones few) give them
// back, and the plan's matmul time follows.
func TestFitInStepTraffic(t *testing.T) {
	const alpha, beta = 0.95, 60e-12
	c := &Calibration{}
	for i, s := range []struct{ gemm, bytes float64 }{{0.018, 110e6}, {0.078, 230e6}, {0.014, 117e6}, {0.0025, 27e6}, {0.0032, 31e6}} {
		m := alpha*s.gemm + beta*s.bytes
		c.InStepSamples = append(c.InStepSamples, InStepSample{Model: fmt.Sprint(i), Tables: 2 * s.gemm, GEMMTables: s.gemm, GEMMMeasured: m,
			GEMMBytes: s.bytes, Calls: 50, Measured: m + s.gemm})
	}
	c.FitInStep()
	assert.InDelta(t, alpha, c.InStepGEMM, 1e-9)
	assert.InDelta(t, beta, c.InStepGEMMPerByte, 1e-18)
	// A sample without its bytes (a table calibrated before they were recorded)
	// falls back to the pooled factor.
	c.InStepSamples[2].GEMMBytes = 0
	c.FitInStep()
	assert.Zero(t, c.InStepGEMMPerByte)
	assert.Greater(t, c.InStepGEMM, 1.0)

	// Samples run with bf16 weights fit the bf16 matmuls' own α and β and leave
	// the fp32 fit alone; a bf16 recipe's matmuls then use them.
	c.InStepSamples[2].GEMMBytes = 117e6
	c.FitInStep()
	fp32GEMM, fp32Byte := c.InStepGEMM, c.InStepGEMMPerByte
	const alphaH, betaH = 1.2, 80e-12
	for i, s := range []struct{ gemm, bytes float64 }{{0.01, 100e6}, {0.05, 200e6}, {0.002, 30e6}} {
		m := alphaH*s.gemm + betaH*s.bytes
		c.InStepSamples = append(c.InStepSamples, InStepSample{Model: fmt.Sprint("bf16 ", i), BF16: true, Tables: 9, GEMMTables: s.gemm,
			GEMMMeasured: m, GEMMBytes: s.bytes, Calls: 50, Measured: 100})
	}
	c.FitInStep()
	assert.InDelta(t, fp32GEMM, c.InStepGEMM, 1e-12, "the bf16 samples leave the fp32 fit alone")
	assert.InDelta(t, fp32Byte, c.InStepGEMMPerByte, 1e-24)
	assert.InDelta(t, alphaH, c.InStepGEMMBF16, 1e-9)
	assert.InDelta(t, betaH, c.InStepGEMMPerByteBF16, 1e-18)
	f, b := c.inStepGEMM(true)
	assert.Equal(t, [2]float64{alphaH, betaH}, [2]float64{math.Round(f*1e9) / 1e9, math.Round(b*1e21) / 1e21})
	f, b = c.inStepGEMM(false)
	assert.Equal(t, [2]float64{fp32GEMM, fp32Byte}, [2]float64{f, b})
}

// TestFitHostShare: a rank count's efficiency is the median over models of their
// step ratio (measured less planned communication and experts' stall, over planned compute; each a
// median of its samples) there, over their ratio at one rank; a model without a
// one-rank sample is left out. Between measured rank counts the efficiency is
// interpolated from 1 at one rank, and held beyond the last.
func TestFitHostShare(t *testing.T) {
	c := &Calibration{}
	add := func(model string, ranks int, measured, compute, comm float64) {
		c.HostShareSamples = append(c.HostShareSamples, HostShareSample{Model: model, Ranks: ranks, Measured: measured, Compute: compute, Comm: comm})
	}
	// Model a: 1.2 alone; 2 ranks (median of 1.2·0.9, 1.2·1.0, 1.2·1.5) 1.2; 4 ranks 0.96.
	add("a", 1, 0.12, 0.1, 0)
	add("a", 2, 0.216+0.01, 0.2, 0.01)
	add("a", 2, 0.24+0.01, 0.2, 0.01)
	add("a", 2, 0.36+0.01, 0.2, 0.01)
	add("a", 4, 0.384+0.02, 0.4, 0.02)
	// Model b: 0.9 alone; 2 ranks 0.9·1.1; 4 ranks 0.9·0.7.
	add("b", 1, 0.09, 0.1, 0)
	add("b", 2, 0.198, 0.2, 0)
	add("b", 4, 0.252, 0.4, 0)
	// Model c has no one-rank sample: left out.
	add("c", 2, 10, 0.2, 0)
	// b's experts stall 0.03 s in each run, which sharing the cores does not
	// scale: taken from the measured step, its ratios stay as above.
	for i := range c.HostShareSamples {
		if c.HostShareSamples[i].Model == "b" {
			c.HostShareSamples[i].Measured += 0.03
			c.HostShareSamples[i].Stall = 0.03
		}
	}
	c.FitHostShare()
	require.Len(t, c.HostShare, 2)
	assert.Equal(t, 2, c.HostShare[0].Ranks)
	assert.InDelta(t, 1.05, c.HostShare[0].Efficiency, 1e-9, "the median of 1.0 and 1.1")
	assert.Equal(t, 4, c.HostShare[1].Ranks)
	assert.InDelta(t, 0.75, c.HostShare[1].Efficiency, 1e-9, "the median of 0.8 and 0.7")

	assert.Equal(t, 1.0, c.shareEfficiency(1))
	assert.InDelta(t, 1.05, c.shareEfficiency(2), 1e-12)
	assert.InDelta(t, 0.9, c.shareEfficiency(3), 1e-12, "halfway between 2 and 4 ranks")
	assert.InDelta(t, 0.75, c.shareEfficiency(8), 1e-12, "beyond the last point, the last point's")
	assert.Equal(t, 1.0, (&Calibration{}).shareEfficiency(4), "no points: ranks divide the cores evenly")

	// Rings: a model's ratio over a ring of cp ranks over its ratio at cp
	// data-parallel ranks. a at cp 2: 1.2·1.25 over a's 1.2 at 2 ranks; b at cp 2:
	// 0.99·1.15 over 0.99; b at cp 4: 0.63·1.5 over 0.63.
	ring := func(model string, cp int, measured, compute, comm float64) {
		c.HostShareSamples = append(c.HostShareSamples, HostShareSample{Model: model, Ranks: cp, CP: cp, Measured: measured, Compute: compute, Comm: comm})
	}
	ring("a", 2, 0.3+0.01, 0.2, 0.01)
	ring("b", 2, 0.198*1.15, 0.2, 0)
	ring("b", 4, 0.252*1.5, 0.4, 0)
	ring("d", 4, 1, 0.4, 0) // no data-parallel sample of d: left out
	c.FitHostShare()
	require.Len(t, c.HostShare, 2, "ring samples leave the host-share fit as it was")
	assert.InDelta(t, 1.05, c.HostShare[0].Efficiency, 1e-9)
	assert.InDelta(t, 0.75, c.HostShare[1].Efficiency, 1e-9)
	require.Len(t, c.RingShare, 2)
	assert.Equal(t, 2, c.RingShare[0].Ranks)
	assert.InDelta(t, 1.2, c.RingShare[0].Efficiency, 1e-9, "the median of 1.25 and 1.15")
	assert.Equal(t, 4, c.RingShare[1].Ranks)
	assert.InDelta(t, 1.5, c.RingShare[1].Efficiency, 1e-9)
	assert.InDelta(t, 1.35, c.ringEfficiency(3), 1e-12, "halfway between cp 2 and 4")
	assert.Equal(t, 1.0, (&Calibration{}).ringEfficiency(4), "no points: no ring cost")

	// A hand-edited point that would plan a zero or negative step is refused.
	for _, key := range []string{"host_share", "ring_share"} {
		b, err := json.Marshal(Calibrations(nil).For("cpu"))
		require.NoError(t, err)
		var raw map[string]any
		require.NoError(t, json.Unmarshal(b, &raw))
		raw[key] = []map[string]any{{"ranks": 2, "efficiency": 0}}
		b, err = json.Marshal(raw)
		require.NoError(t, err)
		_, err = ParseCalibration(b)
		require.ErrorContains(t, err, key)
	}
}

// TestBF16GEMMTable: a bf16 recipe's matmuls are timed from the table measured
// with bf16 weights where the calibration has one (a table without it times them
// from the fp32 one), and every other part of the step is unchanged by that table
// (a CPU bf16 run adds its stores' conversions either way); a table whose two
// grids differ is refused.
func TestBF16GEMMTable(t *testing.T) {
	// The shipped table without its bf16 grid and factors: this test builds a grid.
	c := new(Calibration)
	*c = *Calibrations(nil).For("cpu")
	c.GEMMBF16, c.InStepGEMMBF16, c.InStepGEMMPerByteBF16 = nil, 0, 0
	c.Index()
	cals := Calibrations(nil).With(c)
	res := load(t, "../recipes/tiny.toml", "precision.bf16=true")
	plain := compileWith(t, &load(t, "../recipes/tiny.toml").Recipe, cals)
	without := compileWith(t, &res.Recipe, cals)
	// Without a bf16 table the matmuls time as fp32; the bf16 run also converts its
	// saved activations to and from bf16 stores (the CPU engine), so it plans more.
	assert.Greater(t, without.ComputeS, plain.ComputeS, "no bf16 table: the fp32 one, and the bf16 stores' conversions")
	half := *c
	half.GEMMBF16 = nil
	for _, p := range c.GEMM {
		half.GEMMBF16 = append(half.GEMMBF16, GEMMPoint{M: p.M, K: p.K, N: p.N, Fwd: p.Fwd / 2, Bwd: p.Bwd / 2})
	}
	half.Index()
	assert.InEpsilon(t, c.gemmTime(256, 128, 384, true)/2, half.gemmTimeOf(true, 256, 128, 384, true), 1e-9)
	assert.InEpsilon(t, c.gemmTime(256, 128, 384, true), half.gemmTimeOf(false, 256, 128, 384, true), 1e-12)
	gemm := MicroCompute(res.Recipe.Model, res.Recipe.Train.MicroBatchSize, "none", false, c).GEMM
	gf := c.InStep
	if c.InStepGEMM > 0 {
		gf = c.InStepGEMM
	}
	halved := compileWith(t, &res.Recipe, cals.With(&half))
	assert.InEpsilon(t, without.ComputeS-gf*gemm/2, halved.ComputeS, 1e-9, "the matmuls' table time halves, the rest stays")

	b, err := json.Marshal(&half)
	require.NoError(t, err)
	var raw map[string]any
	require.NoError(t, json.Unmarshal(b, &raw))
	raw["gemm_bf16"] = raw["gemm_bf16"].([]any)[:3]
	b, err = json.Marshal(raw)
	require.NoError(t, err)
	_, err = ParseCalibration(b)
	require.ErrorContains(t, err, "gemm_bf16")
}

// TestRingShare: a plan under context parallelism multiplies its compute (not
// the optimizer, not communication) by the calibration's ring efficiency at its
// cp degree; a plan without cp is untouched.
func TestRingShare(t *testing.T) {
	c := *Calibrations(nil).For("cpu")
	c.RingShare = nil
	with := c
	with.RingShare = []HostSharePoint{{Ranks: 2, Efficiency: 1.2}}
	plan := func(cal *Calibration, sets ...string) *Plan {
		return compileWith(t, &load(t, "../recipes/tiny.toml", sets...).Recipe, Calibrations(nil).With(cal))
	}
	cp := []string{"parallel.world_size=2", "parallel.context_parallel=2", "train.global_batch_size=16"}
	a, b := plan(&c, cp...), plan(&with, cp...)
	assert.InEpsilon(t, 1.2*a.ComputeS, b.ComputeS, 1e-9)
	assert.Equal(t, a.OptimizerS, b.OptimizerS)
	assert.Equal(t, a.ExposedCommS, b.ExposedCommS)
	dp := []string{"parallel.world_size=2", "train.global_batch_size=32"}
	assert.Equal(t, plan(&c, dp...).ComputeS, plan(&with, dp...).ComputeS)
}

// TestCalibrationGridsAreWhole: a table whose GEMM or attention grid misses a
// combination of its axes' values (a point moved off the grid, or repeated) is
// refused by name; the lookups would time the missing shapes as NaN (found by
// FuzzParseCalibration: a bf16 point's N edited to another's).
func TestCalibrationGridsAreWhole(t *testing.T) {
	for name, edit := range map[string]func(raw map[string]any){
		"gemm point off the grid": func(raw map[string]any) { raw["gemm"].([]any)[3].(map[string]any)["M"] = 916 },
		"gemm point repeated":     func(raw map[string]any) { raw["gemm"].([]any)[3].(map[string]any)["N"] = 16 },
		"gemm_bf16 point moved":   func(raw map[string]any) { raw["gemm_bf16"].([]any)[5].(map[string]any)["K"] = 4096 },
		"attention point moved": func(raw map[string]any) {
			for _, p := range raw["attention"].([]any) {
				if p := p.(map[string]any); p["Flash"] == true {
					p["T"] = 3
					return
				}
			}
		},
	} {
		err := parseEdited(t, edit)
		require.ErrorContains(t, err, "grid has", name)
		assert.ErrorContains(t, err, "every combination of its axes' values once", name)
	}
}

// parseEdited is ParseCalibration's error for the shipped cpu table with edit
// applied to its JSON (each call decodes the table afresh, so no edit outlives
// its case).
func parseEdited(t *testing.T, edit func(raw map[string]any)) error {
	t.Helper()
	var raw map[string]any
	require.NoError(t, json.Unmarshal(shippedCPU, &raw))
	edit(raw)
	b, err := json.Marshal(raw)
	require.NoError(t, err)
	_, err = ParseCalibration(b)
	return err
}

// TestStepTailFactor: FitInStep pools the step tails' measured time over
// their tables' (StepTail) into InStepOptimizer, which scales the plan's
// gradient norm and optimizer; a table without tails (measured before they
// were) keeps the warm figures (factor 0: none applied).
func TestStepTailFactor(t *testing.T) {
	c := Calibrations(nil).For("cpu")
	with := *c
	with.InStepSamples = nil
	for i, om := range []float64{3e-3, 1e-3} {
		n := float64(1+i) * 1e6
		with.InStepSamples = append(with.InStepSamples, InStepSample{Model: fmt.Sprint(i), Measured: 1, Tables: 1, OptMeasured: om, OptTables: c.StepTail(n)})
	}
	with.FitInStep()
	require.InEpsilon(t, (3e-3+1e-3)/(c.StepTail(1e6)+c.StepTail(2e6)), with.InStepOptimizer, 1e-12)
	without := with
	without.InStepSamples = slices.Clone(with.InStepSamples)
	for i := range without.InStepSamples {
		without.InStepSamples[i].OptMeasured, without.InStepSamples[i].OptTables = 0, 0
	}
	without.FitInStep()
	require.Zero(t, without.InStepOptimizer)
	r := &load(t, "../recipes/tiny.toml").Recipe
	p := compile(t, r)
	a, b := stepModel(r, p, &with), stepModel(r, p, &without)
	require.InEpsilon(t, with.InStepOptimizer*b.Optimizer, a.Optimizer, 1e-12)
}

// TestExpertsApart: the routed experts' products are counted apart from the
// dense matmuls (times and operand bytes, full recompute repeating their
// forward); the matmuls' fit reads the dense products alone, the experts'
// excess over it is their stall per byte, and a sample measured before the
// experts were timed gives its dense products to the matmuls' fit and nothing
// to the rest's. The plan adds the stall to each rank's compute unscaled by
// the ranks sharing the cores.
func TestExpertsApart(t *testing.T) {
	c := Calibrations(nil).For("cpu")
	moe := load(t, "../recipes/moe-tiny.toml")
	mo, B := moe.Recipe.Model, moe.Recipe.Train.MicroBatchSize
	mt := MicroCompute(mo, B, "none", false, c)
	// Balanced, each of the 8 experts gets BT·K/E = 512 rows; three products of
	// (512, 128, 128) a layer, forward once and backward twice.
	rows, C, EF := float64(B*mo.SeqLen*mo.MoE.TopK/mo.MoE.NumExperts), float64(mo.Hidden), float64(mo.MoE.ExpertFFNHidden)
	one := c.gemmTime(int(rows), int(C), int(EF), false) + c.gemmTime(int(rows), int(C), int(EF), true)
	assert.InEpsilon(t, 4*8*3*one, mt.Experts, 1e-12, "the experts' products, at their balanced rows")
	assert.InEpsilon(t, 4*8*3*3*4*(rows*C+C*EF+rows*EF), mt.ExpertBytes, 1e-12)
	dense := MicroCompute(load(t, "../recipes/tiny.toml").Recipe.Model, B, "none", false, c)
	assert.Less(t, mt.GEMM, dense.GEMM, "moe-tiny's dense products: tiny's less its MLP, plus the router")
	full := MicroCompute(mo, B, "full", false, c)
	fwd := c.gemmTime(int(rows), int(C), int(EF), false)
	assert.InEpsilon(t, mt.Experts+4*8*3*fwd, full.Experts, 1e-12, "full recompute repeats the experts' forward")
	assert.InEpsilon(t, mt.ExpertBytes*4/3, full.ExpertBytes, 1e-12)

	assert.Equal(t, float64(B*mo.SeqLen*mo.MoE.TopK), mt.Routed, "each layer's experts process every routed copy")
	assert.Zero(t, dense.Routed)

	// Samples made from known figures give them back: dense products at
	// α·tables + β·bytes, the experts' at that plus σ(rows)·bytes, where
	// σ(rows) = σ + slope·log2(rows/1024).
	const alpha, beta, sigma, slope = 1.2, 20e-12, 30e-12, 25e-12
	f := &Calibration{}
	for i, s := range []struct{ gemm, bytes, experts, ebytes, rows float64 }{{0.02, 110e6, 0, 0, 0}, {0.08, 230e6, 0, 0, 0},
		{0.01, 60e6, 0.01, 70e6, 2048}, {0.003, 27e6, 0.002, 20e6, 1024}, {0.004, 30e6, 0.003, 40e6, 4096}} {
		d := alpha*s.gemm + beta*s.bytes
		e := alpha * s.experts
		if s.rows > 0 {
			e += (beta + sigma + slope*math.Log2(s.rows/1024)) * s.ebytes
		}
		f.InStepSamples = append(f.InStepSamples, InStepSample{Model: fmt.Sprint(i), Tables: s.gemm + s.experts + 0.01, Calls: 50, Measured: d + e + 0.012,
			GEMMTables: s.gemm + s.experts, GEMMBytes: s.bytes + s.ebytes, GEMMMeasured: d + e,
			ExpertsTables: s.experts, ExpertsBytes: s.ebytes, ExpertsMeasured: e, RoutedRows: s.rows})
	}
	f.FitInStep()
	assert.InDelta(t, alpha, f.InStepGEMM, 1e-9)
	assert.InDelta(t, beta, f.InStepGEMMPerByte, 1e-18)
	assert.InDelta(t, sigma, f.InStepExpertsStall, 1e-18)
	assert.InDelta(t, slope, f.InStepExpertsStallSlope, 1e-18)
	assert.InDelta(t, sigma+2*slope, f.expertsStallOf(false, 4096), 1e-18)
	assert.Zero(t, f.expertsStallOf(false, 0), "no routed rows, no stall")
	assert.Equal(t, f.expertsStallOf(false, 2048), f.expertsStallOf(true, 2048), "no bf16 samples: bf16 runs take the fp32 figures")
	assert.InDelta(t, 1.2, f.InStep, 1e-9, "the rest: 0.012 measured over 0.01 in the tables")
	// Measured before the experts were timed: GEMMMeasured held the dense
	// products alone, and the rest of the pass the experts.
	old := f.InStepSamples[2]
	old.GEMMMeasured -= old.ExpertsMeasured
	old.ExpertsMeasured = 0
	old.Measured += 1 // what the rest's fit must not see
	f.InStepSamples[2] = old
	f.FitInStep()
	assert.InDelta(t, alpha, f.InStepGEMM, 1e-9, "its dense products still fit")
	assert.InDelta(t, 1.2, f.InStep, 1e-9, "its rest is left out")
	assert.InDelta(t, sigma, f.InStepExpertsStall, 1e-18, "from the two samples that timed their experts")
	assert.InDelta(t, slope, f.InStepExpertsStallSlope, 1e-18)
	// One routed-row count: the pooled stall alone.
	f.InStepSamples = f.InStepSamples[:4]
	f.FitInStep()
	assert.InDelta(t, sigma, f.InStepExpertsStall, 1e-18)
	assert.Zero(t, f.InStepExpertsStallSlope)
	// A sample run with bf16 weights fits the bf16 figure and leaves the fp32 one.
	const sigmaH = 40e-12
	h := f.InStepSamples[3]
	h.BF16, h.Model = true, "bf16"
	d := h.dense() // alone, it fits the bf16 matmuls' factor: d.measured/d.tables, no traffic term
	h.ExpertsMeasured = d.measured/d.tables*h.ExpertsTables + sigmaH*h.ExpertsBytes
	h.GEMMMeasured = d.measured + h.ExpertsMeasured
	f.InStepSamples = append(f.InStepSamples, h)
	f.FitInStep()
	assert.InDelta(t, sigma, f.InStepExpertsStall, 1e-18)
	assert.InDelta(t, sigmaH, f.InStepExpertsStallBF16, 1e-18)
	assert.InDelta(t, sigmaH, f.expertsStallOf(true, 1024), 1e-18)

	// The plan: every rank adds its own stall.
	stalled := *c
	stalled.InStepExpertsStall, stalled.InStepExpertsStallSlope = sigma, slope
	stalled.HostShare = []HostSharePoint{{Ranks: 2, Efficiency: 0.9}}
	without := *c
	without.HostShare = stalled.HostShare
	for _, world := range []int{1, 2} {
		r := &load(t, "../recipes/moe-tiny.toml", fmt.Sprintf("parallel.world_size=%d", world), fmt.Sprintf("train.global_batch_size=%d", 16*world)).Recipe
		p := compileWith(t, r, Calibrations(nil).With(&stalled))
		assert.InEpsilon(t, (sigma+2*slope)*mt.ExpertBytes, p.StallS, 1e-12, "%d ranks: each rank's stall (4,096 routed rows), unshared", world)
		base := stepModel(r, p, &without)
		assert.InEpsilon(t, base.GEMM+base.Attention+base.Stream+p.StallS, p.ComputeS, 1e-12)
	}
}

// TestCPUFP8Products: a CPU table times an FP8 layer's products by their
// ratio to the fp32 products at GEMMFP8's shapes, interpolated (a table whose
// FP8 products all took 1.5 times the fp32 ones times every FP8 product at
// 1.5 times the fp32 one at its shape; one point at 3 times moves the
// products near it and not those far off), and FP8's amax and quantisation
// by their own costs. A table without them (the shipped ones, measured
// before) times an FP8 product as the fp32 one plus widening the codes it
// reads whole, amax as a square sum and quantisation as a bf16 conversion,
// and the plan says so. An FP8 point off the fp32 grid, or an FP8 grid
// missing a point, is refused. A CPU plan in FP8 is slower than in bf16 by
// the quantisation and the widening: the CPU has no FP8 arithmetic.
func TestCPUFP8Products(t *testing.T) {
	old := Calibrations(nil).For("cpu")
	require.False(t, old.FP8Timed())
	assert.InEpsilon(t, old.gemmTime(2048, 128, 384, false)+old.stream(StreamFromBF16, 2048*128), old.fp8GEMMTime(2048, 128, 384, false), 1e-12)
	assert.InEpsilon(t, old.gemmTime(2048, 128, 384, true)+old.stream(StreamFromBF16, 2048*384), old.fp8GEMMTime(2048, 128, 384, true), 1e-12)
	assert.Equal(t, old.Stream[StreamSumSquares].Time(1e6), old.stream(StreamAmax, 1e6))
	assert.Equal(t, old.Stream[StreamToBF16].Time(1e6), old.stream(StreamQuantize, 1e6))

	b, err := json.Marshal(old)
	require.NoError(t, err)
	c, err := ParseCalibration(b)
	require.NoError(t, err)
	addFP8Grid(c, 1.5)
	c.Stream[StreamAmax], c.Stream[StreamQuantize] = Linear{Fixed: 1e-6, PerUnit: 1e-10}, Linear{Fixed: 2e-6, PerUnit: 3e-10}
	b, err = json.Marshal(c)
	require.NoError(t, err)
	c, err = ParseCalibration(b)
	require.NoError(t, err)
	require.True(t, c.FP8Timed())
	for _, sh := range [][3]int{{64, 64, 64}, {2048, 128, 384}, {100, 300, 70}, {16, 2048, 2048}} {
		for _, bwd := range []bool{false, true} {
			assert.InEpsilon(t, 1.5*c.gemmTime(sh[0], sh[1], sh[2], bwd), c.fp8GEMMTime(sh[0], sh[1], sh[2], bwd), 1e-12, "%v backward %v", sh, bwd)
		}
	}
	assert.InEpsilon(t, 1e-6+1e-10*1e6, c.stream(StreamAmax, 1e6), 1e-12)
	assert.InEpsilon(t, 2e-6+3e-10*1e6, c.stream(StreamQuantize, 1e6), 1e-12)
	c.GEMMFP8[7].Fwd *= 2 // (1024, 256, 256): 3 times the fp32 product
	c.Index()
	assert.InEpsilon(t, 3*c.gemmTime(1024, 256, 256, false), c.fp8GEMMTime(1024, 256, 256, false), 1e-12)
	assert.InEpsilon(t, 1.5*c.gemmTime(64, 64, 64, false), c.fp8GEMMTime(64, 64, 64, false), 1e-12, "far from it, unmoved")
	mid := c.fp8GEMMTime(256, 128, 128, false) / c.gemmTime(256, 128, 128, false)
	assert.Greater(t, mid, 1.5)
	assert.Less(t, mid, 3.0)

	err = parseEdited(t, func(raw map[string]any) {
		raw["gemm_fp8"] = []any{map[string]any{"M": 48, "K": 64, "N": 64, "Fwd": 1e-5, "Bwd": 2e-5}}
	})
	require.ErrorContains(t, err, "not a shape of the gemm grid")
	err = parseEdited(t, func(raw map[string]any) {
		raw["gemm_fp8"] = []any{map[string]any{"M": 64, "K": 64, "N": 64, "Fwd": 1e-5, "Bwd": 2e-5}, map[string]any{"M": 64, "K": 64, "N": 128, "Fwd": 1e-5, "Bwd": 2e-5},
			map[string]any{"M": 64, "K": 128, "N": 64, "Fwd": 1e-5, "Bwd": 2e-5}}
	})
	require.ErrorContains(t, err, "the gemm_fp8 grid has 3 points")

	base := []string{"precision.bf16=true"}
	bf16 := compile(t, &load(t, "../recipes/tiny.toml", base...).Recipe)
	fp8 := compile(t, &load(t, "../recipes/tiny.toml", append(base, "precision.fp8.format=hybrid")...).Recipe)
	t.Logf("tiny on the CPU: bf16 %.1f ms, FP8 %.1f ms; %s", 1e3*bf16.StepTimeS, 1e3*fp8.StepTimeS, fp8.TimeModel)
	assert.Greater(t, fp8.ComputeS, bf16.ComputeS)
	assert.Contains(t, fp8.TimeModel, "FP8 products timed as fp32 ones plus a pass widening their codes")
	assert.NotContains(t, bf16.TimeModel, "FP8")
	timed := compileWith(t, &load(t, "../recipes/tiny.toml", append(base, "precision.fp8.format=hybrid")...).Recipe, Calibrations{"cpu": c})
	assert.NotContains(t, timed.TimeModel, "FP8")
	// Layers kept in bf16 are timed as such.
	kept := compile(t, &load(t, "../recipes/tiny.toml", append(base, "precision.fp8.format=hybrid", "precision.fp8.first_last_layers_bf16=true")...).Recipe)
	assert.Greater(t, kept.ComputeS, bf16.ComputeS)
	assert.Less(t, kept.ComputeS, fp8.ComputeS)
}

// TestFP8Quantisation: an FP8 layer quantises, as trainer/model's fp8.go
// does, its four inputs (the normed input, the attention output, the MLP's
// normed input and SwiGLU product) forward and again in backward, its seven
// weights likewise, and the seven products' output gradients in backward:
// 29 tensors, each an Amax, an FP8Scale and a Quantize. With FP8 products
// timed as the fp32 ones (a ratio of 1), tiny's micro-batch in FP8 takes its
// fp32 time plus exactly those passes, in every layer the range holds.
func TestFP8Quantisation(t *testing.T) {
	b, err := json.Marshal(Calibrations(nil).For("cpu"))
	require.NoError(t, err)
	c, err := ParseCalibration(b)
	require.NoError(t, err)
	addFP8Grid(c, 1)
	const a, bb, q, qq = 1e-6, 2e-10, 3e-6, 5e-10
	c.Stream[StreamAmax], c.Stream[StreamQuantize] = Linear{Fixed: a, PerUnit: bb}, Linear{Fixed: q, PerUnit: qq}
	c.Index()
	mo := load(t, "../recipes/tiny.toml").Recipe.Model
	sh := microShape{B: 16, T: mo.SeqLen, CP: 1, TP: 1, EP: 1, ETP: 1, Mode: "none"}
	plain := microCompute(mo, sh, c)
	BT, C, Q, KV, FF := 16*mo.SeqLen, mo.Hidden, mo.Hidden, mo.EffectiveKVHeads()*mo.HeadSize(), mo.FFNHidden
	elements := 2*(BT*C+BT*Q+BT*C+BT*FF) + 2*(Q*C+2*KV*C+C*Q+3*FF*C) + (BT*Q + 2*BT*KV + BT*C + 2*BT*FF + BT*C)
	for _, r := range [][2]int{{0, mo.Layers}, {1, mo.Layers - 1}} {
		sh.FP8Lo, sh.FP8Hi = r[0], r[1]
		fp8 := microCompute(mo, sh, c)
		layers := float64(r[1] - r[0])
		assert.InEpsilon(t, plain.GEMM, fp8.GEMM, 1e-12, "products at a ratio of 1")
		assert.InEpsilon(t, layers*(29*(a+q)+(bb+qq)*float64(elements)), fp8.Stream-plain.Stream, 1e-9, "layers %v", r)
		assert.Equal(t, layers*29*3, fp8.Calls-plain.Calls, "layers %v", r)
	}
}

// addFP8Grid gives c FP8 products at eight of its fp32 grid's shapes (m 64
// and 1024, k and n 64 and 256), each ratio times the fp32 product's time.
func addFP8Grid(c *Calibration, ratio float64) {
	for _, m := range []int{64, 1024} {
		for _, k := range []int{64, 256} {
			for _, n := range []int{64, 256} {
				p := c.idx.gemm[0].at[[3]int{m, k, n}]
				c.GEMMFP8 = append(c.GEMMFP8, GEMMPoint{M: m, K: k, N: n, Fwd: ratio * p.Fwd, Bwd: ratio * p.Bwd})
			}
		}
	}
}
