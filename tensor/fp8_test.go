package tensor

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// refFormat is a format as its definition gives it (OCP 8-bit floating point):
// exponent and mantissa widths and bias, and which codes are not numbers.
type refFormat struct {
	f        FP8Format
	exp, man int
	bias     int
	ieee     bool // E5M2: an all-ones exponent is inf (mantissa 0) or NaN; E4M3: only S.1111.111 is NaN
}

var refFormats = []refFormat{
	{f: E4M3, exp: 4, man: 3, bias: 7},
	{f: E5M2, exp: 5, man: 2, bias: 15, ieee: true},
}

// field splits a code's magnitude bits into exponent and mantissa fields.
func (r refFormat) field(c int) (e, m int) { return (c & 0x7f) >> r.man, c & (1<<r.man - 1) }

// unbounded is the value of magnitude code c (0..127) read as an ordinary
// binary float: (-1)^0 · 2^(e-bias) · 1.m, or 2^(1-bias) · 0.m where e = 0.
// The codes past the largest finite one are read the same way: that is the
// exponent-unbounded grid that overflow is judged on.
func (r refFormat) unbounded(c int) float64 {
	e, m := r.field(c)
	frac := float64(m) / float64(int(1)<<r.man)
	if e == 0 {
		return math.Pow(2, float64(1-r.bias)) * frac
	}
	return math.Pow(2, float64(e-r.bias)) * (1 + frac)
}

func (r refFormat) isNaN(c int) bool {
	e, m := r.field(c)
	allOnes := 1<<r.exp - 1
	if r.ieee {
		return e == allOnes && m != 0
	}
	return e == allOnes && m == 1<<r.man-1
}

func (r refFormat) isInf(c int) bool {
	e, m := r.field(c)
	return r.ieee && e == 1<<r.exp-1 && m == 0
}

// maxFinite is the largest finite magnitude code.
func (r refFormat) maxFinite() int {
	c := 0x7f
	for r.isNaN(c) || r.isInf(c) {
		c--
	}
	return c
}

// value is code c's value in float64 (NaN for a NaN code).
func (r refFormat) value(c int) float64 {
	s := 1.0
	if c&0x80 != 0 {
		s = -1
	}
	switch {
	case r.isNaN(c):
		return math.NaN()
	case r.isInf(c):
		return math.Inf(int(s))
	}
	return s * r.unbounded(c)
}

// encode is round-to-nearest-even of x as the definition states it: the
// nearest of the magnitudes 0..max, and one step past max on the
// exponent-unbounded grid; on a tie the even code (even mantissa). Reaching
// the step past max (or x infinite) is an overflow: ±max when saturating,
// else inf where the format has it and NaN where it has not. NaN gives the
// all-ones code with x's sign.
func (r refFormat) encode(x float32, saturate bool) uint8 {
	sign := 0
	if math.Signbit(float64(x)) {
		sign = 0x80
	}
	maxC := r.maxFinite()
	overflow := func() uint8 {
		switch {
		case saturate:
			return uint8(sign | maxC)
		case r.ieee:
			return uint8(sign | (1<<r.exp-1)<<r.man)
		}
		return uint8(sign | 0x7f)
	}
	a := math.Abs(float64(x))
	switch {
	case math.IsNaN(a):
		return uint8(sign | 0x7f)
	case math.IsInf(a, 1):
		return overflow()
	}
	past := maxC + 1
	// The smallest code whose value is ≥ a, then the nearer of it and the one below.
	hi := sort.Search(past+1, func(c int) bool { return r.unbounded(c) >= a })
	var c int
	switch {
	case hi > past:
		c = past
	case hi == 0:
		c = 0
	default:
		dLo, dHi := a-r.unbounded(hi-1), r.unbounded(hi)-a
		switch {
		case dLo < dHi:
			c = hi - 1
		case dHi < dLo:
			c = hi
		case (hi-1)%2 == 0:
			c = hi - 1
		default:
			c = hi
		}
	}
	if c == past {
		return overflow()
	}
	return uint8(sign | c)
}

// fp8Inputs are float32s that exercise every rounding case of r: each
// representable value (and the step past max) with its float32 neighbours,
// every midpoint between adjacent values (the ties) with its neighbours, both
// signs; specials (zeros, infinities, NaNs with payloads, float32 subnormals,
// float32's extremes); random bit patterns (every exponent, NaN and inf
// included) and random magnitudes spread over the format's range in log scale.
func fp8Inputs(r refFormat, rng *rand.Rand) []float32 {
	var xs []float32
	add := func(v float64) {
		f := float32(v)
		xs = append(xs, f, -f, math.Nextafter32(f, float32(math.Inf(1))), math.Nextafter32(f, 0),
			-math.Nextafter32(f, float32(math.Inf(1))), -math.Nextafter32(f, 0))
	}
	past := r.maxFinite() + 1
	for c := 0; c <= past; c++ {
		add(r.unbounded(c))
		if c < past {
			add((r.unbounded(c) + r.unbounded(c+1)) / 2)
		}
	}
	for c := past + 1; c <= past+3; c++ { // beyond the first overflow step
		add(r.unbounded(c))
	}
	xs = append(xs, 0, float32(math.Copysign(0, -1)),
		float32(math.Inf(1)), float32(math.Inf(-1)),
		math.Float32frombits(0x7fc00000), math.Float32frombits(0xffc00000),
		math.Float32frombits(0x7f800001), math.Float32frombits(0xff800001), math.Float32frombits(0x7fffffff),
		math.Float32frombits(1), math.Float32frombits(0x80000001), math.Float32frombits(0x007fffff),
		math.SmallestNonzeroFloat32, math.MaxFloat32, -math.MaxFloat32, 1e-30, 1e30)
	for range 1 << 15 {
		xs = append(xs, math.Float32frombits(rng.Uint32()))
	}
	lo, hi := float64(-r.bias-int(r.man)-3), math.Log2(r.unbounded(past))+2
	for range 1 << 15 {
		v := math.Exp2(lo + (hi-lo)*rng.Float64())
		if rng.IntN(2) == 0 {
			v = -v
		}
		xs = append(xs, float32(v))
	}
	return xs
}

// TestFP8Decode: each of the 256 codes of both formats decodes to the value
// the definition gives, bit for bit (the sign of zero included; NaN codes to
// NaN), and the formats' constants are the definition's.
func TestFP8Decode(t *testing.T) {
	for _, r := range refFormats {
		for c := range 256 {
			got, want := r.f.Decode(uint8(c)), r.value(c)
			if math.IsNaN(want) {
				if !math.IsNaN(float64(got)) {
					t.Errorf("%v: code %#02x decodes to %v, want NaN", r.f, c, got)
				}
				continue
			}
			if math.Float32bits(got) != math.Float32bits(float32(want)) || float64(got) != want {
				t.Errorf("%v: code %#02x decodes to %v, want %v", r.f, c, got, want)
			}
		}
		if r.f.Max() != float32(r.unbounded(r.maxFinite())) {
			t.Errorf("%v: Max %v, the definition's largest finite %v", r.f, r.f.Max(), r.unbounded(r.maxFinite()))
		}
	}
	if E4M3.Max() != 448 || E5M2.Max() != 57344 {
		t.Errorf("maxima %v and %v, want 448 and 57344", E4M3.Max(), E5M2.Max())
	}
	nanCodes := map[FP8Format]int{}
	for _, r := range refFormats {
		for c := range 256 {
			if math.IsNaN(float64(r.f.Decode(uint8(c)))) {
				nanCodes[r.f]++
			}
		}
	}
	if nanCodes[E4M3] != 2 || nanCodes[E5M2] != 6 {
		t.Errorf("NaN codes: e4m3 %d (want one a sign), e5m2 %d (want three a sign)", nanCodes[E4M3], nanCodes[E5M2])
	}
}

// TestFP8Encode: Encode equals the definition's round-to-nearest-even, bit for
// bit, saturating and not, on every code's value, every tie between adjacent
// values, the float32 neighbours of both, specials and 65536 random inputs.
// Every finite code encodes back to itself.
func TestFP8Encode(t *testing.T) {
	rng := rand.New(rand.NewPCG(47, 8))
	for _, r := range refFormats {
		xs := fp8Inputs(r, rng)
		bad := 0
		for _, x := range xs {
			for _, sat := range []bool{false, true} {
				got, want := r.f.Encode(x, sat), r.encode(x, sat)
				if got != want && bad < 20 {
					bad++
					t.Errorf("%v: Encode(%v [%#08x], saturate %v) = %#02x, want %#02x", r.f, x, math.Float32bits(x), sat, got, want)
				}
			}
		}
		for c := range 256 {
			v := r.f.Decode(uint8(c))
			if v != v || math.IsInf(float64(v), 0) {
				continue
			}
			if got := r.f.Encode(v, false); got != uint8(c) {
				t.Errorf("%v: code %#02x (%v) encodes back to %#02x", r.f, c, v, got)
			}
		}
		t.Logf("%v: %d inputs, both modes", r.f, len(xs))
	}
}

// TestFP8EncodeCases: the cases a reader checks by hand.
func TestFP8EncodeCases(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	for _, tc := range []struct {
		f    FP8Format
		x    float32
		sat  bool
		want uint8
	}{
		{E4M3, 1, false, 0x38}, {E4M3, -2, false, 0xc0}, {E4M3, 448, false, 0x7e},
		{E4M3, 464, false, 0x7e},                        // halfway to 480 (odd mantissa): ties to 448
		{E4M3, math.Nextafter32(464, 500), false, 0x7f}, // past it: NaN, e4m3 has no inf
		{E4M3, math.Nextafter32(464, 500), true, 0x7e},  // saturated: 448
		{E4M3, inf, false, 0x7f}, {E4M3, -inf, false, 0xff}, {E4M3, inf, true, 0x7e}, {E4M3, -inf, true, 0xfe},
		{E4M3, nan, true, 0x7f},
		{E4M3, 0x1p-9, false, 0x01},                            // smallest subnormal
		{E4M3, 0x1p-10, false, 0x00},                           // half of it: ties to zero (even)
		{E4M3, -0x1p-10, false, 0x80},                          // the sign of zero is kept
		{E4M3, 0x1.8p-9, false, 0x02},                          // 1.5 units: ties to 2 (even)
		{E4M3, 0x1.ep-7, false, 0x08},                          // 7.5 units, between the largest subnormal and the smallest normal: to the normal (even)
		{E4M3, 1 + 1.0/16, false, 0x38},                        // halfway 1 to 1.125: to 1 (even)
		{E4M3, 1 + 3.0/16, false, 0x3a},                        // halfway 1.125 to 1.25: to 1.25 (even)
		{E5M2, 57344, false, 0x7b}, {E5M2, 61440, false, 0x7c}, // halfway to 65536 (even): overflows to inf
		{E5M2, math.Nextafter32(61440, 0), false, 0x7b},
		{E5M2, 61440, true, 0x7b}, {E5M2, inf, false, 0x7c}, {E5M2, -inf, false, 0xfc}, {E5M2, -inf, true, 0xfb},
		{E5M2, nan, false, 0x7f}, {E5M2, 0x1p-16, false, 0x01}, {E5M2, 0x1p-17, false, 0x00},
		{E5M2, 1.125, false, 0x3c}, {E5M2, 1.375, false, 0x3e},
	} {
		if got := tc.f.Encode(tc.x, tc.sat); got != tc.want {
			t.Errorf("%v: Encode(%v, saturate %v) = %#02x, want %#02x", tc.f, tc.x, tc.sat, got, tc.want)
		}
	}
	if got := E4M3.Encode(math.Float32frombits(0xffc00000), false); got != 0xff {
		t.Errorf("e4m3: a negative NaN encodes to %#02x, want 0xff", got)
	}
}

// TestFP8Quantize: a tensor quantised with its current scale and dequantised
// lies within half a unit in the last place of each value (relative 2^-4 for
// E4M3's 3 mantissa bits, 2^-3 for E5M2's 2) for normals, and each code is
// Encode of the float32 product x·scale.
func TestFP8Quantize(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	src := make([]float32, 4096)
	for i := range src {
		src[i] = float32(rng.NormFloat64() * 1e-3)
	}
	for _, r := range refFormats {
		amax := Amax(src)
		scale := r.f.CurrentScale(amax)
		q := make([]uint8, len(src))
		back := make([]float32, len(src))
		r.f.Quantize(q, src, scale, true)
		r.f.Dequantize(back, q, 1/scale)
		rel := math.Ldexp(1, -int(r.man)-1)
		minNormal := math.Ldexp(1, 1-r.bias) / float64(scale)
		for i, x := range src {
			if q[i] != r.encode(x*scale, true) {
				t.Fatalf("%v: element %d quantised to %#02x, want %#02x", r.f, i, q[i], r.encode(x*scale, true))
			}
			if d := math.Abs(float64(back[i]) - float64(x)); math.Abs(float64(x)) >= minNormal && d > rel*math.Abs(float64(x))*(1+1e-6) {
				t.Errorf("%v: %v came back as %v (error %v > %v relative)", r.f, x, back[i], d, rel)
			}
		}
		// The amax maps onto the format's largest value.
		if got := r.f.Decode(r.f.Encode(amax*scale, true)); got != r.f.Max() {
			t.Errorf("%v: amax·scale quantises to %v, want %v", r.f, got, r.f.Max())
		}
	}
}

// TestFP8Scales: current scaling's scale against its float64 definition
// (Max/amax rounded to float32: one division, so exactly float64's quotient
// rounded once), and its edge cases.
func TestFP8Scales(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, r := range refFormats {
		for range 10000 {
			amax := math.Float32frombits(rng.Uint32() & 0x7fffffff)
			got := r.f.CurrentScale(amax)
			var want float32
			switch a := float64(amax); {
			case math.IsNaN(a) || a == 0 || math.IsInf(a, 1):
				want = 1
			default:
				if want = float32(float64(r.f.Max()) / a); math.IsInf(float64(want), 1) {
					want = math.MaxFloat32
				}
			}
			if math.Float32bits(got) != math.Float32bits(want) {
				t.Fatalf("%v: CurrentScale(%v) = %v, want %v", r.f, amax, got, want)
			}
		}
	}
	if got := Amax([]float32{1, -3, 2}); got != 3 {
		t.Errorf("Amax = %v, want 3", got)
	}
	if got := Amax([]float32{1, float32(math.NaN()), 5}); !math.IsNaN(float64(got)) {
		t.Errorf("Amax with a NaN = %v, want NaN", got)
	}
	if got := Amax(nil); got != 0 {
		t.Errorf("Amax of nothing = %v", got)
	}
	// Quantize is Encode(x·scale) value by value (its fast path for the
	// format's normals included): both formats, saturating and not, over
	// values from 2^-30 to 2^30 of the scale's range with the specials.
	for _, f := range []FP8Format{E4M3, E5M2} {
		for _, sat := range []bool{true, false} {
			src := make([]float32, 100000)
			for i := range src {
				src[i] = float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(60)-30))
				if i%97 == 0 {
					src[i] = []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.MaxFloat32}[i%6]
				}
			}
			dst := make([]uint8, len(src))
			const scale = 1.7
			f.Quantize(dst, src, scale, sat)
			for i, x := range src {
				if want := f.Encode(x*scale, sat); dst[i] != want {
					t.Fatalf("%v saturate %v: Quantize(%v) = %#x, Encode %#x", f, sat, x, dst[i], want)
				}
			}
		}
	}
	// Against the definition, max |x| (NaN where one is), over lengths 0 to
	// 40 of random values with zeros of both signs, subnormals, infinities
	// and NaNs at every position modulo 4 (the unrolled loop's lanes).
	rng = rand.New(rand.NewPCG(3, 4))
	special := []float32{0, float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, -math.MaxFloat32,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
	for n := range 41 {
		for trial := range 50 {
			xs := make([]float32, n)
			for i := range xs {
				xs[i] = float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(40)-20))
				if rng.IntN(8) == 0 {
					xs[i] = special[rng.IntN(len(special))]
				}
			}
			var want float64
			for _, x := range xs {
				if a := math.Abs(float64(x)); a != a || want != want {
					want = math.NaN()
				} else {
					want = max(want, a)
				}
			}
			got := Amax(xs)
			if math.IsNaN(want) != math.IsNaN(float64(got)) || (!math.IsNaN(want) && float64(got) != want) {
				t.Fatalf("n=%d trial %d: Amax = %v, want %v", n, trial, got, want)
			}
		}
	}
}

// TestDelayedScaling: over 300 steps of amaxes (spanning 2^±20, with zeros,
// NaN and inf steps), each step's scale equals the float64 reference written
// from Transformer Engine's recipe: the amax of the last n steps (max) or of
// the last (most_recent), NaN passed over by max; (Max·2^-margin)/amax rounded
// once to float32 where that amax is finite and positive, the previous scale
// otherwise, float32's max where it overflows.
func TestDelayedScaling(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	amaxes := make([]float32, 300)
	for i := range amaxes {
		switch i % 37 {
		case 5:
			amaxes[i] = 0
		case 11:
			amaxes[i] = float32(math.NaN())
		case 23:
			amaxes[i] = float32(math.Inf(1))
		case 29:
			amaxes[i] = 1e-44 // its scale overflows float32
		default:
			amaxes[i] = float32(math.Exp2(40*rng.Float64() - 20))
		}
	}
	for _, f := range []FP8Format{E4M3, E5M2} {
		for _, algo := range []AmaxAlgo{AmaxMax, AmaxMostRecent} {
			for _, n := range []int{1, 4, 16} {
				for _, margin := range []int{0, 2} {
					d, err := NewDelayedScaling(f, n, algo, margin)
					if err != nil {
						t.Fatal(err)
					}
					want := 1.0
					for step, a := range amaxes {
						if float64(d.Scale) != want {
							t.Fatalf("%v %v n=%d margin %d: step %d quantises with scale %v, want %v", f, algo, n, margin, step, d.Scale, want)
						}
						// Two micro-batches: the step's amax is the larger.
						d.Record(a / 2)
						d.Record(a)
						d.Update()
						ref := float64(a)
						if algo == AmaxMax {
							ref = 0
							for k := max(0, step-n+1); k <= step; k++ {
								if v := float64(amaxes[k]); v > ref {
									ref = v
								}
							}
						}
						if ref > 0 && !math.IsInf(ref, 1) {
							want = float64(float32(float64(f.Max()) * math.Ldexp(1, -margin) / ref))
							if math.IsInf(want, 1) {
								want = math.MaxFloat32
							}
						}
					}
					if d.ScaleInv() != 1/d.Scale {
						t.Errorf("ScaleInv %v, 1/Scale %v", d.ScaleInv(), 1/d.Scale)
					}
				}
			}
		}
	}
	if _, err := NewDelayedScaling(E4M3, 0, AmaxMax, 0); err == nil {
		t.Error("an empty amax history was accepted")
	}
}
