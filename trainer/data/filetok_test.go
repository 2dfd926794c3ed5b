package data

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardline/shardline/fileio"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tinyTokenizer (trainer/tokenizer's testdata) is a byte-level BPE tokenizer.json (GPT-2's pre-tokenizer, 300
// merges learnt from English text, NFC, <|endoftext|> as id 556) made for these
// tests.
const tinyTokenizer = "../tokenizer/testdata/tiny-tokenizer.json"

// TestPrepareWithTokenizerFile prepares text with a tokenizer file, stores the
// file with the data and reads it back; the prepared directory refuses a
// recipe naming another tokenizer file, and a changed stored source is found.
func TestPrepareWithTokenizerFile(t *testing.T) {
	dir := t.TempDir()
	text := "the licence<|endoftext|>of the program, and you shall not\n\n  distribute 1234 copies.\n"
	src := filepath.Join(dir, "a.txt")
	require.NoError(t, os.WriteFile(src, []byte(text), 0o644))
	out := filepath.Join(dir, "prepared")
	var last [2]int64
	prep, err := Prepare(PrepareOptions{Sources: []string{src}, Tokenizer: tinyTokenizer, ValFraction: 0.2,
		Progress: func(done, total int64) { last = [2]int64{done, total} }}, out)
	require.NoError(t, err)
	assert.Equal(t, [2]int64{int64(len(text)), int64(len(text))}, last)
	ds, err := Open(out, OpenOptions{Tokenizer: tinyTokenizer})
	require.NoError(t, err)
	assert.Equal(t, prep.Tokenizer.Name(), ds.Tok.Name())
	f, ok := ds.Tok.(File)
	require.True(t, ok, "a tokenizer path gives a File")
	assert.True(t, strings.HasPrefix(f.Name(), "hf-") && len(f.Name()) == 16, f.Name())
	assert.Equal(t, 557, f.VocabSize())
	assert.Equal(t, Specials{BOS: -1, EOS: 556}, f.Specials())
	all := append(ds.Train.Slice(0, ds.Train.Len()), ds.Val.Slice(0, ds.Val.Len())...)
	eos := 0
	for _, v := range all {
		if v == 556 {
			eos++
		}
	}
	assert.Equal(t, 2, eos, "the special token in the text is split out, and the document ends with it")
	assert.Equal(t, text+"<|endoftext|>", f.Decode(all), "the document ends with the tokenizer's EOS")
	assert.FileExists(t, filepath.Join(out, "source.tokenizer.json"))

	got, err := Open(out, OpenOptions{Tokenizer: tinyTokenizer})
	require.NoError(t, err)
	assert.Equal(t, ds.Train.Slice(0, ds.Train.Len()), got.Train.Slice(0, got.Train.Len()))
	assert.Equal(t, f.Name(), got.Tok.Name())

	// Another tokenizer file (one merge fewer) is another tokenizer.
	b, err := os.ReadFile(tinyTokenizer)
	require.NoError(t, err)
	other := filepath.Join(dir, "other", "tokenizer.json")
	require.NoError(t, os.MkdirAll(filepath.Dir(other), 0o755))
	require.NoError(t, os.WriteFile(other, []byte(strings.Replace(string(b), `"Ġ t", `, "", 1)), 0o644))
	_, err = Open(out, OpenOptions{Tokenizer: other})
	assert.ErrorContains(t, err, "prepared with the "+f.Name()+" tokenizer")

	// A stored source that changed is refused, naming it.
	stored := filepath.Join(out, "source.tokenizer.json")
	require.NoError(t, os.WriteFile(stored, []byte(strings.Replace(string(b), `"Ġ t", `, "", 1)), 0o644))
	_, err = LoadTokenizer(filepath.Join(out, "tokenizer.json"))
	assert.ErrorIs(t, err, fileio.ErrCorrupt)
	assert.ErrorContains(t, err, "source.tokenizer.json has sha256")

	// Text read directly is tokenized with the file and cached with it.
	cache := filepath.Join(dir, "cache")
	a, err := Open(src, OpenOptions{Tokenizer: tinyTokenizer, ValFraction: 0.2, CacheDir: cache})
	require.NoError(t, err)
	c, err := Open(src, OpenOptions{Tokenizer: tinyTokenizer, ValFraction: 0.2, CacheDir: cache})
	require.NoError(t, err)
	assert.Equal(t, a.Train.Slice(0, a.Train.Len()), c.Train.Slice(0, c.Train.Len()))
	assert.Equal(t, ds.Train.Slice(0, ds.Train.Len()), a.Train.Slice(0, a.Train.Len()))
}

func TestTokenizerFileErrors(t *testing.T) {
	_, err := NewTokenizer("no/such/tokenizer.json", "")
	assert.ErrorContains(t, err, "no/such/tokenizer.json does not exist")
	dir := t.TempDir()
	bad := filepath.Join(dir, "tokenizer.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"model": {"type": "Unigram", "vocab": [["a", 0]]}}`), 0o644))
	_, err = NewTokenizer(bad, "")
	assert.ErrorContains(t, err, `model.type "Unigram"`)
}
