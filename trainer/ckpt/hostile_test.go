package ckpt

import (
	"encoding/json"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/shardline/shardline/fileio"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rewriteMeta applies change to a checkpoint's metadata.json and seals it again.
func rewriteMeta(t *testing.T, dir string, change func(m *Meta)) {
	b, err := os.ReadFile(filepath.Join(dir, MetadataFile))
	require.NoError(t, err)
	var m Meta
	require.NoError(t, json.Unmarshal(b, &m))
	change(&m)
	// Sealed again, as a writer that knows the format would: the checks
	// under test are the ones behind metadata.json's own checksum.
	m.Checksum, err = m.checksum()
	require.NoError(t, err)
	b, err = json.Marshal(&m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, MetadataFile), b, 0o644))
}

// A tensor or a rank file listed twice in metadata.json is refused by Open
// (and so by ckpt verify, inspect and resume): before, verify passed a table
// naming a tensor twice, and a reader took one of the two.
func TestOpenRefusesNamesListedTwice(t *testing.T) {
	dir := writeCheckpoint(t)
	rewriteMeta(t, dir, func(m *Meta) { m.Tensors = append(m.Tensors, m.Tensors[0]) })
	_, err := Verify(dir)
	require.ErrorIs(t, err, fileio.ErrCorrupt)
	assert.ErrorContains(t, err, "tensor w is listed twice")

	dir = writeCheckpoint(t)
	rewriteMeta(t, dir, func(m *Meta) { m.Files = append(m.Files, m.Files[0]) })
	_, err = Verify(dir)
	require.ErrorIs(t, err, fileio.ErrCorrupt)
	assert.ErrorContains(t, err, "file rank-00000.bin is listed twice")
}

// A piece's size, which metadata.json gives, does not set what a reader
// allocates: a checkpoint of one piece of 92 MiB a state kind (a sparse rank
// file) verifies, and a range of it reads, in chunks of 4 MiB (before, each
// piece was read whole into one buffer).
func TestPieceReadsAreChunked(t *testing.T) {
	dir := StepDir(t.TempDir(), 3)
	const count = 23 << 20 // elements: 92 MiB a state kind
	require.NoError(t, os.MkdirAll(dir, 0o755))
	f, err := os.Create(filepath.Join(dir, RankFile(0)))
	require.NoError(t, err)
	require.NoError(t, f.Truncate(3*4*count))
	require.NoError(t, f.Close())
	zeros := make([]byte, 1<<20)
	h := crc32.New(castagnoli)
	for i := 0; i < 4*count/len(zeros); i++ {
		h.Write(zeros)
	}
	sum := FormatSum(h.Sum32())
	m := &Meta{Step: 3, WorldSize: 1, RunID: "test", Files: []File{{Name: RankFile(0), Size: 3 * 4 * count}},
		Tensors: []Tensor{{Name: "w", Shape: []int{count}, Dtype: "fp32", Pieces: []Piece{{Start: 0, Count: count, File: RankFile(0), CRC: []string{sum, sum, sum}}}}}}
	require.NoError(t, Commit(dir, m))

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	n, err := Verify(dir)
	require.NoError(t, err)
	assert.Equal(t, int64(3*4*count), n)
	m, err = Open(dir)
	require.NoError(t, err)
	r := NewReader(dir, m)
	got := []float32{1, 1, 1}
	require.NoError(t, r.Read("w", 2, count-3, got))
	require.NoError(t, r.Close())
	runtime.ReadMemStats(&after)
	assert.Equal(t, []float32{0, 0, 0}, got)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(16<<20), "bytes allocated")

	rewriteMeta(t, dir, func(m *Meta) { m.Tensors[0].Pieces[0].CRC[1] = "00000000" })
	_, err = Verify(dir)
	require.ErrorIs(t, err, fileio.ErrCorrupt)
	assert.ErrorContains(t, err, "tensor w (exp_avg, elements 0..24117248) at byte offset 96468992 has checksum "+sum)
}

// A step directory planted as a symbolic link is not written into: the rank
// file is refused (fileio.ErrLink), and the directory the link names stays
// empty (before, the rank file was written there).
func TestRankFileRefusesLinkedStepDir(t *testing.T) {
	root, victim := t.TempDir(), t.TempDir()
	dir := StepDir(root, 4)
	require.NoError(t, os.Symlink(victim, dir))
	err := WriteRankFile(dir, 0, []byte("state"))
	require.ErrorIs(t, err, fileio.ErrLink)
	assert.ErrorContains(t, err, dir+": output through a link refused: a symbolic link to \""+victim+"\"")
	entries, err := os.ReadDir(victim)
	require.NoError(t, err)
	assert.Empty(t, entries)
}

// Delayed FP8 scaling's state round-trips through metadata.json bit for bit
// (a NaN amax, float32's largest scale included), and one whose byte counts
// disagree with its tensor and step counts is refused by Open.
func TestFP8ScalingInMetadata(t *testing.T) {
	scales := []float32{1, 3.4028235e38, 0.5}
	hist := []float32{0, 0, 0, float32(math.NaN()), 448, 1e-3}
	dir := writeCheckpoint(t)
	rewriteMeta(t, dir, func(m *Meta) { m.FP8 = NewFP8Scaling(scales, hist) })
	m, err := Open(dir)
	require.NoError(t, err)
	require.Equal(t, [2]int{3, 2}, [2]int{m.FP8.Tensors, m.FP8.History})
	s, h := m.FP8.Values()
	for i := range scales {
		assert.Equal(t, math.Float32bits(scales[i]), math.Float32bits(s[i]), "scale %d", i)
	}
	for i := range hist {
		assert.Equal(t, math.Float32bits(hist[i]), math.Float32bits(h[i]), "history %d", i)
	}

	dir = writeCheckpoint(t)
	rewriteMeta(t, dir, func(m *Meta) {
		m.FP8 = NewFP8Scaling(scales, hist)
		m.FP8.History = 3
	})
	_, err = Open(dir)
	require.ErrorIs(t, err, fileio.ErrCorrupt)
	assert.ErrorContains(t, err, "fp8_scaling holds 12 bytes of scales and 24 of amax history for 3 tensors of 3 steps")
}
