package tensor

import (
	"math"
	"testing"
)

func TestBF16(t *testing.T) {
	for _, tc := range []struct {
		in   float32
		want float32
	}{
		{1, 1}, {-2.5, -2.5}, {0, 0},
		{1 + 1.0/256, 1},                      // halfway between 1 and 1+2^-7: ties to even (1)
		{1 + 3.0/256, 1 + 4.0/256},            // halfway, odd below: rounds up to even
		{1 + 1.0/256 + 1.0/4096, 1 + 1.0/128}, // above halfway: rounds up
		{float32(math.Inf(1)), float32(math.Inf(1))},
		{math.MaxFloat32, float32(math.Inf(1))}, // past bf16's largest finite (0x7F7F): rounds to +Inf
	} {
		if got := ToBF16(tc.in).Float32(); got != tc.want {
			t.Errorf("bf16(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	if nan := ToBF16(float32(math.NaN())).Float32(); !math.IsNaN(float64(nan)) {
		t.Errorf("NaN became %v", nan)
	}
	x := []float32{1.2345678, -3.14159, 1e-20}
	RoundBF16(x)
	for _, v := range x {
		if ToBF16(v).Float32() != v {
			t.Errorf("%v is not representable after RoundBF16", v)
		}
	}
}
