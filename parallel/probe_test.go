package parallel

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestScaledTableScalesThePlan: a table scaled by a probe whose two factors
// are equal times every CPU plan exactly that much longer (the step model is
// linear in the table's figures), at one rank and at two sharing the cores;
// the scaled table says so in the plan's time model and records the probe;
// the table it scaled is unchanged.
func TestScaledTableScalesThePlan(t *testing.T) {
	c := Calibrations(nil).For("cpu")
	require.NotNil(t, c)
	before := c.Digest()
	p := Probe{Host: "a slower machine", GEMM: 1.7, Stream: 1.7, Date: "2026-11-27T00:00:00Z", Table: c.Digest()}
	scaled, err := c.Scaled(p)
	require.NoError(t, err)
	assert.Equal(t, before, c.Digest(), "the shipped table is unchanged")
	require.NotNil(t, scaled.Probe)
	assert.Equal(t, c.Host, scaled.Unscaled.Host)
	assert.Equal(t, before, scaled.Unscaled.Digest)
	for _, recipe := range []string{"../recipes/tiny.toml", "../recipes/moe-tiny.toml"} {
		for _, world := range []string{"1", "2"} {
			r := &load(t, recipe, "parallel.world_size="+world, "train.global_batch_size="+map[string]string{"1": "16", "2": "32"}[world]).Recipe
			plain := compileWith(t, r, nil)
			fast := compileWith(t, r, Calibrations(nil).With(scaled))
			assert.InEpsilon(t, 1.7*plain.StepTimeS, fast.StepTimeS, 1e-9, "%s at %s ranks", recipe, world)
			assert.Contains(t, fast.TimeModel, "scaled to a slower machine by a probe (matmuls ×1.70, memory-bound kernels ×1.70")
			assert.NotContains(t, plain.TimeModel, "scaled")
		}
	}
}

// TestProbeCheck: a probe applies only to the table it was compared with,
// and only with finite factors within 64× either way.
func TestProbeCheck(t *testing.T) {
	c := Calibrations(nil).For("cpu")
	ok := Probe{GEMM: 1.2, Stream: 0.9, Table: c.Digest()}
	require.NoError(t, ok.Check(c))
	other := ok
	other.Table = strings.Repeat("0", 64)
	_, err := c.Scaled(other)
	assert.ErrorContains(t, err, "the probe was compared with the table 000000000000, not with this one")
	for _, f := range []float64{0, -1, 100, math.NaN(), math.Inf(1)} {
		bad := ok
		bad.Stream = f
		assert.ErrorContains(t, bad.Check(c), "probe stream_factor is", "%v", f)
	}
}
