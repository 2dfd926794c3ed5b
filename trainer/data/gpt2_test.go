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

// TestGPT2PiecesEqualWhole: text encoded in pieces cut by gpt2Cut, on several
// goroutines, has exactly the ids the codec gives it whole, on Opticks and on
// text built to cross every kind of boundary near a newline (runs of
// newlines, CRLF, spaces before and after, Unicode whitespace, contractions,
// numbers, punctuation); progress reports each piece's end, in order, ending
// at the text's length.
func TestGPT2PiecesEqualWhole(t *testing.T) {
	opticks, err := os.ReadFile(filepath.Join(runtime.GOROOT(), "src", "testdata", "Isaac.Newton-Opticks.txt"))
	require.NoError(t, err)
	var crafted []byte
	for _, s := range []string{"a\nb", "a\n\nb", "a \nb", "a\n b", "a\r\nb", "x.\n'sy", "1\n2", "é\nü", "a\u00a0\nb", "a\n\u2028b", "z\n\n\n", "!\n?", "end\n"} {
		crafted = append(crafted, s...)
		crafted = append(crafted, "word 42 it's\n"...)
	}
	for name, text := range map[string][]byte{"opticks": opticks[:200_000], "crafted": crafted} {
		ids, _, err := gpt2().Encode(string(text))
		require.NoError(t, err)
		whole := make([]int32, len(ids))
		for i, id := range ids {
			whole[i] = int32(id)
		}
		for _, size := range []int{1, 7, 64, 4096} {
			var seen []int
			got, err := encodePieces(text, size, 3, func(done int) { seen = append(seen, done) })
			require.NoError(t, err)
			require.Equal(t, whole, got, "%s in pieces of %d bytes", name, size)
			require.NotEmpty(t, seen)
			assert.IsIncreasing(t, seen)
			assert.Equal(t, len(text), seen[len(seen)-1])
			if size < 64 {
				assert.Greater(t, len(seen), 10, "%s is cut into many pieces of %d bytes", name, size)
			}
		}
	}
	assert.Equal(t, 3, gpt2Cut([]byte("ab\ncd"), 0), "just after a newline between printable characters")
	assert.Equal(t, 9, gpt2Cut([]byte("ab\n\ncd\n e"), 0), "never after a run of newlines, nor before a space")
}

func TestTokenizerSpecials(t *testing.T) {
	assert.Equal(t, Specials{BOS: -1, EOS: 50256}, GPT2{}.Specials(), "GPT-2's <|endoftext|> is its last token")
	assert.Equal(t, Specials{BOS: -1, EOS: -1}, Byte{}.Specials())
	c, err := NewChar([]byte("ab"))
	require.NoError(t, err)
	assert.Equal(t, Specials{BOS: -1, EOS: -1}, c.Specials())
}
