package tensor

import (
	"fmt"
	"math"
)

// F8E4M3 is an E4M3 value (its code): the element of a Float8E4M3 buffer.
type F8E4M3 uint8

// F8E5M2 is an E5M2 value (its code): the element of a Float8E5M2 buffer.
type F8E5M2 uint8

// ToF8E4M3 rounds f to E4M3, saturating (E4M3.Encode(f, true)): the
// conversion of Memory's writes and copies into an E4M3 buffer.
func ToF8E4M3(f float32) F8E4M3 { return F8E4M3(E4M3.Encode(f, true)) }

// ToF8E5M2 rounds f to E5M2, saturating (E5M2.Encode(f, true)).
func ToF8E5M2(f float32) F8E5M2 { return F8E5M2(E5M2.Encode(f, true)) }

// Float32 is the value, exactly.
func (h F8E4M3) Float32() float32 { return fp8Specs[0].values[h] }

// Float32 is the value, exactly.
func (h F8E5M2) Float32() float32 { return fp8Specs[1].values[h] }

// FP8Format is one of the two 8-bit floating-point formats of FP8 training
// (the OCP 8-bit floating point specification, which NVIDIA's Hopper and
// later GPUs compute in). A value is one byte: a sign bit, then the exponent,
// then the mantissa; a zero exponent field holds subnormals (no implicit 1).
type FP8Format uint8

const (
	// E4M3 is OCP E4M3, PyTorch's float8_e4m3fn: 4 exponent bits (bias 7), 3
	// mantissa bits, no infinities, largest finite ±448 (S.1111.110), and one
	// NaN per sign (S.1111.111). Forward tensors (weights, activations) use it.
	E4M3 FP8Format = iota
	// E5M2 is OCP E5M2, PyTorch's float8_e5m2: IEEE-754's binary16 layout cut
	// to 8 bits, 5 exponent bits (bias 15), 2 mantissa bits, largest finite
	// ±57344 (S.11110.11), ±inf (S.11111.00) and NaNs (S.11111.01 to .11).
	// Gradients use it in Megatron's and Transformer Engine's hybrid format.
	E5M2
)

// fp8Spec is a format's constants and its 256 values.
type fp8Spec struct {
	name    string
	man     uint    // mantissa bits
	bias    int     // exponent bias
	maxCode uint8   // the largest finite positive code
	infCode uint8   // +inf's code; 0 where the format has none
	max     float32 // the largest finite value
	values  [256]float32
}

var fp8Specs = [2]fp8Spec{
	{name: "e4m3", man: 3, bias: 7, maxCode: 0x7e, max: 448},
	{name: "e5m2", man: 2, bias: 15, maxCode: 0x7b, infCode: 0x7c, max: 57344},
}

func init() {
	for i := range fp8Specs {
		s := &fp8Specs[i]
		for c := range 256 {
			s.values[c] = s.decode(uint8(c))
		}
	}
}

// decode reads code c from the format's fields.
func (s *fp8Spec) decode(c uint8) float32 {
	neg := c&0x80 != 0
	mag := c & 0x7f
	var v float32
	switch {
	case s.infCode == 0 && mag == 0x7f: // E4M3's S.1111.111
		return float32(math.NaN())
	case s.infCode != 0 && mag == s.infCode:
		v = float32(math.Inf(1))
	case s.infCode != 0 && mag > s.infCode:
		return float32(math.NaN())
	default:
		e := int(mag >> s.man)
		m := int(mag) & (1<<s.man - 1)
		if e == 0 {
			v = float32(math.Ldexp(float64(m), 1-s.bias-int(s.man)))
		} else {
			v = float32(math.Ldexp(float64(1<<s.man+m), e-s.bias-int(s.man)))
		}
	}
	if neg {
		v = -v
	}
	return v
}

func (f FP8Format) spec() *fp8Spec {
	if f == E5M2 {
		return &fp8Specs[1]
	}
	return &fp8Specs[0]
}

// String is the format's name as recipes write it: "e4m3" or "e5m2".
func (f FP8Format) String() string {
	if f > E5M2 {
		return fmt.Sprintf("fp8format(%d)", uint8(f))
	}
	return f.spec().name
}

// Max is the format's largest finite value: 448 (E4M3) or 57344 (E5M2).
func (f FP8Format) Max() float32 { return f.spec().max }

// Decode is the value of code c, exactly (every FP8 value is a float32).
func (f FP8Format) Decode(c uint8) float32 { return f.spec().values[c] }

// Encode rounds x to the format: to the nearest value, ties to the even
// mantissa (round-to-nearest-even), signed zeros and subnormals kept. A NaN
// becomes the NaN code S.1111111 with x's sign. Past the largest finite value
// (x rounds, with the exponent unbounded, to more than Max in magnitude, or x
// is ±inf):
//
//   - saturate: ±Max, as CUDA's satfinite conversion (Transformer Engine's
//     casts) and torchao's clamp-then-cast do;
//   - otherwise as PyTorch's x.to(float8_e4m3fn or float8_e5m2): E5M2 gives
//     ±inf, E4M3, which has no infinity, gives NaN.
func (f FP8Format) Encode(x float32, saturate bool) uint8 {
	s := f.spec()
	b := math.Float32bits(x)
	sign := uint8(b>>24) & 0x80
	a := b & 0x7fffffff
	if a > 0x7f800000 {
		return sign | 0x7f
	}
	var code uint32
	if a < uint32(128-s.bias)<<23 {
		// Below the smallest normal: count units of the smallest subnormal,
		// 2^(1-bias-man). Both the product and the rounding are exact in
		// float64; 2^man units round up into the smallest normal's code.
		v := float64(math.Float32frombits(a)) * math.Ldexp(1, s.bias-1+int(s.man))
		code = uint32(math.RoundToEven(v))
	} else {
		// A float32 normal: drop 23-man mantissa bits, rounding to nearest
		// even (a carry moves into the exponent), then rebias the exponent.
		shift := 23 - s.man
		r := a + (1<<(shift-1) - 1) + (a>>shift)&1
		code = r>>shift - uint32(127-s.bias)<<s.man
	}
	if code > uint32(s.maxCode) {
		switch {
		case saturate:
			return sign | s.maxCode
		case s.infCode != 0:
			return sign | s.infCode
		}
		return sign | 0x7f
	}
	return sign | uint8(code)
}

// Quantize writes each src[i]·scale, rounded to the format (Encode), into dst
// (same length): a tensor's FP8 storage under its per-tensor scale. The
// product is a float32 multiply, as Transformer Engine and torchao compute it.
//
// A product that is a normal of the format and does not overflow it is
// rounded here, by Encode's steps with the format's constants taken once
// (the common case, and the cost of an FP8 step on the CPU); the rest
// (subnormals, NaNs, overflow) goes to Encode itself.
func (f FP8Format) Quantize(dst []uint8, src []float32, scale float32, saturate bool) {
	s := f.spec()
	shift := 23 - s.man
	half := uint32(1)<<(shift-1) - 1
	rebias := uint32(127-s.bias) << s.man
	minNormal, maxCode := uint32(128-s.bias)<<23, uint32(s.maxCode)
	dst = dst[:len(src)]
	for i, x := range src {
		y := x * scale
		b := math.Float32bits(y)
		a := b & 0x7fffffff
		if a >= minNormal && a < 0x7f800000 {
			if code := (a+half+(a>>shift)&1)>>shift - rebias; code <= maxCode {
				dst[i] = uint8(b>>24)&0x80 | uint8(code)
				continue
			}
		}
		dst[i] = f.Encode(y, saturate)
	}
}

// Dequantize writes each code's value times scaleInv (the reciprocal of the
// scale it was quantised with) into dst (same length), in float32.
func (f FP8Format) Dequantize(dst []float32, src []uint8, scaleInv float32) {
	vals := &f.spec().values
	for i, c := range src {
		dst[i] = vals[c] * scaleInv
	}
}

// Amax is the largest |x| of xs (0 for none): what a scale is computed from.
// A NaN among xs makes it NaN, as torch.amax does, so a non-finite tensor is
// seen (its scale is then kept, see CurrentScale and DelayedScaling.Update).
//
// It compares bit patterns: with the sign cleared, a float32's bits order
// as its magnitude does (infinity above every finite value), and every NaN's
// lie above infinity's, so the largest cleared pattern is the amax, or a
// NaN where there is one (four running maxima, a branch-free loop).
func Amax(xs []float32) float32 {
	const abs = 0x7fffffff
	var m0, m1, m2, m3 uint32
	i := 0
	for ; i+4 <= len(xs); i += 4 {
		m0 = max(m0, math.Float32bits(xs[i])&abs)
		m1 = max(m1, math.Float32bits(xs[i+1])&abs)
		m2 = max(m2, math.Float32bits(xs[i+2])&abs)
		m3 = max(m3, math.Float32bits(xs[i+3])&abs)
	}
	for ; i < len(xs); i++ {
		m0 = max(m0, math.Float32bits(xs[i])&abs)
	}
	return math.Float32frombits(max(m0, m1, m2, m3))
}

// CurrentScale is per-tensor current scaling's scale for a tensor whose amax
// is amax (Transformer Engine's Float8CurrentScaling, torchao's tensorwise
// recipe): Max/amax in float32, so the largest magnitude maps onto the
// format's largest value. It is 1 where amax is 0, inf or NaN (nothing to
// scale by), and float32's largest finite value where the quotient overflows
// (amax below Max/MaxFloat32), as Transformer Engine's compute_scale_from_amax.
func (f FP8Format) CurrentScale(amax float32) float32 {
	s, _ := f.ScaleFrom(amax, 0)
	return s
}

// ScaleFrom is the scale that maps amax onto Max·2^-margin: (Max·2^-margin)/amax
// in float32 (Max·2^-margin is exact), float32's largest finite value where
// the quotient overflows. ok is false, and the scale 1, where amax is 0,
// negative, +inf or NaN: no scale follows from it, so current scaling takes 1
// (CurrentScale, margin 0) and delayed scaling keeps its scale
// (DelayedScaling.Update). The device kernels' scales are this function's
// (tensor.Kernels.FP8Scale).
func (f FP8Format) ScaleFrom(amax float32, margin int) (scale float32, ok bool) {
	if !(amax > 0) || math.IsInf(float64(amax), 1) {
		return 1, false
	}
	s := f.Max() * float32(math.Ldexp(1, -margin)) / amax
	if math.IsInf(float64(s), 1) {
		return math.MaxFloat32, true
	}
	return s, true
}

// MaxScaleMargin is the largest margin the kernels' scales take
// (tensor.Kernels.FP8Scale): 2^-margin stays a float32 normal.
const MaxScaleMargin = 126

// Values is the format's 256 values, by code (a copy of the decoding table:
// products widen codes through it).
func (f FP8Format) Values() [256]float32 { return f.spec().values }

// AmaxAlgo is how delayed scaling reads its amax history.
type AmaxAlgo uint8

const (
	// AmaxMax takes the largest amax in the history (Transformer Engine's
	// "max", Megatron's default).
	AmaxMax AmaxAlgo = iota
	// AmaxMostRecent takes the newest amax alone ("most_recent").
	AmaxMostRecent
)

// String is the algorithm's name as Megatron and recipes write it.
func (a AmaxAlgo) String() string {
	if a == AmaxMostRecent {
		return "most_recent"
	}
	return "max"
}

// MaxAmaxHistory bounds an amax history's length (Megatron's default is 1,
// Transformer Engine's 1024).
const MaxAmaxHistory = 1 << 16

// DelayedScaling is one tensor's delayed scaling state, as Transformer
// Engine's DelayedScaling recipe keeps it: the scale a step quantises with
// comes from the amaxes of earlier steps, so no step waits for its own amax.
//
// History[0] is the current step's slot: Record raises it to each amax the
// step sees (every micro-batch's cast). Update, once a step, computes the
// next scale from the history and rolls it: every entry moves one slot
// towards the front, History[0]'s amax moves to the back, and the slot that
// falls off the front (the oldest amax) becomes the new History[0], zeroed.
// The history thus holds the last len(History) steps' amaxes.
type DelayedScaling struct {
	Format FP8Format
	Algo   AmaxAlgo
	// Margin: the scale maps the amax onto Max·2^-Margin (headroom of Margin
	// binades for growth before the next update).
	Margin int
	// History holds amaxes, newest in History[0] (see above).
	History []float32
	// Scale is what the current step quantises with; 1 at the start, as in
	// Transformer Engine.
	Scale float32
}

// NewDelayedScaling is a fresh state: a zero history of n entries
// (1 ≤ n ≤ MaxAmaxHistory) and scale 1.
func NewDelayedScaling(f FP8Format, n int, algo AmaxAlgo, margin int) (*DelayedScaling, error) {
	if n < 1 || n > MaxAmaxHistory {
		return nil, fmt.Errorf("amax history of %d: want 1 to %d steps", n, MaxAmaxHistory)
	}
	if f > E5M2 || algo > AmaxMostRecent {
		return nil, fmt.Errorf("delayed scaling of format %v, algorithm %v: want e4m3 or e5m2, max or most_recent", f, algo)
	}
	return &DelayedScaling{Format: f, Algo: algo, Margin: margin, History: make([]float32, n), Scale: 1}, nil
}

// Record raises the current step's amax to amax (a NaN stays: the step's
// amax is then not finite).
func (d *DelayedScaling) Record(amax float32) {
	if amax > d.History[0] || amax != amax {
		d.History[0] = amax
	}
}

// Update ends a step: it computes the next scale and rolls the history.
// The amax is the history's largest (NaNs passed over, as CUDA's fmaxf does)
// for AmaxMax, History[0] for AmaxMostRecent. Where it is finite and above 0
// the scale becomes (Max·2^-Margin)/amax in float32, else it is kept; a
// quotient that overflows becomes float32's largest finite value. This is
// Transformer Engine's amax_and_scale_update, step for step.
func (d *DelayedScaling) Update() {
	n := len(d.History)
	last := d.History[0]
	amax := last
	if d.Algo == AmaxMax {
		amax = 0
		for _, a := range d.History {
			if a > amax {
				amax = a
			}
		}
	}
	copy(d.History, d.History[1:])
	d.History[n-1] = last
	d.History[0] = 0
	if s, ok := d.Format.ScaleFrom(amax, d.Margin); ok {
		d.Scale = s
	}
}

// ScaleInv is the reciprocal of the scale, which dequantises: x ≈ code·ScaleInv.
func (d *DelayedScaling) ScaleInv() float32 { return 1 / d.Scale }

// CheckDelayedShape checks the operands of Kernels.FP8DelayedScale: n
// tensors' scales, a history of histLen values and amaxes of amaxLen, in
// format f, laid out as s says. Both backends refuse what it refuses.
func CheckDelayedShape(n, histLen, amaxLen int, f FP8Format, s DelayedShape) error {
	switch {
	case f > E5M2:
		return fmt.Errorf("format %v: want e4m3 or e5m2", f)
	case s.Algo > AmaxMostRecent:
		return fmt.Errorf("amax algorithm %d: want max or most_recent", s.Algo)
	case s.Margin < 0 || s.Margin > MaxScaleMargin:
		return fmt.Errorf("margin %d: want 0 to %d (binades of headroom below the format's largest value)", s.Margin, MaxScaleMargin)
	case s.Steps < 1 || s.Steps > MaxAmaxHistory:
		return fmt.Errorf("amax history of %d steps: want 1 to %d", s.Steps, MaxAmaxHistory)
	case s.Ranks < 1:
		return fmt.Errorf("amaxes of %d ranks: want 1 or more", s.Ranks)
	case s.Stride < n || s.Stride > 1<<40:
		return fmt.Errorf("rows %d values apart for %d tensors: want a stride of at least the tensors", s.Stride, n)
	case n > 0 && histLen < (s.Steps-1)*s.Stride+n:
		return fmt.Errorf("a history of %d values for %d steps of %d tensors %d apart: want at least %d", histLen, s.Steps, n, s.Stride, (s.Steps-1)*s.Stride+n)
	case n > 0 && amaxLen < (s.Ranks-1)*s.Stride+n:
		return fmt.Errorf("amaxes of %d values for %d ranks of %d tensors %d apart: want at least %d", amaxLen, s.Ranks, n, s.Stride, (s.Ranks-1)*s.Stride+n)
	}
	return nil
}
