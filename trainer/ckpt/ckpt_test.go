package ckpt

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardline/shardline/fileio"
	"github.com/stretchr/testify/require"
)

// writeCheckpoint commits a checkpoint of one tensor "w" of shape (2, 3) in two
// pieces, both in rank 0's file, whose state kind k holds values 10k + i for
// element i. It returns the directory.
func writeCheckpoint(t testing.TB) string {
	t.Helper()
	dir := StepDir(t.TempDir(), 7)
	var data []byte
	var pieces []Piece
	for _, pc := range [][2]int64{{0, 4}, {4, 2}} {
		p := Piece{Start: pc[0], Count: pc[1], File: RankFile(0), Offset: int64(len(data))}
		for k := range States {
			b := make([]byte, 4*pc[1])
			for i := range pc[1] {
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(10*k)+float32(pc[0]+i)))
			}
			p.CRC = append(p.CRC, Sum(b))
			data = append(data, b...)
		}
		pieces = append(pieces, p)
	}
	require.NoError(t, WriteRankFile(dir, 0, data))
	m := &Meta{Step: 7, OptimizerSteps: 7, WorldSize: 1, RunID: "test-run", Tensors: []Tensor{{Name: "w", Shape: []int{2, 3}, Dtype: "fp32", Pieces: pieces}},
		Files: []File{{Name: RankFile(0), Size: int64(len(data))}}}
	require.NoError(t, Commit(dir, m))
	return dir
}

// TestRoundTrip: a committed checkpoint opens, reads any range across its pieces
// in every state kind, and verifies.
func TestRoundTrip(t *testing.T) {
	dir := writeCheckpoint(t)
	m, err := Open(dir)
	require.NoError(t, err)
	require.Equal(t, 7, m.Step)
	r := NewReader(dir, m)
	defer r.Close()
	for k := range States {
		got := make([]float32, 4)
		require.NoError(t, r.Read("w", k, 2, got)) // elements 2..5: both pieces
		for i, v := range got {
			require.Equal(t, float32(10*k+2+i), v)
		}
	}
	n, err := Verify(dir)
	require.NoError(t, err)
	require.Equal(t, int64(4*6*len(States)), n)
	require.Error(t, r.Read("w", 0, 4, make([]float32, 3)), "a range past the tensor's end")
	require.Error(t, r.Read("x", 0, 0, make([]float32, 1)), "an unknown tensor")
}

// TestCorruption: a changed byte is caught by its checksum, a truncated file by
// Open, and a missing metadata.json names the checkpoint incomplete.
func TestCorruption(t *testing.T) {
	dir := writeCheckpoint(t)
	f := filepath.Join(dir, RankFile(0))
	b, err := os.ReadFile(f)
	require.NoError(t, err)
	b[5] ^= 1
	require.NoError(t, os.WriteFile(f, b, 0o644))
	_, err = Verify(dir)
	require.ErrorIs(t, err, fileio.ErrCorrupt)
	require.NoError(t, os.WriteFile(f, b[:len(b)-1], 0o644))
	_, err = Open(dir)
	require.ErrorIs(t, err, fileio.ErrCorrupt)
	require.NoError(t, os.Remove(filepath.Join(dir, MetadataFile)))
	_, err = Open(dir)
	require.ErrorContains(t, err, "not a complete checkpoint")
}

// TestCheckRefusesBadTables: pieces that overlap, leave gaps, overflow or reach
// past their file, and shapes whose element count is negative or overflows, are
// refused by Open before any read.
func TestCheckRefusesBadTables(t *testing.T) {
	dir := writeCheckpoint(t)
	orig, err := Open(dir)
	require.NoError(t, err)
	huge := int64(math.MaxInt64/12 + 1) // 12·huge overflows int64
	for name, edit := range map[string]func(m *Meta){
		"overlap":        func(m *Meta) { m.Tensors[0].Pieces[1].Start = 3 },
		"gap":            func(m *Meta) { m.Tensors[0].Pieces[1].Start = 5; m.Tensors[0].Shape = []int{7} },
		"past the file":  func(m *Meta) { m.Tensors[0].Pieces[1].Offset = 60 },
		"negative shape": func(m *Meta) { m.Tensors[0].Shape = []int{-2, 3} },
		"shape overflow": func(m *Meta) { m.Tensors[0].Shape = []int{1 << 62, 1 << 62, 4} },
		"count overflow": func(m *Meta) {
			m.Tensors[0].Shape = []int{int(huge + 4)}
			m.Tensors[0].Pieces[1].Count = huge
		},
		"checksums":   func(m *Meta) { m.Tensors[0].Pieces[0].CRC = m.Tensors[0].Pieces[0].CRC[:2] },
		"not a rank":  func(m *Meta) { m.Files[0].Name = "../rank-00000.bin" },
		"state kinds": func(m *Meta) { m.States = m.States[:1] },
	} {
		t.Run(name, func(t *testing.T) {
			b, err := json.Marshal(orig)
			require.NoError(t, err)
			var m Meta
			require.NoError(t, json.Unmarshal(b, &m))
			edit(&m)
			b, err = json.Marshal(&m)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(dir, MetadataFile), b, 0o644))
			_, err = Open(dir)
			require.Error(t, err)
		})
	}
}

// TestListLatestPrune: List orders checkpoints by step and marks the incomplete;
// Latest is the newest complete; Prune keeps the newest complete ones and drops
// unfinished saves older than them.
func TestListLatestPrune(t *testing.T) {
	root := t.TempDir()
	for _, s := range []int{1, 2, 3, 5} {
		require.NoError(t, Claim(StepDir(root, s), "me"))
		if s != 2 && s != 5 {
			require.NoError(t, os.WriteFile(filepath.Join(StepDir(root, s), MetadataFile), []byte(`{"run_id":"me"}`), 0o644))
		}
	}
	es, err := List(root)
	require.NoError(t, err)
	require.Len(t, es, 4)
	require.Equal(t, []bool{true, false, true, false}, []bool{es[0].Complete, es[1].Complete, es[2].Complete, es[3].Complete})
	latest, err := Latest(root)
	require.NoError(t, err)
	require.Equal(t, StepDir(root, 3), latest)
	require.Empty(t, Prune(root, 1, "me"))
	es, err = List(root)
	require.NoError(t, err)
	var steps []int
	for _, e := range es {
		steps = append(steps, e.Step)
	}
	require.Equal(t, []int{3, 5}, steps, "step 1 beyond keep=1, step 2 an unfinished save older than step 3; step 5 may still be writing")
}

// FuzzOpen: any metadata.json over any rank file is opened and verified or
// refused, never a panic or an allocation the files cannot back; what opens
// reads every piece of every tensor within its bounds.
func FuzzOpen(f *testing.F) {
	dir := writeCheckpoint(f)
	meta, err := os.ReadFile(filepath.Join(dir, MetadataFile))
	if err != nil {
		f.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, RankFile(0)))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(meta, data)
	f.Add([]byte(strings.Replace(string(meta), `"count": 2`, `"count": 768614336404564651`, 1)), data)
	f.Add([]byte(`{"format":"shardline-checkpoint-v2","run_id":"r","states":["a","b","c"],"tensors":[{"name":"w","shape":[-1]}]}`), data)
	f.Fuzz(func(t *testing.T, meta, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, MetadataFile), meta, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, RankFile(0)), data, 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := Open(dir)
		if err != nil {
			return
		}
		if _, err := Verify(dir); err != nil && !errors.Is(err, fileio.ErrCorrupt) {
			t.Fatalf("Verify after Open: %v (want a checksum error or none)", err)
		}
		r := NewReader(dir, m)
		defer r.Close()
		for _, tn := range m.Tensors {
			if n := tn.Numel(); n > 0 && n <= int64(len(data)) {
				_ = r.Read(tn.Name, 0, 0, make([]float32, n))
			}
		}
	})
}

// TestNewest: the newest complete checkpoint that opens, passing over a newer
// one whose metadata is damaged (named, with why) and an unfinished save; ""
// and no error for a root that is missing or holds no complete checkpoint;
// an error for a root that cannot be read.
func TestNewest(t *testing.T) {
	good := writeCheckpoint(t) // step 7
	root := filepath.Dir(good)
	dir, skipped, err := Newest(root)
	require.NoError(t, err)
	require.Equal(t, good, dir)
	require.Empty(t, skipped)

	damaged := StepDir(root, 9)
	require.NoError(t, os.MkdirAll(damaged, 0o755))
	meta, err := os.ReadFile(filepath.Join(good, MetadataFile))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(damaged, MetadataFile), []byte(strings.Replace(string(meta), `"step": 7`, `"step": 9`, 1)), 0o644))
	require.NoError(t, Claim(StepDir(root, 11), "test-run")) // unfinished
	dir, skipped, err = Newest(root)
	require.NoError(t, err)
	require.Equal(t, good, dir)
	require.Len(t, skipped, 1)
	require.Equal(t, damaged, skipped[0].Dir)
	require.Error(t, skipped[0].Err)

	for _, empty := range []string{filepath.Join(t.TempDir(), "none"), t.TempDir()} {
		dir, skipped, err = Newest(empty)
		require.NoError(t, err)
		require.Empty(t, dir)
		require.Empty(t, skipped)
	}
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	_, _, err = Newest(file)
	require.Error(t, err, "a root that is a file cannot be read")
}
