package trainer

import (
	"math"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/stretchr/testify/require"
)

// TestHostSpeed: the host's speed against a calibration is the geometric mean of
// now/then over the calibration's passes of the run's precision, with the passes'
// timing given (no clock: deterministic). Passes of models calibrate no longer
// has, or of the other precision, are skipped, and a model's rounds count
// once; none at all is an error that says to recalibrate.
func TestHostSpeed(t *testing.T) {
	c := &parallel.Calibration{Host: "h", Date: "d", InStepSamples: []parallel.InStepSample{
		{Model: calibrationModels[0].name, Measured: 0.010},
		{Model: calibrationModels[1].name, Measured: 0.040},
		{Model: calibrationModels[1].name, BF16: true, Measured: 0.030},
		{Model: "a model calibrate no longer has", Measured: 1},
	}}
	now := map[int]float64{calibrationModels[0].model.Hidden: 0.020, calibrationModels[1].model.Hidden: 0.050} // the two models differ in width
	measure := func(m config.Model, batch int) (float64, error) { return now[m.Hidden], nil }
	r, n, err := hostSpeed(c, false, measure)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.InDelta(t, math.Sqrt(2.0*1.25), r, 1e-12, "geometric mean of 2 and 1.25")
	r, n, err = hostSpeed(c, true, measure)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.InDelta(t, 0.050/0.030, r, 1e-12)
	// Rounds of a model (calibrate's interleaved rounds): its median round
	// stands for it, rerun once; a pass the fit left out as disturbed is not
	// rerun.
	c.InStepSamples = append(c.InStepSamples, parallel.InStepSample{Model: calibrationModels[0].name, Measured: 0.030},
		parallel.InStepSample{Model: calibrationModels[0].name, Measured: 0.005},
		parallel.InStepSample{Model: calibrationModels[2].name, Measured: 0.1, Disturbed: true})
	r, n, err = hostSpeed(c, false, measure)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.InDelta(t, math.Sqrt(2.0*1.25), r, 1e-12, "the median of 0.010, 0.030 and 0.005")
	_, _, err = hostSpeed(&parallel.Calibration{Host: "h", Date: "d"}, false, measure)
	require.ErrorContains(t, err, "recalibrate with shardline calibrate")
}
