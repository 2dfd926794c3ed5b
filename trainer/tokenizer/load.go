package tokenizer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/shardline/shardline/fileio"
)

// MaxFileBytes caps a tokenizer file (Llama 3's tokenizer.json is 9 MB, Gemma
// 3's 33 MB).
const MaxFileBytes = 256 << 20

// ConfigName is Hugging Face's tokenizer configuration, read beside a
// tokenizer file for BOS, EOS and (for a rank file) the special tokens.
const ConfigName = "tokenizer_config.json"

// IsFileSpec reports whether a data.tokenizer value names a file or directory
// rather than a built-in tokenizer: it holds a path separator or ends in
// .json, .model or .tiktoken.
func IsFileSpec(spec string) bool {
	if filepath.Base(spec) != spec {
		return true
	}
	switch filepath.Ext(spec) {
	case ".json", ".model", ".tiktoken":
		return true
	}
	return false
}

// Load reads a tokenizer file: a Hugging Face tokenizer.json, a tiktoken rank
// file or a SentencePiece model, told apart by their contents. A directory
// stands for the tokenizer.json in it, else its tokenizer.model. A
// tokenizer_config.json beside the file is read too.
func Load(path string) (*Tokenizer, error) {
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("tokenizer %s does not exist (give a tokenizer.json, a tokenizer.model or the directory holding one)", path)
		}
		return nil, fmt.Errorf("tokenizer %s: %w", path, err)
	}
	if st.IsDir() {
		found := ""
		for _, name := range []string{"tokenizer.json", "tokenizer.model"} {
			if _, err := os.Stat(filepath.Join(path, name)); err == nil {
				found = filepath.Join(path, name)
				break
			}
		}
		if found == "" {
			return nil, fmt.Errorf("tokenizer directory %s holds neither tokenizer.json nor tokenizer.model", path)
		}
		path = found
	}
	b, err := fileio.ReadRegular(path, MaxFileBytes)
	if err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", path, err)
	}
	var config []byte
	cpath := filepath.Join(filepath.Dir(path), ConfigName)
	if filepath.Base(path) != ConfigName {
		if c, err := fileio.ReadRegular(cpath, MaxFileBytes); err == nil {
			config = c
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("tokenizer configuration %s: %w", cpath, err)
		}
	}
	t, err := FromBytes(filepath.Base(path), b, config)
	if err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", path, err)
	}
	return t, nil
}

// looksJSON reports whether b is a JSON object: it starts with { after
// whitespace (a SentencePiece model starts with a newline byte, 0x0a, and
// may have { next: then the whole must be valid JSON).
func looksJSON(b []byte) bool {
	t := bytes.TrimLeft(b, " \t\r\n")
	if len(t) == 0 || t[0] != '{' {
		return false
	}
	return b[0] != '\n' || json.Valid(b)
}

// FromBytes builds a tokenizer from a file's bytes (name is its base name, for
// messages) and tokenizer_config.json's (nil where there is none).
func FromBytes(name string, b, config []byte) (*Tokenizer, error) {
	var t *Tokenizer
	var err error
	var stored string
	switch {
	case looksJSON(b):
		t, err = parseHF(b, config)
		stored = "tokenizer.json"
	case looksTiktoken(b):
		t, err = parseTiktoken(b, config)
		stored = "tokenizer.model"
	case len(b) > 0 && b[0] == 0x0a:
		t, err = parseSentencePiece(b, config)
		stored = "tokenizer.model"
	default:
		return nil, fmt.Errorf("%s is neither a Hugging Face tokenizer.json, a tiktoken rank file nor a SentencePiece model", name)
	}
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	h.Write(b)
	t.sources = []Source{{Name: stored, Data: b}}
	if config != nil {
		h.Write([]byte{0})
		h.Write(config)
		t.sources = append(t.sources, Source{Name: ConfigName, Data: config})
	}
	t.fingerprint = hex.EncodeToString(h.Sum(nil))
	return t, nil
}
