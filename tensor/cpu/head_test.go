package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/stretchr/testify/require"
)

// TestHeadLossEqualsWholeVocabulary: HeadLoss, a chunk of rows at a time, gives
// the losses, dx and dw of the whole-logits kernels (Matmul, CrossEntropy,
// their backward over all rows at once), with ignored targets among them and
// a last chunk shorter than the others, and the loss alone when dx is nil. In
// float64, to 1e-12 relative: each row is the same arithmetic (chunking only
// changes the order dw's rows are summed in).
func TestHeadLossEqualsWholeVocabulary(t *testing.T) {
	const BT, C, V = 23, 16, 41
	r := rand.New(rand.NewPCG(3, 4))
	draw := func(n int, scale float64) []float64 {
		x := make([]float64, n)
		for i := range x {
			x[i] = (2*r.Float64() - 1) * scale
		}
		return x
	}
	x, w, dloss, dw0 := draw(BT*C, 1), draw(V*C, 0.5), draw(BT, 1), draw(V*C, 1)
	targets := make([]int32, BT)
	for i := range targets {
		targets[i] = int32(r.IntN(V))
	}
	targets[3], targets[17] = -1, -1
	// The whole logits, their loss and gradient.
	ms := tensor.MatmulShape{BT: BT, C: C, OC: V}
	logits, losses := make([]float64, BT*V), make([]float64, BT)
	Matmul(logits, tensor.FloatWeights(x), tensor.FloatWeights(w), ms, false)
	CrossEntropy(losses, logits, logits, targets, BT, V)
	CrossEntropyBackward(logits, dloss, logits, targets, BT, V)
	dx, dw := make([]float64, BT*C), append([]float64(nil), dw0...)
	MatmulBackward(dx, dw, logits, tensor.FloatWeights(x), tensor.FloatWeights(w), ms, false)
	near := func(what string, got, want []float64) {
		t.Helper()
		for i := range want {
			require.InDelta(t, want[i], got[i], 1e-12*(1+math.Abs(want[i])), "%s[%d]", what, i)
		}
	}
	for _, rows := range []int{1, 5, BT, 2 * BT} {
		s := tensor.HeadShape{BT: BT, C: C, V: V, Rows: min(rows, BT)}
		work := make([]float64, s.Rows*V)
		gotLoss, gotDx, gotDw := make([]float64, BT), make([]float64, BT*C), append([]float64(nil), dw0...)
		for i := range gotDx {
			gotDx[i] = 9 // overwritten
		}
		HeadLoss(gotLoss, gotDx, gotDw, work, tensor.FloatWeights(x), tensor.FloatWeights(w), targets, dloss, s)
		near("losses", gotLoss, losses)
		near("dx", gotDx, dx)
		near("dw", gotDw, dw)
		onlyLoss := make([]float64, BT)
		HeadLoss(onlyLoss, nil, nil, work, tensor.FloatWeights(x), tensor.FloatWeights(w), targets, nil, s)
		near("losses alone", onlyLoss, losses)
	}
}
