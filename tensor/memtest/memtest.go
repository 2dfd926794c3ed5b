package memtest

import (
	"math"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Run runs every check on memories newMem makes (a fresh one per check).
func Run(t *testing.T, newMem func() tensor.Memory) {
	t.Run("round trips", func(t *testing.T) { roundTrips(t, newMem()) })
	t.Run("zeroed and filled", func(t *testing.T) { zeroedAndFilled(t, newMem()) })
	t.Run("bf16 rounding", func(t *testing.T) { bf16Rounding(t, newMem()) })
	t.Run("fp8", func(t *testing.T) { fp8(t, newMem()) })
	t.Run("sticky errors", func(t *testing.T) { stickyErrors(t, newMem) })
}

// roundTrips: values written, copied between dtypes and read back arrive
// rounded as each dtype rounds (exact for f64, float32(x) for f32,
// tensor.ToBF16 of that for bf16, truncation for i32); slices address their
// own elements; every Read and Sync is counted as a read-back, and nothing
// else is.
func roundTrips(t *testing.T, m tensor.Memory) {
	start := m.Readbacks()
	vals := []float64{1.0 / 3, -2.5, 1e-40, 65504.123, math.Inf(-1)}
	f64, f32, bf, i32 := m.Alloc(tensor.Float64, 5), m.Alloc(tensor.Float32, 5), m.Alloc(tensor.BFloat16, 5), m.Alloc(tensor.Int32, 5)
	m.Write(f64, vals)
	m.Copy(f32, f64)
	m.Copy(bf, f32)
	got := make([]float64, 5)
	m.Read(got, f64)
	assert.Equal(t, vals, got, "f64")
	m.Read(got, f32)
	for i, v := range vals {
		assert.Equal(t, float64(float32(v)), got[i], "f32 %d", i)
	}
	m.Read(got, bf)
	for i, v := range vals {
		assert.Equal(t, float64(tensor.ToBF16(float32(v)).Float32()), got[i], "bf16 %d", i)
	}
	m.Write(i32, []float64{1, -2, 3.9, 0, 7})
	m.Read(got, i32)
	assert.Equal(t, []float64{1, -2, 3, 0, 7}, got, "i32 truncates")
	// Host types other than the buffer's convert both ways.
	m.Write(f32, []int32{4, -5, 6, 7, 8})
	asBF := make([]tensor.BF16, 5)
	m.Read(asBF, f32)
	assert.Equal(t, []tensor.BF16{tensor.ToBF16(4), tensor.ToBF16(-5), tensor.ToBF16(6), tensor.ToBF16(7), tensor.ToBF16(8)}, asBF)
	asF32 := make([]float32, 5)
	m.Copy(f64, bf)
	m.Read(asF32, f64)
	for i, v := range vals {
		assert.Equal(t, tensor.ToBF16(float32(v)).Float32(), asF32[i], "bf16 to f64 %d", i)
	}
	// Slices: element offsets within the storage.
	m.Write(f64, vals)
	m.Fill(f64.Slice(1, 3), 9)
	m.Zero(f64.At(4))
	m.Read(got, f64)
	assert.Equal(t, []float64{1.0 / 3, 9, 9, 65504.123, 0}, got)
	m.Copy(f32.Slice(0, 2), f64.Slice(2, 4))
	two := make([]float64, 2)
	m.Read(two, f32.Slice(0, 2))
	assert.Equal(t, []float64{9, float64(float32(65504.123))}, two)
	m.Sync()
	assert.Equal(t, int64(9), m.Readbacks()-start, "eight Reads and one Sync")
	require.NoError(t, m.Err())
	m.Free(f64)
	require.NoError(t, m.Err())
}

// zeroedAndFilled: an allocation of every dtype reads back zero; Fill stores
// its value rounded to the dtype.
func zeroedAndFilled(t *testing.T, m tensor.Memory) {
	for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16, tensor.Int32, tensor.Float64, tensor.Float8E4M3, tensor.Float8E5M2} {
		b := m.Alloc(dt, 7)
		got := make([]float64, 7)
		m.Read(got, b)
		assert.Equal(t, make([]float64, 7), got, "%s allocation", dt)
		m.Fill(b.Slice(2, 5), -3)
		m.Read(got, b)
		assert.Equal(t, []float64{0, 0, -3, -3, -3, 0, 0}, got, "%s fill", dt)
	}
	b := m.Alloc(tensor.BFloat16, 1)
	m.Fill(b, 1.0/3)
	got := []float32{0}
	m.Read(got, b)
	assert.Equal(t, tensor.ToBF16(1.0/3).Float32(), got[0], "bf16 fill rounds")
	require.NoError(t, m.Err())
}

// bf16Rounding: f32 to bf16 copies round to nearest, ties to even, and
// bf16 to f32 widens exactly.
func bf16Rounding(t *testing.T, m tensor.Memory) {
	// 1 + 2⁻⁸ is a tie between 1 and 1 + 2⁻⁷ (to even: 1); 1 + 3·2⁻⁸ is a tie
	// between 1 + 2⁻⁷ and 1 + 2⁻⁶ (to even: 1 + 2⁻⁶); 1 + 2⁻⁸ + 2⁻²⁰ rounds up.
	in := []float32{1 + 1.0/256, 1 + 3.0/256, 1 + 1.0/256 + 1.0/(1<<20), -1 - 1.0/256, 3e38}
	want := []float32{1, 1 + 1.0/64, 1 + 1.0/128, -1, tensor.ToBF16(3e38).Float32()}
	f, h, back := m.Alloc(tensor.Float32, len(in)), m.Alloc(tensor.BFloat16, len(in)), m.Alloc(tensor.Float32, len(in))
	m.Write(f, in)
	m.Copy(h, f)
	m.Copy(back, h)
	got := make([]float32, len(in))
	m.Read(got, back)
	assert.Equal(t, want, got)
	require.NoError(t, m.Err())
}

// fp8: FP8 buffers hold one code per element. Codes written as
// tensor.F8E4M3 or F8E5M2 values read back unchanged, and copy unchanged
// between buffers of the format (an all-gather's copy); other host types and
// dtypes convert through the code's value at scale 1, rounding to nearest
// even and saturating at the format's largest value (as Transformer Engine's
// casts); Fill rounds the same way.
func fp8(t *testing.T, m tensor.Memory) {
	codes := []tensor.F8E4M3{0x00, 0x80, 0x01, 0x38, 0x7e, 0xfe, 0x7f, 0x55}
	e4, e4b := m.Alloc(tensor.Float8E4M3, len(codes)), m.Alloc(tensor.Float8E4M3, len(codes))
	m.Write(e4, codes)
	m.Copy(e4b, e4)
	back := make([]tensor.F8E4M3, len(codes))
	m.Read(back, e4b)
	assert.Equal(t, codes, back, "e4m3 codes")
	in := []float32{1, -2.5, 464, 1000, float32(math.Inf(-1)), 0x1p-10, 0x1.8p-9, 0.3}
	want := []float32{1, -2.5, 448, 448, -448, 0, 0x1p-8, 0.3125}
	f := m.Alloc(tensor.Float32, len(in))
	m.Write(f, in)
	m.Copy(e4, f)
	got := make([]float32, len(in))
	m.Read(got, e4)
	assert.Equal(t, want, got, "f32 into e4m3: nearest even, saturated")
	m.Write(e4, in)
	m.Read(got, e4)
	assert.Equal(t, want, got, "float32 host values into e4m3")
	e5 := m.Alloc(tensor.Float8E5M2, len(in))
	m.Copy(e5, f)
	m.Read(got, e5)
	assert.Equal(t, []float32{1, -2.5, 448, 1024, -57344, 0x1p-10, 0x1.8p-9, 0.3125}, got, "f32 into e5m2")
	asE5 := make([]tensor.F8E5M2, len(in))
	m.Read(asE5, e5)
	assert.Equal(t, tensor.F8E5M2(0x3c), asE5[0], "1 is e5m2's 0x3c")
	m.Copy(e5, e4) // between the formats, through the values
	m.Read(got, e5)
	assert.Equal(t, []float32{1, -2.5, 448, 448, -448, 0, 0x1p-8, 0.3125}, got, "e4m3 into e5m2")
	m.Fill(e4.Slice(1, 3), 500)
	m.Read(back, e4)
	assert.Equal(t, []tensor.F8E4M3{tensor.ToF8E4M3(1), 0x7e, 0x7e}, back[:3], "fill saturates")
	require.NoError(t, m.Err())
}

// stickyErrors: misuse is kept as the memory's first error, later work is
// skipped, and nothing panics: another memory's buffer, the empty buffer (a
// slice out of range), lengths that differ, integers copied into floats, a
// freed buffer, a partial free, a negative allocation, a host type no buffer
// has.
func stickyErrors(t *testing.T, newMem func() tensor.Memory) {
	cases := map[string]func(m, other tensor.Memory){
		"foreign":      func(m, o tensor.Memory) { m.Zero(o.Alloc(tensor.Float32, 2)) },
		"out of range": func(m, _ tensor.Memory) { m.Fill(m.Alloc(tensor.Float32, 2).Slice(1, 3), 1) },
		"lengths": func(m, _ tensor.Memory) {
			m.Write(m.Alloc(tensor.Float64, 2), []float64{1, 2, 3})
		},
		"copy lengths": func(m, _ tensor.Memory) { m.Copy(m.Alloc(tensor.Float32, 2), m.Alloc(tensor.Float32, 3)) },
		"int to float": func(m, _ tensor.Memory) { m.Copy(m.Alloc(tensor.Float32, 2), m.Alloc(tensor.Int32, 2)) },
		"int to fp8":   func(m, _ tensor.Memory) { m.Copy(m.Alloc(tensor.Float8E4M3, 2), m.Alloc(tensor.Int32, 2)) },
		"no dtype":     func(m, _ tensor.Memory) { m.Alloc(tensor.MaxDType+1, 2) },
		"freed": func(m, _ tensor.Memory) {
			b := m.Alloc(tensor.Float64, 2)
			m.Free(b)
			m.Read(make([]float64, 2), b)
		},
		"partial free": func(m, _ tensor.Memory) { m.Free(m.Alloc(tensor.Float64, 4).Slice(0, 2)) },
		"negative":     func(m, _ tensor.Memory) { m.Alloc(tensor.Float32, -1) },
		"host type":    func(m, _ tensor.Memory) { m.Write(m.Alloc(tensor.Float32, 2), []int64{1, 2}) },
	}
	for name, misuse := range cases {
		t.Run(name, func(t *testing.T) {
			m := newMem()
			misuse(m, newMem())
			err := m.Err()
			require.Error(t, err)
			// Sticky: later work is skipped and the first error stays.
			b := m.Alloc(tensor.Float64, 1)
			m.Write(b, []float64{5})
			got := []float64{-1}
			m.Read(got, b)
			assert.Equal(t, -1.0, got[0], "work after a failure is skipped")
			assert.Equal(t, err, m.Err())
		})
	}
}
