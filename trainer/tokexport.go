package trainer

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/trainer/data"
	"github.com/shardline/shardline/trainer/tokenizer"
)

// hfTokenizerFiles are the files a Hugging Face model directory holds its
// tokenizer in, as export writes them and --init-from reads them.
var hfTokenizerFiles = []string{"tokenizer.json", "tokenizer.model"}

// tokExport is what a Hugging Face model directory gets for the run's
// tokenizer besides the weights.
type tokExport struct {
	files    map[string][]byte // tokenizer files, tokenizer_config.json, generation_config.json
	bos, eos any               // ids for config.json (nil where none)
	note     string            // what the files are, for export's output
}

// exportTokenizer returns the run's tokenizer as Hugging Face files, each
// kind encoding text to the run's ids (docs/tokenizers.md, "Export and
// import"):
//
//   - a tokenizer.json or SentencePiece tokenizer.model: the file itself and
//     its tokenizer_config.json (or one written naming BOS, EOS and the class);
//   - a tiktoken rank file: the file (tokenizer.model) and a tokenizer.json
//     converted from its ranks (tokenizer.RankedBPE.HFFiles), which
//     transformers reads, with a tokenizer_config.json naming
//     PreTrainedTokenizerFast;
//   - gpt2: GPT-2's tokenizer.json, vocab.json and merges.txt, as its
//     repository on the Hub has them, built from r50k_base;
//   - byte: a byte-level BPE of the 256 bytes without merges; char: a BPE of
//     the run's characters without merges and the Fuse decoder.
//
// generation_config.json and config.json get BOS and EOS.
func exportTokenizer(tok data.Tokenizer, m config.Model) (*tokExport, error) {
	sp := tok.Specials()
	id := func(v int32) any {
		if v < 0 {
			return nil
		}
		return int(v)
	}
	e := &tokExport{files: map[string][]byte{}, bos: id(sp.BOS), eos: id(sp.EOS)}
	var err error
	if e.files["generation_config.json"], err = indentJSON(map[string]any{"_from_model_config": true, "bos_token_id": e.bos, "eos_token_id": e.eos}); err != nil {
		return nil, err
	}
	name := func(v int32) any {
		if v < 0 {
			return nil
		}
		if f, ok := tok.(data.File); ok {
			return f.Token(v)
		}
		return tok.Decode([]int32{v})
	}
	class := "PreTrainedTokenizerFast" // reads tokenizer.json
	var config map[string]any          // tokenizer_config.json to write, nil: the source's
	switch t := tok.(type) {
	case data.File:
		for _, s := range t.Sources() {
			e.files[s.Name] = s.Data
		}
		e.note = fmt.Sprintf("the tokenizer file (%s) unchanged", t.Sources()[0].Name)
		if len(t.Sources()) > 1 {
			e.note += " with its tokenizer_config.json"
		}
		if t.Kind() == tokenizer.SentencePiece {
			class = "LlamaTokenizer" // reads a SentencePiece tokenizer.model
		}
		if rb, ok := t.RankedBPE(); ok {
			hf, err := rb.HFFiles()
			if err != nil {
				return nil, fmt.Errorf("converting the tiktoken rank file to tokenizer.json: %w", err)
			}
			e.files["tokenizer.json"] = hf.TokenizerJSON
			e.note = fmt.Sprintf("the rank file (tokenizer.model) unchanged and tokenizer.json converted from it (%d merges), which transformers reads", hf.Merges)
			if src, has := e.files[tokenizer.ConfigName]; has {
				// The source's configuration, now naming the tokenizer.json reader.
				if err := json.Unmarshal(src, &config); err != nil {
					return nil, fmt.Errorf("the rank file's tokenizer_config.json: %w", err)
				}
				config["tokenizer_class"] = class
				delete(config, "auto_map") // custom tokenizer code, which the export does not carry
			}
		}
		if _, has := e.files[tokenizer.ConfigName]; !has {
			config = map[string]any{}
		}
	default:
		hf, err := builtinHF(tok)
		if err != nil {
			return nil, err
		}
		if hf == nil {
			e.note = fmt.Sprintf("no tokenizer files: the %s tokenizer has no Hugging Face form (generation_config.json)", tok.Name())
			return e, nil
		}
		maps.Copy(e.files, hf)
		config = map[string]any{}
		switch tok.(type) {
		case data.GPT2:
			class = "GPT2Tokenizer" // GPT2TokenizerFast reads tokenizer.json, GPT2Tokenizer vocab.json and merges.txt
			config["add_prefix_space"] = false
			e.note = "GPT-2's tokenizer.json, vocab.json and merges.txt (as openai-community/gpt2 has them; <|endoftext|> in text is the special token there)"
		case data.Byte:
			e.note = "tokenizer.json: the byte tokenizer as a byte-level BPE of the 256 bytes"
		default:
			e.note = fmt.Sprintf("tokenizer.json: the %s tokenizer's %d characters as a BPE without merges (a character outside them is dropped)", tok.Name(), tok.VocabSize())
		}
	}
	if config != nil {
		if config["tokenizer_class"] == nil {
			config["tokenizer_class"] = class
		}
		for k, v := range map[string]any{"bos_token": name(sp.BOS), "eos_token": name(sp.EOS), "model_max_length": m.SeqLen, "clean_up_tokenization_spaces": false} {
			if _, has := config[k]; !has {
				config[k] = v
			}
		}
		if f, ok := tok.(data.File); ok && f.Kind() == tokenizer.SentencePiece {
			config["add_bos_token"], config["add_eos_token"], config["unk_token"], config["legacy"] = sp.BOS >= 0, false, f.Token(0), true
		}
		if e.files[tokenizer.ConfigName], err = indentJSON(config); err != nil {
			return nil, err
		}
	}
	e.note += " (" + strings.Join(slices.Sorted(maps.Keys(e.files)), ", ") + ")"
	return e, nil
}

// indentJSON is v as indented JSON ending in a newline, <|endoftext|> written
// as it is (no HTML escapes).
func indentJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// builtinHF is a built-in tokenizer's Hugging Face tokenizer files (without
// tokenizer_config.json), or nil for a tokenizer that has none.
func builtinHF(tok data.Tokenizer) (map[string][]byte, error) {
	switch t := tok.(type) {
	case data.GPT2:
		return gpt2HF()
	case data.Byte:
		return byteHF()
	case *data.Char:
		b, err := tokenizer.CharHF(t.Chars)
		if err != nil {
			return nil, fmt.Errorf("the char tokenizer as tokenizer.json: %w", err)
		}
		return map[string][]byte{"tokenizer.json": b}, nil
	}
	return nil, nil
}

// gpt2HF and byteHF are built once: GPT-2's takes a few hundred milliseconds.
var (
	gpt2HF = sync.OnceValues(func() (map[string][]byte, error) {
		rb, err := data.GPT2{}.RankedBPE()
		if err != nil {
			return nil, err
		}
		hf, err := rb.HFFiles()
		if err != nil {
			return nil, fmt.Errorf("gpt2 as tokenizer.json: %w", err)
		}
		return map[string][]byte{"tokenizer.json": hf.TokenizerJSON, "vocab.json": hf.VocabJSON, "merges.txt": hf.MergesTXT}, nil
	})
	byteHF = sync.OnceValues(func() (map[string][]byte, error) {
		rb, err := data.Byte{}.RankedBPE()
		if err != nil {
			return nil, err
		}
		hf, err := rb.HFFiles()
		if err != nil {
			return nil, fmt.Errorf("byte as tokenizer.json: %w", err)
		}
		return map[string][]byte{"tokenizer.json": hf.TokenizerJSON}, nil
	})
)

// dirTokenizer is the tokenizer file a Hugging Face model directory holds
// (tokenizer.json, else tokenizer.model; "" where none) and, where it is the
// tokenizer.json export writes for a built-in tokenizer, that tokenizer's
// name (byte, gpt2, char) and, for char, its characters.
func dirTokenizer(dir string) (path, builtin string, chars []rune, err error) {
	for _, n := range hfTokenizerFiles {
		p := filepath.Join(dir, n)
		if _, err := os.Stat(p); err == nil {
			path = p
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", "", nil, err
		}
	}
	if filepath.Base(path) != "tokenizer.json" {
		return path, "", nil, nil
	}
	b, err := fileio.ReadRegular(path, tokenizer.MaxFileBytes)
	if err != nil {
		return "", "", nil, err
	}
	if chars, ok := tokenizer.CharHFVocab(b); ok {
		return path, "char", chars, nil
	}
	for _, c := range []struct {
		name  string
		files func() (map[string][]byte, error)
	}{{"byte", byteHF}, {"gpt2", gpt2HF}} {
		want, err := c.files()
		if err != nil {
			return "", "", nil, err
		}
		if bytes.Equal(want["tokenizer.json"], b) {
			return path, c.name, nil, nil
		}
	}
	return path, "", nil, nil
}

// InitTokenizer is the data.tokenizer a run --init-from a Hugging Face model
// directory takes where the recipe names none: the built-in tokenizer whose
// export the directory holds (byte, gpt2, char), else the directory itself
// where it holds a tokenizer file (tokenizer.json or tokenizer.model), else
// "".
func InitTokenizer(dir string) (string, error) {
	path, builtin, _, err := dirTokenizer(dir)
	switch {
	case err != nil || path == "":
		return "", err
	case builtin != "":
		return builtin, nil
	}
	return dir, nil
}

// checkInitTokenizer holds a run started from a Hugging Face model directory
// (--init-from) to the tokenizer that directory holds, if any: the model's
// embeddings are rows for its tokens, so the data must be tokenized with the
// same file, or with the built-in tokenizer whose export it is. The recipe
// names it with data.tokenizer (the directory itself will do).
func checkInitTokenizer(dir string, tok data.Tokenizer, spec string) error {
	found, builtin, chars, err := dirTokenizer(dir)
	if err != nil || found == "" {
		return err
	}
	fix := fmt.Sprintf("set data.tokenizer = %q (the model's own tokenizer; --set data.tokenizer=%s) and prepare the data with it", dir, dir)
	what := filepath.Base(found)
	if builtin != "" {
		what = fmt.Sprintf("%s, shardline's %s tokenizer", what, builtin)
		fix = fmt.Sprintf("set data.tokenizer = %q and prepare the data with it", builtin)
		if builtin == "char" {
			fix = fmt.Sprintf("tokenize with the directory's own characters: set data.tokenizer = %q and prepare the data with it", dir)
		}
	}
	if f, ok := tok.(data.File); ok {
		for _, n := range hfTokenizerFiles {
			want, err := fileio.ReadRegular(filepath.Join(dir, n), tokenizer.MaxFileBytes)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			} else if err != nil {
				return err
			}
			for _, s := range f.Sources() {
				if s.Name != tokenizer.ConfigName && sha256.Sum256(s.Data) == sha256.Sum256(want) {
					return nil
				}
			}
		}
		if builtin == "" {
			return config.ValueProblem("data.tokenizer", spec, fmt.Errorf("--init-from %s holds another tokenizer (%s) than the recipe's %s: the model's embeddings are rows for its own tokens", dir, what, tok.Name()), fix)
		}
	} else if builtin == tok.Name() {
		c, isChar := tok.(*data.Char)
		if !isChar || slices.Equal(c.Chars, chars) {
			return nil
		}
		return config.ValueProblem("data.tokenizer", spec, fmt.Errorf("--init-from %s holds a char tokenizer of %d characters, the recipe's data another of %d: the model's embeddings are rows for its own characters", dir, len(chars), len(c.Chars)), fix)
	}
	return config.ValueProblem("data.tokenizer", spec, fmt.Errorf("--init-from %s holds the model's tokenizer (%s), but the recipe tokenizes with %s: the model's embeddings are rows for its own tokens", dir, what, tok.Name()), fix)
}
