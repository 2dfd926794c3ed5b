package tokenizer

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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
}
