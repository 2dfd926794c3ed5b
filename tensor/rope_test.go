package tensor

import (
	"math"
	"testing"
)

// TestRopeInvFreqLlama3 checks the three regimes of Llama 3.1's scaling at its own
// shape (head size 128, theta 500000, factor 8) against the formula evaluated
// here by hand: the highest frequency is kept, the lowest divided by the factor,
// and one between blended.
func TestRopeInvFreqLlama3(t *testing.T) {
	plain := RopeInvFreq(128, 500000, "none", 8)
	scaled := RopeInvFreq(128, 500000, "llama3", 8)
	if plain[0] != 1 || scaled[0] != 1 {
		t.Fatalf("the highest frequency: %v, %v; want 1", plain[0], scaled[0])
	}
	last := len(plain) - 1
	if got, want := scaled[last], plain[last]/8; math.Abs(got-want) > 1e-18 {
		t.Fatalf("the lowest frequency: %v, want %v (divided by 8)", got, want)
	}
	blended := 0
	for i := range plain {
		wavelen := 2 * math.Pi / plain[i]
		if wavelen < 2048 || wavelen > 8192 {
			continue
		}
		blended++
		smooth := (8192/wavelen - 1) / 3
		if want := (1-smooth)*plain[i]/8 + smooth*plain[i]; math.Abs(scaled[i]-want) > 1e-15*want {
			t.Fatalf("frequency %d: %v, want %v", i, scaled[i], want)
		}
	}
	if blended == 0 {
		t.Fatal("no frequency in the blended band: the test would not cover it")
	}
}
