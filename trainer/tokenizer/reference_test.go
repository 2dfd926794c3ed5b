package tokenizer

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// The reference tests encode testCorpus(refDocs) with shardline and with the
// reference encoders (scripts/tokref.js) and require every document's ids to
// be equal; the variants of Llama 3's tokenizer.json, which differ from it in
// their normalizer and pre-tokenizer only, take the first variantDocs.
const (
	refDocs     = 10000
	variantDocs = 3000
)

// runRef runs scripts/tokref.js with NODE_PATH at SHARDLINE_TOKREF.
func runRef(t *testing.T, args ...string) {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "tokref.js")
	cmd := exec.Command("node", append([]string{script}, args...)...)
	cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(tokrefDir(t), "node_modules"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("node tokref.js %s: %v\n%s", args[0], err, out)
	}
}

func readRefIDs(t *testing.T, path string) [][]int32 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]int32
	for len(b) >= 4 {
		n := int(binary.LittleEndian.Uint32(b))
		b = b[4:]
		ids := make([]int32, n)
		for i := range ids {
			ids[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
		}
		b = b[4*n:]
		out = append(out, ids)
	}
	return out
}

// compareIDs encodes every document (each alone, as the reference does) and
// compares, reporting the first few that differ token by token.
func compareIDs(t *testing.T, tok *Tokenizer, docs []string, want [][]int32) {
	t.Helper()
	if len(want) != len(docs) {
		t.Fatalf("the reference encoded %d documents, not %d", len(want), len(docs))
	}
	bad := 0
	for i, d := range docs {
		got, err := tok.Encode([]byte(d))
		if err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		if slices.Equal(got, want[i]) {
			continue
		}
		if bad++; bad <= 3 {
			t.Errorf("document %d %q:\n got  %s\n want %s", i, d, tokenList(tok, got), tokenList(tok, want[i]))
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d documents differ from the reference", bad, len(docs))
	}
}

func tokenList(tok *Tokenizer, ids []int32) string {
	var b strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&b, "%d:%q ", id, tok.Token(id))
	}
	return b.String()
}

// checkRoundTrip decodes every document's ids back to the document.
func checkRoundTrip(t *testing.T, tok *Tokenizer, docs []string, ids [][]int32, normalize func(string) string) {
	t.Helper()
	bad := 0
	for i, d := range docs {
		want := d
		if normalize != nil {
			want = normalize(d)
		}
		if got := tok.Decode(ids[i]); got != want {
			if bad++; bad <= 3 {
				t.Errorf("document %d decodes to %q, not %q", i, got, want)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d documents do not decode back", bad, len(docs))
	}
}

// hfVariant writes a variant of Llama 3's tokenizer.json: top-level keys
// replaced by set (JSON values), the model's by model, and its merges as
// [a, b] pairs when pairs.
func hfVariant(t *testing.T, dir string, set, model map[string]string, pairs bool) string {
	t.Helper()
	b, err := os.ReadFile(llama3JSON(t))
	if err != nil {
		t.Fatal(err)
	}
	var top, m map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(top["model"], &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range set {
		top[k] = json.RawMessage(v)
	}
	for k, v := range model {
		m[k] = json.RawMessage(v)
	}
	if pairs {
		var merges []string
		if err := json.Unmarshal(m["merges"], &merges); err != nil {
			t.Fatal(err)
		}
		pl := make([][2]string, len(merges))
		for i, s := range merges {
			a, c, _ := strings.Cut(s, " ")
			pl[i] = [2]string{a, c}
		}
		if m["merges"], err = json.Marshal(pl); err != nil {
			t.Fatal(err)
		}
	}
	if top["model"], err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "tokenizer.json")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// splitThen is a Sequence pre-tokenizer: Split on pattern, then ByteLevel
// without its own regex.
func splitThen(pattern string) string {
	p, _ := json.Marshal(pattern)
	return `{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": ` + string(p) + `}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]}`
}

// llama3AddedPlus is Llama 3's added_tokens with more appended.
func llama3AddedPlus(t *testing.T, more ...string) string {
	b, err := os.ReadFile(llama3JSON(t))
	if err != nil {
		t.Fatal(err)
	}
	var top struct {
		Added []json.RawMessage `json:"added_tokens"`
	}
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	for _, m := range more {
		top.Added = append(top.Added, json.RawMessage(m))
	}
	out, err := json.Marshal(top.Added)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestHuggingFaceMatchesTokenizers compares ids with Hugging Face's tokenizers
// (npm, its Rust core) on Llama 3's tokenizer.json and on variants of it that
// take the other paths Qwen2/3 and GPT-NeoX files take: an NFC normalizer,
// Qwen2's pattern, [a, b] merges, merges not ignored, added tokens that are
// not special (one matched after normalization), ByteLevel's own GPT-2 regex
// and its prefix space; and on the tests' own tiny tokenizer.
func TestHuggingFaceMatchesTokenizers(t *testing.T) {
	tokrefDir(t)
	allDocs := testCorpus(refDocs)
	tmp := t.TempDir()
	writeDocs(t, filepath.Join(tmp, "docs.jsonl"), allDocs)
	writeDocs(t, filepath.Join(tmp, "variant-docs.jsonl"), allDocs[:variantDocs])
	variants := []struct {
		name       string
		set, model map[string]string
		pairs      bool
	}{
		{name: "llama3"},
		{name: "qwen2-style", pairs: true,
			set: map[string]string{"normalizer": `{"type": "NFC"}`, "pre_tokenizer": splitThen(qwen2Pattern),
				"added_tokens": llama3AddedPlus(t, `{"id": 128256, "content": "<think>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false}`,
					`{"id": 128257, "content": "Ωmega", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}`)},
			model: map[string]string{"ignore_merges": "false"}},
		{name: "neox-style",
			set: map[string]string{"normalizer": `{"type": "Sequence", "normalizers": [{"type": "NFKC"}]}`,
				"pre_tokenizer": `{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}`},
			model: map[string]string{"ignore_merges": "false"}},
	}
	variants = append(variants, struct {
		name       string
		set, model map[string]string
		pairs      bool
	}{name: "tiny"})
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			path, docs, docsPath := llama3JSON(t), allDocs, filepath.Join(tmp, "docs.jsonl")
			if v.name == "tiny" {
				path, docs, docsPath = "testdata/tiny-tokenizer.json", allDocs[:variantDocs], filepath.Join(tmp, "variant-docs.jsonl")
			}
			if v.set != nil || v.model != nil {
				docs, docsPath = allDocs[:variantDocs], filepath.Join(tmp, "variant-docs.jsonl")
				path = hfVariant(t, filepath.Join(tmp, v.name), v.set, v.model, v.pairs)
			}
			tok, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(tmp, v.name+".ids")
			runRef(t, "hf", path, docsPath, out)
			want := readRefIDs(t, out)
			compareIDs(t, tok, docs, want)
			if v.name == "llama3" {
				if tok.VocabSize() != 128256 || tok.BOS() != 128000 || tok.EOS() != 128001 {
					t.Errorf("Llama 3: vocabulary %d, BOS %d, EOS %d; want 128256, 128000, 128001", tok.VocabSize(), tok.BOS(), tok.EOS())
				}
				checkRoundTrip(t, tok, docs, want, nil)
			}
		})
	}
}

// TestTiktokenMatchesTiktoken compares ids with OpenAI's tiktoken (npm, the
// Rust encoder in WASM) on Llama 3's rank file (written here from Llama 3's
// tokenizer.json, whose ids are the ranks) with its pattern and special tokens.
func TestTiktokenMatchesTiktoken(t *testing.T) {
	tokrefDir(t)
	docs := testCorpus(refDocs)
	tmp := t.TempDir()
	docsPath := filepath.Join(tmp, "docs.jsonl")
	writeDocs(t, docsPath, docs)
	ranks := writeLlama3Ranks(t, tmp)
	specials := map[string]int{}
	for i, n := range llama3Specials() {
		specials[n] = llama3Ranks + i
	}
	sj, _ := json.Marshal(specials)
	spPath := filepath.Join(tmp, "specials.json")
	if err := os.WriteFile(spPath, sj, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := Load(ranks)
	if err != nil {
		t.Fatal(err)
	}
	if tok.Kind() != Tiktoken || tok.VocabSize() != 128256 || tok.BOS() != 128000 || tok.EOS() != 128001 {
		t.Fatalf("kind %s, vocabulary %d, BOS %d, EOS %d; want tiktoken, 128256, 128000, 128001", tok.Kind(), tok.VocabSize(), tok.BOS(), tok.EOS())
	}
	out := filepath.Join(tmp, "tt.ids")
	runRef(t, "tiktoken", ranks, spPath, llama3Pattern, docsPath, out)
	want := readRefIDs(t, out)
	compareIDs(t, tok, docs, want)
	checkRoundTrip(t, tok, docs, want, nil)
}

// writeLlama3Ranks writes Llama 3's rank file (tokenizer.model) from its
// tokenizer.json into dir/rank/tokenizer.model.
func writeLlama3Ranks(t testing.TB, dir string) string {
	t.Helper()
	b, err := os.ReadFile(llama3JSON(t))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Model struct {
			Vocab map[string]int `json:"vocab"`
		} `json:"model"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	lines := make([]string, len(f.Model.Vocab))
	for tok, id := range f.Model.Vocab {
		raw, ok := fromByteLevel(tok)
		if !ok {
			t.Fatalf("token %q is not byte-level", tok)
		}
		lines[id] = base64.StdEncoding.EncodeToString(raw) + " " + fmt.Sprint(id)
	}
	path := filepath.Join(dir, "rank", "tokenizer.model")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// convertDocs is how many of testCorpus's documents the converted files are
// compared on: the conversion is checked token by token on every rank, the
// corpus only has to take every path (a few seconds with the references).
const convertDocs = 1000

// TestRankFileAsTokenizerJSONMatches: Llama 3's rank file written as a
// tokenizer.json (RankedBPE.HFFiles, as ckpt export writes it beside the rank
// file) gives the rank file's ids (this package's tiktoken encoder, which
// TestTiktokenMatchesTiktoken holds to OpenAI's) read by this package's
// tokenizer.json reader and by Hugging Face's tokenizers (npm) alike, on every
// one of convertDocs documents and of the tokens no merge makes (each a
// document), and both decode the ids back to the document.
func TestRankFileAsTokenizerJSONMatches(t *testing.T) {
	tokrefDir(t)
	docs := testCorpus(convertDocs)
	tmp := t.TempDir()
	docsPath := filepath.Join(tmp, "docs.jsonl")
	tok, err := Load(writeLlama3Ranks(t, tmp))
	if err != nil {
		t.Fatal(err)
	}
	rb, ok := tok.RankedBPE()
	if !ok {
		t.Fatalf("kind %s: not a rank file", tok.Kind())
	}
	hf, err := rb.HFFiles()
	if err != nil {
		t.Fatal(err)
	}
	// Llama 3's 128,000 ranks less its 256 bytes make a merge each, except the
	// tokens no pair of lower-ranked tokens makes (a word that is one of them
	// is still that token: ignore_merges).
	t.Logf("%d merges, %d tokens without one", hf.Merges, len(hf.Unreachable))
	if hf.Merges+len(hf.Unreachable) != llama3Ranks-256 {
		t.Errorf("%d merges and %d unreachable tokens: want %d in all", hf.Merges, len(hf.Unreachable), llama3Ranks-256)
	}
	// The tokens without a merge, as documents of their own: a word that is
	// one is its token in both (ignore_merges).
	for _, id := range hf.Unreachable {
		if s := tok.Token(id); utf8.ValidString(s) {
			docs = append(docs, s)
		}
	}
	writeDocs(t, docsPath, docs)
	path := filepath.Join(tmp, "conv", "tokenizer.json")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, hf.TokenizerJSON, 0o644); err != nil {
		t.Fatal(err)
	}
	want := make([][]int32, len(docs))
	for i, d := range docs {
		if want[i], err = tok.Encode([]byte(d)); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
	}
	conv, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if conv.Kind() != HuggingFace || conv.VocabSize() != 128256 || conv.BOS() != 128000 || conv.EOS() != 128001 {
		t.Fatalf("converted: kind %s, vocabulary %d, BOS %d, EOS %d; want tokenizer.json, 128256, 128000, 128001", conv.Kind(), conv.VocabSize(), conv.BOS(), conv.EOS())
	}
	t.Run("shardline", func(t *testing.T) {
		compareIDs(t, conv, docs, want)
		checkRoundTrip(t, conv, docs, want, nil)
	})
	t.Run("tokenizers", func(t *testing.T) {
		out, decoded := filepath.Join(tmp, "conv.ids"), filepath.Join(tmp, "conv.decoded.jsonl")
		runRef(t, "hf", path, docsPath, out, decoded)
		compareIDs(t, tok, docs, readRefIDs(t, out))
		b, err := os.ReadFile(decoded)
		if err != nil {
			t.Fatal(err)
		}
		texts := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		if len(texts) != len(docs) {
			t.Fatalf("tokenizers decoded %d documents, not %d", len(texts), len(docs))
		}
		bad := 0
		for i, line := range texts {
			var s string
			if err := json.Unmarshal([]byte(line), &s); err != nil || s != docs[i] {
				if bad++; bad <= 3 {
					t.Errorf("document %d: tokenizers decodes %s, not %q (%v)", i, line, docs[i], err)
				}
			}
		}
	})
}
