package data

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/shardline/shardline/fileio"
)

// Dataset is a tokenized corpus split into training and validation tokens.
type Dataset struct {
	Train, Val []int32
	Tok        Tokenizer

	fpOnce sync.Once
	fp     string
}

// Fingerprint is the sha256 of the training and validation tokens (with their
// tokenizer's name): the same data gives the same fingerprint wherever it lives.
// It is computed once and kept.
func (d *Dataset) Fingerprint() string {
	d.fpOnce.Do(func() {
		h := sha256.New()
		fmt.Fprintf(h, "%s\x00%d\x00%d\x00", d.Tok.Name(), len(d.Train), len(d.Val))
		var b [4]byte
		for _, split := range [][]int32{d.Train, d.Val} {
			buf := make([]byte, 0, 4096)
			for _, t := range split {
				binary.LittleEndian.PutUint32(b[:], uint32(t))
				if buf = append(buf, b[:]...); len(buf) == cap(buf) {
					h.Write(buf)
					buf = buf[:0]
				}
			}
			h.Write(buf)
		}
		d.fp = "sha256:" + hex.EncodeToString(h.Sum(nil))
	})
	return d.fp
}

// Split divides tokens: the last valFraction of them is validation.
func Split(tokens []int32, valFraction float64) (train, val []int32) {
	n := int(float64(len(tokens)) * valFraction)
	return tokens[:len(tokens)-n], tokens[len(tokens)-n:]
}

// MaxTextBytes caps the text read from a data path (or all texts given to Prepare
// together): 2 GiB of text is 8 GiB of byte tokens in memory.
const MaxTextBytes = 2 << 30

// readText reads a text file (a regular file of at most limit bytes), naming it as
// text in errors.
func readText(path string, limit int64) ([]byte, error) {
	b, err := fileio.ReadRegular(path, limit)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("text file %s does not exist", path)
	case errors.Is(err, fileio.ErrTooLarge):
		return nil, fmt.Errorf("text %s: %w; shardline reads at most %d bytes of text", path, unwrapPath(err), MaxTextBytes)
	case err != nil:
		return nil, fmt.Errorf("cannot read text %s: %w", path, unwrapPath(err))
	}
	return b, nil
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// PrepareCommand names data prepare in the manifest of its output directory.
const PrepareCommand = "shardline data prepare"

// preparedFiles are the files Prepare writes.
var preparedFiles = append([]string{"train.tok", "val.tok", "tokenizer.json"}, SourceFiles...)

// Prepare tokenizes the texts (concatenated in order) and writes train.tok, val.tok
// and tokenizer.json to outDir. outDir is claimed first (fileio.ClaimDir): it
// must be new, empty or an earlier Prepare's, unless overwrite. progress, when
// not nil, is called with the bytes of text tokenized so far and their total
// as the work goes on (the gpt2 tokenizer a piece at a time, about a MiB each;
// the others, which take a second for a GiB, once at the end).
func Prepare(texts []string, tokenizer string, valFraction float64, outDir string, overwrite bool, progress func(done, total int)) (*Dataset, error) {
	out, err := fileio.ClaimDir(outDir, PrepareCommand, preparedFiles, overwrite, "give -o a new or empty directory")
	if err != nil {
		return nil, err
	}
	var corpus []byte
	for _, p := range texts {
		b, err := readText(p, MaxTextBytes-int64(len(corpus)))
		if err != nil {
			return nil, err
		}
		corpus = append(corpus, b...)
	}
	ds, err := fromText(corpus, tokenizer, valFraction, progress)
	if err != nil {
		return nil, err
	}
	if err := ds.save(outDir); err != nil {
		return nil, err
	}
	return ds, out.Commit()
}

func (d *Dataset) save(dir string) error {
	if err := WriteShard(filepath.Join(dir, "train.tok"), d.Train, d.Tok.Name(), d.Tok.VocabSize()); err != nil {
		return err
	}
	if err := WriteShard(filepath.Join(dir, "val.tok"), d.Val, d.Tok.Name(), d.Tok.VocabSize()); err != nil {
		return err
	}
	return SaveTokenizer(filepath.Join(dir, "tokenizer.json"), d.Tok)
}

// fromText tokenizes text and splits it, calling progress (when not nil) as
// Prepare says.
func fromText(text []byte, tokenizer string, valFraction float64, progress func(done, total int)) (*Dataset, error) {
	if len(text) == 0 {
		return nil, errors.New("the text is empty")
	}
	// char's vocabulary comes from the text; the others are fixed.
	var tok Tokenizer
	var err error
	if tokenizer == "char" {
		tok, err = NewChar(text)
	} else {
		tok, err = NewTokenizer(tokenizer, "")
	}
	if err != nil {
		return nil, err
	}
	var tokens []int32
	if _, ok := tok.(GPT2); ok && progress != nil {
		tokens, err = encodeGPT2(text, func(done int) { progress(done, len(text)) })
	} else if f, ok := tok.(File); ok && progress != nil {
		tokens, err = f.EncodeProgress(text, func(done int) { progress(done, len(text)) })
	} else {
		tokens, err = tok.Encode(text)
		if err == nil && progress != nil {
			progress(len(text), len(text))
		}
	}
	if err != nil {
		return nil, err
	}
	ds := &Dataset{Tok: tok}
	ds.Train, ds.Val = Split(tokens, valFraction)
	return ds, nil
}

// Open reads a prepared directory, or a text file which it tokenizes once and
// caches under cacheDir (keyed by the text's hash, the tokenizer and the split;
// an empty cacheDir disables the cache).
func Open(path, tokenizer string, valFraction float64, cacheDir string) (*Dataset, error) {
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s does not exist", path)
		}
		return nil, err
	}
	if st.IsDir() {
		return openPrepared(path, tokenizer)
	}
	text, err := readText(path, MaxTextBytes)
	if err != nil {
		return nil, err
	}
	if len(text) == 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	key := sha256.Sum256(append(text, fmt.Sprintf("\x00%s\x00%g", tokenizer, valFraction)...))
	cached := ""
	if cacheDir != "" {
		cached = filepath.Join(cacheDir, hex.EncodeToString(key[:12]))
		// A cache entry that fails any check (checksum, token ids, an older format)
		// is rebuilt from the text below.
		if ds, err := openPrepared(cached, tokenizer); err == nil {
			return ds, nil
		}
	}
	ds, err := fromText(text, tokenizer, valFraction, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if cached != "" {
		// A cache that cannot be written only costs the next run a re-tokenization.
		if err := os.MkdirAll(cached, 0o755); err == nil {
			_ = ds.save(cached)
		}
	}
	return ds, nil
}

func openPrepared(dir, tokenizer string) (*Dataset, error) {
	tok, err := LoadTokenizer(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("%s is not a prepared data directory (no readable tokenizer.json: %w); write one with `shardline data prepare`", dir, err)
	}
	if same, err := sameTokenizer(tok, tokenizer); err != nil {
		return nil, err
	} else if !same {
		return nil, fmt.Errorf("%s was prepared with the %s tokenizer, the recipe asks for %s", dir, tok.Name(), tokenizer)
	}
	ds := &Dataset{Tok: tok}
	for _, split := range []struct {
		name string
		dst  *[]int32
	}{{"train.tok", &ds.Train}, {"val.tok", &ds.Val}} {
		path := filepath.Join(dir, split.name)
		sh, err := ReadShard(path)
		if err != nil {
			return nil, err
		}
		if sh.Tokenizer != tok.Name() || sh.Vocab > tok.VocabSize() {
			return nil, fmt.Errorf("%s holds %s tokens below %d, but %s describes the %s tokenizer with %d tokens; prepare the directory again",
				path, sh.Tokenizer, sh.Vocab, filepath.Join(dir, "tokenizer.json"), tok.Name(), tok.VocabSize())
		}
		*split.dst = sh.Tokens
	}
	return ds, nil
}

// splitmix64 mixes a counter into a uniform 64-bit value.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Batch fills tokens and targets (B·T each) with sequences first..first+B−1 of a
// step's global batch: sequence i starts at a position drawn from (seed, step, i),
// and targets are the tokens shifted by one. It is a pure function of its
// arguments, and keyed by the global sequence index, so any split of the global
// batch over ranks and micro-batches sees the same sequences.
func Batch(tokens, targets, split []int32, seed int64, step, first, B, T int) {
	n := len(split) - T - 1
	for b := 0; b < B; b++ {
		h := splitmix64(uint64(seed))
		for _, v := range []int{step, first + b} {
			h = splitmix64(h ^ uint64(v))
		}
		start := 0
		if n > 0 {
			start = int(h % uint64(n+1))
		}
		copy(tokens[b*T:(b+1)*T], split[start:start+T])
		copy(targets[b*T:(b+1)*T], split[start+1:start+T+1])
	}
}
