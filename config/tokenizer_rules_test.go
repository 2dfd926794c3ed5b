package config

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTokenizerFileRules: data.tokenizer takes a tokenizer file's path; lint
// reads it and holds model.vocab_size to its vocabulary (557 tokens here;
// more pads), warns where the file is missing and refuses one it cannot read.
func TestTokenizerFileRules(t *testing.T) {
	tiny, err := filepath.Abs("../trainer/tokenizer/testdata/tiny-tokenizer.json")
	require.NoError(t, err)
	bad := filepath.Join(t.TempDir(), "tokenizer.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"model": {"type": "WordPiece", "vocab": {}}}`), 0o644))
	codes := func(src string) map[string]Diagnostic {
		out := map[string]Diagnostic{}
		for _, d := range lintString(t, src, Options{}, nil) {
			out[d.Code] = d
		}
		return out
	}
	recipe := func(tok string, vocab int) string {
		return fmt.Sprintf("[data]\npath = \"/\"\ntokenizer = %q\n[model]\nvocab_size = %d\n", tok, vocab)
	}
	for _, vocab := range []int{557, 640} {
		got := codes(recipe(tiny, vocab))
		assert.NotContains(t, got, "SL305", "vocab_size %d covers 557 tokens", vocab)
		assert.NotContains(t, got, "SL004")
	}
	d, ok := codes(recipe(tiny, 556))["SL305"]
	require.True(t, ok, "vocab_size 556 is below the tokenizer's 557")
	assert.Equal(t, SevError, d.Severity)
	assert.Contains(t, d.Message, "smaller than the 557 tokens of the tokenizer")
	assert.Contains(t, d.Help, "set vocab_size = 557")

	d, ok = codes(recipe("/no/such/tokenizer.json", 600))["SL402"]
	require.True(t, ok)
	assert.Equal(t, SevWarning, d.Severity)
	assert.Equal(t, "x.toml:3:1", d.Location())

	d, ok = codes(recipe(bad, 600))["SL308"]
	require.True(t, ok)
	assert.Contains(t, d.Message, `model.type "WordPiece"`)

	d, ok = codes(recipe("llama3", 600))["SL004"]
	require.True(t, ok, "a bare name that is no tokenizer is still refused")
	assert.Contains(t, d.Message, "or a file's path")
}
