package hf

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/shardline/shardline/fileio"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A model directory's weights files are read only up to what the recipe's
// model needs, checked from their sizes before a byte is read (a sparse file
// of 256 MiB, where the model needs a few kilobytes, was read whole before);
// and a directory holding both model.safetensors and an index is refused,
// where the index silently won.
func TestReadModelBoundsAndAmbiguity(t *testing.T) {
	dir := t.TempDir()
	w := []Tensor{{Name: "w", Shape: []int{2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}}}
	require.NoError(t, WriteSafetensors(filepath.Join(dir, "model.safetensors"), w, nil))
	limit := int64(4*6 + 4<<10)
	ts, err := ReadModel(dir, limit)
	require.NoError(t, err)
	assert.Equal(t, w[0].Data, ts["w"].Data)

	big := filepath.Join(dir, "model.safetensors")
	f, err := os.OpenFile(big, os.O_WRONLY, 0)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(256<<20))
	require.NoError(t, f.Close())
	_, err = ReadModel(dir, limit)
	require.ErrorIs(t, err, fileio.ErrTooLarge)
	assert.ErrorContains(t, err, "more than the recipe's model needs")

	require.NoError(t, WriteSafetensors(big, w, nil))
	other := []Tensor{{Name: "w", Shape: []int{2, 3}, Data: []float32{9, 9, 9, 9, 9, 9}}}
	require.NoError(t, WriteSafetensors(filepath.Join(dir, "model-00001-of-00001.safetensors"), other, nil))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), []byte(`{"weight_map":{"w":"model-00001-of-00001.safetensors"}}`), 0o644))
	_, err = ReadModel(dir, limit)
	assert.ErrorContains(t, err, dir+" holds both model.safetensors and model.safetensors.index.json")

	_, err = ReadModel(t.TempDir(), limit)
	assert.ErrorContains(t, err, "holds neither model.safetensors nor model.safetensors.index.json")
}

// ReadSafetensors decoded each header entry as it parsed it, before the
// overlap check: a file of 1 MiB of data whose 200 entries all name the same
// bytes [0, 1 MiB) allocated 200 MiB of tensors before it was refused. The
// spans are now checked first, so what is decoded is at most the file's data:
// the refusal allocates about the file's size.
func TestOverlappingEntriesAllocateNothing(t *testing.T) {
	const data = 1 << 20
	header := map[string]any{}
	for i := range 200 {
		header[fmt.Sprintf("t%03d", i)] = headerEntry{Dtype: "F32", Shape: []int{data / 4}, Offsets: [2]int64{0, data}}
	}
	hb, err := json.Marshal(header)
	require.NoError(t, err)
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(hb)))
	b = append(append(b, hb...), make([]byte, data)...)
	path := filepath.Join(t.TempDir(), "model.safetensors")
	require.NoError(t, os.WriteFile(path, b, 0o644))

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err = ReadSafetensors(path, int64(len(b)))
	runtime.ReadMemStats(&after)
	require.Error(t, err)
	assert.Contains(t, err.Error(), path+": not a valid safetensors file: tensors t")
	assert.Contains(t, err.Error(), "overlap")
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(4*len(b)), "allocated for a refused file of %d bytes", len(b))
}
