package trainer

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/shardline/shardline/trainer/model"
)

// TestCalibrateSmallGrid: Calibrate over a small grid measures every table the
// plan's step model reads (ParseCalibration accepts the result: every stream kernel,
// matmul and attention point present and positive), says where it ran, and fits the
// in-step factors to its five model passes: the matmuls' from their own time
// inside the passes, the rest by least squares.
func TestCalibrateSmallGrid(t *testing.T) {
	grid := CalibrationGrid{GEMMRows: []int{16, 64}, GEMMDims: []int{16, 32}, AttnT: []int{32, 64}, AttnHD: []int{16, 32}, CollectiveSizes: []int{2},
		FP8Rows: []int{64}, FP8Dims: []int{32},
		ShareModels: []string{"dense 2×96, ffn 256, seq 64, vocab 128, batch 8"}, ShareRanks: []int{2}, ShareSteps: 3, ShareRounds: 1, RingCP: []int{2}}
	c, err := Calibrate(cpu.Backend{}, grid, time.Millisecond, nil)
	require.NoError(t, err)
	c.Source = "shardline calibrate test"
	b, err := json.Marshal(c)
	require.NoError(t, err)
	back, err := parallel.ParseCalibration(b)
	require.NoError(t, err)
	require.Len(t, back.GEMM, 8)
	require.Len(t, back.GEMMBF16, 8, "the same grid with bf16 weights")
	require.Contains(t, []string{"dot", "widened"}, back.BF16Matmul)
	require.Len(t, back.GEMMFP8, 1, "the FP8 products at the FP8 sub-grid's one shape")
	require.Equal(t, [3]int{64, 32, 32}, [3]int{back.GEMMFP8[0].M, back.GEMMFP8[0].K, back.GEMMFP8[0].N})
	require.True(t, back.FP8Timed(), "FP8 products, amax and quantisation measured")
	require.Len(t, back.Attention, 8, "flash, with and without the causal mask")
	full := 0
	for _, p := range back.Attention {
		require.True(t, p.Flash, "flash attention is the engine's only attention")
		if p.Full {
			full++
		}
	}
	require.Equal(t, 4, full)
	require.Len(t, back.InStepSamples, 2*len(calibrationModels), "every calibration model, with fp32 and with bf16 weights")
	require.Greater(t, back.InStepGEMMBF16, 0.0, "bf16 matmuls' own in-step factor")
	require.Greater(t, back.InStep, 0.0)
	require.GreaterOrEqual(t, back.PerCall, 0.0)
	require.Greater(t, back.InStepGEMM, 0.0, "the matmuls' own in-step factor")
	require.Greater(t, back.InStepAttention, 0.0, "attention's own in-step factor")
	for _, k := range append(slices.Clone(parallel.StreamKinds), parallel.LaterStreamKinds...) {
		require.Contains(t, back.Stream, k, "every memory-bound kernel is measured")
	}
	var om, ot float64
	moe := 0
	for _, smp := range back.InStepSamples {
		require.Greater(t, smp.GEMMMeasured, 0.0, smp.Model)
		require.Greater(t, smp.AttnMeasured, 0.0, smp.Model)
		require.Less(t, smp.GEMMMeasured+smp.AttnMeasured, smp.Measured, "%s: the matmuls and attention are part of the pass", smp.Model)
		require.Greater(t, smp.GEMMTables, 0.0, smp.Model)
		require.Greater(t, smp.AttnTables, 0.0, smp.Model)
		require.Greater(t, smp.GEMMBytes, 0.0, "%s: the matmuls' operand bytes", smp.Model)
		require.Greater(t, smp.OptMeasured, 0.0, "%s: the step's tail after the pass", smp.Model)
		require.Greater(t, smp.OptTables, 0.0, smp.Model)
		if !smp.Disturbed { // a pass other work slowed is left out of every fit
			om, ot = om+smp.OptMeasured, ot+smp.OptTables
		}
		if strings.HasPrefix(smp.Model, "moe") {
			// The experts' products are timed among the matmuls, and apart.
			require.Greater(t, smp.ExpertsMeasured, 0.0, smp.Model)
			require.Less(t, smp.ExpertsMeasured, smp.GEMMMeasured, smp.Model)
			require.Greater(t, smp.ExpertsTables, 0.0, smp.Model)
			require.Less(t, smp.ExpertsTables, smp.GEMMTables, smp.Model)
			require.Greater(t, smp.ExpertsBytes, 0.0, smp.Model)
			require.Less(t, smp.ExpertsBytes, smp.GEMMBytes, smp.Model)
			moe++
		} else {
			require.Zero(t, smp.ExpertsMeasured+smp.ExpertsTables+smp.ExpertsBytes, smp.Model)
		}
	}
	require.Equal(t, 6, moe, "three MoE models, fp32 and bf16")
	require.Positive(t, back.Drift, "the matmuls timed again after the passes")
	require.InEpsilon(t, om/ot, back.InStepOptimizer, 1e-12, "the step tail's factor, pooled over the undisturbed passes")
	require.Contains(t, back.Collectives, parallel.CollectiveKey(parallel.SendRecv, 2))
	require.Contains(t, back.Host, "CPUs")
	// Ranks sharing the cores: the model trained at 1 and 2 in-process ranks, and
	// the efficiency of 2 fitted from the two runs; then at 2 ranks splitting each
	// sequence over a ring, and the ring's factor fitted against the 2-rank run.
	require.Len(t, back.HostShareSamples, 3)
	for i, smp := range back.HostShareSamples {
		require.Equal(t, []int{1, 2, 2}[i], smp.Ranks)
		require.Equal(t, []int{0, 0, 2}[i], smp.CP)
		require.Greater(t, smp.Measured, 0.0)
		require.Greater(t, smp.Compute, 0.0)
	}
	require.Len(t, back.RingShare, 1)
	s2, r2 := back.HostShareSamples[1], back.HostShareSamples[2]
	require.InEpsilon(t, ((r2.Measured-r2.Comm)/r2.Compute)/((s2.Measured-s2.Comm)/s2.Compute), back.RingShare[0].Efficiency, 1e-12)
	require.Zero(t, back.HostShareSamples[0].Comm, "one rank communicates nothing")
	require.Greater(t, back.HostShareSamples[1].Comm, 0.0, "two ranks gather and reduce")
	require.Len(t, back.HostShare, 1)
	s1, s2 := back.HostShareSamples[0], back.HostShareSamples[1]
	require.InEpsilon(t, ((s2.Measured-s2.Comm)/s2.Compute)/(s1.Measured/s1.Compute), back.HostShare[0].Efficiency, 1e-12)
	require.Contains(t, back.Collectives, parallel.CollectiveKey(parallel.AllGather, 2))
}

// TestRefit: redoing the in-step fit of a shipped table keeps every measured time,
// recomputes each sample's model-derived figures (the same as the table's, which
// a refit wrote) and fits the matmuls' traffic term; a sample of a model
// Calibrate does not time is refused by name.
func TestRefit(t *testing.T) {
	// The AMD table: measured by this version's calibrate (the Intel default
	// predates flash attention at every length, so its fits are not this
	// version's fixed point).
	b, err := os.ReadFile("../parallel/calibration/cpu-amd-epyc.json")
	require.NoError(t, err)
	shipped, err := parallel.ParseCalibration(b)
	require.NoError(t, err)
	c, err := parallel.ParseCalibration(b)
	require.NoError(t, err)
	for i := range c.InStepSamples {
		c.InStepSamples[i].GEMMBytes, c.InStepSamples[i].Tables = 0, 0
	}
	require.NoError(t, Refit(c))
	for i, smp := range c.InStepSamples {
		want := shipped.InStepSamples[i]
		require.Equal(t, want.Measured, smp.Measured, "measured times are kept")
		require.Equal(t, want.GEMMMeasured, smp.GEMMMeasured)
		require.InEpsilon(t, want.GEMMBytes, smp.GEMMBytes, 1e-12, smp.Model)
		require.InEpsilon(t, want.Tables, smp.Tables, 1e-9, smp.Model)
	}
	require.InEpsilon(t, shipped.InStepGEMM, c.InStepGEMM, 1e-9)
	require.InEpsilon(t, shipped.InStepGEMMPerByte, c.InStepGEMMPerByte, 1e-9)
	require.Greater(t, c.InStepGEMMPerByte, 0.0, "the shipped table's matmuls pay for their operands' traffic")

	c.InStepSamples[0].Model = "a model of another shardline"
	require.ErrorContains(t, Refit(c), `"a model of another shardline"`)
}

// TestRefitHostShare: a refit recomputes the host-share samples' planned compute
// and communication with the current step model (the measured times kept) and
// fits the efficiency again; a sample of a model Calibrate does not train is
// refused by name.
func TestRefitHostShare(t *testing.T) {
	b, err := json.Marshal(parallel.Calibrations(nil).For("cpu"))
	require.NoError(t, err)
	c, err := parallel.ParseCalibration(b)
	require.NoError(t, err)
	const model = "dense 2×192, ffn 512, seq 128, vocab 512, batch 8"
	c.HostShareSamples = []parallel.HostShareSample{{Model: model, Ranks: 1, Measured: 0.04}, {Model: model, Ranks: 4, Measured: 0.15}}
	require.NoError(t, Refit(c))
	s1, s4 := c.HostShareSamples[0], c.HostShareSamples[1]
	require.Equal(t, 0.04, s1.Measured)
	require.Greater(t, s1.Compute, 0.0)
	require.Greater(t, s4.Compute, 3.5*s1.Compute, "four ranks, each a micro-batch, on the same cores")
	require.Greater(t, s4.Comm, 0.0)
	require.Len(t, c.HostShare, 1)
	require.InEpsilon(t, ((0.15-s4.Comm)/s4.Compute)/(0.04/s1.Compute), c.HostShare[0].Efficiency, 1e-12)

	c.HostShareSamples[1].Model = "a model of another shardline"
	require.ErrorContains(t, Refit(c), `"a model of another shardline"`)
}

// TestStreamKernelUnknownKind: a stream kind calibrate has no kernel for is an
// error naming it, not a crash.
func TestStreamKernelUnknownKind(t *testing.T) {
	_, err := streamKernel(cpu.Backend{}, "no-such-kernel", 1024)
	require.ErrorContains(t, err, `"no-such-kernel"`)
}

// slowProducts is the CPU backend with every product and attention call made
// at least pause longer, counting the calls.
type slowProducts struct {
	cpu.Backend
	pause                      time.Duration
	products, experts, attends int
}

func (b *slowProducts) Matmul(out, inp, weight tensor.Buffer, s tensor.MatmulShape, acc bool) {
	b.products++
	time.Sleep(b.pause)
	b.Backend.Matmul(out, inp, weight, s, acc)
}

func (b *slowProducts) MatmulBackward(dinp, dweight, dout, inp, weight tensor.Buffer, s tensor.MatmulShape, acc bool) {
	b.products++
	time.Sleep(b.pause)
	b.Backend.MatmulBackward(dinp, dweight, dout, inp, weight, s, acc)
}

func (b *slowProducts) ExpertsMatmul(out, inp tensor.Buffer, w []tensor.Buffer, offsets tensor.Buffer, s tensor.ExpertsShape, acc bool) {
	b.products++
	b.experts++
	time.Sleep(b.pause)
	b.Backend.ExpertsMatmul(out, inp, w, offsets, s, acc)
}

func (b *slowProducts) ExpertsMatmulBackward(dinp tensor.Buffer, dw []tensor.Buffer, dout, inp tensor.Buffer, w []tensor.Buffer, offsets tensor.Buffer, s tensor.ExpertsShape, acc bool) {
	b.products++
	b.experts++
	time.Sleep(b.pause)
	b.Backend.ExpertsMatmulBackward(dinp, dw, dout, inp, w, offsets, s, acc)
}

func (b *slowProducts) FlashAttention(out, lse, q, k, v tensor.Buffer, s tensor.AttentionShape) {
	b.attends++
	time.Sleep(b.pause)
	b.Backend.FlashAttention(out, lse, q, k, v, s)
}

func (b *slowProducts) FlashAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v tensor.Buffer, s tensor.AttentionShape, accumulate bool) {
	b.attends++
	time.Sleep(b.pause)
	b.Backend.FlashAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, s, accumulate)
}

// TestKernelTimedTimesEveryProduct: the matmuls a calibration pass times are
// every product the plan counts as one, the experts' among them and apart (a
// pass of an MoE calibration model whose products each sleep a millisecond
// reports at least that millisecond per product as matmul time, per grouped
// product as the experts' time, and per attention call as attention time). The bound is one-sided, so deterministic: a sleep lasts
// at least its pause.
func TestKernelTimedTimesEveryProduct(t *testing.T) {
	i := slices.IndexFunc(calibrationModels, func(m calibrationModel) bool { return m.name == "moe 2×96, 16 experts top-2 of 64, seq 64, batch 8" })
	require.GreaterOrEqual(t, i, 0, "the smallest MoE calibration model")
	cm := calibrationModels[i]
	slow := &slowProducts{pause: time.Millisecond}
	tb := &kernelTimed{Backend: slow}
	table, err := parallel.ParamTable(cm.model, 1, 1)
	require.NoError(t, err)
	mem := tb.NewMemory()
	w, g := make([][]float32, len(table)), make([]tensor.Buffer, len(table))
	for i := range table {
		w[i] = make([]float32, table[i].LocalNumel())
		model.InitParam(w[i], &table[i], 0, 1, cm.model.InitStd, cm.model.Layers)
		g[i] = mem.Alloc(tensor.Float32, len(w[i]))
	}
	m, err := model.New[float32](cm.model, table, tensor.Upload(mem, tensor.Float32, w), g, tb, cm.batch, cm.model.SeqLen, model.WithMemory(mem))
	require.NoError(t, err)
	n := cm.batch * cm.model.SeqLen
	tokens := make([]int32, n)
	for i := range tokens {
		tokens[i] = int32(i * 7 % cm.model.VocabSize)
	}
	m.Forward(tokens, tokens, mem.Alloc(tensor.Float64, 1), false)
	m.Backward(tokens, tokens, 1/float64(n))
	mem.Sync()
	require.NoError(t, mem.Err())
	require.Positive(t, slow.products)
	require.GreaterOrEqual(t, tb.gemm, time.Duration(slow.products)*slow.pause, "%d products (experts' included)", slow.products)
	require.Equal(t, 2*3*2, slow.experts, "two layers' three grouped products, forward and backward")
	require.GreaterOrEqual(t, tb.experts, time.Duration(slow.experts)*slow.pause, "the experts' products, apart")
	require.GreaterOrEqual(t, tb.gemm-tb.experts, time.Duration(slow.products-slow.experts)*slow.pause, "the dense products")
	require.Equal(t, 4, slow.attends, "two layers, forward and backward")
	require.GreaterOrEqual(t, tb.attn, time.Duration(slow.attends)*slow.pause)
}

// TestDisturbedWarning: calibrate names the models whose passes its fit left
// out as disturbed, and says nothing when none was.
func TestDisturbedWarning(t *testing.T) {
	c := &parallel.Calibration{}
	for i, r := range []float64{1.2, 1.3, 4, 1.25} {
		c.InStepSamples = append(c.InStepSamples, parallel.InStepSample{Model: calibrationModels[i].name, Measured: r, Tables: 1})
	}
	c.FitInStep()
	w := disturbedWarning(c)
	require.Contains(t, w, "1 of 4 models' in-step passes")
	require.Contains(t, w, calibrationModels[2].name+" (fp32)")
	c.InStepSamples[2].Measured = 1.2
	c.FitInStep()
	require.Empty(t, disturbedWarning(c))
}

// TestGEMMDrift: the matmuls timed again after the in-step passes are
// compared with their table; a machine slower or faster now than when it
// measured the table (here: a table of 1 ns and of 100 s products, timed
// again with a millisecond's pause in each) is told to calibrate again, and
// one within driftLimit is not.
func TestGEMMDrift(t *testing.T) {
	grid := CalibrationGrid{GEMMRows: []int{16, 32}, GEMMDims: []int{16, 32}}
	slow := &slowProducts{pause: time.Millisecond}
	for _, c := range []struct {
		table float64
		above bool
	}{{1e-9, true}, {100, false}} {
		cal := &parallel.Calibration{}
		for _, m := range grid.GEMMRows {
			for _, k := range grid.GEMMDims {
				for _, n := range grid.GEMMDims {
					cal.GEMM = append(cal.GEMM, parallel.GEMMPoint{M: m, K: k, N: n, Fwd: c.table, Bwd: c.table})
				}
			}
		}
		drift, err := gemmDrift(slow, cal, grid, time.Millisecond)
		require.NoError(t, err)
		if c.above {
			require.Greater(t, drift, driftLimit)
		} else {
			require.Less(t, drift, 1/driftLimit)
		}
		require.Contains(t, driftWarning(drift), "calibrate again on a quiet machine")
	}
	require.Empty(t, driftWarning(1.1))
	require.Empty(t, driftWarning(0.9))
	_, err := gemmDrift(slow, &parallel.Calibration{}, grid, time.Millisecond)
	require.ErrorContains(t, err, "not in the grid")
}
