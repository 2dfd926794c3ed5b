package trainer

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor/cpu"
)

// TestCalibrateSmallGrid: Calibrate over a small grid measures every table the
// plan's step model reads (ParseCalibration accepts the result: every stream kernel,
// matmul and attention point present and positive), says where it ran, and fits the
// in-step factors to its five model passes: the matmuls' from their own time
// inside the passes, the rest by least squares.
func TestCalibrateSmallGrid(t *testing.T) {
	grid := CalibrationGrid{GEMMRows: []int{16, 64}, GEMMDims: []int{16, 32}, AttnT: []int{32, 64}, AttnHD: []int{16, 32}, CollectiveSizes: []int{2}}
	c, err := Calibrate(cpu.Backend{}, grid, time.Millisecond, nil)
	require.NoError(t, err)
	c.Source = "shardline calibrate test"
	b, err := json.Marshal(c)
	require.NoError(t, err)
	back, err := parallel.ParseCalibration(b)
	require.NoError(t, err)
	require.Len(t, back.GEMM, 8)
	require.Len(t, back.Attention, 8)
	require.Len(t, back.InStepSamples, 5)
	require.Greater(t, back.InStep, 0.0)
	require.GreaterOrEqual(t, back.PerCall, 0.0)
	require.Greater(t, back.InStepGEMM, 0.0, "the matmuls' own in-step factor")
	require.Greater(t, back.InStepAttention, 0.0, "attention's own in-step factor")
	for _, k := range append(slices.Clone(parallel.StreamKinds), parallel.LaterStreamKinds...) {
		require.Contains(t, back.Stream, k, "every memory-bound kernel is measured")
	}
	for _, smp := range back.InStepSamples {
		require.Greater(t, smp.GEMMMeasured, 0.0, smp.Model)
		require.Greater(t, smp.AttnMeasured, 0.0, smp.Model)
		require.Less(t, smp.GEMMMeasured+smp.AttnMeasured, smp.Measured, "%s: the matmuls and attention are part of the pass", smp.Model)
		require.Greater(t, smp.GEMMTables, 0.0, smp.Model)
		require.Greater(t, smp.AttnTables, 0.0, smp.Model)
	}
	require.Contains(t, back.Collectives, parallel.CollectiveKey(parallel.SendRecv, 2))
	require.Contains(t, back.Host, "CPUs")
	require.Contains(t, back.Collectives, parallel.CollectiveKey(parallel.AllGather, 2))
}
