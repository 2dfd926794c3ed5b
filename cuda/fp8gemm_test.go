//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/stretchr/testify/require"
)

// fp8Case is one FP8 product's operands on the device, quantised there, with
// their codes and scale inverses read back for the host's reference.
type fp8Case struct {
	q, inv tensor.Buffer
	vals   []float64 // the dequantised values (code value × scale inverse)
}

func quantFP8(t *testing.T, k *Kernels, m tensor.Memory, r *rand.Rand, n int, scale float32, f tensor.FP8Format) fp8Case {
	t.Helper()
	x := make([]float32, n)
	for i := range x {
		x[i] = (2*r.Float32() - 1) * scale
	}
	dt := tensor.Float8E4M3
	if f == tensor.E5M2 {
		dt = tensor.Float8E5M2
	}
	xb, amax, s := m.Alloc(tensor.Float32, n), m.Alloc(tensor.Float64, 1), m.Alloc(tensor.Float32, 1)
	m.Write(xb, x)
	c := fp8Case{q: m.Alloc(dt, n), inv: m.Alloc(tensor.Float32, 1)}
	k.Amax(amax, xb, false)
	k.FP8Scale(s, amax, f, 0)
	k.Quantize(c.q, c.inv, xb, s)
	codes, inv := make([]float32, n), make([]float32, 1)
	m.Read(codes, c.q)
	m.Read(inv, c.inv)
	require.NoError(t, m.Err())
	c.vals = make([]float64, n)
	for i, v := range codes {
		c.vals[i] = float64(v) * float64(inv[0])
	}
	return c
}

// TestFP8NativeProducts: on a device of compute capability 8.9 or later (the
// host emulator reports 9.0) the FP8 products whose operands meet
// cuBLASLt's FP8 rules run on its FP8 kernels, the backward's operands
// transposed into scratch first; those that do not, on the widening path.
// Both paths against the float64 product of the dequantised operands, for
// fp32 and bf16 outputs, E5M2 and E4M3 output gradients, a product into a
// zeroed and into an accumulated output, with and without dinp. Tolerance:
// 1e-5 of the sum of the terms' magnitudes (fp32 sums over at most 80
// terms, in any order cuBLASLt picks: 80·2⁻²⁴ ≈ 5e-6), plus half an ulp of
// the output's dtype where it is bf16 (one rounding of the fp32 result).
func TestFP8NativeProducts(t *testing.T) {
	k := dev.Kernels()
	m := k.NewMemory()
	type shape struct {
		BT, C, OC int
		// fwd and bwd: the forward's product and the backward's fit
		// cuBLASLt's FP8 rules (C, and OC and BT, multiples of 16).
		fwd, bwd bool
	}
	for _, sh := range []shape{{48, 64, 80, true, true}, {48, 40, 80, false, true}, {40, 64, 80, true, false}} {
		for _, grad := range []tensor.FP8Format{tensor.E5M2, tensor.E4M3} {
			for _, odt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
				for _, acc := range []bool{false, true} {
					for _, withDx := range []bool{true, false} {
						name := fmt.Sprintf("%dx%dx%d/%v/%v/acc=%v/dinp=%v", sh.BT, sh.C, sh.OC, grad, odt, acc, withDx)
						t.Run(name, func(t *testing.T) {
							r := rand.New(rand.NewPCG(uint64(sh.BT*sh.C), 11))
							BT, C, OC := sh.BT, sh.C, sh.OC
							x := quantFP8(t, k, m, r, BT*C, 2, tensor.E4M3)
							w := quantFP8(t, k, m, r, OC*C, 0.2, tensor.E4M3)
							dy := quantFP8(t, k, m, r, BT*OC, 1e-3, grad)
							start := func(n int) ([]float32, tensor.Buffer) {
								v := make([]float32, n)
								for i := range v {
									v[i] = float32(r.NormFloat64())
									if odt == tensor.BFloat16 {
										v[i] = tensor.ToBF16(v[i]).Float32()
									}
								}
								b := m.Alloc(odt, n)
								m.Write(b, v)
								return v, b
							}
							for _, widen := range []bool{false, true} {
								dev.Do(func() { dev.widenFP8 = widen })
								out0, out := start(BT * OC)
								dx0, dx := start(BT * C)
								dw0, dw := start(OC * C)
								dinp := dx
								if !withDx {
									dinp = tensor.Buffer{}
								}
								dev.Do(func() { dev.CountTraffic(true) })
								k.Matmul(out, x.q, w.q, tensor.MatmulShape{BT: BT, C: C, OC: OC, Scales: tensor.MatmulScales{Inp: x.inv, Weight: w.inv}}, acc)
								k.MatmulBackward(dinp, dw, dy.q, x.q, w.q, tensor.MatmulShape{BT: BT, C: C, OC: OC, Scales: tensor.MatmulScales{Inp: x.inv, Weight: w.inv, Dout: dy.inv}}, acc)
								var tr Traffic
								dev.Do(func() { tr = dev.Traffic(); dev.CountTraffic(false); dev.widenFP8 = false })
								require.NoError(t, m.Err())
								fp8Gemms, transposes := int64(0), tr["transpose_u8"].Ops
								for op, kt := range tr {
									if strings.HasPrefix(op, "gemm f8") {
										fp8Gemms += kt.Ops
									}
								}
								var wantGemms, wantT int64
								if sh.fwd && !widen {
									wantGemms++
								}
								if sh.bwd && !widen {
									wantGemms, wantT = wantGemms+1, 2 // dweight: x and dout transposed
									if withDx {
										wantGemms, wantT = wantGemms+1, 3 // dinp: w transposed
									}
								}
								require.Equal(t, wantGemms, fp8Gemms, "FP8 products on cuBLASLt's FP8 kernels (traffic %v)", tr)
								require.Equal(t, wantT, transposes, "operands transposed")
								check := func(what string, b tensor.Buffer, was []float32, add bool, ref func(i int) (sum, mag float64)) {
									got := make([]float32, b.Len())
									m.Read(got, b)
									require.NoError(t, m.Err())
									for i, g := range got {
										s, mag := ref(i)
										if add {
											s += float64(was[i])
											mag += math.Abs(float64(was[i]))
										}
										tol := 1e-5 * mag
										if odt == tensor.BFloat16 {
											tol += math.Abs(s) * 0x1p-8
										}
										require.InDelta(t, s, float64(g), tol+1e-30, "%s[%d] (widen=%v)", what, i, widen)
									}
								}
								check("out", out, out0, acc, func(i int) (float64, float64) {
									return dotAbs(x.vals[i/OC*C:], 1, w.vals[i%OC*C:], 1, C)
								})
								if withDx {
									check("dinp", dx, dx0, acc, func(i int) (float64, float64) {
										return dotAbs(dy.vals[i/C*OC:], 1, w.vals[i%C:], C, OC)
									})
								}
								check("dweight", dw, dw0, true, func(i int) (float64, float64) {
									return dotAbs(dy.vals[i/C:], OC, x.vals[i%C:], C, BT)
								})
							}
						})
					}
				}
			}
		}
	}
}

// dotAbs is Σ a[i·sa]·b[i·sb] over n terms and the sum of the terms'
// magnitudes (a product's reference and the scale of its rounding error).
func dotAbs(a []float64, sa int, b []float64, sb, n int) (sum, mag float64) {
	for i := range n {
		v := a[i*sa] * b[i*sb]
		sum, mag = sum+v, mag+math.Abs(v)
	}
	return sum, mag
}

// TestTransposeFP8: transpose_u8 moves every code, over tiles cut at both
// edges (rows and columns not multiples of 32) and a one-row matrix.
func TestTransposeFP8(t *testing.T) {
	k := dev.Kernels()
	m := k.NewMemory()
	for _, sh := range [][2]int{{70, 33}, {1, 45}, {64, 32}} {
		rows, cols := sh[0], sh[1]
		codes := make([]tensor.F8E4M3, rows*cols)
		for i := range codes {
			codes[i] = tensor.F8E4M3(i*7 + i/cols)
		}
		in := m.Alloc(tensor.Float8E4M3, rows*cols)
		m.Write(in, codes)
		require.NoError(t, m.Err())
		got := make([]tensor.F8E4M3, rows*cols)
		var err error
		dev.Do(func() {
			b, ok := m.(*Memory).Device("transpose", in)
			if !ok {
				err = fmt.Errorf("the FP8 buffer is not the device memory's")
				return
			}
			dev.Download(got, dev.transposed(b, rows, cols, scratchFP8TA))
			err = dev.Err()
		})
		require.NoError(t, err)
		for r := range rows {
			for c := range cols {
				require.Equal(t, codes[r*cols+c], got[c*rows+r], "%dx%d: in[%d][%d]", rows, cols, r, c)
			}
		}
	}
}
