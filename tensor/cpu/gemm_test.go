package cpu

import (
	"fmt"
	"math"
	"math/rand"
	"slices"
	"testing"
)

// refGemm is the float64 reference: C = alpha·op(A)·op(B) + beta·C.
func refGemm(transA, transB bool, M, N, K int, alpha float32, A []float32, lda int, B []float32, ldb int, beta float32, C []float32, ldc int) []float64 {
	out := make([]float64, M*ldc)
	for i := 0; i < M; i++ {
		for j := 0; j < N; j++ {
			var s float64
			for p := 0; p < K; p++ {
				ai, bi := i*lda+p, p*ldb+j
				if transA {
					ai = p*lda + i
				}
				if transB {
					bi = j*ldb + p
				}
				a, b := A[ai], B[bi]
				s += float64(a) * float64(b)
			}
			out[i*ldc+j] = float64(alpha)*s + float64(beta)*float64(C[i*ldc+j])
		}
	}
	return out
}

// gemmLayout is the tests' layout of a product's operands, each row padded
// past its last column (so a kernel that writes or reads past it is caught): the
// row strides of A, B and C and the rows A and B hold, for op(A) M×K and op(B)
// K×N stored transposed or not.
func gemmLayout(M, N, K int, tA, tB bool) (lda, ldb, ldc, rowsA, rowsB int) {
	lda, ldb, ldc, rowsA, rowsB = K+3, N+1, N+2, M, K
	if tA {
		lda, rowsA = M+3, K
	}
	if tB {
		ldb, rowsB = K+1, N
	}
	return
}

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// TestSgemm compares with the float64 reference. Tolerance: each output is a sum of
// K products of unit normals, accumulated in fp32 in a different order; the error
// bound grows like sqrt(K)·eps·|terms|, so 1e-5·(1+sqrt(K))·scale is generous
// without hiding a wrong index (which would be off by O(1)).
func TestSgemm(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(1))
		shapes := [][3]int{{1, 1, 1}, {6, 32, 1}, {7, 33, 5}, {13, 70, 300}, {768, 384, 128}, {128, 768, 384}, {5, 3, 700}, {100, 1, 64}, {2, 3100, 17}}
		for _, s := range shapes {
			for _, tA := range []bool{false, true} {
				for _, tB := range []bool{false, true} {
					for _, ab := range [][2]float32{{1, 0}, {1, 1}, {0.5, -2}} {
						M, N, K := s[0], s[1], s[2]
						name := fmt.Sprintf("%dx%dx%d/tA=%v/tB=%v/a=%v/b=%v", M, N, K, tA, tB, ab[0], ab[1])
						lda, ldb, ldc, rowsA, rowsB := gemmLayout(M, N, K, tA, tB)
						A, B, C := randSlice(r, rowsA*lda), randSlice(r, rowsB*ldb), randSlice(r, M*ldc)
						want := refGemm(tA, tB, M, N, K, ab[0], A, lda, B, ldb, ab[1], C, ldc)
						before := append([]float32(nil), C...)
						Sgemm(tA, tB, M, N, K, ab[0], A, lda, B, ldb, ab[1], C, ldc)
						tol := 1e-5 * (1 + math.Sqrt(float64(K))) * 4
						for i := 0; i < M; i++ {
							for j := 0; j < ldc; j++ {
								got := float64(C[i*ldc+j])
								if j >= N {
									if C[i*ldc+j] != before[i*ldc+j] {
										t.Fatalf("%s: padding column C[%d,%d] written", name, i, j)
									}
									continue
								}
								if math.Abs(got-want[i*ldc+j]) > tol*(1+math.Abs(want[i*ldc+j])) {
									t.Fatalf("%s: C[%d,%d] = %v, want %v (kernel %s)", name, i, j, got, want[i*ldc+j], KernelName())
								}
							}
						}
					}
				}
			}
		}
	})
}

// TestSgemmWideBSameBits multiplies the same untransposed B stored at row
// strides either side of maxInPlaceLDB: read in place at one, packed at the
// other, the products must agree to the bit (packing moves values, the kernel's
// sums are the same).
func TestSgemmWideBSameBits(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(5))
		const M, N, K = 50, 96, 600 // K spans two K blocks; N three full panels
		A := randSlice(r, M*K)
		var got [2][]float32
		for i, ldb := range []int{maxInPlaceLDB, maxInPlaceLDB + 1} {
			src := rand.New(rand.NewSource(6)) // the same B values at each stride
			B := make([]float32, K*ldb)
			for p := 0; p < K; p++ {
				for j := 0; j < N; j++ {
					B[p*ldb+j] = float32(src.NormFloat64())
				}
			}
			got[i] = make([]float32, M*N)
			Sgemm(false, false, M, N, K, 1, A, K, B, ldb, 0, got[i], N)
		}
		for i := range got[0] {
			if math.Float32bits(got[0][i]) != math.Float32bits(got[1][i]) {
				t.Fatalf("element %d: in place %v, packed %v", i, got[0][i], got[1][i])
			}
		}
	})
}

// TestKernelsAgree runs the assembly and Go micro-kernels on the same panels,
// adding to C and overwriting it (the columns past the tile must stay untouched),
// with A and B packed (strides MR and NR) and read in place (wider strides).
func TestKernelsAgree(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(2))
		for _, add := range []bool{true, false} {
			for _, ld := range []int{0, 13} { // packed (ars MR, ldb NR), or read in place
				ars, ldb := mr+ld, nr+ld
				for _, k := range []int{1, 2, 7, 256} {
					a, b := randSlice(r, (k-1)*ars+mr), randSlice(r, (k-1)*ldb+nr)
					c1, c2 := randSlice(r, mr*40), make([]float32, mr*40)
					copy(c2, c1)
					kernel(k, a, ars, b, ldb, c1, 40, add)
					kernelGo(k, a, ars, b, ldb, c2, 40, add)
					for i := range c1 {
						if d := math.Abs(float64(c1[i] - c2[i])); d > 1e-4*(1+math.Abs(float64(c2[i]))) {
							t.Fatalf("k=%d ars=%d ldb=%d add=%v: element %d: %s %v, go %v", k, ars, ldb, add, i, KernelName(), c1[i], c2[i])
						}
					}
				}
			}
		}
	})
}

// TestStridedKernelMatchesPacked: the kernel that reads A's rows in place
// makes the same sums as the one reading A packed, so their tiles are equal bit
// for bit, added or stored, with B packed or read at a wider stride.
func TestStridedKernelMatchesPacked(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		if !hasStrided {
			t.Skip("no in-place kernel at this level: Sgemm packs A")
		}
		r := rand.New(rand.NewSource(7))
		for _, add := range []bool{true, false} {
			for _, k := range []int{1, 2, 7, 256} {
				lda, ldb := k+5, nr+3
				rows, b := randSlice(r, (mr-1)*lda+k), randSlice(r, (k-1)*ldb+nr)
				panel := make([]float32, k*mr) // rows packed: panel[p*mr+i] = rows[i*lda+p]
				for i := 0; i < mr; i++ {
					for p := 0; p < k; p++ {
						panel[p*mr+i] = rows[i*lda+p]
					}
				}
				c1, c2 := randSlice(r, mr*40), make([]float32, mr*40)
				copy(c2, c1)
				kernelStrided(k, rows, lda, b, ldb, c1, 40, add)
				kernel(k, panel, mr, b, ldb, c2, 40, add)
				for i := range c1 {
					if math.Float32bits(c1[i]) != math.Float32bits(c2[i]) {
						t.Fatalf("k=%d add=%v: element %d: in place %v, packed %v (%s)", k, add, i, c1[i], c2[i], KernelName())
					}
				}
			}
		}
	})
}

// BenchmarkSgemmWideB multiplies 2048×512 by an untransposed 512×N at widths
// either side of maxInPlaceLDB, in GFLOP/s: below it B's panels are read in
// place, from it on they are packed.
func BenchmarkSgemmWideB(b *testing.B) {
	const M, K = 2048, 512
	for _, N := range []int{512, 768, 1024, 1536, 2048} {
		b.Run(fmt.Sprint("N", N), func(b *testing.B) {
			r := rand.New(rand.NewSource(3))
			A, B, C := randSlice(r, M*K), randSlice(r, K*N), make([]float32, M*N)
			for b.Loop() {
				Sgemm(false, false, M, N, K, 1, A, K, B, N, 0, C, N)
			}
			b.ReportMetric(2*float64(M*N*K)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkSgemm runs the GEMMs of one training step of the nanoGPT
// Shakespeare-char shape (B·T = 12·64 = 768 tokens, C = 128, FFN 512) and a 1024³
// square, reporting GFLOP/s. make bench compares them with OpenBLAS and PyTorch.
func BenchmarkSgemm(b *testing.B) {
	for _, s := range []struct {
		name    string
		M, N, K int
		tA, tB  bool
	}{
		{"fwd_768x128x128", 768, 128, 128, false, true},
		{"fwd_768x384x128", 768, 384, 128, false, true},
		{"fwd_768x128x384", 768, 128, 384, false, true},
		{"dinp_768x128x128", 768, 128, 128, false, false},
		{"dinp_768x128x384", 768, 128, 384, false, false},
		{"dinp_768x384x128", 768, 384, 128, false, false},
		{"dw_128x128x768", 128, 128, 768, true, false},
		{"dw_384x128x768", 384, 128, 768, true, false},
		{"dw_128x384x768", 128, 384, 768, true, false},
		{"fwd_768x512x128", 768, 512, 128, false, true},
		{"dinp_768x128x512", 768, 128, 512, false, false},
		{"dw_512x128x768", 512, 128, 768, true, false},
		{"square_1024", 1024, 1024, 1024, false, false},
	} {
		b.Run(s.name, func(b *testing.B) {
			r := rand.New(rand.NewSource(3))
			A, B, C := randSlice(r, s.M*s.K), randSlice(r, s.K*s.N), make([]float32, s.M*s.N)
			lda, ldb := s.K, s.N
			if s.tA {
				lda = s.M
			}
			if s.tB {
				ldb = s.K
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				Sgemm(s.tA, s.tB, s.M, s.N, s.K, 1, A, lda, B, ldb, 0, C, s.N)
			}
			b.ReportMetric(2*float64(s.M*s.N*s.K)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// TestTriangularProducts: told that op(A) is lower or upper triangular (causal
// attention's probabilities), the product skips the zeros and must equal the full
// product bit for bit (the skipped terms are exact zeros), whether A is read in
// place, transposed or packed (alpha ≠ 1), adding or overwriting, over several
// K blocks.
func TestTriangularProducts(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(9))
		for _, s := range [][2]int{{64, 32}, {13, 40}, {600, 33}} {
			T, N := s[0], s[1]
			for _, tri := range []triangle{lower, upper} {
				for _, transA := range []bool{false, true} {
					for _, ab := range [][2]float32{{1, 0}, {1, 1}, {0.5, 1}} {
						// op(A) is T×T with zeros where tri says.
						A := randSlice(r, T*T)
						for m := 0; m < T; m++ {
							for k := 0; k < T; k++ {
								if (tri == lower && k > m) || (tri == upper && k < m) {
									if transA {
										A[k*T+m] = 0
									} else {
										A[m*T+k] = 0
									}
								}
							}
						}
						B, C0 := randSlice(r, T*N), randSlice(r, T*N)
						want, got := slices.Clone(C0), slices.Clone(C0)
						var bufs gemmBufs
						sgemmSerial(&bufs, full, transA, false, T, N, T, ab[0], A, T, B, N, ab[1], want, N)
						sgemmSerial(&bufs, tri, transA, false, T, N, T, ab[0], A, T, B, N, ab[1], got, N)
						if !slices.Equal(want, got) {
							t.Fatalf("T=%d N=%d tri=%d transA=%v alpha=%v beta=%v: differs from the full product", T, N, tri, transA, ab[0], ab[1])
						}
					}
				}
			}
		}
	})
}

// BenchmarkMicroKernel times the micro-kernel alone on one core: a 12×32 tile
// over k = 256 from packed panels that stay in L1, in GFLOP/s, under each
// kernel level this CPU has.
func BenchmarkMicroKernel(b *testing.B) {
	const k = 256
	r := rand.New(rand.NewSource(4))
	a, bp, c := randSlice(r, k*mr), randSlice(r, k*nr), make([]float32, mr*nr)
	eachISABench(b, func(b *testing.B) {
		for b.Loop() {
			kernel(k, a, mr, bp, nr, c, nr, false)
		}
		b.ReportMetric(2*k*mr*nr*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	})
}
