package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// fastSplit matches one of the common pre-tokenizer patterns without a
// regular-expression engine: next returns the end of the match that starts at
// i (these patterns match every character, so matches follow one another
// from the start of the text). TestFastSplitMatchesRegexp holds each to
// regexp2 running the pattern itself.
type fastSplit func(s string, i int) int

// fastPatterns maps the patterns with a hand-written matcher to it.
var fastPatterns = map[string]fastSplit{
	gpt2Pattern:   gpt2Next,
	llama3Pattern: func(s string, i int) int { return llama3Next(s, i, 3) },
	qwen2Pattern:  func(s string, i int) int { return llama3Next(s, i, 1) },
}

// Character classes of the patterns: \p{L}, \p{N}, \s (Unicode White_Space,
// as Oniguruma, fancy-regex and .NET read it) and the rest.
const (
	clOther = iota
	clLetter
	clNumber
	clSpace
)

var asciiClass = func() (t [128]uint8) {
	for c := range 128 {
		r := rune(c)
		switch {
		case unicode.IsLetter(r):
			t[c] = clLetter
		case unicode.IsNumber(r):
			t[c] = clNumber
		case unicode.IsSpace(r):
			t[c] = clSpace
		}
	}
	return
}()

// class returns the class of the character at i and its length.
func class(s string, i int) (uint8, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	switch {
	case unicode.IsLetter(r):
		return clLetter, n
	case unicode.IsNumber(r):
		return clNumber, n
	case unicode.IsSpace(r):
		return clSpace, n
	}
	return clOther, n
}

// run returns the end of the run of characters of class c from i.
func run(s string, i int, c uint8) int {
	for i < len(s) {
		k, n := class(s, i)
		if k != c {
			break
		}
		i += n
	}
	return i
}

// contraction returns the end of 's, 't, 're, 've, 'm, 'll or 'd at i (in that
// order), or -1. With fold the letters match case-insensitively as Unicode
// folds them: either ASCII case, and ſ (U+017F, long s) for s.
func contraction(s string, i int, fold bool) int {
	if s[i] != '\'' || i+1 >= len(s) {
		return -1
	}
	if fold && len(s) >= i+3 && s[i+1:i+3] == "ſ" {
		return i + 3
	}
	lower := func(c byte) byte {
		if fold && c >= 'A' && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	at := func(j int) byte {
		if j < len(s) {
			return lower(s[j])
		}
		return 0
	}
	switch c := at(i + 1); c {
	case 's', 't', 'm', 'd':
		return i + 2
	case 'r', 'v':
		if at(i+2) == 'e' {
			return i + 3
		}
	case 'l':
		if at(i+2) == 'l' {
			return i + 3
		}
	}
	return -1
}

// spaceRun matches \s*[\r\n]+ (when newlines), then \s+(?!\S), then \s+ at
// i, where a whitespace character starts.
func spaceRun(s string, i int, newlines bool) int {
	end, lastNL, prev := i, -1, i
	for end < len(s) {
		k, n := class(s, end)
		if k != clSpace {
			break
		}
		if s[end] == '\r' || s[end] == '\n' {
			lastNL = end
		}
		prev = end
		end += n
	}
	if newlines && lastNL >= 0 {
		return lastNL + 1
	}
	if end == len(s) || prev == i {
		return end // the run ends the text, or is one character before a non-space
	}
	return prev // \s+(?!\S): all but the last, which stays before the non-space
}

// llama3Next is Llama 3's pattern (digits = 3) and Qwen2's (digits = 1):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,digits}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func llama3Next(s string, i, digits int) int {
	if e := contraction(s, i, true); e >= 0 {
		return e
	}
	k, n := class(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if k == clLetter {
		return run(s, i+n, clLetter)
	}
	if k != clNumber && s[i] != '\r' && s[i] != '\n' && i+n < len(s) {
		if k2, _ := class(s, i+n); k2 == clLetter {
			return run(s, i+n, clLetter)
		}
	}
	switch k {
	case clNumber:
		e := i + n
		for d := 1; d < digits && e < len(s); d++ {
			k2, n2 := class(s, e)
			if k2 != clNumber {
				break
			}
			e += n2
		}
		return e
	case clOther:
		return newlinesAfter(s, run(s, i+n, clOther))
	}
	// k == clSpace: " ?[^\s\p{L}\p{N}]+[\r\n]*" for a space before others.
	if s[i] == ' ' && i+1 < len(s) {
		if k2, _ := class(s, i+1); k2 == clOther {
			return newlinesAfter(s, run(s, i+1, clOther))
		}
	}
	return spaceRun(s, i, true)
}

// newlinesAfter is the end of [\r\n]* from i.
func newlinesAfter(s string, i int) int {
	for i < len(s) && (s[i] == '\r' || s[i] == '\n') {
		i++
	}
	return i
}

// gpt2Next is GPT-2's pattern: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
// ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func gpt2Next(s string, i int) int {
	if e := contraction(s, i, false); e >= 0 {
		return e
	}
	k, n := class(s, i)
	if k == clSpace && s[i] == ' ' && i+1 < len(s) {
		if k2, n2 := class(s, i+1); k2 != clSpace {
			return run(s, i+1+n2, k2)
		}
	}
	if k != clSpace {
		return run(s, i+n, k)
	}
	return spaceRun(s, i, false)
}
