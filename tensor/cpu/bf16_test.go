package cpu

import (
	"fmt"
	"math"
	"math/rand"
	"slices"
	"testing"

	"github.com/shardline/shardline/tensor"
)

// bf16Of rounds x to bf16 storage and returns it with its exact float32 widening.
func bf16Of(x []float32) ([]tensor.BF16, []float32) {
	h := make([]tensor.BF16, len(x))
	tensor.CastToBF16(h, x)
	w := make([]float32, len(x))
	tensor.CastToFloat32(w, h)
	return h, w
}

// TestSgemmBF16 holds SgemmBF16 to Sgemm on the widened B, bit for bit: widening
// is exact and the packed panels then hold the same float32 values, so the
// micro-kernels run the same sums in the same order. Shapes cover partial panels
// (N not a multiple of 32), several K blocks (K > 512), both layouts of B, beta
// 0 and 1, and products shared among the cores.
func TestSgemmBF16(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(7))
		shapes := [][3]int{{1, 1, 1}, {7, 33, 5}, {13, 70, 300}, {768, 384, 128}, {128, 768, 700}, {100, 1, 64}, {2, 3100, 17}}
		for _, s := range shapes {
			for _, tA := range []bool{false, true} {
				for _, tB := range []bool{false, true} {
					for _, beta := range []float32{0, 1} {
						M, N, K := s[0], s[1], s[2]
						name := fmt.Sprintf("%dx%dx%d/tA=%v/tB=%v/beta=%v", M, N, K, tA, tB, beta)
						lda, ldb, ldc, rowsA, rowsB := gemmLayout(M, N, K, tA, tB)
						A, C := randSlice(r, rowsA*lda), randSlice(r, M*ldc)
						Bh, Bw := bf16Of(randSlice(r, rowsB*ldb))
						want := slices.Clone(C)
						Sgemm(tA, tB, M, N, K, 1, A, lda, Bw, ldb, beta, want, ldc)
						SgemmBF16(tA, tB, M, N, K, 1, A, lda, Bh, ldb, beta, C, ldc)
						if !slices.Equal(want, C) {
							t.Fatalf("%s: the bf16 product differs from the float32 product of the widened B", name)
						}
					}
				}
			}
		}
	})
}

// TestBF16WeightKernels runs every kernel that reads weights on a bf16 view and
// on the float32 view of the same (widened) values: the outputs must agree bit
// for bit, since each kernel widens exactly and then computes as for float32.
func TestBF16WeightKernels(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		defer SetBF16Dot(false)() // the widening path; TestBF16DotKernels covers the other
		r := rand.New(rand.NewSource(8))
		const BT, C, OC, V = 37, 96, 130, 50
		inp, dout := randSlice(r, BT*C), randSlice(r, BT*OC)
		wh, ww := bf16Of(randSlice(r, OC*C))
		gh, gw := bf16Of(randSlice(r, C))
		eh, ew := bf16Of(randSlice(r, V*C))
		tokens := make([]int32, BT)
		for i := range tokens {
			tokens[i] = int32(r.Intn(V))
		}
		type outs struct{ mm, dinp, dw, emb, norm, rstd, dnorm, dgain []float32 }
		run := func(w, g, e tensor.Weights[float32]) outs {
			o := outs{mm: make([]float32, BT*OC), dinp: make([]float32, BT*C), dw: make([]float32, OC*C), emb: make([]float32, BT*C),
				norm: make([]float32, BT*C), rstd: make([]float32, BT), dnorm: make([]float32, BT*C), dgain: make([]float32, C)}
			s := tensor.MatmulShape{BT: BT, C: C, OC: OC}
			Matmul(o.mm, tensor.FloatWeights(inp), w, s, false)
			MatmulBackward(o.dinp, o.dw, dout, tensor.FloatWeights(inp), w, s, false)
			Embedding(o.emb, tokens, e, tensor.EmbeddingShape{BT: BT, C: C, N: V})
			RMSNorm(o.norm, o.rstd, inp, g, BT, C, 1e-5)
			RMSNormBackward(o.dnorm, o.dgain, o.norm, inp, g, o.rstd, BT, C, true)
			return o
		}
		a := run(tensor.BF16Weights[float32](wh), tensor.BF16Weights[float32](gh), tensor.BF16Weights[float32](eh))
		b := run(tensor.FloatWeights(ww), tensor.FloatWeights(gw), tensor.FloatWeights(ew))
		for name, pair := range map[string][2][]float32{"matmul": {a.mm, b.mm}, "dinp": {a.dinp, b.dinp}, "dweight": {a.dw, b.dw},
			"embedding": {a.emb, b.emb}, "rmsnorm": {a.norm, b.norm}, "rmsnorm dinp": {a.dnorm, b.dnorm}, "rmsnorm dweight": {a.dgain, b.dgain}} {
			if !slices.Equal(pair[0], pair[1]) {
				t.Errorf("%s: bf16 weights differ from their float32 widening", name)
			}
		}
		// float64 kernels (the gradient checks) widen bf16 weights too.
		m64 := make([]float64, BT*OC)
		Matmul(m64, tensor.FloatWeights(toF64(inp)), tensor.BF16Weights[float64](wh), tensor.MatmulShape{BT: BT, C: C, OC: OC}, false)
		for i, v := range m64 {
			if d := v - float64(b.mm[i]); d > 1e-3 || d < -1e-3 { // float32 vs float64 sums of 96 unit-size products
				t.Fatalf("float64 matmul on bf16 weights: element %d is %v, float32 gives %v", i, v, b.mm[i])
			}
		}
	})
}

// TestSgemmDotBF16 holds the bf16 dot-product GEMM, in AVX-512 BF16 where the
// CPU has it and in Go, to the float64 product of op(A)'s values rounded to bf16
// (after alpha) and B's: every product of two bf16 values is exact in float32, so
// the only error is float32 accumulation, bounded here by (K+2)·2⁻²² of the sum
// of the terms' magnitudes (a float32 sum of K terms errs by at most about
// K·2⁻²⁴ of it; the factor 4 is slack). That bound is far below A's rounding
// (2⁻⁹ of a value), so a product that left A unrounded fails. Shapes as
// TestSgemmBF16's, odd K included (the last pair padded with zero).
func TestSgemmDotBF16(t *testing.T) {
	kernels := []bool{false}
	if hasBF16Dot {
		kernels = append(kernels, true)
	}
	defer func(h bool) { hasBF16Dot = h }(hasBF16Dot)
	r := rand.New(rand.NewSource(17))
	shapes := [][3]int{{1, 1, 1}, {7, 33, 5}, {13, 70, 300}, {200, 160, 96}, {100, 96, 131}, {100, 1, 64}, {2, 3100, 17}, {30, 64, 1030}}
	t.Logf("AVX-512 BF16 kernel: %v", hasBF16Dot)
	for _, asm := range kernels {
		hasBF16Dot = asm
		for _, s := range shapes {
			for _, tA := range []bool{false, true} {
				for _, tB := range []bool{false, true} {
					for _, ab := range [][2]float32{{1, 0}, {1, 1}, {0.5, 1}} {
						M, N, K := s[0], s[1], s[2]
						alpha, beta := ab[0], ab[1]
						name := fmt.Sprintf("asm=%v/%dx%dx%d/tA=%v/tB=%v/alpha=%v/beta=%v", asm, M, N, K, tA, tB, alpha, beta)
						lda, ldb, ldc, rowsA, rowsB := gemmLayout(M, N, K, tA, tB)
						A, C := randSlice(r, rowsA*lda), randSlice(r, M*ldc)
						Bh, Bw := bf16Of(randSlice(r, rowsB*ldb))
						C0 := slices.Clone(C)
						SgemmDotBF16(tA, tB, M, N, K, alpha, A, lda, Bh, ldb, beta, C, ldc)
						// The reference multiplies alpha·A's bf16 values by B's; the
						// same product of their magnitudes is the terms' size.
						ar, aAbs := make([]float32, len(A)), make([]float32, len(A))
						for i, v := range A {
							ar[i] = tensor.ToBF16(alpha * v).Float32()
							aAbs[i] = float32(math.Abs(float64(ar[i])))
						}
						bAbs, cAbs := slices.Clone(Bw), slices.Clone(C0)
						for i := range bAbs {
							bAbs[i] = float32(math.Abs(float64(bAbs[i])))
						}
						for i := range cAbs {
							cAbs[i] = float32(math.Abs(float64(cAbs[i])))
						}
						want := refGemm(tA, tB, M, N, K, 1, ar, lda, Bw, ldb, beta, C0, ldc)
						mag := refGemm(tA, tB, M, N, K, 1, aAbs, lda, bAbs, ldb, float32(math.Abs(float64(beta))), cAbs, ldc)
						for i := 0; i < M; i++ {
							for j := 0; j < N; j++ {
								k := i*ldc + j
								if d := math.Abs(float64(C[k]) - want[k]); d > float64(K+2)*math.Pow(2, -22)*mag[k] {
									t.Fatalf("%s: C[%d][%d] = %v, want %v (error %.3g of the terms' %.3g)", name, i, j, C[k], want[k], d, mag[k])
								}
							}
						}
						// Columns past N (the row padding of C) are untouched.
						for i := 0; i < M; i++ {
							for j := N; j < ldc; j++ {
								if C[i*ldc+j] != C0[i*ldc+j] {
									t.Fatalf("%s: C[%d][%d] past N was written", name, i, j)
								}
							}
						}
					}
				}
			}
		}
	}
}

// TestBF16DotKernels: Matmul and MatmulBackward on bf16 weights, on the
// dot-product path, equal the widening path's products of the same weights with
// the input rounded to bf16 (the same float32 sums up to their order: to 1e-5
// of the largest output, 96 and 130 terms of unit size), and the weight gradient,
// which multiplies two float32 activations, bit for bit.
func TestBF16DotKernels(t *testing.T) {
	r := rand.New(rand.NewSource(18))
	const BT, C, OC = 37, 96, 130
	inp, dout := randSlice(r, BT*C), randSlice(r, BT*OC)
	wh, _ := bf16Of(randSlice(r, OC*C))
	_, inpR := bf16Of(inp)
	_, doutR := bf16Of(dout)
	s := tensor.MatmulShape{BT: BT, C: C, OC: OC}
	w := tensor.BF16Weights[float32](wh)
	dot := func(on bool, in, dy []float32) (mm, dinp, dw []float32) {
		defer SetBF16Dot(on)()
		mm, dinp, dw = make([]float32, BT*OC), make([]float32, BT*C), make([]float32, OC*C)
		Matmul(mm, tensor.FloatWeights(in), w, s, false)
		MatmulBackward(dinp, dw, dy, tensor.FloatWeights(inp), w, s, false)
		return
	}
	mm, dinp, dw := dot(true, inp, dout)
	mmR, _, _ := dot(false, inpR, dout)
	_, dinpR, _ := dot(false, inp, doutR)
	close := func(name string, got, want []float32) {
		var top float64
		for _, v := range want {
			top = math.Max(top, math.Abs(float64(v)))
		}
		for i := range got {
			if d := math.Abs(float64(got[i] - want[i])); d > 1e-5*top {
				t.Fatalf("%s: element %d is %v, the widening path on rounded inputs gives %v", name, i, got[i], want[i])
			}
		}
	}
	close("matmul", mm, mmR)
	close("dinp", dinp, dinpR)
	_, _, dwF := dot(false, inp, dout)
	if !slices.Equal(dw, dwF) {
		t.Fatal("dweight: the weight gradient (two float32 activations) left the float32 path")
	}
}

// TestToBF16 holds the ToBF16 kernel (AVX-512 where the CPU has it, blocks on
// the cores) to tensor.ToBF16 bit for bit: random values over many binades,
// ties (exactly half a bf16 step, odd and even), the largest finites that round
// to infinity, infinities, zeros of both signs, subnormals and NaNs with
// payloads that the rounding would carry into the exponent; lengths that leave
// a tail past the sixteen-value blocks and span several core blocks.
func TestToBF16(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(9))
		specials := []uint32{0, 0x80000000, 0x7f800000, 0xff800000, 0x7f7fffff, 0xff7fffff, 0x7f7f8000, 0x00000001, 0x807fffff,
			0x3f808000, 0x3f818000, 0x3f80c000, 0x7fc00000, 0x7f800001, 0xffffffff, 0x7fffffff, 0x7f80ffff, 0xff81ffff}
		for _, n := range []int{0, 1, 15, 16, 17, 100, 4096*3 + 7} {
			src := make([]float32, n)
			for i := range src {
				switch {
				case i < len(specials):
					src[i] = math.Float32frombits(specials[i])
				case i%3 == 0:
					src[i] = math.Float32frombits(r.Uint32()) // any bit pattern
				default:
					src[i] = float32(r.NormFloat64() * math.Pow(2, float64(r.Intn(60)-30)))
				}
			}
			got := make([]tensor.BF16, n)
			ToBF16(got, src)
			for i, v := range src {
				if want := tensor.ToBF16(v); got[i] != want {
					t.Fatalf("n=%d: %#08x rounds to %#04x, want %#04x", n, math.Float32bits(v), got[i], want)
				}
			}
		}
	})
}

// TestFromBF16 widens every bf16 bit pattern, at lengths that leave tails in a
// panel and in a block, and checks each value against tensor.BF16.Float32 bit for
// bit (the widening is exact, NaN payloads included).
func TestFromBF16(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		for _, n := range []int{0, 1, 31, 32, 33, 4096 + 40, 1 << 16, 1<<16 + 4096*2 + 5} {
			src := make([]tensor.BF16, n)
			for i := range src {
				src[i] = tensor.BF16(i * 40503) // every pattern once at n = 1<<16, scrambled
			}
			got := make([]float32, n)
			for i := range got {
				got[i] = float32(math.NaN())
			}
			FromBF16(got, src)
			for i, h := range src {
				if math.Float32bits(got[i]) != math.Float32bits(h.Float32()) {
					t.Fatalf("n=%d: bf16 %#04x widened to %#08x, want %#08x", n, h, math.Float32bits(got[i]), math.Float32bits(h.Float32()))
				}
			}
			got64 := make([]float64, n)
			FromBF16(got64, src)
			for i, h := range src {
				if v := float64(h.Float32()); got64[i] != v && !(math.IsNaN(v) && math.IsNaN(got64[i])) {
					t.Fatalf("n=%d float64: bf16 %#04x widened to %v, want %v", n, h, got64[i], v)
				}
			}
		}
	})
}

// BenchmarkMatmulBF16 runs the products that read weights (forward and the
// input gradient) with float32 weights, with bf16 weights widened while packed
// (bf16), and with bf16 weights on the dot-product path (dot: the input rounded
// to bf16, VDPBF16PS where the CPU has it, else a portable kernel that is not
// worth timing), on the nanoGPT shape's projections (768 tokens, C = 128 and 384,
// FFN 512) and llama-style 2048 tokens of C = 512.
func BenchmarkMatmulBF16(b *testing.B) {
	for _, s := range []struct {
		name      string
		BT, C, OC int
	}{{"768x128x384", 768, 128, 384}, {"768x512x128", 768, 512, 128}, {"2048x512x1536", 2048, 512, 1536}} {
		r := rand.New(rand.NewSource(3))
		inp, dout := randSlice(r, s.BT*s.C), randSlice(r, s.BT*s.OC)
		wh, ww := bf16Of(randSlice(r, s.OC*s.C))
		out, dinp := make([]float32, s.BT*s.OC), make([]float32, s.BT*s.C)
		sh := tensor.MatmulShape{BT: s.BT, C: s.C, OC: s.OC}
		for _, v := range []struct {
			name string
			w    tensor.Weights[float32]
			dot  bool
		}{{"fp32", tensor.FloatWeights(ww), false}, {"bf16", tensor.BF16Weights[float32](wh), false}, {"dot", tensor.BF16Weights[float32](wh), true}} {
			if v.dot && !hasBF16Dot {
				continue
			}
			b.Run(fmt.Sprintf("%s/%s", s.name, v.name), func(b *testing.B) {
				defer SetBF16Dot(v.dot)()
				for i := 0; i < b.N; i++ {
					Matmul(out, tensor.FloatWeights(inp), v.w, sh, false)
					gemmW(false, false, s.BT, s.C, s.OC, dout, s.OC, v.w, s.C, 0, dinp, s.C)
				}
				b.ReportMetric(4*float64(s.BT*s.C*s.OC)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// TestBF16Inputs: a matmul whose input is bf16 storage (a bf16 run's saved
// activation) computes, bit for bit, what it computes on the float32 widening of
// that input: forward on both paths (the dot-product path reads the rows as
// they are, or copies them where a tile of rows or an odd row length needs it),
// the weight gradient (the input widened as it is packed), float64 too.
func TestBF16Inputs(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(21))
		for _, sh := range []tensor.MatmulShape{{BT: 48, C: 64, OC: 40}, {BT: 37, C: 33, OC: 70}, {BT: 12, C: 520, OC: 33}} {
			ih, iw := bf16Of(randSlice(r, sh.BT*sh.C))
			wh, _ := bf16Of(randSlice(r, sh.OC*sh.C))
			dout := randSlice(r, sh.BT*sh.OC)
			w := tensor.BF16Weights[float32](wh)
			for _, dot := range []bool{false, true} {
				restore := SetBF16Dot(dot)
				run := func(in tensor.Weights[float32]) (mm, dinp, dw []float32) {
					mm, dinp, dw = make([]float32, sh.BT*sh.OC), make([]float32, sh.BT*sh.C), make([]float32, sh.OC*sh.C)
					for i := range mm {
						mm[i] = 0.5 // accumulate onto something
					}
					Matmul(mm, in, w, sh, true)
					MatmulBackward(dinp, dw, dout, in, w, sh, false)
					return
				}
				a, ad, aw := run(tensor.BF16Weights[float32](ih))
				b, bd, bw := run(tensor.FloatWeights(iw))
				restore()
				if !slices.Equal(b, a) {
					t.Fatalf("%v dot=%v: forward differs from the widened input", sh, dot)
				}
				if !slices.Equal(bd, ad) {
					t.Fatalf("%v dot=%v: input gradient differs from the widened input", sh, dot)
				}
				if !slices.Equal(bw, aw) {
					t.Fatalf("%v dot=%v: weight gradient differs from the widened input", sh, dot)
				}
			}
			m64, w64 := make([]float64, sh.BT*sh.OC), make([]float64, sh.BT*sh.OC)
			dw64, dwW := make([]float64, sh.OC*sh.C), make([]float64, sh.OC*sh.C)
			Matmul(m64, tensor.BF16Weights[float64](ih), tensor.BF16Weights[float64](wh), sh, false)
			Matmul(w64, tensor.FloatWeights(toF64(iw)), tensor.BF16Weights[float64](wh), sh, false)
			MatmulBackward(nil, dw64, toF64(dout), tensor.BF16Weights[float64](ih), tensor.BF16Weights[float64](wh), sh, false)
			MatmulBackward(nil, dwW, toF64(dout), tensor.FloatWeights(toF64(iw)), tensor.BF16Weights[float64](wh), sh, false)
			if !slices.Equal(w64, m64) {
				t.Fatalf("%v float64 forward differs from the widened input", sh)
			}
			if !slices.Equal(dwW, dw64) {
				t.Fatalf("%v float64 weight gradient differs from the widened input", sh)
			}
		}
	})
}
