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

// TestBF16Views: each view holds its slice rounded to bf16 (fresh storage: the
// float32 source is untouched), for a float32 and a float64 view type.
func TestBF16Views(t *testing.T) {
	x := [][]float32{{1.2345678, -3.14159}, {}, {1e-20}}
	v32, v64 := BF16Views[float32](x), BF16Views[float64](x)
	if len(v32) != 3 || len(v64) != 3 {
		t.Fatalf("%d and %d views of 3 slices", len(v32), len(v64))
	}
	for i, s := range x {
		if v32[i].Len() != len(s) || v64[i].Len() != len(s) || v32[i].F != nil {
			t.Fatalf("view %d: lengths %d, %d of %d, float storage %v", i, v32[i].Len(), v64[i].Len(), len(s), v32[i].F)
		}
		for j, f := range s {
			if v32[i].BF16[j] != ToBF16(f) || v64[i].BF16[j] != ToBF16(f) {
				t.Errorf("view %d[%d] holds %#04x, want %#04x", i, j, v32[i].BF16[j], ToBF16(f))
			}
		}
	}
	if x[0][0] != 1.2345678 {
		t.Error("the float32 source was rounded in place")
	}
}
