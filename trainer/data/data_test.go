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

// openText writes text to a file and opens it as a document source.
func openText(t testing.TB, text []byte, tokenizer string, valFraction float64) (*Dataset, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "text.txt")
	require.NoError(t, os.WriteFile(p, text, 0o644))
	return Open(p, OpenOptions{Tokenizer: tokenizer, ValFraction: valFraction})
}

// all is a dataset's training then validation tokens.
func all(ds *Dataset) []int32 {
	return append(ds.Train.Slice(0, ds.Train.Len()), ds.Val.Slice(0, ds.Val.Len())...)
}

func TestTokenizersRoundTrip(t *testing.T) {
	text := []byte("Of the Reflexions of Light — ½ œuvre.\n")
	for _, name := range []string{"byte", "char", "gpt2"} {
		ds, err := openText(t, text, name, 0)
		require.NoError(t, err)
		want := string(text)
		if name == "gpt2" {
			want += "<|endoftext|>" // a document ends with the end-of-text token
		}
		assert.Equal(t, want, ds.Tok.Decode(all(ds)), name)
	}
	c, err := NewChar(text)
	require.NoError(t, err)
	_, err = c.Encode([]byte("Z"))
	assert.ErrorContains(t, err, `character 'Z'`)
}

func TestPrepareAndOpen(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "a.txt")
	require.NoError(t, os.WriteFile(src, []byte("hello world, hello shards\nhello world, hello shards\n"), 0o644))
	out := filepath.Join(dir, "prepared")
	var calls [][2]int64
	res, err := Prepare(PrepareOptions{Sources: []string{src}, Tokenizer: "char", ValFraction: 0.25, Progress: func(done, total int64) { calls = append(calls, [2]int64{done, total}) }}, out)
	require.NoError(t, err)
	assert.Equal(t, 13, res.ValTokens) // 52 characters, the last quarter held out (one text file: its end)
	assert.Equal(t, [][2]int64{{52, 52}}, calls, "one piece of text, reported once")
	got, err := Open(out, OpenOptions{Tokenizer: "char"})
	require.NoError(t, err)
	assert.Equal(t, 39, got.Train.Len())
	assert.Equal(t, "hello shards\n", got.Tok.Decode(got.Val.Slice(0, 13)))

	_, err = Open(out, OpenOptions{Tokenizer: "byte"})
	assert.ErrorContains(t, err, "prepared with the char tokenizer")

	// Text files are cached: the second open reads the cache.
	cache := filepath.Join(dir, "cache")
	a, err := Open(src, OpenOptions{Tokenizer: "byte", ValFraction: 0.1, CacheDir: cache})
	require.NoError(t, err)
	entries, _ := os.ReadDir(cache)
	require.Len(t, entries, 1)
	b, err := Open(src, OpenOptions{Tokenizer: "byte", ValFraction: 0.1, CacheDir: cache})
	require.NoError(t, err)
	assert.Equal(t, a.Fingerprint(), b.Fingerprint())
	// byte: the split is the old one, the last ⌊n·f⌋ tokens (here bytes).
	assert.Equal(t, 52-5, a.Train.Len())
	assert.Equal(t, 5, a.Val.Len())
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.txt")
	require.NoError(t, os.WriteFile(empty, nil, 0o644))
	_, err := Open(empty, OpenOptions{Tokenizer: "byte", ValFraction: 0.1})
	assert.ErrorContains(t, err, "holds no text")
	_, err = Open(filepath.Join(dir, "none.txt"), OpenOptions{Tokenizer: "byte", ValFraction: 0.1})
	assert.ErrorContains(t, err, "does not exist")
	_, err = Open("/dev/zero", OpenOptions{Tokenizer: "byte", ValFraction: 0.1})
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
	opts := PrepareOptions{Sources: []string{src}, Tokenizer: "char", ValFraction: 0.25}
	_, err := Prepare(opts, out)
	require.NoError(t, err)
	require.NoError(t, WriteShard(filepath.Join(out, "train-00000.tok"), []int32{0, 1, 2, 200}, "char", 256))
	_, err = Open(out, OpenOptions{Tokenizer: "char"})
	assert.ErrorContains(t, err, "holds char tokens below 256")

	_, err = Prepare(opts, out)
	require.NoError(t, err)
	tj := filepath.Join(out, "tokenizer.json")
	b, err := os.ReadFile(tj)
	require.NoError(t, err)
	require.Contains(t, string(b), `"abc"`)
	require.NoError(t, os.WriteFile(tj, []byte(strings.Replace(string(b), `"abc"`, `"abd"`, 1)), 0o644)) // one character changed
	_, err = Open(out, OpenOptions{Tokenizer: "char"})
	assert.ErrorIs(t, err, fileio.ErrCorrupt)
	assert.ErrorContains(t, err, "tokenizer.json")
}

// A corrupt token cache entry is rebuilt from the text, not trusted.
func TestCorruptCacheIsRebuilt(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "a.txt")
	require.NoError(t, os.WriteFile(src, []byte("the quick brown fox jumps over the lazy dog\n"), 0o644))
	cache := filepath.Join(dir, "cache")
	_, err := Open(src, OpenOptions{Tokenizer: "byte", ValFraction: 0.1, CacheDir: cache})
	require.NoError(t, err)
	entries, err := os.ReadDir(cache)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	shard := filepath.Join(cache, entries[0].Name(), "train-00000.tok")
	flip(t, shard, headerSize+3)
	_, err = ReadShard(shard)
	require.ErrorIs(t, err, fileio.ErrCorrupt)
	got, err := Open(src, OpenOptions{Tokenizer: "byte", ValFraction: 0.1, CacheDir: cache})
	require.NoError(t, err)
	text, _ := os.ReadFile(src)
	wantTokens, _ := Byte{}.Encode(text)
	assert.Equal(t, wantTokens, all(got))
	_, err = ReadShard(shard)
	assert.NoError(t, err, "the cache entry was written again")
}

// TestPrepareGPT2Progress: preparation reports its progress as it reads
// (increasing, ending at the input's size); four files are four documents,
// each ended by <|endoftext|>, their tokens those of each whole.
func TestPrepareGPT2Progress(t *testing.T) {
	opticks, err := os.ReadFile(filepath.Join(runtime.GOROOT(), "src", "testdata", "Isaac.Newton-Opticks.txt"))
	require.NoError(t, err)
	dir := t.TempDir()
	src := filepath.Join(dir, "opticks.txt")
	require.NoError(t, os.WriteFile(src, opticks, 0o644))
	var done []int64
	total := int64(0)
	_, err = Prepare(PrepareOptions{Sources: []string{src, src, src, src}, Tokenizer: "gpt2", ValFraction: 0.1,
		Progress: func(d, n int64) { done, total = append(done, d), n }}, filepath.Join(dir, "out"))
	require.NoError(t, err)
	assert.Equal(t, int64(4*len(opticks)), total)
	assert.GreaterOrEqual(t, len(done), 2, "2.2 MB of text is more than one piece")
	assert.IsNonDecreasing(t, done)
	assert.Equal(t, total, done[len(done)-1])
	ds, err := Open(filepath.Join(dir, "out"), OpenOptions{Tokenizer: "gpt2"})
	require.NoError(t, err)
	whole, err := GPT2{}.Encode(opticks)
	require.NoError(t, err)
	var want []int32
	for range 4 {
		want = append(append(want, whole...), endOfText)
	}
	assert.Equal(t, want, all(ds), "four documents of 0.1 hold out none (⌊4·0.1⌋ = 0)")
	assert.Equal(t, 4, ds.Train.Docs())
}
