package tensor

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestFP8MatchesPyTorch: Encode and Decode against PyTorch's float8_e4m3fn and
// float8_e5m2 (scripts/fp8_reference.py), bit for bit on the same inputs as
// TestFP8Encode, plain casts against x.to(dtype) and saturating ones against
// clamp-then-cast. It needs PyTorch 2.1 or later: Debian's python3-torch
// (1.13, which make test sets as SHARDLINE_TORCH_PYTHON) has no float8 dtypes,
// so there the test skips saying so, and the float64 reference of
// TestFP8Encode is the check.
func TestFP8MatchesPyTorch(t *testing.T) {
	py := os.Getenv("SHARDLINE_TORCH_PYTHON")
	if py == "" {
		t.Skip("SHARDLINE_TORCH_PYTHON is not set: `make test` installs python3-torch and sets it")
	}
	rng := rand.New(rand.NewPCG(47, 8))
	var xs []float32
	for _, r := range refFormats {
		xs = append(xs, fp8Inputs(r, rng)...)
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.f32"), filepath.Join(dir, "out.bin")
	b := make([]byte, 4*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	if err := os.WriteFile(in, b, 0o644); err != nil {
		t.Fatal(err)
	}
	msg, err := exec.Command(py, "../scripts/fp8_reference.py", in, out).CombinedOutput()
	t.Log(string(msg))
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 3 {
		t.Skipf("%s: its torch has no float8 dtypes; TestFP8Encode's float64 reference stands alone", py)
	}
	if err != nil {
		t.Fatalf("%s: %v", py, err)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	per := 2*len(xs) + 4*256
	if len(got) != 2*per {
		t.Fatalf("torch wrote %d bytes, want %d", len(got), 2*per)
	}
	for k, f := range []FP8Format{E4M3, E5M2} {
		part := got[k*per : (k+1)*per]
		bad := 0
		for i, x := range xs {
			for m, sat := range []bool{false, true} {
				want := part[m*len(xs)+i]
				if sat && x != x && want&0x7f == 0x7f {
					continue // torch.clamp may drop a NaN's sign; it stays a NaN
				}
				if f.Encode(x, sat) != want && bad < 20 {
					bad++
					t.Errorf("%v: Encode(%v [%#08x], saturate %v) = %#02x, torch %#02x", f, x, math.Float32bits(x), sat, f.Encode(x, sat), want)
				}
			}
		}
		vals := part[2*len(xs):]
		for c := range 256 {
			want := math.Float32frombits(binary.LittleEndian.Uint32(vals[4*c:]))
			d := f.Decode(uint8(c))
			if math.IsNaN(float64(want)) != math.IsNaN(float64(d)) || (!math.IsNaN(float64(d)) && math.Float32bits(d) != math.Float32bits(want)) {
				t.Errorf("%v: code %#02x decodes to %v, torch %v", f, c, d, want)
			}
		}
	}
}
