package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestFastSplitMatchesRegexp holds each hand-written matcher to regexp2
// running its pattern, on the test corpus and on random strings of the
// characters the patterns treat apart (apostrophes and contraction letters
// of both cases, letters, numbers of several scripts, spaces of several
// kinds, CR and LF, punctuation).
func TestFastSplitMatchesRegexp(t *testing.T) {
	texts := testCorpus(3000)
	r := rand.New(rand.NewPCG(7, 43))
	alphabet := []string{"'", "s", "S", "t", "r", "e", "E", "v", "m", "l", "L", "d", "D", "x", "é", "ß", "字", "ſ",
		"1", "٣", "²", "Ⅻ", " ", " ", "  ", "\t", "\u00a0", "\u3000", "\u2028", "\r", "\n", "\r\n", ".", "!", "(", "-", "😀", "\u0301", "_"}
	for range 20000 {
		var b strings.Builder
		for range r.IntN(16) {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		texts = append(texts, b.String())
	}
	for pattern, fast := range fastPatterns {
		re, err := compilePattern(pattern)
		if err != nil {
			t.Fatal(err)
		}
		slow := &splitStep{re: re, behavior: isolated}
		quick := &splitStep{re: re, fast: fast, behavior: isolated}
		bad := 0
		for _, s := range texts {
			want, err := slow.split([]string{s}, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := quick.split([]string{s}, nil)
			if !slices.Equal(got, want) {
				if bad++; bad <= 3 {
					t.Errorf("pattern %.30q… on %q:\n got  %q\n want %q", pattern, s, got, want)
				}
			}
		}
	}
}
