package data

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTokenizersRoundTrip(t *testing.T) {
	text := []byte("Of the Reflexions of Light — ½ œuvre.\n")
	for _, name := range []string{"byte", "char", "gpt2"} {
		ds, err := fromText(text, name, 0)
		require.NoError(t, err)
		assert.Equal(t, string(text), ds.Tok.Decode(ds.Train), name)
	}
	c, err := NewChar(text)
	require.NoError(t, err)
	_, err = c.Encode([]byte("Z"))
	assert.ErrorContains(t, err, `character 'Z'`)
}

func TestPrepareAndOpen(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "a.txt")
	require.NoError(t, os.WriteFile(src, []byte("hello world, hello shards\n"), 0o644))
	out := filepath.Join(dir, "prepared")
	ds, err := Prepare([]string{src, src}, "char", 0.25, out)
	require.NoError(t, err)
	assert.Len(t, ds.Val, 13) // 52 characters, a quarter held out
	got, err := Open(out, "char", 0.25, "")
	require.NoError(t, err)
	assert.Equal(t, ds.Train, got.Train)
	assert.Equal(t, ds.Val, got.Val)
	assert.Equal(t, ds.Tok.VocabSize(), got.Tok.VocabSize())

	_, err = Open(out, "byte", 0.25, "")
	assert.ErrorContains(t, err, "prepared with the char tokenizer")

	// Text files are cached: the second open reads the cache.
	cache := filepath.Join(dir, "cache")
	a, err := Open(src, "byte", 0.1, cache)
	require.NoError(t, err)
	entries, _ := os.ReadDir(cache)
	require.Len(t, entries, 1)
	b, err := Open(src, "byte", 0.1, cache)
	require.NoError(t, err)
	assert.Equal(t, a.Train, b.Train)
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.txt")
	require.NoError(t, os.WriteFile(empty, nil, 0o644))
	_, err := Open(empty, "byte", 0.1, "")
	assert.ErrorContains(t, err, "is empty")
	_, err = Open(filepath.Join(dir, "none.txt"), "byte", 0.1, "")
	assert.ErrorContains(t, err, "does not exist")
	bad := filepath.Join(dir, "bad.tok")
	require.NoError(t, WriteShard(bad, []int32{1, 2, 3, 4}, "byte", 256))
	require.NoError(t, os.Truncate(bad, headerSize+5)) // a shard cut short
	_, _, err = ReadShard(bad)
	assert.ErrorContains(t, err, "header says 4 tokens")
	require.NoError(t, os.WriteFile(bad, []byte("not a shard at all, just some text here"), 0o644))
	_, _, err = ReadShard(bad)
	assert.ErrorIs(t, err, ErrNotShard)
}

func TestBatchIsAPureFunction(t *testing.T) {
	split := make([]int32, 1000)
	for i := range split {
		split[i] = int32(i)
	}
	B, T := 3, 8
	x1, y1 := make([]int32, B*T), make([]int32, B*T)
	x2, y2 := make([]int32, B*T), make([]int32, B*T)
	Batch(x1, y1, split, 5, 10, 3, B, T)
	Batch(x2, y2, split, 5, 10, 3, B, T)
	assert.Equal(t, x1, x2)
	for i := range x1 {
		assert.Equal(t, x1[i]+1, y1[i], "targets are the next token")
	}
	Batch(x2, y2, split, 5, 11, 3, B, T)
	assert.NotEqual(t, x1, x2, "another step draws other windows")
	// Two ranks of one sequence each see what one rank of two sequences sees.
	a, at := make([]int32, 2*T), make([]int32, 2*T)
	Batch(a, at, split, 5, 10, 4, 2, T)
	Batch(x2[:T], y2[:T], split, 5, 10, 5, 1, T)
	assert.Equal(t, a[T:], x2[:T])
}
