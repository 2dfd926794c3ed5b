package trainer

import (
	"errors"
	"maps"
	"math"
	"slices"
	"strconv"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slowerMachine is c as another machine would measure it whose arithmetic
// takes g times as long and whose memory s times: every matmul, attention
// and per-call time g times c's, every memory-bound kernel, collective and
// per-byte time s times (written out here, apart from Calibration.Scaled).
func slowerMachine(c *parallel.Calibration, g, s float64) *parallel.Calibration {
	out := *c
	out.GEMM, out.GEMMBF16, out.Attention = slices.Clone(c.GEMM), slices.Clone(c.GEMMBF16), slices.Clone(c.Attention)
	for _, pts := range [][]parallel.GEMMPoint{out.GEMM, out.GEMMBF16} {
		for i := range pts {
			pts[i].Fwd *= g
			pts[i].Bwd *= g
		}
	}
	for i := range out.Attention {
		out.Attention[i].Fwd *= g
		out.Attention[i].Bwd *= g
	}
	out.Stream, out.Collectives = maps.Clone(c.Stream), maps.Clone(c.Collectives)
	for _, m := range []map[string]parallel.Linear{out.Stream, out.Collectives} {
		for k, l := range m {
			m[k] = parallel.Linear{Fixed: s * l.Fixed, PerUnit: s * l.PerUnit}
		}
	}
	out.PerCall *= g
	out.InStepGEMMPerByte *= s
	out.InStepGEMMPerByteBF16 *= s
	out.InStepExpertsStall *= s
	out.InStepExpertsStallSlope *= s
	out.InStepExpertsStallBF16 *= s
	out.InStepExpertsStallSlopeBF16 *= s
	out.Index()
	return &out
}

// stepTimeWith is the plan's step time of recipe (with sets) timed by c.
func stepTimeWith(t *testing.T, c *parallel.Calibration, recipe string, sets ...string) float64 {
	t.Helper()
	res, diags := config.Load(recipe, config.Options{Sets: sets})
	require.False(t, diags.HasErrors(), "%v", diags)
	topo, err := parallel.TopologyOf(res.Recipe.Parallel, parallel.Calibrations(nil).With(c))
	require.NoError(t, err)
	p, err := parallel.Compile(&res.Recipe, topo)
	require.NoError(t, err)
	return p.StepTimeS
}

// TestProbeBringsThePlanBack: the shipped table times the step of a machine
// 1.8× slower in arithmetic and 1.35× in memory 1.3 to 1.8 times too fast;
// the probe, its kernels timed on that machine with errors of up to 4% each
// (injected: no timing here), scales the table so that the plans of tiny and
// moe-tiny at 1 and 2 ranks come within those 4% of the slower machine's own.
func TestProbeBringsThePlanBack(t *testing.T) {
	const g, s, e = 1.8, 1.35, 0.04
	shipped := parallel.Calibrations(nil).For("cpu")
	require.NotNil(t, shipped)
	slow := slowerMachine(shipped, g, s)
	// The probe's measurements on the slower machine, each off by up to e.
	errs := []float64{1 + e, 1 - e, 1 + e/2, 1 - e/2, 1 + e, 1 + e}
	var timed [][3]int
	p, err := probeOf(shipped, func(sh [3]int) (float64, float64, error) {
		i := slices.IndexFunc(slow.GEMM, func(p parallel.GEMMPoint) bool { return [3]int{p.M, p.K, p.N} == sh })
		require.GreaterOrEqual(t, i, 0, "%v is on the grid", sh)
		k := 2 * len(timed)
		timed = append(timed, sh)
		return slow.GEMM[i].Fwd * errs[k], slow.GEMM[i].Bwd * errs[k+1], nil
	}, func() (float64, error) {
		return slow.Stream[parallel.ProbeStreamKind].Time(parallel.ProbeStreamElements) * (1 - e), nil
	})
	require.NoError(t, err)
	assert.Equal(t, [][3]int{{1024, 256, 256}, {8192, 256, 256}, {1024, 512, 512}}, timed, "the drift check's shapes on the shipped grid")
	assert.InDelta(t, g, p.GEMM, g*e+1e-9)
	assert.InDelta(t, s, p.Stream, s*e+1e-9)
	scaled, err := shipped.Scaled(p)
	require.NoError(t, err)
	for _, recipe := range []string{"../recipes/tiny.toml", "../recipes/moe-tiny.toml"} {
		for _, world := range []int{1, 2} {
			sets := []string{"parallel.world_size=" + strconv.Itoa(world), "train.global_batch_size=" + strconv.Itoa(16*world)}
			truth := stepTimeWith(t, slow, recipe, sets...)
			plain := stepTimeWith(t, shipped, recipe, sets...)
			probed := stepTimeWith(t, scaled, recipe, sets...)
			t.Logf("%s, %d ranks: the slower machine's step %.1f ms; shipped table %.2f× that, probed %.3f×", recipe, world, 1e3*truth, plain/truth, probed/truth)
			assert.Less(t, plain/truth, 1/1.3, "the shipped table is far off")
			assert.LessOrEqual(t, math.Abs(probed/truth-1), e+1e-9, "the probe brings it back")
		}
	}
}

// TestProbeRefusesWhatItCannotCompare: a table without the drift check's
// matmul, a kernel that fails, or factors beyond 64× are errors that say what
// to do; none is a panic.
func TestProbeRefusesWhatItCannotCompare(t *testing.T) {
	shipped := parallel.Calibrations(nil).For("cpu")
	ok := func(sh [3]int) (float64, float64, error) { return 1e-3, 2e-3, nil }
	stream := func() (float64, error) { return 1e-3, nil }
	holed := *shipped
	holed.GEMM = slices.DeleteFunc(slices.Clone(shipped.GEMM), func(p parallel.GEMMPoint) bool { return p.M == 8192 && p.K == 256 && p.N == 256 })
	_, err := probeOf(&holed, ok, stream)
	assert.ErrorContains(t, err, "matmul 8192×256×256 is not in the calibration's grid")
	assert.ErrorContains(t, err, "shardline calibrate")
	_, err = probeOf(&parallel.Calibration{}, ok, stream)
	assert.ErrorContains(t, err, "has no matmuls to compare with")
	_, err = probeOf(shipped, func([3]int) (float64, float64, error) { return 0, 0, errors.New("out of memory") }, stream)
	assert.ErrorContains(t, err, "out of memory")
	_, err = probeOf(shipped, ok, func() (float64, error) { return 1e6, nil })
	assert.ErrorContains(t, err, "probe stream_factor is")
	assert.ErrorContains(t, err, "plan again")
}
