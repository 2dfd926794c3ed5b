package tokenizer

import (
	"os"
	"testing"
	"time"
	"unicode/utf8"
)

// FuzzFromBytes: any bytes as a tokenizer file (a tokenizer.json, a rank file,
// a SentencePiece model) are read or refused, never a panic; a tokenizer read
// encodes text to ids below its vocabulary and decodes them to UTF-8.
func FuzzFromBytes(f *testing.F) {
	tiny, err := os.ReadFile("testdata/tiny-tokenizer.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(tiny, "Hello <|endoftext|> wörld 123\n\n  x")
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "<0x41>": 3}, "merges": [["a", "b"]], "byte_fallback": true},
		"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\w+?+|\\s"}, "behavior": "MergedWithNext", "invert": true},
		"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
		"decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}}`), "ab a bA")
	f.Add([]byte("YQ== 0\nYg== 1\nYWI= 2\n"), "abab")
	f.Add([]byte{0x0a, 0x09, 0x0a, 0x03, 0xe2, 0x96, 0x81, 0x15, 0, 0, 0, 0, 0x12, 0x02, 0x18, 0x02}, "a b")
	matchTimeout = 50 * time.Millisecond // a backtracking pattern fails fast here
	f.Fuzz(func(t *testing.T, b []byte, text string) {
		tok, err := FromBytes("fuzz", b, nil)
		if err != nil {
			return
		}
		if !utf8.ValidString(text) {
			return
		}
		ids, err := tok.Encode([]byte(text))
		if err != nil {
			return
		}
		for _, id := range ids {
			if id < 0 || int(id) >= tok.VocabSize() {
				t.Fatalf("id %d outside the vocabulary of %d", id, tok.VocabSize())
			}
		}
		if s := tok.Decode(ids); !utf8.ValidString(s) {
			t.Fatalf("decoded text is not UTF-8: %q", s)
		}
	})
}
