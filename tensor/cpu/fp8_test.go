package cpu

import (
	"fmt"
	"math"
	"math/rand"
	"testing"

	"github.com/shardline/shardline/tensor"
)

// fp8Of quantises x to format f at scale s (saturating) and returns the codes
// with their values (exact float32s).
func fp8Of(x []float32, f tensor.FP8Format, s float32) ([]uint8, []float32) {
	q := make([]uint8, len(x))
	f.Quantize(q, x, s, true)
	v := make([]float32, len(x))
	for i, c := range q {
		v[i] = f.Decode(c)
	}
	return q, v
}

// TestSgemmFP8: SgemmFP8 is Sgemm on B's values bit for bit (codes widened as
// the panels are packed, exactly), for both formats, B transposed or not,
// shapes with edge panels and K blocks, alpha ≠ 1 and beta 0 and 1, under
// every micro-kernel level.
func TestSgemmFP8(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(8))
		for _, f := range []tensor.FP8Format{tensor.E4M3, tensor.E5M2} {
			for _, sh := range [][3]int{{48, 64, 40}, {37, 70, 33}, {12, 33, 600}} {
				M, N, K := sh[0], sh[1], sh[2]
				for _, tB := range []bool{false, true} {
					for _, beta := range []float32{0, 1} {
						A := randSlice(r, M*K)
						q, bv := fp8Of(randSlice(r, K*N), f, 30)
						ldb := N
						if tB {
							ldb = K
						}
						c0 := randSlice(r, M*N)
						got, want := append([]float32(nil), c0...), append([]float32(nil), c0...)
						const alpha = 0.0123
						SgemmFP8(false, tB, M, N, K, alpha, A, K, q, f, ldb, beta, got, N)
						Sgemm(false, tB, M, N, K, alpha, A, K, bv, ldb, beta, want, N)
						for i := range want {
							if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
								t.Fatalf("%v %dx%dx%d transB %v beta %v: C[%d] = %v, want %v (Sgemm on the values)", f, M, N, K, tB, beta, i, got[i], want[i])
							}
						}
					}
				}
			}
		}
	})
}

// BenchmarkMatmulFP8 runs a linear layer's three products (forward, input
// and weight gradients, fp32 output gradient) through the kernel set with
// fp32 weights, bf16 weights (widened as packed), and E4M3 weights and
// inputs (codes widened as packed or into scratch; α from the scale
// inverses), on two of BenchmarkMatmulBF16's shapes.
func BenchmarkMatmulFP8(b *testing.B) {
	k := Backend{}
	for _, s := range []struct {
		name      string
		BT, C, OC int
	}{{"768x128x384", 768, 128, 384}, {"2048x512x1536", 2048, 512, 1536}} {
		r := rand.New(rand.NewSource(3))
		m := NewMemory()
		x32, w32 := randSlice(r, s.BT*s.C), randSlice(r, s.OC*s.C)
		out, dinp, dout := m.Alloc(tensor.Float32, s.BT*s.OC), m.Alloc(tensor.Float32, s.BT*s.C), m.Alloc(tensor.Float32, s.BT*s.OC)
		dw := m.Alloc(tensor.Float32, s.OC*s.C)
		m.Write(dout, randSlice(r, s.BT*s.OC))
		for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16, tensor.Float8E4M3} {
			x, w := m.Alloc(tensor.Float32, s.BT*s.C), m.Alloc(dt, s.OC*s.C)
			m.Write(x, x32)
			sh := tensor.MatmulShape{BT: s.BT, C: s.C, OC: s.OC}
			if dt == tensor.Float8E4M3 {
				xq := m.Alloc(dt, s.BT*s.C)
				inv, scale, amax := m.Alloc(tensor.Float32, 2), m.Alloc(tensor.Float32, 2), m.Alloc(tensor.Float64, 2)
				wf := m.Alloc(tensor.Float32, s.OC*s.C)
				m.Write(wf, w32)
				for i, v := range []tensor.Buffer{x, wf} {
					k.Amax(amax.Slice(i, i+1), v, false)
					k.FP8Scale(scale.Slice(i, i+1), amax.Slice(i, i+1), tensor.E4M3, 0)
				}
				k.Quantize(xq, inv.Slice(0, 1), x, scale.Slice(0, 1))
				k.Quantize(w, inv.Slice(1, 2), wf, scale.Slice(1, 2))
				x = xq
				sh.Scales = tensor.MatmulScales{Inp: inv.Slice(0, 1), Weight: inv.Slice(1, 2)}
			} else {
				m.Write(w, w32)
			}
			b.Run(fmt.Sprintf("%s/%s", s.name, dt), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					k.Matmul(out, x, w, sh, false)
					k.MatmulBackward(dinp, dw, dout, x, w, sh, false)
				}
				b.ReportMetric(6*float64(s.BT*s.C*s.OC)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
			if err := m.Err(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// TestFP8KernelsChunked: Amax and Quantize over more values than one chunk
// of the cores' share (fp8Per) give what tensor.Amax and
// tensor.FP8Format.Quantize give over the whole buffer, on any number of
// cores: a NaN in the last chunk makes the amax NaN, and without it the
// largest |x|, wherever it lies, is the amax.
func TestFP8KernelsChunked(t *testing.T) {
	const n = 5*fp8Per + 77
	r := rand.New(rand.NewSource(5))
	x := randSlice(r, n)
	x[3*fp8Per+5] = -40 // the amax, in a middle chunk
	k, m := Backend{}, NewMemory()
	xb, amax := m.Alloc(tensor.Float32, n), m.Alloc(tensor.Float64, 1)
	m.Write(xb, x)
	k.Amax(amax, xb, false)
	got := make([]float64, 1)
	m.Read(got, amax)
	if want := float64(tensor.Amax(x)); got[0] != want || want != 40 {
		t.Fatalf("Amax over %d values = %v, want %v (40)", n, got[0], want)
	}
	scale, inv := m.Alloc(tensor.Float32, 1), m.Alloc(tensor.Float32, 1)
	k.FP8Scale(scale, amax, tensor.E5M2, 0)
	q := m.Alloc(tensor.Float8E5M2, n)
	k.Quantize(q, inv, xb, scale)
	codes := make([]tensor.F8E5M2, n)
	m.Read(codes, q)
	want := make([]uint8, n)
	tensor.E5M2.Quantize(want, x, tensor.E5M2.CurrentScale(40), true)
	for i, c := range codes {
		if uint8(c) != want[i] {
			t.Fatalf("Quantize: code %d = %#02x, want %#02x", i, c, want[i])
		}
	}
	x[n-3] = float32(math.NaN())
	m.Write(xb, x)
	k.Amax(amax, xb, false)
	m.Read(got, amax)
	if !math.IsNaN(got[0]) {
		t.Fatalf("Amax with a NaN in the last chunk = %v, want NaN", got[0])
	}
	if err := m.Err(); err != nil {
		t.Fatal(err)
	}
}
