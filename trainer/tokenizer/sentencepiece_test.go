package tokenizer

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
)

// spmPython is a python3 with Debian's python3-sentencepiece: SHARDLINE_SPM_PYTHON,
// which `make test` sets after ci-deps installs python3-sentencepiece and
// sentencepiece (spm_train). Unset, the test skips; set, a missing module or
// spm_train fails it.
func spmPython(t *testing.T) string {
	t.Helper()
	py := os.Getenv("SHARDLINE_SPM_PYTHON")
	if py == "" {
		t.Skip("SHARDLINE_SPM_PYTHON is not set: `make ci-deps` installs python3-sentencepiece and sentencepiece, and `make test` sets it")
	}
	if out, err := exec.Command(py, "-c", "import sentencepiece").CombinedOutput(); err != nil {
		t.Fatalf("SHARDLINE_SPM_PYTHON=%s cannot import sentencepiece (apt-get install python3-sentencepiece): %v\n%s", py, err, out)
	}
	if _, err := exec.LookPath("spm_train"); err != nil {
		t.Fatalf("spm_train is missing (apt-get install sentencepiece): %v", err)
	}
	return py
}

// TestSentencePieceMatchesSentencePiece trains a BPE model as Llama 2's
// (identity normalizer, dummy prefix, whitespace kept, byte fallback, digits
// split, whitespace-only pieces) with spm_train on the test corpus, then
// compares every document's ids with Google's SentencePiece (python3
// bindings) and decodes them back.
func TestSentencePieceMatchesSentencePiece(t *testing.T) {
	py := spmPython(t)
	docs := testCorpus(refDocs)
	tmp := t.TempDir()
	corpus := filepath.Join(tmp, "corpus.txt")
	if err := os.WriteFile(corpus, []byte(strings.Join(docs, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	prefix := filepath.Join(tmp, "spm")
	train := exec.Command("spm_train", "--input="+corpus, "--model_prefix="+prefix, "--model_type=bpe", "--vocab_size=1500",
		"--byte_fallback=true", "--normalization_rule_name=identity", "--add_dummy_prefix=true", "--remove_extra_whitespaces=false",
		"--split_digits=true", "--allow_whitespace_only_pieces=true", "--character_coverage=0.995", "--max_sentencepiece_length=16",
		"--user_defined_symbols=<|eot_id|>,<think>", "--num_threads=2", "--minloglevel=2")
	if out, err := train.CombinedOutput(); err != nil {
		t.Fatalf("spm_train: %v\n%s", err, out)
	}
	model := prefix + ".model"
	tok, err := Load(model)
	if err != nil {
		t.Fatal(err)
	}
	if tok.Kind() != SentencePiece || tok.VocabSize() != 1500 || tok.BOS() != 1 || tok.EOS() != 2 {
		t.Fatalf("kind %s, vocabulary %d, BOS %d, EOS %d; want sentencepiece, 1500, 1, 2", tok.Kind(), tok.VocabSize(), tok.BOS(), tok.EOS())
	}
	docsPath := filepath.Join(tmp, "docs.jsonl")
	writeDocs(t, docsPath, docs)
	out := filepath.Join(tmp, "spm.ids")
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "spmref.py")
	if b, err := exec.Command(py, script, model, docsPath, out).CombinedOutput(); err != nil {
		t.Fatalf("spmref.py: %v\n%s", err, b)
	}
	want := readRefIDs(t, out)
	compareIDs(t, tok, docs, want)
	checkRoundTrip(t, tok, docs, want, nil)

	// In pieces on several goroutines, as the whole.
	if !tok.cutSafe {
		t.Fatal("a Llama-2-style model may be cut at spaces")
	}
	text := []byte(strings.Join(docs[:2000], "\n"))
	whole, err := tok.encodePieces(text, len(text), 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	pieces, err := tok.encodePieces(text, 512, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(whole, pieces) {
		t.Errorf("in pieces %d ids, whole %d, or they differ", len(pieces), len(whole))
	}

	// The same model as a Llama-2-style tokenizer.json (character-level BPE with
	// byte fallback, no pre-tokenizer: Prepend and Replace normalizers, the
	// ByteFallback decoders), held to Hugging Face's tokenizers.
	t.Run("tokenizer.json", func(t *testing.T) {
		if os.Getenv("SHARDLINE_TOKREF") == "" {
			t.Skip("SHARDLINE_TOKREF is not set (make tokref-deps)")
		}
		b, err := os.ReadFile(model)
		if err != nil {
			t.Fatal(err)
		}
		js := llama2StyleJSON(t, b)
		path := filepath.Join(tmp, "llama2-style", "tokenizer.json")
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, js, 0o644); err != nil {
			t.Fatal(err)
		}
		hf, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		sub := docs[:variantDocs]
		subPath := filepath.Join(tmp, "sub.jsonl")
		writeDocs(t, subPath, sub)
		out := filepath.Join(tmp, "llama2-style.ids")
		runRef(t, "hf", path, subPath, out)
		ref := readRefIDs(t, out)
		compareIDs(t, hf, sub, ref)
		// Decoding is held to Hugging Face's decoder, not to the text: its
		// Prepend normalizer puts a space after each added token, which
		// decodes as a space.
		texts := filepath.Join(tmp, "llama2-style.texts")
		runRef(t, "hf-decode", path, out, texts)
		b, err = os.ReadFile(texts)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		if len(lines) != len(sub) {
			t.Fatalf("%d decoded texts for %d documents", len(lines), len(sub))
		}
		bad := 0
		for i, l := range lines {
			var want string
			if err := json.Unmarshal([]byte(l), &want); err != nil {
				t.Fatal(err)
			}
			if got := hf.Decode(ref[i]); got != want {
				if bad++; bad <= 3 {
					t.Errorf("document %d decodes to %q, Hugging Face's decoder gives %q", i, got, want)
				}
			}
		}
	})
}

// llama2StyleJSON writes a SentencePiece BPE model as Hugging Face's Llama
// converter does: its pieces as the vocabulary, merges from every split of a
// piece into two pieces (by the piece's score, then the halves' ids), byte
// fallback, "▁" prepended and spaces replaced, and the decoder undoing it.
func llama2StyleJSON(t *testing.T, model []byte) []byte {
	p, err := parseSpmProto(model)
	if err != nil {
		t.Fatal(err)
	}
	vocab := map[string]int{}
	for i, sp := range p.pieces {
		vocab[sp.piece] = i
	}
	type mergeRow struct {
		a, b  string
		score float32
	}
	var rows []mergeRow
	for _, sp := range p.pieces {
		if sp.typ != spmNormal {
			continue
		}
		var local []mergeRow
		for i := range sp.piece {
			if i == 0 {
				continue
			}
			l, r := sp.piece[:i], sp.piece[i:]
			if _, ok := vocab[l]; !ok {
				continue
			}
			if _, ok := vocab[r]; !ok {
				continue
			}
			local = append(local, mergeRow{l, r, sp.score})
		}
		sort.SliceStable(local, func(i, j int) bool {
			if vocab[local[i].a] != vocab[local[j].a] {
				return vocab[local[i].a] < vocab[local[j].a]
			}
			return vocab[local[i].b] < vocab[local[j].b]
		})
		rows = append(rows, local...)
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].score > rows[j].score })
	merges := make([][2]string, len(rows))
	for i, r := range rows {
		merges[i] = [2]string{r.a, r.b}
	}
	var added []map[string]any
	for i, sp := range p.pieces {
		if sp.typ == spmUnknown || sp.typ == spmControl || sp.typ == spmUserDefined {
			added = append(added, map[string]any{"id": i, "content": sp.piece, "single_word": false, "lstrip": false, "rstrip": false,
				"normalized": false, "special": sp.typ != spmUserDefined})
		}
	}
	f := map[string]any{
		"version": "1.0", "added_tokens": added,
		"normalizer": map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Prepend", "prepend": "▁"},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"}}},
		"pre_tokenizer": nil, "post_processor": nil,
		"decoder": map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
			map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"},
			map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0}}},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": "<unk>", "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": merges},
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
