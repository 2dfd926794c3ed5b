package cpu

import (
	"math/rand"
	"testing"
)

// TestRowsEqualScalar: the vectorised rows of SwiGLU (forward, backward with and
// without accumulation) and RMSNorm's backward equal their scalar expressions bit
// for bit on every length from 1 to 70 (bulk of sixteen plus tails), since they
// round the same products and sums in the same order.
func TestRowsEqualScalar(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(8))
		for n := 1; n <= 70; n++ {
			v := func() []float32 { return toF32(randF64(r, n)) }
			g, u, do, d, w, x := v(), v(), v(), v(), v(), v()
			s := make([]float32, n)
			sigmoid(s, g)
			rr, k := float32(r.Float64()+0.5), float32(r.NormFloat64())

			o, want := make([]float32, n), make([]float32, n)
			swigluRow(o, g, u, s)
			swigluRowScalar(want, g, u, s)
			same(t, "swiglu", n, o, want)

			for _, acc := range []bool{false, true} {
				dg, du := v(), v()
				wdg, wdu := append([]float32(nil), dg...), append([]float32(nil), du...)
				swigluBackRow(dg, du, do, g, u, s, acc)
				swigluBackRowScalar(wdg, wdu, do, g, u, s, acc)
				same(t, "swiglu backward dgate", n, dg, wdg)
				same(t, "swiglu backward dup", n, du, wdu)
			}

			dx, dw := v(), v()
			wdx, wdw := append([]float32(nil), dx...), append([]float32(nil), dw...)
			rmsBackRow(dx, dw, d, w, x, rr, k)
			rmsBackRowScalar(wdx, wdw, d, w, x, rr, k)
			same(t, "rmsnorm backward dx", n, dx, wdx)
			same(t, "rmsnorm backward dw", n, dw, wdw)
		}
	})
}

func same(t *testing.T, what string, n int, got, want []float32) {
	t.Helper()
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s, n=%d, element %d: %v, want %v", what, n, i, got[i], want[i])
		}
	}
}
