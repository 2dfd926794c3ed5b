package cpu

import (
	"math"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/memtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMemoryRoundTrips: values written, copied between dtypes and read back
// arrive rounded as each dtype rounds (exact for f64, float32(x) for f32,
// tensor.ToBF16 for bf16, truncation for i32); slices address their own
// elements; every Read and Sync is counted, and nothing else is; Held and Peak
// count the bytes held now and at most.
func TestMemoryRoundTrips(t *testing.T) {
	m := NewMemory()
	vals := []float64{1.0 / 3, -2.5, 1e-40, 65504.123, math.Inf(-1)}
	f64, f32, bf, i32 := m.Alloc(tensor.Float64, 5), m.Alloc(tensor.Float32, 5), m.Alloc(tensor.BFloat16, 5), m.Alloc(tensor.Int32, 5)
	assert.Equal(t, int64(5*8+5*4+5*2+5*4), m.Held())
	m.Write(f64, vals)
	m.Copy(f32, f64)
	m.Copy(bf, f32)
	got := make([]float64, 5)
	m.Read(got, f64)
	assert.Equal(t, vals, got)
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
	assert.Equal(t, []float64{1, -2, 3, 0, 7}, got)
	// Slices: element offsets within the storage.
	m.Fill(f64.Slice(1, 3), 9)
	m.Zero(f64.At(4))
	m.Read(got, f64)
	assert.Equal(t, []float64{1.0 / 3, 9, 9, 65504.123, 0}, got)
	m.Copy(f32.Slice(0, 2), f64.Slice(2, 4))
	two := make([]float64, 2)
	m.Read(two, f32.Slice(0, 2))
	assert.Equal(t, []float64{9, float64(float32(65504.123))}, two)
	assert.Equal(t, []float32{9, float32(65504.123)}, m.Float32s(f32)[:2], "Float32s views the elements in place")
	m.Sync()
	assert.Equal(t, int64(7), m.Readbacks(), "six Reads and one Sync")
	require.NoError(t, m.Err())
	m.Free(f64)
	assert.Equal(t, int64(5*4+5*2+5*4), m.Held())
	assert.Equal(t, int64(5*8+5*4+5*2+5*4), m.Peak(), "the most held at once, before the free")
	m.Free(m.Alloc(tensor.Float32, 3))
	assert.Equal(t, int64(5*8+5*4+5*2+5*4), m.Peak(), "less than the peak, allocated and freed")
	m.Free(m.Alloc(tensor.Float32, 20))
	assert.Equal(t, int64(5*4+5*2+5*4+20*4), m.Peak())
	// FP8 buffers hold one byte a value.
	e4, e5 := m.Alloc(tensor.Float8E4M3, 1000), m.Alloc(tensor.Float8E5M2, 24)
	assert.Equal(t, int64(5*4+5*2+5*4+1000+24), m.Held())
	m.Free(e4)
	m.Free(e5)
	assert.Equal(t, int64(5*4+5*2+5*4), m.Held())
	require.NoError(t, m.Err())
}

// TestMemoryErrorsAreSticky: misuse of the CPU's own kinds is kept as the
// memory's first error, later work is skipped, and nothing panics: a host
// view of the wrong dtype, kernels handed buffers of the wrong dtype.
func TestMemoryErrorsAreSticky(t *testing.T) {
	// The misuses every memory refuses (another memory's buffer, lengths,
	// freed buffers, ...) are tensor/memtest's; these are the CPU's own.
	cases := map[string]func(m, other *Memory){
		"f64 as f32":  func(m, _ *Memory) { m.Float32s(m.Alloc(tensor.Float64, 1)) },
		"stats dtype": func(m, _ *Memory) { CloseStep(m.Alloc(tensor.Float32, tensor.NumStats), 1) },
		// Token ids must be an int32 buffer: f32 ones fail and the kernel does
		// nothing (no index is read from them).
		"float tokens": func(m, _ *Memory) {
			Backend{}.Embedding(m.Alloc(tensor.Float32, 2*4), m.Alloc(tensor.Float32, 2), m.Alloc(tensor.Float32, 3*4),
				tensor.EmbeddingShape{BT: 2, C: 4, N: 3})
		},
		"float routing": func(m, _ *Memory) {
			s := tensor.MoEShape{BT: 2, E: 2, K: 1, C: 1, Capacity: 2}
			Backend{}.Router(m.Alloc(tensor.Float32, 4), m.Alloc(tensor.Float32, 2), m.Alloc(tensor.Float32, 4),
				tensor.Routing{Idx: m.Alloc(tensor.Float32, 2)}, s)
		},
	}
	for name, misuse := range cases {
		t.Run(name, func(t *testing.T) {
			m := NewMemory()
			misuse(m, NewMemory())
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

// TestStepStatistics: the kernels that keep a step's statistics on the backend
// compute what the host computed before them: the loss sum over counted tokens
// in token order, square sums (with accumulation), the norm, clip factor and
// gate, clipping and the optimizers only when the step applies, AdamW at the
// optimizer step the buffer counts. Exact equality: the same float64 and
// float32 operations in the same order.
func TestStepStatistics(t *testing.T) {
	m := NewMemory()
	st := m.Alloc(tensor.Float64, tensor.NumStats)
	losses := []float32{0.5, 1.25, 3, 0.125}
	targets := []int32{1, -1, 2, 0}
	LossSum(st.At(tensor.StatLoss), losses, targets, false)
	LossSum(st.At(tensor.StatLoss), losses, targets, true)
	m.Write(st.At(tensor.StatTokens), []float64{6})
	g := []float32{3, 4, 12}
	SumSquaresInto(st.At(tensor.StatSumSq), g[:2], false)
	SumSquaresInto(st.At(tensor.StatExpertSumSq), g[2:], false)
	CloseStep(st, 1)
	got := make([]float64, tensor.NumStats)
	m.Read(got, st)
	assert.Equal(t, 2*(0.5+3+0.125), got[tensor.StatLoss])
	assert.Equal(t, 25.0, got[tensor.StatSumSq])
	assert.Equal(t, 13.0, got[tensor.StatNorm])
	assert.Equal(t, tensor.ClipFactor(13, 1), got[tensor.StatClip])
	assert.Equal(t, []float64{1, 1}, got[tensor.StatApplied:tensor.NumStats])

	// AdamW applies, at optimizer step 1, from the gradients clipped: as AdamW
	// on gradients scaled in place beforehand. The gradients are left as they are.
	want := []float32{3, 4, 12}
	Scale(want, tensor.ClipFactor(13, 1))
	p, mm, v := []float32{1, 2, 3}, make([]float32, 3), make([]float32, 3)
	pw, mw, vw := []float32{1, 2, 3}, make([]float32, 3), make([]float32, 3)
	AdamW(pw, nil, want, mw, vw, 0.1, 0.9, 0.95, 1e-8, 0.01, 1, 1)
	// The backend's AdamW on buffers: the same values, read back as float32,
	// and the bf16 compute copy of them.
	pb, gb, mb, vb := m.Alloc(tensor.Float32, 3), m.Alloc(tensor.Float32, 3), m.Alloc(tensor.Float32, 3), m.Alloc(tensor.Float32, 3)
	cb := m.Alloc(tensor.BFloat16, 3)
	m.Write(pb, p)
	m.Write(gb, g)
	Backend{}.AdamW(pb, cb, gb, mb, vb, 0.1, 0.9, 0.95, 1e-8, 0.01, st)
	m.Read(p, pb)
	m.Read(mm, mb)
	m.Read(v, vb)
	assert.Equal(t, pw, p)
	assert.Equal(t, mw, mm)
	assert.Equal(t, vw, v)
	gr, cw := make([]float32, 3), make([]float32, 3)
	m.Read(gr, gb)
	assert.Equal(t, g, gr)
	m.Read(cw, cb)
	for i := range pw {
		assert.Equal(t, tensor.ToBF16(pw[i]).Float32(), cw[i])
	}

	// A non-finite loss: not applied, the optimizer step count kept, nothing moves.
	m.Write(st.At(tensor.StatLoss), []float64{math.NaN()})
	CloseStep(st, 1)
	m.Read(got, st)
	assert.Equal(t, []float64{0, 1}, got[tensor.StatApplied:tensor.NumStats])
	before := append([]float32(nil), p...)
	AdamWStep(p, nil, g, mm, v, 0.1, 0.9, 0.95, 1e-8, 0.01, st)
	SGDStep(p, nil, g, mm, 0.1, 0.9, 0.01, st)
	assert.Equal(t, before, p)
	// A finite step again: optimizer step 2; clipping off leaves the factor 1.
	m.Write(st.At(tensor.StatLoss), []float64{1})
	CloseStep(st, 0)
	m.Read(got, st)
	assert.Equal(t, []float64{1, 1, 2}, got[tensor.StatClip:tensor.NumStats])
	require.NoError(t, m.Err())
	// float64 kernels take f64 buffers (the gradient checks); an f32 buffer is
	// refused, the failure kept.
	d := m.Alloc(tensor.Float64, 3)
	Kernels[float64]{}.SGD(d, tensor.Buffer{}, d, d, 0.1, 0, 0, st)
	require.NoError(t, m.Err())
	Kernels[float64]{}.SGD(d, tensor.Buffer{}, pb, d, 0.1, 0, 0, st)
	require.ErrorContains(t, m.Err(), "f32 buffer where the kernels run in float64")
	// A compute copy of another length is refused, the failure kept.
	m2 := NewMemory()
	f := m2.Alloc(tensor.Float32, 3)
	Backend{}.AdamW(f, m2.Alloc(tensor.BFloat16, 2), f, f, f, 0.1, 0.9, 0.95, 1e-8, 0.01, st)
	require.ErrorContains(t, m2.Err(), "a compute copy of 2 values for 3 parameters")
}

// TestMemoryConformance: the CPU memory behaves as every tensor.Memory must
// (tensor/memtest), the checks the GPU's memory runs in the device tests.
func TestMemoryConformance(t *testing.T) {
	memtest.Run(t, func() tensor.Memory { return NewMemory() })
}
