package tokenizer

import "unicode/utf8"

// byteToRune is GPT-2's byte-level alphabet: every byte as a printable
// character (printable Latin-1 bytes as themselves, the rest from U+0100 on),
// so that a byte-level vocabulary can be written as text.
var byteToRune, runeToByte = func() ([256]rune, map[rune]byte) {
	var b2r [256]rune
	printable := func(b int) bool {
		return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
	}
	n := 0
	for b := range 256 {
		if printable(b) {
			b2r[b] = rune(b)
		} else {
			b2r[b] = rune(256 + n)
			n++
		}
	}
	r2b := make(map[rune]byte, 256)
	for b, r := range b2r {
		r2b[r] = byte(b)
	}
	return b2r, r2b
}()

// fromByteLevel maps a byte-level token back to its bytes; ok is false when a
// character is outside the alphabet.
func fromByteLevel(s string) (b []byte, ok bool) {
	b = make([]byte, 0, len(s))
	for _, r := range s {
		c, in := runeToByte[r]
		if !in {
			return nil, false
		}
		b = append(b, c)
	}
	return b, true
}

// toByteLevel writes bytes in the byte-level alphabet.
func toByteLevel(b []byte) string {
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = utf8.AppendRune(out, byteToRune[c])
	}
	return string(out)
}
