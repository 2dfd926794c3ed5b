package tensor

import "math"

// BF16 is a bfloat16 value: the top 16 bits of an IEEE-754 float32.
type BF16 uint16

// ToBF16 rounds f to the nearest bf16, ties to even; NaN stays NaN.
func ToBF16(f float32) BF16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep it quiet and non-zero
		return BF16(b>>16 | 0x40)
	}
	return BF16((b + 0x7fff + (b>>16)&1) >> 16)
}

// Float32 widens a bf16 exactly.
func (h BF16) Float32() float32 { return math.Float32frombits(uint32(h) << 16) }

// CastToBF16 rounds src into dst (same length).
func CastToBF16(dst []BF16, src []float32) {
	for i, v := range src {
		dst[i] = ToBF16(v)
	}
}

// CastToFloat32 widens src into dst (same length).
func CastToFloat32(dst []float32, src []BF16) {
	for i, v := range src {
		dst[i] = v.Float32()
	}
}

// RoundBF16 rounds every value of x to bf16 precision in place (the compute weights
// of a bf16 run, kept as float32 for the kernels).
func RoundBF16(x []float32) {
	for i, v := range x {
		x[i] = ToBF16(v).Float32()
	}
}

// Weights is a view of compute weights as kernels read them (and of a matmul's
// input: a bf16 run's saved activation): F values, or bf16 values (bf16
// storage) that kernels widen to F as they read them, accumulating in F. At most one of F and BF16 is set; neither is an empty view (a parameter a
// runtime binds later).
type Weights[F Float] struct {
	F    []F
	BF16 []BF16
}

// FloatWeights views F values as weights.
func FloatWeights[F Float](x []F) Weights[F] { return Weights[F]{F: x} }

// BF16Weights views bf16 values as weights of element type F.
func BF16Weights[F Float](x []BF16) Weights[F] { return Weights[F]{BF16: x} }

// BF16Views rounds each slice of x to new bf16 storage and views it as weights.
func BF16Views[F Float](x [][]float32) []Weights[F] {
	out := make([]Weights[F], len(x))
	for i, v := range x {
		h := make([]BF16, len(v))
		CastToBF16(h, v)
		out[i] = Weights[F]{BF16: h}
	}
	return out
}

// Len is the view's element count.
func (w Weights[F]) Len() int {
	if w.BF16 != nil {
		return len(w.BF16)
	}
	return len(w.F)
}

// Slice is elements [lo, hi) of the view, in its dtype.
func (w Weights[F]) Slice(lo, hi int) Weights[F] {
	if w.BF16 != nil {
		return Weights[F]{BF16: w.BF16[lo:hi:hi]}
	}
	if w.F == nil {
		return w
	}
	return Weights[F]{F: w.F[lo:hi:hi]}
}

// Bytes is what the view's elements occupy.
func (w Weights[F]) Bytes() int64 {
	if w.BF16 != nil {
		return 2 * int64(len(w.BF16))
	}
	var z F
	return int64(len(w.F)) * int64(sizeOf(z))
}

// Widen writes elements [lo, lo+len(dst)) of the view into dst as F values
// (exact: every bf16 is a float32).
func (w Weights[F]) Widen(dst []F, lo int) {
	if w.BF16 == nil {
		copy(dst, w.F[lo:])
		return
	}
	src := w.BF16[lo : lo+len(dst)]
	for i, v := range src {
		dst[i] = F(math.Float32frombits(uint32(v) << 16))
	}
}

func sizeOf[F Float](z F) int {
	if _, ok := any(z).(float32); ok {
		return 4
	}
	return 8
}
