//go:build cuda || cudaemu

package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTrafficCounts: a product and a norm count one operation each with their
// operands' bytes (a product's output read as well when it accumulates), a
// copy and a fill theirs, and nothing is counted once counting stops. On the
// host emulator a dry run counts the same and leaves the outputs untouched.
func TestTrafficCounts(t *testing.T) {
	const BT, C, OC = 4, 8, 16
	ones := func(n int, v float32) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = v
		}
		return x
	}
	var x, w, y, out, rstd, nw Buffer
	onDevice(t, func() {
		x, w, y = put(t, BF16, ones(BT*C, 1)), put(t, BF16, ones(OC*C, 0.5)), put(t, F32, ones(BT*OC, 7))
		out, rstd, nw = put(t, BF16, ones(BT*C, 0)), put(t, F32, ones(BT, 0)), put(t, BF16, ones(C, 1))
	})
	step := func() {
		onDevice(t, func() {
			dev.Matmul(y, x, w, MatmulShape{BT: BT, C: C, OC: OC}, true)
			dev.RMSNorm(out, rstd, x, nw, BT, C, 1e-5)
			dev.Copy(out, x)
			dev.Zero(rstd)
		})
	}
	gemm := KernelTraffic{Ops: 1, Read: (BT*C+OC*C)*2 + BT*OC*4, Written: BT * OC * 4}
	norm := KernelTraffic{Ops: 1, Read: BT*C*2 + C*2, Written: BT*C*2 + BT*4}
	want := Traffic{
		"gemm bf16·bf16→f32": gemm,
		"rmsnorm_bf16":       norm,
		"copy":               {Ops: 1, Read: BT * C * 2, Written: BT * C * 2},
		"memset":             {Ops: 1, Written: BT * 4},
	}
	dev.CountTraffic(true)
	step()
	require.Equal(t, want, dev.Traffic())
	require.Equal(t, gemm.add(norm), dev.Traffic().Kernels(), "copies and fills are not kernels")
	dev.CountTraffic(false)
	step()
	require.Equal(t, want, dev.Traffic(), "counted after counting stopped")
	if !Emulated {
		require.Error(t, dev.SetDryRun(true))
		return
	}
	var before, after []float32
	onDevice(t, func() { before = get(y) })
	require.NoError(t, dev.SetDryRun(true))
	dev.CountTraffic(true)
	step()
	require.Equal(t, want, dev.Traffic())
	dev.CountTraffic(false)
	require.NoError(t, dev.SetDryRun(false))
	onDevice(t, func() { after = get(y) })
	require.Equal(t, before, after, "a dry run ran the product")
}
