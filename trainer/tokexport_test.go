package trainer

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/trainer/data"
	"github.com/shardline/shardline/trainer/tokenizer"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestExportCarriesTokenizer: a run trained with a tokenizer file exports it
// beside the weights (the same bytes), with tokenizer_config.json,
// generation_config.json and BOS/EOS ids in config.json; --init-from that
// directory refuses a recipe tokenizing with something else and takes the
// directory itself as data.tokenizer. A char run exports no tokenizer file and
// null ids.
func TestExportCarriesTokenizer(t *testing.T) {
	tiny, err := filepath.Abs("tokenizer/testdata/tiny-tokenizer.json")
	require.NoError(t, err)
	sets := []string{"data.tokenizer=" + tiny, "model.vocab_size=560", "model.seq_len=16"}
	run, out := trainedForExport(t, sets, 1<<30)
	readJSON := func(name string) map[string]any {
		var m map[string]any
		require.NoError(t, json.Unmarshal(must(os.ReadFile(filepath.Join(out, name))), &m), name)
		return m
	}
	assert.Equal(t, must(os.ReadFile(tiny)), must(os.ReadFile(filepath.Join(out, "tokenizer.json"))))
	tc := readJSON("tokenizer_config.json")
	assert.Equal(t, "PreTrainedTokenizerFast", tc["tokenizer_class"])
	assert.Equal(t, "<|endoftext|>", tc["eos_token"])
	assert.Nil(t, tc["bos_token"])
	for _, name := range []string{"config.json", "generation_config.json"} {
		c := readJSON(name)
		assert.Equal(t, 556.0, c["eos_token_id"], name)
		assert.Contains(t, c, "bos_token_id", name)
		assert.Nil(t, c["bos_token_id"], name)
	}

	// --init-from: the recipe must tokenize with the directory's tokenizer.
	fr, err := loadRun(run)
	require.NoError(t, err)
	base := []string{"train.steps=1", "train.eval_interval=0", "train.lr=1e-30", "train.warmup_steps=0", "logging.sample_tokens=0", "model.vocab_size=560", "model.seq_len=16"}
	res, _ := tinyRun(t, base...) // char
	o := opts()
	o.InitFrom = out
	_, err = Run(context.Background(), res, o)
	assert.ErrorContains(t, err, "holds the model's tokenizer (tokenizer.json), but the recipe tokenizes with char")
	res, _ = tinyRun(t, append(base, "data.tokenizer="+out)...)
	r, err := Run(context.Background(), res, o)
	require.NoError(t, err)
	back, err := loadRun(r.Dir)
	require.NoError(t, err)
	assert.Equal(t, "hf-", back.tok.Name()[:3], "the run tokenized with the directory's tokenizer.json")
	for i := range fr.table {
		require.Equal(t, fr.weights[i], back.weights[i], fr.table[i].Name)
	}

	// A char run exports its characters as a tokenizer.json and null ids;
	// --init-from that directory takes a char recipe whose data has the same
	// characters, and refuses one whose data has others.
	charRun, charOut := trainedForExport(t, nil, 1<<30)
	cr, err := loadRun(charRun)
	require.NoError(t, err)
	chars, ok := tokenizer.CharHFVocab(must(os.ReadFile(filepath.Join(charOut, "tokenizer.json"))))
	require.True(t, ok)
	assert.Equal(t, cr.tok.(*data.Char).Chars, chars)
	var c map[string]any
	require.NoError(t, json.Unmarshal(must(os.ReadFile(filepath.Join(charOut, "config.json"))), &c))
	assert.Nil(t, c["eos_token_id"])
	note, err := ExportHF(charRun, filepath.Join(t.TempDir(), "again"), 1<<30, false)
	require.NoError(t, err)
	assert.Contains(t, note, "the char tokenizer's 28 characters as a BPE without merges")
	charBase := []string{"train.steps=1", "train.eval_interval=0", "train.lr=1e-30", "train.warmup_steps=0", "logging.sample_tokens=0"}
	res, dir := tinyRun(t, charBase...)
	o.InitFrom = charOut
	_, err = Run(context.Background(), res, o)
	require.NoError(t, err)
	other := filepath.Join(dir, "other.txt")
	require.NoError(t, os.WriteFile(other, []byte(strings.Repeat("zig zag zog\n", 400)), 0o644))
	res, _ = tinyRun(t, append(charBase, "data.path="+other)...)
	_, err = Run(context.Background(), res, o)
	assert.ErrorContains(t, err, "holds a char tokenizer of 28 characters, the recipe's data another of 7")
}

// writeExport writes what exportTokenizer returns for tok into a new
// directory, as ExportHF does beside the weights.
func writeExport(t *testing.T, tok data.Tokenizer) (string, *tokExport) {
	t.Helper()
	e, err := exportTokenizer(tok, config.Model{SeqLen: 64})
	require.NoError(t, err)
	dir := t.TempDir()
	for n, b := range e.files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), b, 0o644))
	}
	return dir, e
}

// TestExportTokenizerKinds: each tokenizer kind exports files a Hugging Face
// fast tokenizer reads (tokenizer.json, with tokenizer_config.json naming the
// class), which this package's tokenizer.json reader encodes to the run's ids
// (Hugging Face's own tokenizers: TestRankFileAsTokenizerJSONMatches and
// TestBuiltinsAsTokenizerJSONMatchTokenizers in trainer/tokenizer); a rank
// file keeps its tokenizer.model beside the converted tokenizer.json, gpt2
// gets vocab.json and merges.txt too. --init-from the directory takes the
// run's own tokenizer (a built-in one by name: InitTokenizer), the directory
// itself, or the rank file it was converted from, and refuses another.
func TestExportTokenizerKinds(t *testing.T) {
	lines := make([]string, 0, 260)
	for b := range 256 {
		lines = append(lines, fmt.Sprintf("%s %d", base64.StdEncoding.EncodeToString([]byte{byte(b)}), b))
	}
	for _, s := range []string{"th", "the", " the", "at"} {
		lines = append(lines, fmt.Sprintf("%s %d", base64.StdEncoding.EncodeToString([]byte(s)), len(lines)))
	}
	rankDir := t.TempDir()
	ranks := filepath.Join(rankDir, "tokenizer.model")
	require.NoError(t, os.WriteFile(ranks, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(rankDir, tokenizer.ConfigName),
		[]byte(`{"bos_token": "<|bos|>", "eos_token": "<|eos|>", "auto_map": {"AutoTokenizer": ["x.py", null]}, "chat_template": "{{ x }}", "added_tokens_decoder": {"260": {"content": "<|bos|>"}, "261": {"content": "<|eos|>"}}}`), 0o644))
	rankTok, err := data.LoadFile(ranks)
	require.NoError(t, err)
	char, err := data.NewChar([]byte("the cat sat on the mat\n"))
	require.NoError(t, err)
	text := "the cat sat on the mat\nthe  at"
	for _, c := range []struct {
		tok      data.Tokenizer
		files    []string
		class    string
		bos, eos any
		builtin  string
		note     string
	}{
		{rankTok, []string{"tokenizer.json", "tokenizer.model"}, "PreTrainedTokenizerFast", 260.0, 261.0, "", "tokenizer.json converted from it (4 merges)"},
		{data.GPT2{}, []string{"tokenizer.json", "vocab.json", "merges.txt"}, "GPT2Tokenizer", nil, 50256.0, "gpt2", "GPT-2's tokenizer.json, vocab.json and merges.txt"},
		{data.Byte{}, []string{"tokenizer.json"}, "PreTrainedTokenizerFast", nil, nil, "byte", "the byte tokenizer as a byte-level BPE"},
		{char, []string{"tokenizer.json"}, "PreTrainedTokenizerFast", nil, nil, "char", "the char tokenizer's 11 characters"},
	} {
		t.Run(c.tok.Name(), func(t *testing.T) {
			dir, e := writeExport(t, c.tok)
			assert.Contains(t, e.note, c.note)
			for _, n := range append(c.files, "tokenizer_config.json", "generation_config.json") {
				assert.Contains(t, e.files, n)
			}
			assert.Len(t, e.files, len(c.files)+2)
			// The bytes the reference tests hold to Hugging Face's tokenizers.
			var wantJSON []byte
			if ch, ok := c.tok.(*data.Char); ok {
				wantJSON, err = tokenizer.CharHF(ch.Chars)
				require.NoError(t, err)
			} else {
				var rb tokenizer.RankedBPE
				switch tok := c.tok.(type) {
				case data.File:
					rb, _ = tok.RankedBPE()
				case interface {
					RankedBPE() (tokenizer.RankedBPE, error)
				}:
					rb, err = tok.RankedBPE()
					require.NoError(t, err)
				}
				hf, err := rb.HFFiles()
				require.NoError(t, err)
				wantJSON = hf.TokenizerJSON
			}
			assert.Equal(t, wantJSON, e.files["tokenizer.json"])
			var tc, gen map[string]any
			require.NoError(t, json.Unmarshal(e.files["tokenizer_config.json"], &tc))
			require.NoError(t, json.Unmarshal(e.files["generation_config.json"], &gen))
			assert.Equal(t, c.class, tc["tokenizer_class"])
			assert.Equal(t, c.bos, gen["bos_token_id"])
			assert.Equal(t, c.eos, gen["eos_token_id"])
			assert.Equal(t, 64.0, tc["model_max_length"])

			back, err := tokenizer.Load(dir)
			require.NoError(t, err)
			assert.Equal(t, c.tok.VocabSize(), back.VocabSize())
			sp := c.tok.Specials()
			assert.Equal(t, sp.BOS, back.BOS())
			assert.Equal(t, sp.EOS, back.EOS())
			want, err := c.tok.Encode([]byte(text))
			require.NoError(t, err)
			got, err := back.Encode([]byte(text))
			require.NoError(t, err)
			assert.Equal(t, want, got)

			spec, err := InitTokenizer(dir)
			require.NoError(t, err)
			if c.builtin != "" {
				assert.Equal(t, c.builtin, spec)
			} else {
				assert.Equal(t, dir, spec)
			}
			assert.NoError(t, checkInitTokenizer(dir, c.tok, "x"), "the run's own tokenizer")
			assert.NoError(t, checkInitTokenizer(dir, data.File{Tokenizer: back}, dir), "the directory itself")
			other := data.Tokenizer(data.Byte{})
			if c.builtin == "byte" {
				other = data.GPT2{}
			}
			assert.ErrorContains(t, checkInitTokenizer(dir, other, "x"), "holds the model's tokenizer (tokenizer.json")
		})
	}
	// The rank file's own configuration is kept, naming the tokenizer.json
	// reader; its custom code (auto_map) is not exported.
	dir, e := writeExport(t, rankTok)
	var tc map[string]any
	require.NoError(t, json.Unmarshal(e.files["tokenizer_config.json"], &tc))
	assert.Equal(t, "{{ x }}", tc["chat_template"])
	assert.NotContains(t, tc, "auto_map")
	assert.Equal(t, must(os.ReadFile(ranks)), e.files["tokenizer.model"])
	assert.NoError(t, checkInitTokenizer(dir, rankTok, ranks), "the rank file the export was converted from")
}
