package data

import (
	"encoding/json"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/shardline/shardline/fileio"
)

// Tokenizer maps text to tokens and back.
type Tokenizer interface {
	Name() string
	VocabSize() int
	Encode(text []byte) ([]int32, error)
	Decode(tokens []int32) string
	// Specials names the tokenizer's document markers.
	Specials() Specials
}

// Specials are a tokenizer's document markers: EOS (end of text) ends a
// document, BOS begins one; -1 where the tokenizer has no such token. The
// built-in tokenizers' Encode never produces them from text: a literal
// "<|endoftext|>" in a document is ordinary text. A tokenizer file's (File)
// splits its added special tokens out of the text, as its reference
// implementation does.
type Specials struct {
	BOS, EOS int32
}

// noSpecials is a tokenizer without document markers (byte, char).
var noSpecials = Specials{BOS: -1, EOS: -1}

// Byte is the byte-level tokenizer: token = byte value.
type Byte struct{}

func (Byte) Name() string   { return "byte" }
func (Byte) VocabSize() int { return 256 }

// Specials: the byte tokenizer's 256 tokens are all bytes; it has no markers.
func (Byte) Specials() Specials { return noSpecials }
func (Byte) Encode(text []byte) ([]int32, error) {
	out := make([]int32, len(text))
	for i, b := range text {
		out[i] = int32(b)
	}
	return out, nil
}
func (Byte) Decode(tokens []int32) string {
	b := make([]byte, len(tokens))
	for i, t := range tokens {
		b[i] = byte(t)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// Char is the character-level tokenizer: token i is the i-th of the corpus's
// distinct characters in code-point order.
type Char struct {
	Chars []rune `json:"chars"`
	index map[rune]int32
}

// NewChar builds the vocabulary of a corpus.
func NewChar(text []byte) (*Char, error) {
	if !utf8.Valid(text) {
		return nil, fmt.Errorf("the char tokenizer needs UTF-8 text")
	}
	seen := map[rune]bool{}
	for _, r := range string(text) {
		seen[r] = true
	}
	c := &Char{}
	for r := range seen {
		c.Chars = append(c.Chars, r)
	}
	sort.Slice(c.Chars, func(i, j int) bool { return c.Chars[i] < c.Chars[j] })
	c.buildIndex()
	return c, nil
}

func (c *Char) buildIndex() {
	c.index = make(map[rune]int32, len(c.Chars))
	for i, r := range c.Chars {
		c.index[r] = int32(i)
	}
}

func (c *Char) Name() string   { return "char" }
func (c *Char) VocabSize() int { return len(c.Chars) }

// Specials: every char token is a character of the corpus; it has no markers.
func (c *Char) Specials() Specials { return noSpecials }
func (c *Char) Encode(text []byte) ([]int32, error) {
	out := make([]int32, 0, len(text))
	for i, r := range string(text) {
		t, ok := c.index[r]
		if !ok {
			return nil, fmt.Errorf("character %q at byte %d is not in the vocabulary", r, i)
		}
		out = append(out, t)
	}
	return out, nil
}
func (c *Char) Decode(tokens []int32) string {
	var b strings.Builder
	for _, t := range tokens {
		if int(t) < len(c.Chars) && t >= 0 {
			b.WriteRune(c.Chars[t])
		} else {
			b.WriteRune('\uFFFD')
		}
	}
	return b.String()
}

// tokenizerFile is tokenizer.json: the name, the vocabulary for char, and a
// CRC-32C of both (a changed character would silently remap every token).
//
// A tokenizer read from a file (File) is stored with its sources: they are
// written beside tokenizer.json (SourceFiles), which lists them with their
// sha256 (covered by the checksum).
type tokenizerFile struct {
	Name     string            `json:"name"`
	Chars    string            `json:"chars,omitempty"`
	Sources  []tokenizerSource `json:"sources,omitempty"`
	Checksum string            `json:"checksum"`
}

func (f *tokenizerFile) sum() string {
	s := f.Name + "\x00" + f.Chars
	for _, src := range f.Sources {
		s += "\x00" + src.File + "\x00" + src.SHA256
	}
	return fmt.Sprintf("crc32c:%08x", crc32.Checksum([]byte(s), crc32.MakeTable(crc32.Castagnoli)))
}

// maxTokenizerBytes caps tokenizer.json: a char vocabulary of every Unicode code
// point fits several times over.
const maxTokenizerBytes = 16 << 20

// SaveTokenizer writes tokenizer.json.
func SaveTokenizer(path string, tok Tokenizer) error {
	f := tokenizerFile{Name: tok.Name()}
	if c, ok := tok.(*Char); ok {
		f.Chars = string(c.Chars)
	}
	if ft, ok := tok.(File); ok {
		srcs, err := saveSources(filepath.Dir(path), ft)
		if err != nil {
			return err
		}
		f.Sources = srcs
	}
	f.Checksum = f.sum()
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	return fileio.WriteAtomic(path, append(b, '\n'))
}

// LoadTokenizer reads tokenizer.json, checking its checksum and vocabulary.
func LoadTokenizer(path string) (Tokenizer, error) {
	b, err := fileio.ReadRegular(path, maxTokenizerBytes)
	if err != nil {
		return nil, err
	}
	var f tokenizerFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if f.Checksum != f.sum() {
		return nil, fmt.Errorf("%s: %w: checksum %q, the contents give %q", path, fileio.ErrCorrupt, f.Checksum, f.sum())
	}
	if len(f.Sources) > 0 {
		return loadSources(path, f.Name, f.Sources)
	}
	if f.Name == "char" {
		if f.Chars == "" || !utf8.ValidString(f.Chars) {
			return nil, fmt.Errorf("%s: %w: the char vocabulary is empty or not UTF-8", path, fileio.ErrCorrupt)
		}
		seen := map[rune]bool{}
		for _, r := range f.Chars {
			if seen[r] {
				return nil, fmt.Errorf("%s: %w: character %q appears twice in the vocabulary", path, fileio.ErrCorrupt, r)
			}
			seen[r] = true
		}
	}
	tok, err := NewTokenizer(f.Name, f.Chars)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return tok, nil
}

// Tokenizers are the built-in tokenizers' names (config's data.tokenizer enum
// lists the same); a path to a tokenizer file is accepted too (IsTokenizerFile).
var Tokenizers = []string{"byte", "char", "gpt2"}

// NewTokenizer builds a tokenizer by name, or reads the file a path names
// (LoadFile); chars is the char vocabulary.
func NewTokenizer(name, chars string) (Tokenizer, error) {
	if IsTokenizerFile(name) {
		return LoadFile(name)
	}
	switch name {
	case "byte":
		return Byte{}, nil
	case "char":
		c := &Char{Chars: []rune(chars)}
		c.buildIndex()
		return c, nil
	case "gpt2":
		return GPT2{}, nil
	}
	return nil, fmt.Errorf("unknown tokenizer %q (byte, char, gpt2, or the path of a tokenizer.json, a tiktoken rank file or a SentencePiece .model)", name)
}
