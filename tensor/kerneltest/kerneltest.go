package kerneltest

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/stretchr/testify/require"
)

// Tolerances, relative to |want| plus the root mean square of the output (so
// that values near zero from cancellation are judged against the output's
// scale). A float32 kernel differs from its float64 reference by rounding in
// its sums and its exp/log (about 1e-6 relative for the sizes here, up to 1e-5
// for the softmax-based ones); a product that reads a bf16 operand, or rounds
// one to bf16 as the CPU's dot-product path and a GPU's tensor cores do,
// differs by bf16's 2⁻⁹ relative rounding, averaged over its inner dimension.
const (
	tolF32  = 2e-5
	tolBF16 = 1.5e-2
)

// Options adapt the checks to a backend.
type Options struct {
	// Skip names the cases (by the prefix of their names: a kernel's name skips
	// all of its cases) the backend does not run yet, each with the reason,
	// which the skipped subtest reports.
	Skip map[string]string
	// Do runs one side of a case (kernel calls, memory calls, read-backs) where
	// the backend takes its calls: a GPU's device goroutine. Nil runs it on the
	// test's goroutine.
	Do func(func())
}

// Run checks every kernel of be against the CPU's in float64, then that be
// refuses what the FP8 kernels must refuse (each refusal's error in the
// memory).
func Run(t *testing.T, be tensor.Backend, opts Options) {
	var ref tensor.Backend = cpu.Kernels[float64]{} // F appears in no method: the float64 set is a Backend too
	do := opts.Do
	if do == nil {
		do = func(fn func()) { fn() }
	}
	for _, c := range cases() {
		t.Run(c.name, func(t *testing.T) {
			for prefix, why := range opts.Skip {
				if c.name == prefix || strings.HasPrefix(c.name, prefix+"/") {
					t.Skipf("%s: not run on %s: %s", c.name, be.Name(), why)
				}
			}
			got, err := runCase(c, be, tensor.Float32, do)
			require.NoError(t, err, "%s on %s", c.name, be.Name())
			want, err := runCase(c, ref, tensor.Float64, func(fn func()) { fn() })
			require.NoError(t, err, "%s on the reference", c.name)
			require.Len(t, got, len(want))
			tol := c.tol
			switch {
			case c.exact:
				tol = 0
			case tol == 0:
				tol = tolF32
			}
			for i := range want {
				compare(t, fmt.Sprintf("output %d", i), got[i], want[i], tol)
			}
		})
	}
	for _, r := range refusals() {
		t.Run("refuses/"+r.name, func(t *testing.T) {
			var err error
			do(func() {
				m := be.NewMemory()
				r.run(be, m)
				err = m.Err()
			})
			require.ErrorContains(t, err, r.want, "%s on %s", r.name, be.Name())
		})
	}
}

// runCase runs c on k with a fresh memory, inside do, and returns its outputs
// on the host, or the memory's error.
func runCase(c kcase, k tensor.Backend, f tensor.DType, do func(func())) (vals [][]float64, err error) {
	do(func() {
		e := &env{k: k, m: k.NewMemory(), f: f, rng: rand.New(rand.NewPCG(1, seedOf(c.name)))}
		outs := c.run(e)
		if err = e.m.Err(); err != nil {
			return
		}
		vals = make([][]float64, len(outs))
		for i, b := range outs {
			vals[i] = make([]float64, b.Len())
			e.m.Read(vals[i], b)
		}
		if err = e.m.Err(); err != nil {
			err = fmt.Errorf("reading the outputs back: %w", err)
		}
	})
	return vals, err
}

// seedOf is the case's seed: a hash of its name, the same on both sides.
func seedOf(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

// compare checks got against want elementwise: equal non-finite values, and
// |got−want| ≤ tol·(|want| + rms(want)) for finite ones.
func compare(t *testing.T, what string, got, want []float64, tol float64) {
	t.Helper()
	require.Len(t, got, len(want), what)
	var ss float64
	n := 0
	for _, w := range want {
		if !math.IsInf(w, 0) && !math.IsNaN(w) {
			ss += w * w
			n++
		}
	}
	rms := math.Sqrt(ss / float64(max(n, 1)))
	bad, worst := 0, 0.0
	defer func() { t.Logf("%s: %d values, worst error %.3g of its bound", what, len(want), worst) }()
	for i, w := range want {
		g := got[i]
		switch {
		case math.IsNaN(w) || math.IsInf(w, 0):
			if !(math.IsNaN(w) && math.IsNaN(g)) && g != w {
				t.Errorf("%s[%d] = %v, want %v", what, i, g, w)
				bad++
			}
		case rms == 0 && g == w:
		case !(math.Abs(g-w) <= tol*(math.Abs(w)+rms)):
			t.Errorf("%s[%d] = %v, want %v (error %.3g of the bound %.3g)", what, i, g, w, math.Abs(g-w), tol*(math.Abs(w)+rms))
			bad++
		default:
			worst = max(worst, math.Abs(g-w)/(tol*(math.Abs(w)+rms)))
		}
		if bad >= 5 {
			t.Errorf("%s: further elements not checked", what)
			return
		}
	}
}

// kcase is one check: run makes its inputs from e's generator, runs kernels
// and returns the buffers to compare.
type kcase struct {
	name  string  // the kernel, then the variant: "Matmul/bf16 weight"
	tol   float64 // 0: tolF32
	exact bool    // every value equal (tol ignored): the FP8 casts and scales
	run   func(e *env) []tensor.Buffer
}

// env is one side of a case: a kernel set, its memory, the dtype its float
// buffers hold (f32 for the backend under test, f64 for the reference), and
// the case's generator, seeded alike on both sides so that both draw the same
// inputs.
type env struct {
	k   tensor.Backend
	m   tensor.Memory
	f   tensor.DType
	rng *rand.Rand
}

// draw is n values uniform in [−scale, scale), each exactly a float32.
func (e *env) draw(n int, scale float64) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = float64(float32((2*e.rng.Float64() - 1) * scale))
	}
	return x
}

// vals is a float buffer (the side's dtype) holding x.
func (e *env) vals(x []float64) tensor.Buffer {
	b := e.m.Alloc(e.f, len(x))
	e.m.Write(b, x)
	return b
}

// floats is a float buffer of n drawn values.
func (e *env) floats(n int, scale float64) tensor.Buffer { return e.vals(e.draw(n, scale)) }

// weight is n drawn values as a weight: with bf16, rounded to bf16 and held
// as bf16 by the backend under test (as a bf16 run's compute weights and
// stashed activations are), as the same rounded values in float64 by the
// reference.
func (e *env) weight(n int, scale float64, bf16 bool) tensor.Buffer {
	return e.weightOf(e.draw(n, scale), bf16)
}

// weightOf is weight's buffer of the values x (each exactly a float32).
func (e *env) weightOf(x []float64, bf16 bool) tensor.Buffer {
	n := len(x)
	if !bf16 {
		return e.vals(x)
	}
	for i, v := range x {
		x[i] = float64(tensor.ToBF16(float32(v)).Float32())
	}
	t := tensor.BFloat16
	if e.f == tensor.Float64 {
		t = tensor.Float64
	}
	b := e.m.Alloc(t, n)
	e.m.Write(b, x)
	return b
}

// fp8 is n drawn values quantised to format f under current scaling
// (tensor.FP8Format.CurrentScale of their amax, a scale that is no power of
// two), as an FP8 run holds a weight, an activation or an output gradient:
// the backend under test holds the codes (an FP8 buffer) and their scale
// inverse (an f32 buffer, the operand's entry in MatmulShape.Scales); the
// reference holds the values they stand for, each code's value times the
// scale inverse (exact in float64), in float64, and no scale inverse (the
// empty Buffer). Both sides' products so multiply the same values: they
// differ by float32's rounding of the sums and of α, not by FP8's.
func (e *env) fp8(n int, scale float64, f tensor.FP8Format) (vals, inv tensor.Buffer) {
	x, sInv := e.fp8Values(n, scale, f)
	if e.f == tensor.Float64 {
		return e.vals(x), tensor.Buffer{}
	}
	vals = e.m.Alloc(fp8DType(f), n)
	e.m.Write(vals, x)
	return vals, e.scalars(sInv)
}

// fp8Values draws n values and quantises them as fp8 does: on the backend
// under test the codes' values (each exactly a value of the format, written
// as its code) and their scale inverse; on the reference the values they
// stand for (code value × scale inverse, exact in float64).
func (e *env) fp8Values(n int, scale float64, f tensor.FP8Format) (x []float64, inv float64) {
	x = e.draw(n, scale)
	x32 := make([]float32, n)
	for i, v := range x {
		x32[i] = float32(v)
	}
	s := f.CurrentScale(tensor.Amax(x32))
	codes := make([]uint8, n)
	f.Quantize(codes, x32, s, true)
	sInv := 1 / s
	for i, c := range codes {
		x[i] = float64(f.Decode(c))
		if e.f == tensor.Float64 {
			x[i] *= float64(sInv)
		}
	}
	return x, float64(sInv)
}

// fp8DType is the dtype of format f's codes.
func fp8DType(f tensor.FP8Format) tensor.DType {
	if f == tensor.E5M2 {
		return tensor.Float8E5M2
	}
	return tensor.Float8E4M3
}

// fp8Experts is E experts' weights of n values each in E4M3, each
// quantised under its own current scaling (fp8's rule: one scale per
// expert), laid out as experts lays them (apart, or slices of one
// allocation), and their E scale inverses in one f32 buffer (the
// ExpertsShape.Scales.Weight the grouped products take; the empty Buffer on
// the reference, which holds the dequantised values).
func (e *env) fp8Experts(E, n int, scale float64, together bool) (w []tensor.Buffer, inv tensor.Buffer) {
	t := tensor.Float8E4M3
	if e.f == tensor.Float64 {
		t = tensor.Float64
	}
	w = e.experts(E, n, together, func(n int) tensor.Buffer { return e.m.Alloc(t, n) })
	invs := make([]float64, E)
	for i, b := range w {
		var x []float64
		x, invs[i] = e.fp8Values(n, scale, tensor.E4M3)
		e.m.Write(b, x)
	}
	if e.f == tensor.Float64 {
		return w, tensor.Buffer{}
	}
	return w, e.scalars(invs...)
}

// scalars is an f32 buffer holding x (scales and scale inverses: f32 on
// both sides, as on every backend).
func (e *env) scalars(x ...float64) tensor.Buffer {
	b := e.m.Alloc(tensor.Float32, len(x))
	e.m.Write(b, x)
	return b
}

// ints is an int32 buffer holding x.
func (e *env) ints(x []int32) tensor.Buffer {
	b := e.m.Alloc(tensor.Int32, len(x))
	e.m.Write(b, x)
	return b
}

// intsN is an int32 buffer of n zeros (routing buffers the kernels fill).
func (e *env) intsN(n int) tensor.Buffer { return e.m.Alloc(tensor.Int32, n) }

// stats is an f64 buffer holding x (a step's statistics), on both sides.
func (e *env) stats(x []float64) tensor.Buffer {
	b := e.m.Alloc(tensor.Float64, len(x))
	e.m.Write(b, x)
	return b
}

// tokens is n token ids drawn from [lo, hi), with every fifth one repeated
// from an earlier position (so that backward passes meet repeats).
func (e *env) tokens(n, lo, hi int) []int32 {
	x := make([]int32, n)
	for i := range x {
		x[i] = int32(lo + e.rng.IntN(hi-lo))
		if i > 0 && i%5 == 0 {
			x[i] = x[e.rng.IntN(i)]
		}
	}
	return x
}

// variants names the bool combinations of a case: fn is called with each.
func variants(name string, flags []string, fn func(on []bool) kcase) []kcase {
	var out []kcase
	for mask := 0; mask < 1<<len(flags); mask++ {
		on := make([]bool, len(flags))
		var parts []string
		for i, f := range flags {
			on[i] = mask&(1<<i) != 0
			if on[i] {
				parts = append(parts, f)
			}
		}
		c := fn(on)
		if c.run == nil {
			continue // a combination the kernel does not have
		}
		c.name = name
		if len(parts) > 0 {
			c.name += "/" + strings.Join(parts, ",")
		} else {
			c.name += "/plain"
		}
		out = append(out, c)
	}
	return out
}
