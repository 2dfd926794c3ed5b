//go:build cuda || cudaemu

package cuda

import (
	"math/rand/v2"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/stretchr/testify/require"
)

// TestFP8ProductsIntoBF16: the FP8 products write bf16 outputs and
// gradients (a bf16-native run's activations, input gradients and bf16
// weight gradients) as their fp32 results rounded once to nearest, ties to
// even, bit for bit: the same fp32 product, then the rounding (the CPU's
// kernels take no bf16 output, so tensor/kerneltest cannot hold this).
func TestFP8ProductsIntoBF16(t *testing.T) {
	const BT, C, OC = 19, 24, 12
	k := dev.Kernels()
	m := k.NewMemory()
	r := rand.New(rand.NewPCG(4, 7))
	quant := func(n int, scale float32, dt tensor.DType, f tensor.FP8Format) (q, inv tensor.Buffer) {
		x := make([]float32, n)
		for i := range x {
			x[i] = (2*r.Float32() - 1) * scale
		}
		xb, amax, s := m.Alloc(tensor.Float32, n), m.Alloc(tensor.Float64, 1), m.Alloc(tensor.Float32, 1)
		m.Write(xb, x)
		q, inv = m.Alloc(dt, n), m.Alloc(tensor.Float32, 1)
		k.Amax(amax, xb, false)
		k.FP8Scale(s, amax, f, 0)
		k.Quantize(q, inv, xb, s)
		return q, inv
	}
	x, xi := quant(BT*C, 2, tensor.Float8E4M3, tensor.E4M3)
	w, wi := quant(OC*C, 0.2, tensor.Float8E4M3, tensor.E4M3)
	dy, di := quant(BT*OC, 1e-3, tensor.Float8E5M2, tensor.E5M2)
	s := tensor.MatmulShape{BT: BT, C: C, OC: OC, Scales: tensor.MatmulScales{Inp: xi, Weight: wi, Dout: di}}
	fwd := tensor.MatmulShape{BT: BT, C: C, OC: OC, Scales: tensor.MatmulScales{Inp: xi, Weight: wi}}
	outs := map[tensor.DType][3]tensor.Buffer{}
	for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
		out, dx, dw := m.Alloc(dt, BT*OC), m.Alloc(dt, BT*C), m.Alloc(dt, OC*C)
		k.Matmul(out, x, w, fwd, false)
		k.MatmulBackward(dx, dw, dy, x, w, s, false)
		outs[dt] = [3]tensor.Buffer{out, dx, dw}
	}
	require.NoError(t, m.Err())
	for i, name := range []string{"out", "dinp", "dweight"} {
		f, h := outs[tensor.Float32][i], outs[tensor.BFloat16][i]
		want, got := make([]float32, f.Len()), make([]float32, h.Len())
		m.Read(want, f)
		m.Read(got, h)
		require.NoError(t, m.Err())
		nonzero := 0
		for j, v := range want {
			require.Equal(t, tensor.ToBF16(v).Float32(), got[j], "%s[%d]: the bf16 output is not the fp32 one rounded", name, j)
			if v != 0 {
				nonzero++
			}
		}
		require.Greater(t, nonzero, len(want)/2, "%s: the product left its output zero", name)
	}
}
