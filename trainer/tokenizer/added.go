package tokenizer

import (
	"sort"
	"strings"
)

// addedVocab finds added tokens in text, leftmost first and the longest where
// several start at the same place (as Hugging Face's Aho-Corasick matcher,
// LeftmostLongest, does).
type addedVocab struct {
	first  [256]bool           // a token starts with this byte
	byByte map[byte][]addedTok // tokens by first byte, longest first
}

type addedTok struct {
	content string
	id      int32
}

func newAddedVocab(toks []addedTok) *addedVocab {
	if len(toks) == 0 {
		return nil
	}
	a := &addedVocab{byByte: map[byte][]addedTok{}}
	for _, t := range toks {
		if t.content == "" {
			continue
		}
		a.first[t.content[0]] = true
		a.byByte[t.content[0]] = append(a.byByte[t.content[0]], t)
	}
	for _, l := range a.byByte {
		sort.SliceStable(l, func(i, j int) bool { return len(l[i].content) > len(l[j].content) })
	}
	return a
}

// each calls fn for the pieces of text in order: the text between added
// tokens with id -1, and each added token with its id. A nil vocabulary gives
// the whole text.
func (a *addedVocab) each(text string, fn func(seg string, id int32)) {
	if a == nil {
		fn(text, -1)
		return
	}
	start := 0
	for i := 0; i < len(text); i++ {
		if !a.first[text[i]] {
			continue
		}
		for _, t := range a.byByte[text[i]] {
			if strings.HasPrefix(text[i:], t.content) {
				if i > start {
					fn(text[start:i], -1)
				}
				fn(t.content, t.id)
				start = i + len(t.content)
				i = start - 1
				break
			}
		}
	}
	if start < len(text) {
		fn(text[start:], -1)
	}
}

// hasNewline reports whether an added token holds a newline (text with such
// tokens is not cut at newlines).
func (a *addedVocab) hasNewline() bool {
	if a == nil {
		return false
	}
	for _, l := range a.byByte {
		for _, t := range l {
			if strings.ContainsAny(t.content, "\r\n") {
				return true
			}
		}
	}
	return false
}
