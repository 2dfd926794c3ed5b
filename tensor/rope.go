package tensor

import "math"

// RopeInvFreq is the HD/2 inverse frequencies of rotary position embeddings:
// theta^(−2i/HD), scaled as scaling says. "llama3" is Llama 3.1's scaling (the
// same as Megatron-Core's and transformers' "llama3" rope type): with an original
// context of 8192 positions, low-frequency factor 1 and high-frequency factor 4,
// wavelengths 2π/f above 8192 are divided by factor, below 8192/4 kept, and
// between blended smoothly. "none" (or "") leaves them.
func RopeInvFreq(HD int, theta float64, scaling string, factor float64) []float64 {
	const original, lowFactor, highFactor = 8192.0, 1.0, 4.0
	inv := make([]float64, HD/2)
	for i := range inv {
		f := math.Pow(theta, -2*float64(i)/float64(HD))
		if scaling == "llama3" {
			wavelen := 2 * math.Pi / f
			switch {
			case wavelen < original/highFactor:
				// high frequencies: unchanged
			case wavelen > original/lowFactor:
				f /= factor
			default:
				smooth := (original/wavelen - lowFactor) / (highFactor - lowFactor)
				f = (1-smooth)*f/factor + smooth*f
			}
		}
		inv[i] = f
	}
	return inv
}
