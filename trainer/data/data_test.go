package data

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/shardline/shardline/fileio"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTokenizersRoundTrip(t *testing.T) {
	text := []byte("Of the Reflexions of Light — ½ œuvre.\n")
	for _, name := range []string{"byte", "char", "gpt2"} {
		ds, err := fromText(text, name, 0, nil)
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
	var calls [][2]int
	ds, err := Prepare([]string{src, src}, "char", 0.25, out, false, func(done, total int) { calls = append(calls, [2]int{done, total}) })
	require.NoError(t, err)
	assert.Len(t, ds.Val, 13) // 52 characters, a quarter held out
	assert.Equal(t, [][2]int{{52, 52}}, calls, "char reports its progress once, at the end")
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
	_, err = Open("/dev/zero", "byte", 0.1, "")
	assert.ErrorContains(t, err, "not a regular file (a device)")
}

// flip changes one byte of a file.
func flip(t *testing.T, path string, off int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	if off < 0 {
		off += int64(len(b))
	}
	b[off] ^= 0x40
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

// Shards are checked where they enter: checksum, header against size, and every
// token id against the vocabulary, with the file and offset named.
func TestShardChecks(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.tok")
	write := func(tokens []int32, vocab int) {
		require.NoError(t, WriteShard(bad, tokens, "byte", vocab))
	}
	write([]int32{1, 2, 3, 4}, 256)
	sh, err := ReadShard(bad)
	require.NoError(t, err)
	assert.Equal(t, &Shard{Tokens: []int32{1, 2, 3, 4}, Tokenizer: "byte", Vocab: 256}, sh)

	require.NoError(t, os.Truncate(bad, headerSize+5)) // a shard cut short
	_, err = ReadShard(bad)
	assert.ErrorIs(t, err, fileio.ErrCorrupt)
	assert.ErrorContains(t, err, bad)

	write([]int32{1, 2, 3, 4}, 256)
	flip(t, bad, headerSize+2) // one token changed
	_, err = ReadShard(bad)
	assert.ErrorIs(t, err, fileio.ErrCorrupt)

	write([]int32{1, 2, 259, 4}, 260) // a token past a vocabulary of 256 is fine below 260 ...
	_, err = ReadShard(bad)
	require.NoError(t, err)
	write([]int32{1, 2, 3, 7}, 4) // ... and refused at or past the vocabulary
	_, err = ReadShard(bad)
	assert.ErrorIs(t, err, ErrBadToken)
	assert.ErrorContains(t, err, "token 7 at byte offset 54 (token 3) is not below the vocabulary size 4")

	require.NoError(t, os.WriteFile(bad, []byte("not a shard at all, just some text here"), 0o644))
	_, err = ReadShard(bad)
	assert.ErrorIs(t, err, fileio.ErrCorrupt)
}

// A prepared directory whose shards hold ids past its tokenizer's vocabulary is
// refused; a corrupt tokenizer.json is refused naming the file.
func TestPreparedDirectoryChecks(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "a.txt")
	require.NoError(t, os.WriteFile(src, []byte("abcabcabcabc"), 0o644))
	out := filepath.Join(dir, "prepared")
	_, err := Prepare([]string{src}, "char", 0.25, out, false, nil)
	require.NoError(t, err)
	require.NoError(t, WriteShard(filepath.Join(out, "train.tok"), []int32{0, 1, 2, 200}, "char", 256))
	_, err = Open(out, "char", 0.25, "")
	assert.ErrorContains(t, err, "holds char tokens below 256")

	_, err = Prepare([]string{src}, "char", 0.25, out, false, nil)
	require.NoError(t, err)
	tj := filepath.Join(out, "tokenizer.json")
	b, err := os.ReadFile(tj)
	require.NoError(t, err)
	require.Contains(t, string(b), `"abc"`)
	require.NoError(t, os.WriteFile(tj, []byte(strings.Replace(string(b), `"abc"`, `"abd"`, 1)), 0o644)) // one character changed
	_, err = Open(out, "char", 0.25, "")
	assert.ErrorIs(t, err, fileio.ErrCorrupt)
	assert.ErrorContains(t, err, "tokenizer.json")
}

// A corrupt token cache entry is rebuilt from the text, not trusted.
func TestCorruptCacheIsRebuilt(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "a.txt")
	require.NoError(t, os.WriteFile(src, []byte("the quick brown fox jumps over the lazy dog\n"), 0o644))
	cache := filepath.Join(dir, "cache")
	want, err := Open(src, "byte", 0.1, cache)
	require.NoError(t, err)
	entries, err := os.ReadDir(cache)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	shard := filepath.Join(cache, entries[0].Name(), "train.tok")
	flip(t, shard, headerSize+3)
	_, err = ReadShard(shard)
	require.ErrorIs(t, err, fileio.ErrCorrupt)
	got, err := Open(src, "byte", 0.1, cache)
	require.NoError(t, err)
	assert.Equal(t, want.Train, got.Train)
	_, err = ReadShard(shard)
	assert.NoError(t, err, "the cache entry was written again")
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

// TestPrepareGPT2Progress: the gpt2 tokenizer reports its progress a piece at
// a time (about a MiB each), increasing, ending at the text's length.
func TestPrepareGPT2Progress(t *testing.T) {
	opticks, err := os.ReadFile(filepath.Join(runtime.GOROOT(), "src", "testdata", "Isaac.Newton-Opticks.txt"))
	require.NoError(t, err)
	dir := t.TempDir()
	src := filepath.Join(dir, "opticks.txt")
	require.NoError(t, os.WriteFile(src, opticks, 0o644))
	var done []int
	total := 0
	ds, err := Prepare([]string{src, src, src, src}, "gpt2", 0.1, filepath.Join(dir, "out"), false, func(d, n int) { done, total = append(done, d), n })
	require.NoError(t, err)
	assert.Equal(t, 4*len(opticks), total)
	assert.GreaterOrEqual(t, len(done), 2, "2.2 MB of text is more than one piece")
	assert.IsIncreasing(t, done)
	assert.Equal(t, total, done[len(done)-1])
	whole, err := GPT2{}.Encode(append(append(append(append([]byte(nil), opticks...), opticks...), opticks...), opticks...))
	require.NoError(t, err)
	assert.Equal(t, whole, append(append([]int32(nil), ds.Train...), ds.Val...))
}
