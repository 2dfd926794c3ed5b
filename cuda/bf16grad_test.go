//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/stretchr/testify/require"
)

// The kernels that add into a bf16 parameter gradient add in fp32 and round
// each element once per call (tensor.Kernels' contract). The conformance
// cases (tensor/kerneltest) hold them to bf16's tolerance, which a rounding
// per token or per row would pass as well; these checks tell the two apart
// exactly: a gradient of 1 takes contributions of 2⁻⁹ (a quarter of bf16's
// step at 1), which a rounding each would lose, and whose sum rounded once is
// exact.

const quarterStep = 1.0 / 512 // 2⁻⁹

// TestEmbeddingBackwardBF16RoundsOnce: every row's tokens summed, then added
// once, over more tokens than one shared-memory stage of the links kernel
// (EMB_STAGE, 1024), with tokens outside the table's rows (a vocabulary part)
// and a row no token picks.
func TestEmbeddingBackwardBF16RoundsOnce(t *testing.T) {
	for _, dy := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
		t.Run(dy.String(), func(t *testing.T) {
			k := dev.Kernels()
			m := k.NewMemory()
			const BT, C, N, lo = 2500, 5, 4, 10
			tok := make([]int32, BT)
			count := make([]int, N)
			for i := range tok {
				row := 0
				switch {
				case i == 3 || i == 1100 || i == 2200 || i == BT-1:
					row = 1 // four tokens, in three stages
				case i%7 == 0:
					row = -1 // before the part
				case i%11 == 0:
					row = N + 2 // after it
				case i%13 == 0:
					row = 3
				}
				tok[i] = int32(lo + row)
				if row >= 0 && row < N {
					count[row]++
				}
			}
			dwte, dout, tb := m.Alloc(tensor.BFloat16, N*C), m.Alloc(dy, BT*C), m.Alloc(tensor.Int32, BT)
			m.Fill(dwte, 1)
			m.Fill(dout, quarterStep)
			m.Write(tb, tok)
			k.EmbeddingBackward(dwte, dout, tb, tensor.EmbeddingShape{BT: BT, C: C, N: N, Lo: lo})
			got := make([]float64, N*C)
			m.Read(got, dwte)
			require.NoError(t, m.Err())
			for r := range N {
				// The sum is exact in fp32; rounded once to bf16 (row 1's four
				// tokens: 1 + 2⁻⁷, exact; each rounded: 1).
				want := float64(tensor.ToBF16(float32(1 + float64(count[r])*quarterStep)).Float32())
				for c := range C {
					require.Equal(t, want, got[r*C+c], "row %d (%d tokens), channel %d", r, count[r], c)
					if r == 1 {
						require.Equal(t, 1+4*quarterStep, got[r*C+c])
					}
				}
			}
		})
	}
}

// TestRMSNormBackwardBF16RoundsOnce: the weight gradient's partial sums (32
// rows each) reduced in fp32 and added once.
func TestRMSNormBackwardBF16RoundsOnce(t *testing.T) {
	k := dev.Kernels()
	m := k.NewMemory()
	const rows, C = 100, 12
	x, w, rstd := m.Alloc(tensor.Float32, rows*C), m.Alloc(tensor.Float32, C), m.Alloc(tensor.Float32, rows)
	dinp, dout, dw := m.Alloc(tensor.Float32, rows*C), m.Alloc(tensor.Float32, rows*C), m.Alloc(tensor.BFloat16, C)
	m.Fill(x, 1)
	m.Fill(w, 1)
	m.Fill(rstd, 1) // as a norm of rows of ones without eps would leave it
	m.Fill(dout, quarterStep)
	m.Fill(dw, 1)
	k.RMSNormBackward(dinp, dw, dout, x, w, rstd, rows, C, false)
	got := make([]float64, C)
	m.Read(got, dw)
	require.NoError(t, m.Err())
	want := 1 + rows*quarterStep // 1.1953125: 8 significant bits
	for c := range C {
		require.Equal(t, want, got[c], "channel %d", c)
	}
}

// TestGemmIntoBF16: fp32 products into a bf16 C (which cuBLASLt does not
// write: an fp32 product in scratch, then gemm_epilogue_bf16) over strided
// batches with padded leading dimensions, every transposition, β 0 and 1, in
// one piece, a few products at a time and a few columns at a time (the
// scratch's bound lowered). Operands are small integers, so every fp32 sum is
// exact and C must be the float64 result rounded to bf16 once, bit for bit;
// C's padding stays as it was.
func TestGemmIntoBF16(t *testing.T) {
	const m, n, k, batch = 3, 5, 4, 3
	const lda, ldb, ldc = 6, 7, 4 // at least the rows of each stored matrix
	const sa, sb, sc = 40, 50, 23 // products apart, beyond their last element
	const pad = -1000             // C's padding (exact in bf16)
	ints := func(n, seed int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32((i*7+seed)%23 - 11)
		}
		return x
	}
	for _, bound := range []int{gemmScratchValues, 2 * m * n, 2 * m} {
		for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			for _, b := range []float32{0, 1} {
				t.Run(fmt.Sprintf("bound %d, ta %v, tb %v, beta %v", bound, tr[0], tr[1], b), func(t *testing.T) {
					saved := gemmScratchValues
					gemmScratchValues = bound
					defer func() { gemmScratchValues = saved }()
					ta, tb := tr[0], tr[1]
					ah, bh := ints(batch*sa, 1), ints(batch*sb, 5)
					ch := make([]float32, batch*sc)
					for i := range ch {
						ch[i] = pad
					}
					// op(A)(i,p): A[i + p·lda], or A[p + i·lda] transposed.
					at := func(bi, i, p int) float64 {
						if ta {
							return float64(ah[bi*sa+p+i*lda])
						}
						return float64(ah[bi*sa+i+p*lda])
					}
					bt := func(bi, p, j int) float64 {
						if tb {
							return float64(bh[bi*sb+j+p*ldb])
						}
						return float64(bh[bi*sb+p+j*ldb])
					}
					want := make([]float32, len(ch))
					copy(want, ch)
					for bi := range batch {
						for j := range n {
							for i := range m {
								c0 := float64(3*i - j + 100*bi) // C's own values, exact in bf16
								ch[bi*sc+i+j*ldc] = float32(c0)
								s := float64(b) * c0
								for p := range k {
									s += at(bi, i, p) * bt(bi, p, j)
								}
								want[bi*sc+i+j*ldc] = tensor.ToBF16(float32(s)).Float32()
							}
						}
					}
					var got []float32
					onDevice(t, func() {
						A, B, Cb := put(t, F32, ah), put(t, F32, bh), put(t, BF16, ch)
						dev.gemmBatched(ta, tb, m, n, k, A, lda, sa, B, ldb, sb, b, Cb, ldc, sc, batch)
						got = get(Cb)
					})
					for i := range want {
						if got[i] != want[i] && !(math.IsNaN(float64(got[i])) && math.IsNaN(float64(want[i]))) {
							t.Fatalf("C[%d] = %v, want %v", i, got[i], want[i])
						}
					}
				})
			}
		}
	}
}
