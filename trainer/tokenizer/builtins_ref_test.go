package tokenizer_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shardline/shardline/trainer/data"
	"github.com/shardline/shardline/trainer/tokenizer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBuiltinsAsTokenizerJSONMatchTokenizers: the built-in tokenizers as
// ckpt export writes them for Hugging Face (gpt2 from r50k_base's ranks, byte
// as a byte-level BPE of the 256 bytes, char as a BPE of the corpus's
// characters), read by Hugging Face's tokenizers (npm), give the built-in
// encoder's ids on every one of tokenizer.ConvertDocs documents, and decode
// back to the document. GPT-2's files on the Hub make <|endoftext|> in the
// text the special token, which shardline's gpt2 reads as text: a document
// holding it is compared as its pieces around it encoded alone, joined by
// 50256.
func TestBuiltinsAsTokenizerJSONMatchTokenizers(t *testing.T) {
	tokenizer.TokrefDir(t)
	docs := tokenizer.Corpus(tokenizer.ConvertDocs)
	tmp := t.TempDir()
	docsPath := filepath.Join(tmp, "docs.jsonl")
	tokenizer.WriteDocs(t, docsPath, docs)

	gpt2, err := data.GPT2{}.RankedBPE()
	require.NoError(t, err)
	gpt2HF, err := gpt2.HFFiles()
	require.NoError(t, err)
	// Every GPT-2 token but the 256 bytes has its merge, as GPT-2's 50,000
	// merges on the Hub.
	assert.Equal(t, 50000, gpt2HF.Merges)
	assert.Empty(t, gpt2HF.Unreachable)
	checkSlowFiles(t, gpt2HF)
	byteRB, err := data.Byte{}.RankedBPE()
	require.NoError(t, err)
	byteHF, err := byteRB.HFFiles()
	require.NoError(t, err)
	assert.Equal(t, 0, byteHF.Merges)
	char, err := data.NewChar([]byte(strings.Join(docs, "")))
	require.NoError(t, err)
	charJSON, err := tokenizer.CharHF(char.Chars)
	require.NoError(t, err)

	endOfText := func(tok data.Tokenizer, d string) ([]int32, error) {
		var ids []int32
		for i, piece := range strings.Split(d, "<|endoftext|>") {
			if i > 0 {
				ids = append(ids, data.GPT2Vocab-1)
			}
			p, err := tok.Encode([]byte(piece))
			if err != nil {
				return nil, err
			}
			ids = append(ids, p...)
		}
		return ids, nil
	}
	for _, c := range []struct {
		name string
		tok  data.Tokenizer
		json []byte
	}{{"gpt2", data.GPT2{}, gpt2HF.TokenizerJSON}, {"byte", data.Byte{}, byteHF.TokenizerJSON}, {"char", char, charJSON}} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(tmp, c.name+".json")
			require.NoError(t, os.WriteFile(path, c.json, 0o644))
			ids, decoded := filepath.Join(tmp, c.name+".ids"), filepath.Join(tmp, c.name+".decoded.jsonl")
			tokenizer.RunRef(t, "hf", path, docsPath, ids, decoded)
			got := tokenizer.ReadRefIDs(t, ids)
			require.Len(t, got, len(docs))
			var texts []string
			for _, line := range strings.Split(strings.TrimSuffix(string(must(os.ReadFile(decoded))), "\n"), "\n") {
				var s string
				require.NoError(t, json.Unmarshal([]byte(line), &s))
				texts = append(texts, s)
			}
			require.Len(t, texts, len(docs))
			bad := 0
			for i, d := range docs {
				want, err := c.tok.Encode([]byte(d))
				if c.name == "gpt2" {
					want, err = endOfText(c.tok, d)
				}
				require.NoError(t, err)
				if !slices.Equal(want, got[i]) || texts[i] != d {
					if bad++; bad <= 3 {
						t.Errorf("document %d %q:\n shardline  %v\n tokenizers %v, decoded %q", i, d, want, got[i], texts[i])
					}
				}
			}
			assert.Zero(t, bad, "documents whose ids or decoding differ, of %d", len(docs))
		})
	}
}

// checkSlowFiles: vocab.json and merges.txt (GPT-2's slow tokenizer) hold
// tokenizer.json's vocabulary and added tokens, and its merges.
func checkSlowFiles(t *testing.T, hf *tokenizer.HFFiles) {
	var f struct {
		Added []struct {
			ID      int32  `json:"id"`
			Content string `json:"content"`
		} `json:"added_tokens"`
		Model struct {
			Vocab  map[string]int32 `json:"vocab"`
			Merges []string         `json:"merges"`
		} `json:"model"`
	}
	require.NoError(t, json.Unmarshal(hf.TokenizerJSON, &f))
	var vocab map[string]int32
	require.NoError(t, json.Unmarshal(hf.VocabJSON, &vocab))
	for _, a := range f.Added {
		f.Model.Vocab[a.Content] = a.ID
	}
	assert.Equal(t, f.Model.Vocab, vocab)
	assert.Equal(t, "#version: 0.2\n"+strings.Join(f.Model.Merges, "\n")+"\n", string(hf.MergesTXT))
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
