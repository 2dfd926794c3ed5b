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

// Cut: after a newline between printable characters (gpt2Cut), or before a
// space between a printable character and a letter (gpt2SpaceCut), whichever
// comes first.
func (GPT2) Cut(text []byte, from int) int { return min(gpt2Cut(text, from), gpt2SpaceCut(text, from)) }

// gpt2SpaceCut returns the first i ≥ from where text[i] is a space, text[i−1]
// printable ASCII other than space and text[i+1] an ASCII letter, or
// len(text). GPT-2's pre-tokenizer matches the space with the letters after
// it (" ?\p{L}+"), in the whole text as in the piece that begins there, and
// no match runs from a printable character across a space, so the pieces'
// tokens are the whole's. Text without newlines (one long line, a JSON
// document) can then be cut too.
func gpt2SpaceCut(text []byte, from int) int {
	letter := func(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }
	for i := max(from, 1); i+1 < len(text); i++ {
		if text[i] == ' ' && text[i-1] > ' ' && text[i-1] < 0x7f && letter(text[i+1]) {
			return i
		}
	}
	return len(text)
}

// utf8Cut is the first i ≥ from that starts a character, or len(text).
func utf8Cut(text []byte, from int) int {
	for i := max(from, 0); i < len(text); i++ {
		if utf8.RuneStart(text[i]) {
			return i
		}
	}
	return len(text)
}
