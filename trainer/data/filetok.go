package data

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/trainer/tokenizer"
)

// File is a tokenizer read from a model's own file (trainer/tokenizer): a
// Hugging Face tokenizer.json, a tiktoken rank file or a SentencePiece model.
// Its name is "hf-", "tt-" or "spm-" and the start of the files' sha256.
type File struct {
	*tokenizer.Tokenizer
}

// Specials: the file's BOS and EOS (tokenizer_config.json's bos_token and
// eos_token where it is beside the file).
func (f File) Specials() Specials { return Specials{BOS: f.BOS(), EOS: f.EOS()} }

// Encode tokenizes UTF-8 text as the file's reference implementation does,
// added special tokens in the text included (Hugging Face's tokenizers split
// them out; tiktoken's encode with allowed_special="all").
func (f File) Encode(text []byte) ([]int32, error) { return f.Tokenizer.Encode(text) }

// LoadFile reads a tokenizer file (or a directory holding tokenizer.json or
// tokenizer.model) with its tokenizer_config.json, if beside it.
func LoadFile(path string) (File, error) {
	t, err := tokenizer.Load(path)
	if err != nil {
		return File{}, err
	}
	return File{t}, nil
}

// IsTokenizerFile reports whether a data.tokenizer value names a file rather
// than byte, char or gpt2 (it holds a path separator or ends in .json,
// .model or .tiktoken).
func IsTokenizerFile(spec string) bool { return tokenizer.IsFileSpec(spec) }

// sourcePrefix names a tokenizer's source files where they are stored beside
// shardline's tokenizer.json (in prepared data, caches and run directories):
// source.tokenizer.json, source.tokenizer.model, source.tokenizer_config.json.
const sourcePrefix = "source."

// SourceFiles are the names a tokenizer file's sources may be stored under
// beside tokenizer.json.
var SourceFiles = []string{sourcePrefix + "tokenizer.json", sourcePrefix + "tokenizer.model", sourcePrefix + tokenizer.ConfigName}

// tokenizerSource is a stored source in tokenizer.json: its file name and its
// sha256.
type tokenizerSource struct {
	File   string `json:"file"`
	SHA256 string `json:"sha256"`
}

// saveSources writes a file tokenizer's sources beside path and returns what
// tokenizer.json records of them.
func saveSources(dir string, f File) ([]tokenizerSource, error) {
	var out []tokenizerSource
	for _, s := range f.Sources() {
		name := sourcePrefix + s.Name
		if err := fileio.WriteAtomic(filepath.Join(dir, name), s.Data); err != nil {
			return nil, err
		}
		sum := sha256.Sum256(s.Data)
		out = append(out, tokenizerSource{File: name, SHA256: hex.EncodeToString(sum[:])})
	}
	return out, nil
}

// loadSources reads the sources tokenizer.json records, checking each sha256,
// and builds the tokenizer; its name must be the one recorded.
func loadSources(path, name string, srcs []tokenizerSource) (File, error) {
	dir := filepath.Dir(path)
	var main, config []byte
	mainName := ""
	for _, s := range srcs {
		if !slices.Contains(SourceFiles, s.File) {
			return File{}, fmt.Errorf("%s: %w: source %q is not one of %s", path, fileio.ErrCorrupt, s.File, strings.Join(SourceFiles, ", "))
		}
		b, err := fileio.ReadRegular(filepath.Join(dir, s.File), tokenizer.MaxFileBytes)
		if err != nil {
			return File{}, fmt.Errorf("%s: the tokenizer's source: %w", path, err)
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != s.SHA256 {
			return File{}, fmt.Errorf("%s: %w: %s has sha256 %x, tokenizer.json records %s", path, fileio.ErrCorrupt, s.File, sum, s.SHA256)
		}
		if s.File == sourcePrefix+tokenizer.ConfigName {
			config = b
		} else {
			main, mainName = b, s.File
		}
	}
	if main == nil {
		return File{}, fmt.Errorf("%s: %w: the %s tokenizer lists no source file", path, fileio.ErrCorrupt, name)
	}
	t, err := tokenizer.FromBytes(mainName, main, config)
	if err != nil {
		return File{}, fmt.Errorf("%s: %s: %w", path, mainName, err)
	}
	if t.Name() != name {
		return File{}, fmt.Errorf("%s: %w: its sources make the tokenizer %s, it records %s", path, fileio.ErrCorrupt, t.Name(), name)
	}
	return File{t}, nil
}

// sameTokenizer reports whether tok is the tokenizer spec names: the same
// name, or for a file the same fingerprint.
func sameTokenizer(tok Tokenizer, spec string) (bool, error) {
	if !IsTokenizerFile(spec) {
		return tok.Name() == spec, nil
	}
	f, err := LoadFile(spec)
	if err != nil {
		return false, err
	}
	return tok.Name() == f.Name(), nil
}
