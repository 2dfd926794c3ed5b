package cpu

import (
	"fmt"
	"math"

	"github.com/shardline/shardline/tensor"
)

// The step statistics kernels (tensor.Kernels' LossSum, SumSquares, CloseStep,
// and the optimizers' gate and clip factor) read and write an f64 buffer of this
// backend's memory in place: nothing goes back to the caller.

// statsView is the f64 view of b (floats) with at least n elements, or nil
// after keeping a failure (on b's memory when b is a CPU buffer): the kernel is
// then skipped.
func statsView(op string, b tensor.Buffer, n int) []float64 {
	x := floats[float64](op, b)
	if x != nil && len(x) >= n {
		return x
	}
	if s, ok := b.Storage().(*store); ok {
		s.mem.fail(fmt.Errorf("cpu: %s: want an f64 buffer of at least %d elements, got %d %v values", op, n, b.Len(), b.DType()))
	}
	return nil
}

// LossSum sets dst[0] to Σ losses[i] over the tokens whose target is ≥ 0, in
// float64 and token order (adds it with accumulate).
func LossSum[F Float](dst tensor.Buffer, losses []F, targets []int32, accumulate bool) {
	d := statsView("LossSum", dst, 1)
	if d == nil {
		return
	}
	var s float64
	for i, t := range targets {
		if t >= 0 {
			s += float64(losses[i])
		}
	}
	if accumulate {
		s += d[0]
	}
	d[0] = s
}

// SumSquaresInto sets dst[0] to SumSquares(x) (adds it with accumulate).
func SumSquaresInto[F Float](dst tensor.Buffer, x []F, accumulate bool) {
	d := statsView("SumSquares", dst, 1)
	if d == nil {
		return
	}
	s := SumSquares(x)
	if accumulate {
		s = d[0] + s
	}
	d[0] = s
}

// sumSquaresBF16Into is SumSquaresInto over bf16 values.
func sumSquaresBF16Into(dst tensor.Buffer, x []tensor.BF16, accumulate bool) {
	d := statsView("SumSquares", dst, 1)
	if d == nil {
		return
	}
	s := sumSquaresBF16(x)
	if accumulate {
		s = d[0] + s
	}
	d[0] = s
}

// CloseStep finishes a step's statistics (tensor.Kernels.CloseStep).
func CloseStep(st tensor.Buffer, maxNorm float64) {
	s := statsView("CloseStep", st, tensor.NumStats)
	if s == nil {
		return
	}
	norm := math.Sqrt(s[tensor.StatSumSq] + s[tensor.StatExpertSumSq])
	loss := s[tensor.StatLoss] / s[tensor.StatTokens]
	s[tensor.StatNorm], s[tensor.StatClip] = norm, tensor.ClipFactor(norm, maxNorm)
	s[tensor.StatApplied] = 0
	if finite(loss) && finite(norm) {
		s[tensor.StatApplied] = 1
		s[tensor.StatOptSteps]++
	}
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// applied is whether the step in st applies its update, at which optimizer
// step, and the factor that clips its gradients.
func applied(op string, st tensor.Buffer) (ok bool, step int, clip float64) {
	s := statsView(op, st, tensor.NumStats)
	if s == nil || s[tensor.StatApplied] == 0 {
		return false, 0, 0
	}
	return true, int(s[tensor.StatOptSteps]), s[tensor.StatClip]
}

// AdamWStep is AdamW at optimizer step st[StatOptSteps], from the gradients
// clipped by st[StatClip], when the step applies (compute as AdamW's).
func AdamWStep[F Float](params []F, compute []tensor.BF16, grads, m, v []F, lr, beta1, beta2, eps, wd float64, st tensor.Buffer) {
	if ok, t, clip := applied("AdamW", st); ok {
		AdamW(params, compute, grads, m, v, lr, beta1, beta2, eps, wd, clip, t)
	}
}

// SGDStep is SGD from the gradients clipped by st[StatClip], when the step
// applies.
func SGDStep[F Float](params []F, compute []tensor.BF16, grads, buf []F, lr, momentum, wd float64, st tensor.Buffer) {
	if ok, _, clip := applied("SGD", st); ok {
		SGD(params, compute, grads, buf, lr, momentum, wd, clip)
	}
}

// Axpy adds a·src[i] to dst[i] (f64 buffers of the same length): statistics
// moved from one buffer into another, scaled.
func Axpy(dst, src tensor.Buffer, a float64) {
	d, x := statsView("Axpy", dst, dst.Len()), statsView("Axpy", src, src.Len())
	if d == nil || x == nil {
		return
	}
	if len(d) != len(x) {
		if s, ok := dst.Storage().(*store); ok {
			s.mem.fail(fmt.Errorf("cpu: Axpy of %d values into %d", len(x), len(d)))
		}
		return
	}
	for i, v := range x {
		d[i] += a * v
	}
}
