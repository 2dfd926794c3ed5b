//go:build cuda || cudaemu

package cuda

import (
	"testing"

	"github.com/shardline/shardline/tensor"
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

// TestTrafficBF16Gradients: the kernels adding into bf16 parameter gradients
// count a bf16 gradient's 2 bytes a value. A weight gradient's product of bf16
// operands writes its bf16 C directly (read too: β = 1); one of fp32 operands
// is an fp32 product into scratch and gemm_epilogue_bf16 (the scratch's 4
// bytes, C's 2 read and written). The embedding's backward into a bf16 table
// is its links (tokens read, a link per token written, a first token per row
// read and written) and its chains (the table read and written).
func TestTrafficBF16Gradients(t *testing.T) {
	const BT, C, OC, N = 6, 8, 16, 10
	x32, dy32 := make([]float32, BT*C), make([]float32, BT*OC)
	var x, dy, xb, dyb, dw Buffer
	onDevice(t, func() {
		x, dy, xb, dyb = put(t, F32, x32), put(t, F32, dy32), put(t, BF16, x32), put(t, BF16, dy32)
		dw = put(t, BF16, make([]float32, OC*C))
	})
	dev.CountTraffic(true)
	onDevice(t, func() {
		dev.MatmulBackward(Buffer{}, dw, dy, x, Buffer{}, MatmulShape{BT: BT, C: C, OC: OC}, false)
		dev.MatmulBackward(Buffer{}, dw, dyb, xb, Buffer{}, MatmulShape{BT: BT, C: C, OC: OC}, false)
	})
	require.Equal(t, Traffic{
		"gemm f32·f32→f32":    {Ops: 1, Read: (C*BT + BT*OC) * 4, Written: C * OC * 4},
		"gemm_epilogue_bf16":  {Ops: 1, Read: C*OC*4 + C*OC*2, Written: C * OC * 2},
		"gemm bf16·bf16→bf16": {Ops: 1, Read: (C*BT+BT*OC)*2 + C*OC*2, Written: C * OC * 2},
	}, dev.Traffic())

	k := dev.Kernels()
	m := k.NewMemory()
	dwte, dout, tok := m.Alloc(tensor.BFloat16, N*C), m.Alloc(tensor.BFloat16, BT*C), m.Alloc(tensor.Int32, BT)
	m.Write(tok, []int32{1, 2, 1, 9, 0, 1})
	require.NoError(t, m.Err())
	dev.CountTraffic(true)
	k.EmbeddingBackward(dwte, dout, tok, tensor.EmbeddingShape{BT: BT, C: C, N: N})
	require.Equal(t, Traffic{
		"embedding_backward_links":            {Ops: 1, Read: BT*4 + N*4, Written: BT*4 + N*4},
		"embedding_backward_chains_bf16_bf16": {Ops: 1, Read: N*C*2 + BT*C*2 + BT*4 + BT*4 + N*4, Written: N * C * 2},
	}, dev.Traffic())
	dev.CountTraffic(false)
	require.NoError(t, m.Err())
}

// TestTrafficFP8: the FP8 kernels count an FP8 value's 1 byte. Current
// scaling of an fp32 x is its amax (partial maxima in f64, then one), its
// scale (the amax read, the f32 scale written) and its codes (x and the scale
// read, a byte a value and the scale inverse written); a product of E4M3
// operands widens its first operand times α (the codes and both scale
// inverses read, fp32 written) and its second (cast_e4m3_f32), then
// multiplies them in fp32.
func TestTrafficFP8(t *testing.T) {
	const BT, C, OC = 4, 8, 16
	k := dev.Kernels()
	m := k.NewMemory()
	x, w := m.Alloc(tensor.Float32, BT*C), m.Alloc(tensor.Float32, OC*C)
	m.Fill(x, 0.5)
	m.Fill(w, 0.25)
	xq, wq := m.Alloc(tensor.Float8E4M3, BT*C), m.Alloc(tensor.Float8E4M3, OC*C)
	amax, scale, xinv, wscale, winv := m.Alloc(tensor.Float64, 1), m.Alloc(tensor.Float32, 1), m.Alloc(tensor.Float32, 1), m.Alloc(tensor.Float32, 1), m.Alloc(tensor.Float32, 1)
	m.Fill(wscale, 2)
	out := m.Alloc(tensor.Float32, BT*OC)
	require.NoError(t, m.Err())
	dev.CountTraffic(true)
	k.Amax(amax, x, false)
	k.FP8Scale(scale, amax, tensor.E4M3, 0)
	k.Quantize(xq, xinv, x, scale)
	k.Quantize(wq, winv, w, wscale)
	k.Matmul(out, xq, wq, tensor.MatmulShape{BT: BT, C: C, OC: OC, Scales: tensor.MatmulScales{Inp: xinv, Weight: winv}}, false)
	got := dev.Traffic()
	dev.CountTraffic(false)
	require.NoError(t, m.Err())
	require.Equal(t, Traffic{
		"amax_partial_f32":  {Ops: 1, Read: BT * C * 4, Written: 8},
		"amax_finish":       {Ops: 1, Read: 8, Written: 8},
		"fp8_scale":         {Ops: 1, Read: 8, Written: 4},
		"quantize_f32_e4m3": {Ops: 2, Read: (BT*C+OC*C)*4 + 2*4, Written: BT*C + OC*C + 2*4},
		"widen_scaled_e4m3": {Ops: 1, Read: BT*C + 2*4, Written: BT * C * 4},
		"cast_e4m3_f32":     {Ops: 1, Read: OC * C, Written: OC * C * 4},
		"gemm f32·f32→f32":  {Ops: 1, Read: (BT*C + OC*C) * 4, Written: BT * OC * 4},
	}, got)
	y := make([]float32, BT*OC)
	m.Read(y, out)
	require.NoError(t, m.Err())
	require.Equal(t, float32(C*0.5*0.25), y[0], "0.5 and 0.25 quantise to the codes 448 and 0.5 (scales 896 and 2), and 448·(1/896 in fp32)·0.5 rounds to 0.25: every value of the product is exact")
}
