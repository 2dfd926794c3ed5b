package tensor

import (
	"math"
	"testing"
)

// llama31 is Llama 3.1's scaling with factor k.
func llama31(k float64) RopeScaling {
	return RopeScaling{Type: "llama3", Factor: k, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}
}

// TestRopeInvFreqLlama3 checks the three regimes of Llama 3.1's scaling at its own
// shape (head size 128, theta 500000, factor 8) against the formula evaluated
// here by hand: the highest frequency is kept, the lowest divided by the factor,
// and one between blended.
func TestRopeInvFreqLlama3(t *testing.T) {
	plain := RopeInvFreq(128, 500000, RopeScaling{Type: "none"})
	scaled := RopeInvFreq(128, 500000, llama31(8))
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

// torchtitanInvFreq is torchtitan's precompute_freqs_cis (llama3 and llama4
// model.py) transcribed in float64 as it is written, with its torch.where
// masks: the low frequencies divided first, the blend computed everywhere,
// and kept only where neither λ < L/hi nor λ > L/lo. It is independent of
// RopeInvFreq's switch; where the blend's denominator is 0 (lo = hi) its
// value is NaN, as theirs.
func torchtitanInvFreq(HD int, theta float64, k, lo, hi, L float64) []float64 {
	out := make([]float64, HD/2)
	for i := range out {
		f := 1 / math.Pow(theta, float64(2*i)/float64(HD))
		wavelen := 2 * math.Pi / f
		freqs := f
		if wavelen > L/lo {
			freqs = f / k
		}
		smooth := (L/wavelen - lo) / (hi - lo)
		smoothed := (1-smooth)*freqs/k + smooth*freqs
		if !(wavelen < L/hi) && !(wavelen > L/lo) {
			freqs = smoothed
		}
		out[i] = freqs
	}
	return out
}

// TestRopeInvFreqMatchesTorchtitan compares RopeInvFreq with the transcription
// of torchtitan's computation over scalings that cover each regime: Llama
// 3.1's and 3.2's, Llama 4's (lo = hi: a step, no blend), and a short original
// context with other factors at a small head size (every regime among few
// frequencies). Tolerance 1e-15 relative: the same float64 operations, in an
// order that differs only where the blend multiplies f by its factors.
func TestRopeInvFreqMatchesTorchtitan(t *testing.T) {
	for _, c := range []struct {
		name        string
		HD          int
		theta       float64
		k, lo, hi   float64
		L           float64
		blendedLeft bool
	}{
		{"llama3.1", 128, 500000, 8, 1, 4, 8192, true},
		{"llama3.2", 64, 500000, 32, 1, 4, 8192, true},
		{"llama4", 128, 500000, 16, 1, 1, 8192, false},
		{"short", 16, 10000, 4, 2, 8, 64, true},
		{"short step", 16, 10000, 16, 1, 1, 64, false},
	} {
		got := RopeInvFreq(c.HD, c.theta, RopeScaling{Type: "llama3", Factor: c.k, LowFreqFactor: c.lo, HighFreqFactor: c.hi, OriginalMaxPositions: c.L})
		want := torchtitanInvFreq(c.HD, c.theta, c.k, c.lo, c.hi, c.L)
		plain := RopeInvFreq(c.HD, c.theta, RopeScaling{})
		var kept, divided, blended int
		for i := range got {
			if math.IsNaN(want[i]) {
				t.Fatalf("%s: frequency %d falls on λ = L/lo exactly, where torchtitan's formula is 0/0: choose another case", c.name, i)
			}
			if math.Abs(got[i]-want[i]) > 1e-15*want[i] {
				t.Fatalf("%s: frequency %d is %v, torchtitan's computation %v", c.name, i, got[i], want[i])
			}
			switch got[i] {
			case plain[i]:
				kept++
			case plain[i] / c.k:
				divided++
			default:
				blended++
			}
		}
		if kept == 0 || divided == 0 || (blended > 0) != c.blendedLeft {
			t.Fatalf("%s: %d frequencies kept, %d divided, %d blended: the case does not cover the regimes it is for", c.name, kept, divided, blended)
		}
	}
}

// With lo = hi a wavelength of exactly L/lo is where torchtitan's and
// transformers' blend divides 0 by 0; RopeInvFreq keeps the frequency (the
// blend's value at its high-frequency end) rather than return NaN. Head size 2
// has the single frequency 1, of wavelength 2π: L = 2π puts it on the point.
func TestRopeInvFreqEqualFactorsAtTheStep(t *testing.T) {
	got := RopeInvFreq(2, 10000, RopeScaling{Type: "llama3", Factor: 16, LowFreqFactor: 1, HighFreqFactor: 1, OriginalMaxPositions: 2 * math.Pi})
	if got[0] != 1 {
		t.Fatalf("the frequency at λ = L/lo with lo = hi: %v, want 1 (kept)", got[0])
	}
	if w := torchtitanInvFreq(2, 10000, 16, 1, 1, 2*math.Pi); !math.IsNaN(w[0]) {
		t.Fatalf("torchtitan's formula gives %v there, not NaN: the test's premise is wrong", w[0])
	}
}
