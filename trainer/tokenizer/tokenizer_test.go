package tokenizer

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tiny is testdata/tiny-tokenizer.json: byte-level BPE with GPT-2's
// pre-tokenizer (ByteLevel use_regex), 300 merges learnt from English, NFC,
// and <|endoftext|> (556) as an added special token; written for these tests.
func tiny(t testing.TB) *Tokenizer {
	t.Helper()
	tok, err := Load("testdata/tiny-tokenizer.json")
	require.NoError(t, err)
	return tok
}

// withPattern is the tiny tokenizer with a Split on pattern before ByteLevel
// (without its regex).
func withPattern(t testing.TB, pattern string) *Tokenizer {
	t.Helper()
	b, err := os.ReadFile("testdata/tiny-tokenizer.json")
	require.NoError(t, err)
	s := strings.Replace(string(b), `"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}`,
		`"pre_tokenizer": `+splitThen(pattern), 1)
	require.NotEqual(t, string(b), s)
	tok, err := FromBytes("tokenizer.json", []byte(s), nil)
	require.NoError(t, err)
	return tok
}

// TestPiecesEqualWhole: text encoded in pieces on several goroutines gives the
// ids of the whole, for each pattern whose tokenizer may be cut.
func TestPiecesEqualWhole(t *testing.T) {
	text := []byte(strings.Join(testCorpus(2000), "\n"))
	for name, tok := range map[string]*Tokenizer{"gpt2": tiny(t), "llama3": withPattern(t, llama3Pattern), "qwen2": withPattern(t, qwen2Pattern)} {
		require.True(t, tok.cutSafe, name)
		whole, err := tok.encodePieces(text, len(text), 1, nil)
		require.NoError(t, err)
		var done []int
		pieces, err := tok.encodePieces(text, 512, 4, func(d int) { done = append(done, d) })
		require.NoError(t, err)
		assert.Greater(t, len(done), 20, "%s: cut into many pieces", name)
		assert.Equal(t, len(text), done[len(done)-1])
		if !slices.Equal(whole, pieces) {
			t.Errorf("%s: %d ids in pieces, %d whole, or they differ", name, len(pieces), len(whole))
		}
	}
	// An unknown pattern is encoded in one piece.
	tok := withPattern(t, `\w+|\W+`)
	assert.False(t, tok.cutSafe)
}

func TestTinyRoundTripAndSpecials(t *testing.T) {
	tok := tiny(t)
	assert.Equal(t, 557, tok.VocabSize())
	assert.Equal(t, int32(-1), tok.BOS())
	assert.Equal(t, int32(556), tok.EOS(), "<|endoftext|> is the usual EOS name")
	text := "Hello, wörld!<|endoftext|>  the 1234\n\n\tcafe\u0301 <|endoftext"
	ids, err := tok.Encode([]byte(text))
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(fmt.Sprint(ids), " 556 "), "one special token, the cut one is text")
	assert.Equal(t, strings.Replace(text, "e\u0301", "é", 1), tok.Decode(ids), "decodes to the NFC text")
	assert.Equal(t, "\uFFFD", tok.Decode([]int32{9999}), "an id outside the vocabulary")
	_, err = tok.Encode([]byte("ok \xff"))
	assert.ErrorContains(t, err, "invalid byte 0xff at offset 3")
}

func TestSplitBehaviors(t *testing.T) {
	re, err := compilePattern(`-`)
	require.NoError(t, err)
	text := "a-b--c-"
	for b, want := range map[behavior][]string{
		isolated:           {"a", "-", "b", "-", "-", "c", "-"},
		removed:            {"a", "b", "c"},
		mergedWithPrevious: {"a-", "b-", "-", "c-"},
		mergedWithNext:     {"a", "-b", "-", "-c", "-"},
		contiguous:         {"a", "-", "b", "--", "c", "-"},
	} {
		got, err := (&splitStep{re: re, behavior: b}).split([]string{text}, nil)
		require.NoError(t, err)
		assert.Equal(t, want, got, "behavior %d", b)
	}
	got, err := (&splitStep{re: re, behavior: removed, invert: true}).split([]string{text}, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"-", "-", "-", "-"}, got, "inverted: the text between matches is removed")
	got, err = (&digitsStep{individual: true}).split([]string{"ab12c3"}, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"ab", "1", "2", "c", "3"}, got)
	got, err = (&digitsStep{}).split([]string{"ab12c3"}, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"ab", "12", "c", "3"}, got)
}

func TestPossessiveToAtomic(t *testing.T) {
	for in, want := range map[string]string{
		`[^\r\n\p{L}\p{N}]?+\p{L}+`:  `(?>[^\r\n\p{L}\p{N}]?)\p{L}+`,
		` ?[^\s\p{L}\p{N}]++[\r\n]*`: ` ?(?>[^\s\p{L}\p{N}]+)[\r\n]*`,
		`\p{N}{1,3}+x`:               `(?>\p{N}{1,3})x`,
		`(ab)*+é?+`:                  `(?>(ab)*)(?>é?)`,
		llama3Pattern:                llama3Pattern,
	} {
		got, err := possessiveToAtomic(in)
		require.NoError(t, err)
		assert.Equal(t, want, got, in)
	}
	_, err := compilePattern(cl100kPattern)
	assert.NoError(t, err, "cl100k's possessive pattern compiles")
}

func TestRefusals(t *testing.T) {
	b, err := os.ReadFile("testdata/tiny-tokenizer.json")
	require.NoError(t, err)
	for _, c := range []struct{ from, to, want string }{
		{`"dropout": null`, `"dropout": 0.1`, "BPE dropout makes encoding random"},
		{`"type": "BPE"`, `"type": "WordPiece"`, `model.type "WordPiece"`},
		{`{"type": "NFC"}`, `{"type": "Lowercase"}`, `normalizer type "Lowercase" is not supported`},
		{`"pre_tokenizer": {"type": "ByteLevel"`, `"pre_tokenizer": {"type": "Whitespace"`, `pre-tokenizer type "Whitespace" is not supported`},
		{`"lstrip": false`, `"lstrip": true`, "lstrip and rstrip are not implemented"},
		{`"Ġ t", `, `"Ġ q t", `, "two tokens separated by one space"},
		{`"Ġ t", `, `"Ġ zzz", `, `must all be in model.vocab`},
	} {
		s := strings.Replace(string(b), c.from, c.to, 1)
		require.NotEqual(t, string(b), s, c.from)
		_, err := FromBytes("tokenizer.json", []byte(s), nil)
		assert.ErrorContains(t, err, c.want)
	}
	_, err = FromBytes("x", []byte("hello"), nil)
	assert.ErrorContains(t, err, "neither a Hugging Face tokenizer.json, a tiktoken rank file nor a SentencePiece model")
}

func TestTiktokenFile(t *testing.T) {
	var lines []string
	for c := range 256 {
		lines = append(lines, base64.StdEncoding.EncodeToString([]byte{byte(c)})+" "+fmt.Sprint(c))
	}
	ab := base64.StdEncoding.EncodeToString([]byte("ab"))
	lines = append(lines, ab+" 256")
	dir := t.TempDir()
	path := filepath.Join(dir, "tokenizer.model")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	tok, err := Load(path)
	require.NoError(t, err)
	assert.Equal(t, Tiktoken, tok.Kind())
	assert.Equal(t, 257, tok.VocabSize(), "no special tokens: not Llama 3's rank count, no tokenizer_config.json")
	ids, err := tok.Encode([]byte("abc ab"))
	require.NoError(t, err)
	assert.Equal(t, []int32{256, 'c', ' ', 256}, ids, "\" ab\" is one word, whose a and b merge")

	// Special tokens from tokenizer_config.json beside the file.
	cfg := `{"bos_token": "<|b|>", "eos_token": {"content": "<|e|>"}, "added_tokens_decoder": {"257": {"content": "<|b|>", "special": true}, "258": {"content": "<|e|>", "special": true}}}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, ConfigName), []byte(cfg), 0o644))
	tok, err = Load(dir)
	require.NoError(t, err)
	assert.Equal(t, 259, tok.VocabSize())
	assert.Equal(t, [2]int32{257, 258}, [2]int32{tok.BOS(), tok.EOS()})
	ids, err = tok.Encode([]byte("<|b|>ab<|e|>"))
	require.NoError(t, err)
	assert.Equal(t, []int32{257, 256, 258}, ids)
	assert.Equal(t, "<|b|>ab<|e|>", tok.Decode(ids))
	assert.Len(t, tok.Sources(), 2)

	for _, bad := range []string{"YQ== x\n", "!!! 1\n", "YQ== 1\nYQ== 2\n"} {
		_, err := FromBytes("tokenizer.model", []byte(bad), nil)
		assert.Error(t, err, bad)
	}
	_, err = FromBytes("tokenizer.model", []byte("YQ== 0\n"), nil)
	assert.ErrorContains(t, err, "lacks the single byte 0x00")
}

// TestMergeLongEqualsScan: the heap merge of long words gives the scan's
// tokens (the scan is the reference: the leftmost of the lowest-ranked pairs,
// merged until none is left).
func TestMergeLongEqualsScan(t *testing.T) {
	tok := tiny(t)
	m := tok.model.(*bpe)
	for _, s := range testCorpus(300) {
		if len(s) < 2 {
			continue
		}
		syms := make([]int32, len(s))
		for i := range len(s) {
			syms[i] = m.byteIDs[s[i]]
		}
		want := mergeShort(append([]int32(nil), syms...), m.merges)
		got := mergeLong(append([]int32(nil), syms...), m.merges)
		require.Equal(t, want, got, "%q", s)
	}
}

// TestTiktokenLongWords: long words (over 64 bytes) merged on the heap give
// the ids of tiktoken's scan, on ranks made from the tiny tokenizer's
// vocabulary (its ids as ranks).
func TestTiktokenLongWords(t *testing.T) {
	tok := tiny(t)
	m := tok.model.(*bpe)
	ranks := map[string]int32{}
	for k, id := range m.vocab {
		ranks[k] = id
	}
	tt := &tiktokenBPE{ranks: ranks}
	for _, s := range testCorpus(300) {
		if len(s) <= 64 {
			continue
		}
		long, err := tt.mergeLong(s, nil)
		require.NoError(t, err)
		short, err := tt.scan(s, nil)
		require.NoError(t, err)
		require.Equal(t, short, long, "%q", s)
	}
}

// TestCutOnlyWhereEncodeAgrees: Cut offers a place to cut only where encoding
// the pieces with Encode gives the whole's tokens: after a newline between
// printable characters for a cut-safe tokenizer, nowhere (len(text)) for one
// that is not, or whose later pieces normalize otherwise than the first
// (SentencePiece's dummy prefix), which Encode would treat as first pieces.
func TestCutOnlyWhereEncodeAgrees(t *testing.T) {
	text := []byte("ab\ncd ef\ngh")
	safe := &Tokenizer{cutSafe: true}
	if got := safe.Cut(text, 0); got != 3 {
		t.Fatalf("cut-safe: Cut = %d, want 3", got)
	}
	for name, tok := range map[string]*Tokenizer{"not cut-safe": {}, "later pieces normalized otherwise": {cutSafe: true, normalizeRest: func(s string) string { return s }}} {
		if got := tok.Cut(text, 0); got != len(text) {
			t.Fatalf("%s: Cut = %d, want %d (no cut)", name, got, len(text))
		}
	}
}
