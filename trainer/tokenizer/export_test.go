package tokenizer

import "testing"

// The reference helpers, for the tests of package tokenizer_test (which
// import trainer/data, whose built-in tokenizers are written as Hugging Face
// files with this package's writers).

// Corpus is testCorpus.
func Corpus(n int) []string { return testCorpus(n) }

// TokrefDir is tokrefDir.
func TokrefDir(t testing.TB) string { return tokrefDir(t) }

// RunRef is runRef.
func RunRef(t *testing.T, args ...string) { runRef(t, args...) }

// ReadRefIDs is readRefIDs.
func ReadRefIDs(t *testing.T, path string) [][]int32 { return readRefIDs(t, path) }

// WriteDocs is writeDocs.
func WriteDocs(t testing.TB, path string, docs []string) { writeDocs(t, path, docs) }

// ConvertDocs is convertDocs.
const ConvertDocs = convertDocs
