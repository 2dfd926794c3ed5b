package tokenizer

import (
	"os"
	"testing"
)

// BenchmarkLoadLlama3 reads Llama 3's tokenizer.json (9 MB, 128,256 tokens and
// 280,147 merges).
func BenchmarkLoadLlama3(b *testing.B) {
	data, err := os.ReadFile(llama3JSON(b))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := FromBytes("tokenizer.json", data, nil); err != nil {
			b.Fatal(err)
		}
	}
}
