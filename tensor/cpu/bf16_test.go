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
	r := rand.New(rand.NewSource(7))
	shapes := [][3]int{{1, 1, 1}, {7, 33, 5}, {13, 70, 300}, {768, 384, 128}, {128, 768, 700}, {100, 1, 64}, {2, 3100, 17}}
	for _, s := range shapes {
		for _, tA := range []bool{false, true} {
			for _, tB := range []bool{false, true} {
				for _, beta := range []float32{0, 1} {
					M, N, K := s[0], s[1], s[2]
					name := fmt.Sprintf("%dx%dx%d/tA=%v/tB=%v/beta=%v", M, N, K, tA, tB, beta)
					lda, ldb, ldc := K+3, N+1, N+2
					rowsA, rowsB := M, K
					if tA {
						lda, rowsA = M+3, K
					}
					if tB {
						ldb, rowsB = K+1, N
					}
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
}

// TestBF16WeightKernels runs every kernel that reads weights on a bf16 view and
// on the float32 view of the same (widened) values: the outputs must agree bit
// for bit, since each kernel widens exactly and then computes as for float32.
func TestBF16WeightKernels(t *testing.T) {
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
		Matmul(o.mm, inp, w, s, false)
		MatmulBackward(o.dinp, o.dw, dout, inp, w, s, false)
		Embedding(o.emb, tokens, e, BT, C)
		RMSNorm(o.norm, o.rstd, inp, g, BT, C, 1e-5)
		RMSNormBackward(o.dnorm, o.dgain, o.norm, inp, g, o.rstd, BT, C)
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
	Matmul(m64, toF64(inp), tensor.BF16Weights[float64](wh), tensor.MatmulShape{BT: BT, C: C, OC: OC}, false)
	for i, v := range m64 {
		if d := v - float64(b.mm[i]); d > 1e-3 || d < -1e-3 { // float32 vs float64 sums of 96 unit-size products
			t.Fatalf("float64 matmul on bf16 weights: element %d is %v, float32 gives %v", i, v, b.mm[i])
		}
	}
}

// TestToBF16 holds the ToBF16 kernel (AVX-512 where the CPU has it, blocks on
// the cores) to tensor.ToBF16 bit for bit: random values over many binades,
// ties (exactly half a bf16 step, odd and even), the largest finites that round
// to infinity, infinities, zeros of both signs, subnormals and NaNs with
// payloads that the rounding would carry into the exponent; lengths that leave
// a tail past the sixteen-value blocks and span several core blocks.
func TestToBF16(t *testing.T) {
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
}
