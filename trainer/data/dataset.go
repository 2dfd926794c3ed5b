package data

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/shardline/shardline/fileio"
)

// Dataset is a tokenized corpus: its training and validation token streams.
type Dataset struct {
	Train, Val *Tokens
	Tok        Tokenizer
	// Sources are a blend's sources (Blend); empty for one source.
	Sources []Source
	// TrainSampler and ValSampler draw sequences once Sample has made them.
	TrainSampler, ValSampler *Sampler

	fpOnce sync.Once
	fp     string
	fpErr  error
}

// Fingerprint is the sha256 of the training and validation tokens (with their
// tokenizer's name and counts, each token as a little-endian uint32): the same
// tokens give the same fingerprint wherever and however they are stored. It is
// computed once, reading the files (Tokens.Scan), and kept.
func (d *Dataset) Fingerprint() string {
	d.fpOnce.Do(func() {
		h := sha256.New()
		fmt.Fprintf(h, "%s\x00%d\x00%d\x00", d.Tok.Name(), d.Train.Len(), d.Val.Len())
		buf := make([]byte, 0, 4*scanChunk)
		for _, split := range []*Tokens{d.Train, d.Val} {
			err := split.Scan(func(ts []int32) error {
				buf = buf[:0]
				for _, t := range ts {
					buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
				}
				h.Write(buf)
				return nil
			})
			if err != nil && d.fpErr == nil {
				d.fpErr = err
			}
		}
		d.fp = "sha256:" + hex.EncodeToString(h.Sum(nil))
		if d.fpErr != nil {
			d.fp = "unreadable: " + d.fpErr.Error()
		}
	})
	return d.fp
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// OpenOptions say how Open reads a path.
type OpenOptions struct {
	// Tokenizer the data must have been (or is to be) tokenized with.
	Tokenizer string
	// Field is the JSON field or Parquet column of a document source ("" is
	// DefaultField).
	Field string
	// ValFraction is held out for validation from document sources and
	// Megatron datasets given alone (SplitDoc; the tail of a one-document
	// corpus).
	ValFraction float64
	// CacheDir keeps document sources tokenized (keyed by the files' contents,
	// the tokenizer, the field and the split); "" tokenizes into a temporary
	// directory removed once the tokens are mapped.
	CacheDir string
}

// Open reads a corpus for training, memory-mapped:
//   - a directory `shardline data prepare` wrote (dataset.json; or the
//     train.tok and val.tok of earlier versions, or train/val .bin and .idx
//     of --format megatron);
//   - a Megatron indexed dataset: PREFIX, PREFIX.bin or PREFIX.idx, its
//     documents split by SplitDoc;
//   - a document source (ResolveFiles: text, JSON lines, Parquet; a file, a
//     directory or a glob), tokenized once as Prepare does and cached.
func Open(path string, o OpenOptions) (*Dataset, error) {
	if o.Field == "" {
		o.Field = DefaultField
	}
	if hasMeta(path) {
		return openSource(path, o)
	}
	st, err := os.Stat(path)
	if err != nil {
		if prefix, ok := MegatronPrefix(path); ok {
			return openMegatronPrefix(prefix, o)
		}
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s does not exist", path)
		}
		return nil, err
	}
	if st.IsDir() {
		if exists(filepath.Join(path, datasetFile)) {
			return openShardline(path, o.Tokenizer)
		}
		if exists(filepath.Join(path, "train.idx")) && exists(filepath.Join(path, "train.bin")) {
			return openMegatronDir(path, o.Tokenizer)
		}
		if exists(filepath.Join(path, "train.tok")) {
			return openLegacy(path, o.Tokenizer)
		}
		return openSource(path, o)
	}
	if prefix, ok := MegatronPrefix(path); ok && prefix != path {
		return openMegatronPrefix(prefix, o)
	}
	return openSource(path, o)
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// cacheVersion changes the cache key when what a cache entry holds changes.
const cacheVersion = "shardline-cache-3"

// openSource tokenizes a document source into the cache (or a temporary
// directory) and opens the result.
func openSource(path string, o OpenOptions) (*Dataset, error) {
	files, err := ResolveFiles(path)
	if err != nil {
		return nil, err
	}
	prep := PrepareOptions{Sources: []string{path}, Field: o.Field, Tokenizer: o.Tokenizer, ValFraction: o.ValFraction}
	if o.CacheDir == "" {
		tmp, err := os.MkdirTemp("", "shardline-data-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp) // the mappings outlive the files
		if _, err := Prepare(prep, tmp); err != nil {
			return nil, err
		}
		return openShardline(tmp, o.Tokenizer)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%g\x00", cacheVersion, o.Tokenizer, o.Field, o.ValFraction)
	for _, f := range files {
		if err := hashFile(h, f); err != nil {
			return nil, err
		}
	}
	key := hex.EncodeToString(h.Sum(nil))[:24]
	cached := filepath.Join(o.CacheDir, key)
	// An entry that fails any check (checksum, token ids, an older format) is
	// made again.
	if ds, err := openShardline(cached, o.Tokenizer); err == nil {
		return ds, nil
	}
	if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot make the data cache %s: %w", o.CacheDir, err)
	}
	// Prepared beside the entry and renamed into place, so processes preparing
	// the same source at once each see a whole entry.
	tmp, err := os.MkdirTemp(o.CacheDir, ".prep-"+key+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if _, err := Prepare(prep, tmp); err != nil {
		return nil, err
	}
	os.RemoveAll(cached) // a broken entry
	if err := os.Rename(tmp, cached); err != nil {
		if ds, err2 := openShardline(cached, o.Tokenizer); err2 == nil {
			return ds, nil // another process put it there first
		}
		return openShardline(tmp, o.Tokenizer)
	}
	return openShardline(cached, o.Tokenizer)
}

// hashFile feeds a file's name, size and contents to h.
func hashFile(h io.Writer, path string) error {
	f, size, err := fileio.OpenRegular(path)
	if err != nil {
		return fmt.Errorf("cannot read %s: %w", path, unwrapPath(err))
	}
	defer f.Close()
	fmt.Fprintf(h, "%s\x00%d\x00", filepath.Base(path), size)
	_, err = io.Copy(h, f)
	return err
}

// maxDatasetJSON caps dataset.json (its shard list).
const maxDatasetJSON = 64 << 20

// openShardline opens a directory Prepare wrote in FormatShardline.
func openShardline(dir, tokenizer string) (*Dataset, error) {
	b, err := fileio.ReadRegular(filepath.Join(dir, datasetFile), maxDatasetJSON)
	if err != nil {
		return nil, err
	}
	var m datasetMeta
	if err := json.Unmarshal(b, &m); err != nil || m.Format != datasetFormat {
		return nil, fmt.Errorf("%s: %w: not a dataset.json `shardline data prepare` wrote", filepath.Join(dir, datasetFile), fileio.ErrCorrupt)
	}
	if m.Version != datasetVersion {
		return nil, fmt.Errorf("%s: version %d, this shardline reads version %d; prepare the data again with `shardline data prepare`", filepath.Join(dir, datasetFile), m.Version, datasetVersion)
	}
	tok, err := openTokenizer(dir, tokenizer)
	if err != nil {
		return nil, err
	}
	ds := &Dataset{Tok: tok}
	for _, split := range []struct {
		meta splitMeta
		dst  **Tokens
	}{{m.Train, &ds.Train}, {m.Val, &ds.Val}} {
		t := &Tokens{docs: split.meta.Docs}
		for _, name := range split.meta.Shards {
			if name != filepath.Base(name) || name == "." || name == ".." {
				return nil, fmt.Errorf("%s: %w: shard %q is not a file of the directory", filepath.Join(dir, datasetFile), fileio.ErrCorrupt, name)
			}
			v, err := openShardView(filepath.Join(dir, name), tok)
			if err != nil {
				return nil, err
			}
			t.append(v, 0, v.count)
		}
		if t.Len() != split.meta.Tokens {
			return nil, fmt.Errorf("%s: %w: it counts %d tokens, its shards hold %d", filepath.Join(dir, datasetFile), fileio.ErrCorrupt, split.meta.Tokens, t.Len())
		}
		if idx := split.meta.DocIndex; idx != "" {
			if err := checkDocIndex(filepath.Join(dir, filepath.Base(idx)), split.meta.Docs, t.Len()); err != nil {
				return nil, err
			}
		}
		*split.dst = t
	}
	return ds, nil
}

// checkDocIndex checks a document index: docs sealed uint64 offsets,
// ascending from 0, each within the split's n tokens.
func checkDocIndex(path string, docs, n int) error {
	prev, count := uint64(0), 0
	size, err := fileio.ScanSealed(path, func(off int64, b []byte) error {
		for i := 0; i+8 <= len(b); i += 8 { // pieces are whole multiples of 8 bytes
			v := binary.LittleEndian.Uint64(b[i:])
			if v < prev || v > uint64(n) || (count == 0 && v != 0) {
				return fmt.Errorf("%s: %w: document %d begins at token %d (after %d, in %d tokens)", path, fileio.ErrCorrupt, count, v, prev, n)
			}
			prev = v
			count++
		}
		return nil
	})
	if err != nil {
		return err
	}
	if size != int64(8*docs) {
		return fmt.Errorf("%s: %w: %d bytes, %d documents take %d", path, fileio.ErrCorrupt, size, docs, 8*docs)
	}
	return nil
}

// openTokenizer loads dir/tokenizer.json and checks it is the recipe's.
func openTokenizer(dir, tokenizer string) (Tokenizer, error) {
	tok, err := LoadTokenizer(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("%s is not a prepared data directory (no readable tokenizer.json: %w); write one with `shardline data prepare`", dir, err)
	}
	if same, err := sameTokenizer(tok, tokenizer); err != nil {
		return nil, err
	} else if !same {
		return nil, fmt.Errorf("%s was prepared with the %s tokenizer, the recipe asks for %s", dir, tok.Name(), tokenizer)
	}
	return tok, nil
}

// openShardView checks a shard (header, checksum, every token below the
// tokenizer's vocabulary, reading it once a piece at a time) and maps its
// tokens.
func openShardView(path string, tok Tokenizer) (*view, error) {
	if _, err := checkShardHeader(path); err != nil {
		return nil, err
	}
	var hdr []byte
	var width, count int
	var bad error
	_, err := fileio.ScanSealed(path, func(off int64, b []byte) error {
		if off == 0 { // the first piece holds the header (pieces are 1 MiB)
			hdr = append([]byte(nil), b[:headerSize]...)
			width, count = int(binary.LittleEndian.Uint32(hdr[12:])), int(binary.LittleEndian.Uint64(hdr[16:]))
			name, vocab := cString(hdr[24:40]), int(binary.LittleEndian.Uint32(hdr[40:]))
			if name != tok.Name() || vocab > tok.VocabSize() {
				return fmt.Errorf("%s holds %s tokens below %d, but the directory's tokenizer.json describes the %s tokenizer with %d tokens; prepare the directory again", path, name, vocab, tok.Name(), tok.VocabSize())
			}
			b, off = b[headerSize:], headerSize
		}
		// (1 MiB − the 48-byte header) is a whole number of tokens: pieces
		// hold whole tokens.
		if j := badToken(b, width, tok.VocabSize()); j >= 0 && bad == nil {
			i := int(off-headerSize)/width + j
			bad = fmt.Errorf("%s: %w: token %d at byte offset %d (token %d) is not below the vocabulary size %d", path, ErrBadToken, rawToken(b[j*width:], width), headerSize+width*i, i, tok.VocabSize())
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if bad != nil {
		return nil, bad
	}
	return mapTokens(path, headerSize, count, width)
}

// openLegacy opens a directory of an earlier data prepare (train.tok, val.tok).
func openLegacy(dir, tokenizer string) (*Dataset, error) {
	tok, err := openTokenizer(dir, tokenizer)
	if err != nil {
		return nil, err
	}
	ds := &Dataset{Tok: tok}
	for _, split := range []struct {
		name string
		dst  **Tokens
	}{{"train.tok", &ds.Train}, {"val.tok", &ds.Val}} {
		v, err := openShardView(filepath.Join(dir, split.name), tok)
		if err != nil {
			return nil, err
		}
		*split.dst = &Tokens{}
		(*split.dst).append(v, 0, v.count)
	}
	return ds, nil
}

// openMegatronDir opens train and val .bin/.idx written by data prepare
// --format megatron.
func openMegatronDir(dir, tokenizer string) (*Dataset, error) {
	tok, err := openTokenizer(dir, tokenizer)
	if err != nil {
		return nil, err
	}
	ds := &Dataset{Tok: tok}
	for _, split := range []struct {
		prefix string
		dst    **Tokens
	}{{"train", &ds.Train}, {"val", &ds.Val}} {
		mi, err := openMegatron(filepath.Join(dir, split.prefix), tok.VocabSize())
		if err != nil {
			return nil, err
		}
		t := &Tokens{docs: mi.docs}
		t.append(mi.tokens, 0, mi.tokens.count)
		*split.dst = t
	}
	return ds, nil
}

// openMegatronPrefix opens one Megatron indexed dataset and splits its
// documents.
func openMegatronPrefix(prefix string, o OpenOptions) (*Dataset, error) {
	tok, err := NewTokenizer(o.Tokenizer, "")
	if err != nil {
		return nil, err
	}
	if o.Tokenizer == "char" {
		return nil, fmt.Errorf("%s: a Megatron dataset records no char vocabulary; use the tokenizer it was made with", prefix)
	}
	mi, err := openMegatron(prefix, tok.VocabSize())
	if err != nil {
		return nil, err
	}
	ds := &Dataset{Tok: tok}
	ds.Train, ds.Val = splitMegatron(mi, o.ValFraction)
	return ds, nil
}
