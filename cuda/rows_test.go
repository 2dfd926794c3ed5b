//go:build cuda || cudaemu

package cuda

// The row and elementwise kernels against the CPU backend (tensor/cpu) on
// random inputs, in fp32 and bf16 storage (both sides fed the same
// bf16-rounded inputs), and the helpers every device test shares. These run on
// the GPU (bin/cuda.test) and on the host emulator (-tags cudaemu, make test).
//
// Tolerances are ‖gpu − cpu‖/‖cpu‖ over the whole output:
//   - fp32: 1e-5 elementwise and row kernels (fp32 arithmetic, different summation
//     order), 1e-4 for attention and products (sums of hundreds to thousands of
//     terms in another order).
//   - bf16: 8e-3: the output is stored in bf16 (relative rounding ≤ 2⁻⁹ ≈ 2e-3 per
//     value), on top of fp32 accumulation.

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
)

// onDevice runs fn on the device goroutine (only t.Error/Log there: t.Fatal would
// end the device's goroutine) and fails the test on a sticky device error.
func onDevice(t *testing.T, fn func()) {
	t.Helper()
	var err error
	dev.Do(func() {
		fn()
		err = dev.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
}

func randn(r *rand.Rand, n int, scale float64) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64() * scale)
	}
	return s
}

// roundTo rounds x to the storage dtype (bf16 keeps 8 bits of mantissa).
func roundTo(dt DType, x []float32) []float32 {
	y := append([]float32(nil), x...)
	if dt == BF16 {
		tensor.RoundBF16(y)
	}
	return y
}

// upload allocates a buffer of dt on d holding x (rounded to bf16 for BF16); a
// failure is d's sticky error.
func upload(d *Device, dt DType, x []float32) Buffer {
	b, err := d.Alloc(dt, len(x))
	if err != nil {
		d.fail("test alloc", err)
		return b
	}
	if dt == BF16 {
		h := make([]tensor.BF16, len(x))
		tensor.CastToBF16(h, x)
		d.Upload(b, h)
	} else {
		d.Upload(b, x)
	}
	return b
}

// put is upload on the test's device, freed when the test ends.
func put(t *testing.T, dt DType, x []float32) Buffer {
	b := upload(dev, dt, x)
	t.Cleanup(func() { dev.Do(func() { dev.Free(b) }) })
	return b
}

// poisoned allocates n values of dt filled with NaN, so an unwritten output shows.
func poisoned(t *testing.T, dt DType, n int) Buffer {
	nan := make([]float32, n)
	for i := range nan {
		nan[i] = float32(math.NaN())
	}
	return put(t, dt, nan)
}

func putI32(t *testing.T, x []int32) Buffer {
	b, err := dev.Alloc(I32, len(x))
	if err != nil {
		t.Error(err)
		return b
	}
	dev.Upload(b, x)
	t.Cleanup(func() { dev.Do(func() { dev.Free(b) }) })
	return b
}

func get(b Buffer) []float32 { return download(dev, b) }

func relErr(got, want []float32) float64 {
	var num, den float64
	for i := range want {
		g, w := float64(got[i]), float64(want[i])
		if math.IsNaN(g) || math.IsInf(g, 0) {
			return math.Inf(1)
		}
		num += (g - w) * (g - w)
		den += w * w
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

func tol(dt DType, fp32 float64) float64 {
	if dt == BF16 {
		return 8e-3
	}
	return fp32
}

func check(t *testing.T, what string, dt DType, got, want []float32, fp32tol float64) {
	t.Helper()
	if e := relErr(got, want); !(e <= tol(dt, fp32tol)) {
		t.Errorf("%s (%s): relative error %.3g > %.3g", what, dt, e, tol(dt, fp32tol))
	} else {
		t.Logf("%s (%s): relative error %.3g", what, dt, e)
	}
}

var dtypes = []DType{F32, BF16}

// layout is a shape and placement the row and elementwise kernels are checked
// on, so that both of their paths run: rows of whole 16-byte vectors on aligned
// buffers (the vector path), odd sizes (no whole vectors in a row, and a scalar
// tail after the vectors of a flat operand), and every buffer one value past an
// allocation's alignment (the scalar path throughout; on the emulator a vector
// access there would stop the test).
type layout struct {
	name      string
	C, HD     int // RMSNorm's row width, RoPE's head size
	tail, off int // values added to a flat operand's length; each buffer's offset in its allocation
}

var layouts = []layout{{"vectors", 96, 64, 0, 0}, {"odd sizes", 37, 12, 3, 0}, {"unaligned", 96, 64, 0, 1}}

// at is put, the buffer starting off values into its allocation.
func at(t *testing.T, dt DType, x []float32, off int) Buffer {
	return put(t, dt, append(make([]float32, off), x...)).Slice(off, off+len(x))
}

// poisonedAt is poisoned, the buffer starting off values into its allocation.
func poisonedAt(t *testing.T, dt DType, n, off int) Buffer {
	return poisoned(t, dt, n+off).Slice(off, off+n)
}

// download reads b back from d as float32 (bf16 widened).
func download(d *Device, b Buffer) []float32 {
	out := make([]float32, b.N)
	if b.DType == BF16 {
		h := make([]tensor.BF16, b.N)
		d.Download(h, b)
		tensor.CastToFloat32(out, h)
	} else {
		d.Download(out, b)
	}
	return out
}

// forLayouts runs check for every layout in fp32 and bf16 storage.
func forLayouts(t *testing.T, check func(t *testing.T, dt DType, l layout)) {
	for _, l := range layouts {
		for _, dt := range dtypes {
			t.Run(l.name+"/"+dt.String(), func(t *testing.T) { check(t, dt, l) })
		}
	}
}

func TestRowKernels(t *testing.T) { forLayouts(t, rowKernels) }

func rowKernels(t *testing.T, dt DType, l layout) {
	r := rand.New(rand.NewPCG(2, uint64(dt)))
	BT, C, V, off := 70, l.C, 300, l.off
	// RMSNorm
	inp, w, dout := roundTo(dt, randn(r, BT*C, 1)), roundTo(dt, randn(r, C, 1)), roundTo(dt, randn(r, BT*C, 1))
	out, rstd := make([]float32, BT*C), make([]float32, BT)
	cpu.RMSNorm(out, rstd, inp, tensor.FloatWeights(w), BT, C, 1e-5)
	prevD := roundTo(dt, randn(r, BT*C, 1))
	dinp, dw0 := append([]float32(nil), prevD...), randn(r, C, 1)
	dw := append([]float32(nil), dw0...)
	cpu.RMSNormBackward(dinp, dw, dout, inp, tensor.FloatWeights(w), rstd, BT, C, true)
	// Cross-entropy
	logits := roundTo(dt, randn(r, BT*V, 2))
	targets := make([]int32, BT)
	for i := range targets {
		targets[i] = int32(r.IntN(V))
	}
	targets[3] = -1
	losses, probs := make([]float32, BT), make([]float32, BT*V)
	cpu.CrossEntropy(losses, probs, logits, targets, BT, V)
	onDevice(t, func() {
		bo, brs := poisonedAt(t, dt, BT*C, off), poisonedAt(t, F32, BT, off)
		bi, bw, bd := at(t, dt, inp, off), at(t, dt, w, off), at(t, dt, dout, off)
		dev.RMSNorm(bo, brs, bi, bw, BT, C, 1e-5)
		check(t, "rmsnorm", dt, get(bo), out, 1e-5)
		check(t, "rmsnorm rstd", F32, get(brs), rstd, 1e-5)
		bdi, bdw := at(t, dt, prevD, off), at(t, F32, dw0, off)
		dev.RMSNormBackward(bdi, bdw, bd, bi, bw, brs, BT, C, true)
		check(t, "rmsnorm dinp", dt, get(bdi), dinp, 1e-5)
		check(t, "rmsnorm dweight", F32, get(bdw), dw, 1e-5)

		bl, blse := poisoned(t, F32, BT), poisoned(t, F32, BT)
		bz, bt := put(t, dt, logits), putI32(t, targets)
		dev.CrossEntropy(bl, blse, bz, bt, BT, V)
		check(t, "cross-entropy losses", F32, get(bl), losses, 1e-5)
	})
}

func TestElementwise(t *testing.T) { forLayouts(t, elementwise) }

func elementwise(t *testing.T, dt DType, l layout) {
	r := rand.New(rand.NewPCG(3, uint64(dt)))
	B, T, NH, HD, off := 2, 37, 3, l.HD, l.off
	n := B * T * NH * HD
	rn := n // RoPE's operand; the flat ones have the layout's tail
	n += l.tail
	x := roundTo(dt, randn(r, rn, 1))
	cos, sin := make([]float32, T*HD/2), make([]float32, T*HD/2)
	inv := tensor.RopeInvFreq(HD, 10000, tensor.RopeScaling{})
	cpu.RopeTables(cos, sin, T, inv)
	rot := append([]float32(nil), x...)
	cpu.Rope(rot, cos, sin, tensor.RopeShape{B: B, T: T, NH: NH, HD: HD})
	back := append([]float32(nil), x...)
	cpu.RopeBackward(back, cos, sin, tensor.RopeShape{B: B, T: T, NH: NH, HD: HD})
	g, u, d := roundTo(dt, randn(r, n, 2)), roundTo(dt, randn(r, n, 1)), roundTo(dt, randn(r, n, 1))
	sw := make([]float32, n)
	cpu.SwiGLU(sw, g, u, n)
	dg0, du0 := roundTo(dt, randn(r, n, 1)), roundTo(dt, randn(r, n, 1))
	dg, du := append([]float32(nil), dg0...), append([]float32(nil), du0...)
	cpu.SwiGLUBackward(dg, du, d, g, u, n, true)
	sum := make([]float32, n)
	cpu.Add(sum, g, u, n)
	onDevice(t, func() {
		bc, bs := poisoned(t, F32, T*HD/2), poisoned(t, F32, T*HD/2)
		dev.RopeTables(bc, bs, T, inv)
		check(t, "rope tables", F32, get(bc), cos, 0)
		bx := at(t, dt, x, off)
		dev.Rope(bx, bc, bs, RopeShape{B: B, T: T, NH: NH, HD: HD}, false)
		check(t, "rope", dt, get(bx), rot, 1e-6)
		bx = at(t, dt, x, off)
		dev.Rope(bx, bc, bs, RopeShape{B: B, T: T, NH: NH, HD: HD}, true)
		check(t, "rope backward", dt, get(bx), back, 1e-6)
		bg, bu, bd := at(t, dt, g, off), at(t, dt, u, off), at(t, dt, d, off)
		bo := poisonedAt(t, dt, n, off)
		dev.SwiGLU(bo, bg, bu)
		check(t, "swiglu", dt, get(bo), sw, 1e-5)
		bdg, bdu := at(t, dt, dg0, off), at(t, dt, du0, off)
		dev.SwiGLUBackward(bdg, bdu, bd, bg, bu, true)
		check(t, "swiglu dgate", dt, get(bdg), dg, 1e-5)
		check(t, "swiglu dup", dt, get(bdu), du, 1e-5)
		dev.Add(bo, bg, bu)
		check(t, "add", dt, get(bo), sum, 1e-6)
	})
}
