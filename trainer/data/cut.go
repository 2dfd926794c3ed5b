package data

import "unicode/utf8"

// Cutter is a tokenizer that can say where text may be cut so that encoding
// the pieces gives the tokens of the whole: data prepare reads a large text
// file a piece at a time through it. A tokenizer without it has each text
// file encoded whole.
type Cutter interface {
	// Cut returns the first i ≥ from where text can be cut, or len(text).
	Cut(text []byte, from int) int
}

// Cut: byte tokens are bytes; any place will do.
func (Byte) Cut(text []byte, from int) int { return min(max(from, 0), len(text)) }

// Cut: a char token is a character; cut before the first character start
// from from on.
func (*Char) Cut(text []byte, from int) int { return utf8Cut(text, from) }

// Cut: after a newline between printable characters (gpt2Cut).
func (GPT2) Cut(text []byte, from int) int { return gpt2Cut(text, from) }

// utf8Cut is the first i ≥ from that starts a character, or len(text).
func utf8Cut(text []byte, from int) int {
	for i := max(from, 0); i < len(text); i++ {
		if utf8.RuneStart(text[i]) {
			return i
		}
	}
	return len(text)
}
