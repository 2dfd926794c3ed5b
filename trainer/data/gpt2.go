package data

import (
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/tiktoken-go/tokenizer/codec"
)

// GPT2 is GPT-2's byte-pair encoding (OpenAI's r50k_base: 50,257 tokens, the
// last one <|endoftext|>). Its merge table ships inside the tiktoken-go module,
// so it works offline; the table is built on first use (tens of milliseconds).
type GPT2 struct{}

// GPT2Vocab is the size of GPT-2's vocabulary.
const GPT2Vocab = 50257

// gpt2 is the codec, built once; it passes bytes through unchanged (Decode
// joins the tokens' bytes before it repairs split characters).
var gpt2 = sync.OnceValue(codec.NewR50kBase)

// endOfText is the special token that separates documents.
const endOfText = GPT2Vocab - 1

func (GPT2) Name() string   { return "gpt2" }
func (GPT2) VocabSize() int { return GPT2Vocab }

// Encode tokenizes UTF-8 text; <|endoftext|> in the text is encoded as plain
// text, never as the special token.
func (GPT2) Encode(text []byte) ([]int32, error) {
	if !utf8.Valid(text) {
		at := 0
		for at < len(text) {
			r, n := utf8.DecodeRune(text[at:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			at += n
		}
		return nil, fmt.Errorf("the gpt2 tokenizer needs UTF-8 text: invalid byte 0x%02x at offset %d (convert the file to UTF-8, or use the byte tokenizer)", text[at], at)
	}
	ids, _, err := gpt2().Encode(string(text))
	if err != nil {
		return nil, fmt.Errorf("gpt2 tokenizer: %w", err)
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out, nil
}

// Decode maps tokens back to text. A character split across tokens is joined
// before the bytes are read as UTF-8; bytes that still do not form a character
// (the sample ended inside one) and tokens outside the vocabulary become U+FFFD,
// as in GPT-2's own decoder (errors="replace").
func (GPT2) Decode(tokens []int32) string {
	var out []byte
	id := make([]uint, 1)
	for _, t := range tokens {
		switch {
		case t == endOfText:
			out = append(out, "<|endoftext|>"...)
		case t >= 0 && t < endOfText:
			id[0] = uint(t)
			if s, err := gpt2().Decode(id); err == nil {
				out = append(out, s...)
				continue
			}
			fallthrough
		default:
			out = utf8.AppendRune(out, utf8.RuneError)
		}
	}
	return strings.ToValidUTF8(string(out), "\uFFFD")
}
