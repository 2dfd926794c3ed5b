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
