package data

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// GPT-2's published token ids (OpenAI's encoder.json / tiktoken's r50k_base).
func TestGPT2KnownTokens(t *testing.T) {
	for text, want := range map[string][]int32{
		"Hello, world!":       {15496, 11, 995, 0},
		"The quick brown fox": {464, 2068, 7586, 21831},
		" the":                {262},
	} {
		got, err := GPT2{}.Encode([]byte(text))
		require.NoError(t, err)
		assert.Equal(t, want, got, text)
		assert.Equal(t, text, GPT2{}.Decode(got))
	}
}

func TestGPT2RoundTripsOpticks(t *testing.T) {
	text, err := os.ReadFile(filepath.Join(runtime.GOROOT(), "src", "testdata", "Isaac.Newton-Opticks.txt"))
	require.NoError(t, err)
	tokens, err := GPT2{}.Encode(text)
	require.NoError(t, err)
	// BPE merges English prose to about four bytes a token.
	assert.Less(t, len(tokens), len(text)/3)
	for _, tok := range tokens {
		require.True(t, tok >= 0 && tok < GPT2Vocab)
	}
	assert.Equal(t, string(text), GPT2{}.Decode(tokens))
}

func TestGPT2Decode(t *testing.T) {
	tokens, err := GPT2{}.Encode([]byte("œuvre"))
	require.NoError(t, err)
	// œ is two bytes; GPT-2 may split a character across tokens, which Decode
	// joins before reading UTF-8; a sample ending inside one shows U+FFFD.
	assert.Equal(t, "œuvre", GPT2{}.Decode(tokens))
	one, err := GPT2{}.Encode([]byte("😀"))
	require.NoError(t, err)
	require.Greater(t, len(one), 1, "an emoji takes several byte-level tokens")
	assert.Equal(t, "\uFFFD", GPT2{}.Decode(one[:1]))
	assert.Equal(t, "a<|endoftext|>\uFFFD", GPT2{}.Decode([]int32{64, endOfText, GPT2Vocab}))
}

func TestGPT2RejectsInvalidUTF8(t *testing.T) {
	_, err := GPT2{}.Encode([]byte("ab\xffcd"))
	assert.ErrorContains(t, err, "invalid byte 0xff at offset 2")
}
