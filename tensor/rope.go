package tensor

import "math"

// RopeScaling is a rotary embedding's frequency scaling. Type "none" (or "")
// leaves the frequencies; "llama3" is Llama 3.1's scaling (transformers' and
// Megatron-Core's "llama3" rope type, torchtitan's RoPEScalingArgs) with its
// four numbers: Factor divides the low frequencies, whose wavelengths exceed
// OriginalMaxPositions / LowFreqFactor; wavelengths below OriginalMaxPositions
// / HighFreqFactor are kept; those between are blended smoothly. Llama 3.1
// uses 8, 1, 4, 8192; Llama 4 16, 1, 1, 8192.
type RopeScaling struct {
	Type                                  string
	Factor, LowFreqFactor, HighFreqFactor float64
	OriginalMaxPositions                  float64
}

// RopeInvFreq is the HD/2 inverse frequencies of rotary position embeddings:
// theta^(−2i/HD), scaled as s says. With the llama3 scaling, a frequency f of
// wavelength λ = 2π/f, original context L, factors lo and hi and factor k is
//
//	f            where λ < L/hi (high frequencies)
//	f/k          where λ > L/lo (low frequencies)
//	(1−s)·f/k + s·f, s = (L/λ − lo)/(hi − lo), between
//
// as torchtitan's precompute_freqs_cis and transformers'
// _compute_llama3_parameters compute it. With lo = hi (Llama 4) the blend's
// band shrinks to the single wavelength λ = L/lo, where their formula is 0/0
// (NaN); RopeInvFreq keeps f there (the blend's value at its high-frequency
// end), so the scaling is a step: wavelengths above L/lo divided by k, the
// others kept, as theirs are everywhere else.
func RopeInvFreq(HD int, theta float64, s RopeScaling) []float64 {
	inv := make([]float64, HD/2)
	for i := range inv {
		f := math.Pow(theta, -2*float64(i)/float64(HD))
		if s.Type == "llama3" {
			lo, hi, L := s.LowFreqFactor, s.HighFreqFactor, s.OriginalMaxPositions
			wavelen := 2 * math.Pi / f
			switch {
			case wavelen > L/lo:
				f /= s.Factor
			case wavelen < L/hi:
				// high frequencies: unchanged
			case hi != lo:
				smooth := (L/wavelen - lo) / (hi - lo)
				f = (1-smooth)*f/s.Factor + smooth*f
			}
		}
		inv[i] = f
	}
	return inv
}
