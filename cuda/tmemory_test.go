//go:build cuda || cudaemu

package cuda

import (
	"math"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/memtest"
	"github.com/stretchr/testify/require"
)

// TestMemoryConformance: the device memory behaves as every tensor.Memory
// must (tensor/memtest: conversions and rounding, slices, counted read-backs,
// sticky refusals), the checks the CPU memory passes in the ordinary suite;
// memtest calls it from the test's goroutine, so every call also takes the
// way to the device's goroutine.
func TestMemoryConformance(t *testing.T) {
	memtest.Run(t, func() tensor.Memory { return dev.NewMemory() })
}

// TestFP8Casts: the device's FP8 conversion kernels (Memory.Copy between
// dtypes) give tensor's casts bit for bit: every code of both formats to f32,
// bf16 and f64, and 65,536 float32 bit patterns (every exponent, NaNs and
// infinities) plus each code's value, its float32 neighbours and the tie with
// the next code to E4M3 and E5M2, saturating.
func TestFP8Casts(t *testing.T) {
	m := dev.NewMemory()
	codes := make([]tensor.F8E4M3, 256)
	for i := range codes {
		codes[i] = tensor.F8E4M3(i)
	}
	xs := make([]float32, 0, 1<<16+256*4*2)
	for i := range 1 << 16 {
		xs = append(xs, math.Float32frombits(uint32(i)*0x9e3779b9))
	}
	for _, f := range []tensor.FP8Format{tensor.E4M3, tensor.E5M2} {
		for c := range 256 {
			v := f.Decode(uint8(c))
			xs = append(xs, v, math.Nextafter32(v, float32(math.Inf(1))), math.Nextafter32(v, float32(math.Inf(-1))))
			if c&0x7f < 0x7f { // the tie with the next code up (past the largest: the overflow step)
				xs = append(xs, (v+f.Decode(uint8(c+1)))/2)
			}
		}
	}
	for _, dt := range []tensor.DType{tensor.Float8E4M3, tensor.Float8E5M2} {
		f, _ := dt.FP8()
		q := m.Alloc(dt, 256)
		var hostCodes any
		if dt == tensor.Float8E4M3 {
			hostCodes = codes
		} else {
			e5 := make([]tensor.F8E5M2, 256)
			for i := range e5 {
				e5[i] = tensor.F8E5M2(i)
			}
			hostCodes = e5
		}
		m.Write(q, hostCodes)
		f32, bf, f64 := m.Alloc(tensor.Float32, 256), m.Alloc(tensor.BFloat16, 256), m.Alloc(tensor.Float64, 256)
		m.Copy(f32, q)
		m.Copy(bf, q)
		m.Copy(f64, q)
		got32, gotBF, got64 := make([]float32, 256), make([]tensor.BF16, 256), make([]float64, 256)
		m.Read(got32, f32)
		m.Read(gotBF, bf)
		m.Read(got64, f64)
		for c := range 256 {
			want := f.Decode(uint8(c))
			if want != want {
				if got32[c] == got32[c] || got64[c] == got64[c] || gotBF[c].Float32() == gotBF[c].Float32() {
					t.Errorf("%v code %#02x: %v, %v, %v, want NaN", dt, c, got32[c], gotBF[c], got64[c])
				}
				continue
			}
			if math.Float32bits(got32[c]) != math.Float32bits(want) || gotBF[c] != tensor.ToBF16(want) || math.Float64bits(got64[c]) != math.Float64bits(float64(want)) {
				t.Errorf("%v code %#02x: %v, %v, %v, want %v", dt, c, got32[c], gotBF[c].Float32(), got64[c], want)
			}
		}
		in, out := m.Alloc(tensor.Float32, len(xs)), m.Alloc(dt, len(xs))
		m.Write(in, xs)
		m.Copy(out, in)
		back := m.Alloc(tensor.Float32, len(xs))
		m.Copy(back, out)
		gotV := make([]float32, len(xs))
		m.Read(gotV, back)
		bad := 0
		for i, x := range xs {
			want := f.Decode(f.Encode(x, true))
			same := math.Float32bits(gotV[i]) == math.Float32bits(want) || (want != want && gotV[i] != gotV[i])
			if !same && bad < 10 {
				bad++
				t.Errorf("%v: %v [%#08x] became %v, want %v", dt, x, math.Float32bits(x), gotV[i], want)
			}
		}
	}
	require.NoError(t, m.Err())
}
