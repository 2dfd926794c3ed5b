package hf

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The reader refuses what the format forbids, naming the file: a header past the
// data, an unknown dtype, a shape that does not fit its byte range, overlapping
// tensors; BF16 and F16 read as float32.
func TestReadSafetensorsChecks(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.safetensors")
	write := func(header string, data []byte) {
		for len(header)%8 != 0 {
			header += " "
		}
		b := []byte{byte(len(header)), byte(len(header) >> 8), 0, 0, 0, 0, 0, 0}
		require.NoError(t, os.WriteFile(path, append(append(b, header...), data...), 0o644))
	}
	write(`{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"F16","shape":[1],"data_offsets":[4,6]},"__metadata__":{"k":"v"}}`,
		[]byte{0x80, 0x3f, 0x00, 0xc0, 0x00, 0x3c}) // bf16 1, -2; f16 1
	ts, meta, err := ReadSafetensors(path, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, []float32{1, -2}, ts["a"].Data)
	assert.Equal(t, []float32{1}, ts["b"].Data)
	assert.Equal(t, map[string]string{"k": "v"}, meta)
	for _, c := range []struct{ header, want string }{
		{`{"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}`, `dtype "I64"`},
		{`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, "does not fit bytes"},
		{`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, "overlap"},
		{`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, "does not fit bytes"},
		{`{"a":`, "header"},
	} {
		write(c.header, make([]byte, 8))
		_, _, err := ReadSafetensors(path, 1<<20)
		assert.ErrorContains(t, err, c.want, c.header)
		assert.ErrorContains(t, err, path)
	}
	require.NoError(t, os.WriteFile(path, []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}, 0o644))
	_, _, err = ReadSafetensors(path, 1<<20)
	assert.ErrorContains(t, err, "header length")
}

// FuzzReadSafetensors: any bytes are read or refused, never a panic, and what is
// read has as many values as its shape says.
func FuzzReadSafetensors(f *testing.F) {
	dir := f.TempDir()
	p := filepath.Join(dir, "seed.safetensors")
	if err := WriteSafetensors(p, []Tensor{{Name: "w", Shape: []int{2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}}}, map[string]string{"format": "pt"}); err != nil {
		f.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(t.TempDir(), "x.safetensors")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		ts, _, err := ReadSafetensors(p, 1<<20)
		if err != nil {
			return
		}
		for name, tn := range ts {
			if numel(tn.Shape) != int64(len(tn.Data)) {
				t.Fatalf("%s: shape %v but %d values", name, tn.Shape, len(tn.Data))
			}
		}
	})
}

// An empty tensor (a zero-width shared expert) at the offset where another
// starts overlaps nothing: it reads, whichever name sorts first (it was
// refused as overlapping when its name sorted after the other's).
func TestReadSafetensorsEmptyTensor(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.safetensors")
	require.NoError(t, WriteSafetensors(p, []Tensor{{Name: "z", Shape: []int{0, 4}}, {Name: "a", Shape: []int{1}, Data: []float32{3}}}, nil))
	ts, _, err := ReadSafetensors(p, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, []float32{3}, ts["a"].Data)
	assert.Empty(t, ts["z"].Data)
	assert.Equal(t, []int{0, 4}, ts["z"].Shape)
}
