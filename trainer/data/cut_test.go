package data

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// Text cut into pieces wherever each Cutter allows encodes to the tokens of
// the whole: random text of letters, digits, spaces, newlines, punctuation,
// apostrophes and multi-byte characters, cut at every place found.
func TestCuttersKeepTokens(t *testing.T) {
	alphabet := []string{"a", "b", "Z", "s", "t", "1", "7", " ", " ", " ", "\n", "\n\n", ".", ",", "'", "'s", "\t", "é", "½", "—", "\r\n", "  ", "x"}
	rng := rand.New(rand.NewPCG(1, 2))
	c, err := NewChar([]byte(string([]rune("abZst17 \n.,'\tx\ré½—"))))
	require.NoError(t, err)
	for n := 0; n < 400; n++ {
		var text []byte
		for range 5 + rng.IntN(120) {
			text = append(text, alphabet[rng.IntN(len(alphabet))]...)
		}
		for _, tok := range []Tokenizer{Byte{}, c, GPT2{}} {
			whole, err := tok.Encode(text)
			require.NoError(t, err)
			cut := tok.(Cutter)
			var got []int32
			at := 0
			for at < len(text) {
				end := cut.Cut(text, at+1)
				ids, err := tok.Encode(text[at:end])
				require.NoError(t, err)
				got = append(got, ids...)
				at = end
			}
			require.Equal(t, whole, got, "%s: %q", tok.Name(), text)
		}
	}
}
