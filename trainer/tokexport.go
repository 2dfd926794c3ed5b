package trainer

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/trainer/data"
	"github.com/shardline/shardline/trainer/tokenizer"
)

// hfTokenizerFiles are the files a Hugging Face model directory holds its
// tokenizer in, as export writes them and --init-from reads them.
var hfTokenizerFiles = []string{"tokenizer.json", "tokenizer.model"}

// exportTokenizer returns what a Hugging Face model directory gets for the
// run's tokenizer besides the weights: its BOS and EOS ids (nil where it has
// none) for config.json and generation_config.json, and the files: a tokenizer
// file's own sources (tokenizer.json or tokenizer.model, and its
// tokenizer_config.json, or one written here naming BOS, EOS and the
// tokenizer class), and generation_config.json. The built-in tokenizers have
// no Hugging Face files: byte and char none, gpt2 is Hugging Face's "gpt2"
// tokenizer (its EOS, 50256, is written).
func exportTokenizer(tok data.Tokenizer, m config.Model) (files map[string][]byte, bos, eos any, err error) {
	sp := tok.Specials()
	id := func(v int32) any {
		if v < 0 {
			return nil
		}
		return int(v)
	}
	bos, eos = id(sp.BOS), id(sp.EOS)
	files = map[string][]byte{}
	gen, err := json.MarshalIndent(map[string]any{"_from_model_config": true, "bos_token_id": bos, "eos_token_id": eos}, "", "  ")
	if err != nil {
		return nil, nil, nil, err
	}
	files["generation_config.json"] = append(gen, '\n')
	f, ok := tok.(data.File)
	if !ok {
		return files, bos, eos, nil
	}
	for _, s := range f.Sources() {
		files[s.Name] = s.Data
	}
	if _, has := files[tokenizer.ConfigName]; !has {
		name := func(v int32) any {
			if v < 0 {
				return nil
			}
			return f.Token(v)
		}
		class := "PreTrainedTokenizerFast" // reads tokenizer.json
		if f.Kind() == tokenizer.SentencePiece {
			class = "LlamaTokenizer" // reads a SentencePiece tokenizer.model
		}
		c := map[string]any{"tokenizer_class": class, "bos_token": name(sp.BOS), "eos_token": name(sp.EOS),
			"model_max_length": m.SeqLen, "clean_up_tokenization_spaces": false}
		if f.Kind() == tokenizer.SentencePiece {
			c["add_bos_token"], c["add_eos_token"], c["unk_token"], c["legacy"] = sp.BOS >= 0, false, f.Token(0), true
		}
		b, err := json.MarshalIndent(c, "", "  ")
		if err != nil {
			return nil, nil, nil, err
		}
		files[tokenizer.ConfigName] = append(b, '\n')
	}
	return files, bos, eos, nil
}

// checkInitTokenizer holds a run started from a Hugging Face model directory
// (--init-from) to the tokenizer that directory holds, if any: the model's
// embeddings are rows for its tokens, so the data must be tokenized with the
// same file. The recipe names it with data.tokenizer (the directory itself
// will do).
// InitTokenizer is the tokenizer file a Hugging Face model directory holds
// (tokenizer.json, else tokenizer.model), or "" where it holds none: run
// --init-from trains with it where the recipe names no tokenizer of its own.
func InitTokenizer(dir string) (string, error) {
	for _, n := range hfTokenizerFiles {
		p := filepath.Join(dir, n)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
	}
	return "", nil
}

func checkInitTokenizer(dir string, tok data.Tokenizer, spec string) error {
	found, err := InitTokenizer(dir)
	if err != nil || found == "" {
		return err
	}
	fix := fmt.Sprintf("set data.tokenizer = %q (the model's own tokenizer; --set data.tokenizer=%s) and prepare the data with it", dir, dir)
	f, ok := tok.(data.File)
	if !ok {
		return config.ValueProblem("data.tokenizer", spec, fmt.Errorf("--init-from %s holds the model's tokenizer (%s), but the recipe tokenizes with %s: the model's embeddings are rows for its own tokens", dir, filepath.Base(found), tok.Name()), fix)
	}
	want, err := fileio.ReadRegular(found, tokenizer.MaxFileBytes)
	if err != nil {
		return err
	}
	for _, s := range f.Sources() {
		if s.Name != tokenizer.ConfigName && sha256.Sum256(s.Data) == sha256.Sum256(want) {
			return nil
		}
	}
	return config.ValueProblem("data.tokenizer", spec, fmt.Errorf("--init-from %s holds another tokenizer (%s) than the recipe's %s: the model's embeddings are rows for its own tokens", dir, filepath.Base(found), tok.Name()), fix)
}
