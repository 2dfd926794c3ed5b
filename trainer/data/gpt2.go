package data

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/shardline/shardline/trainer/tokenizer"
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

// Specials: GPT-2 ends documents with <|endoftext|> and begins them with
// nothing (its BOS is the same token, which GPT-2's training did not use).
func (GPT2) Specials() Specials { return Specials{BOS: -1, EOS: endOfText} }

// Encode tokenizes UTF-8 text; <|endoftext|> in the text is encoded as plain
// text, never as the special token. Long text is encoded in pieces of about
// gpt2Piece bytes on every core (encodePieces), equal to encoding it whole.
func (GPT2) Encode(text []byte) ([]int32, error) {
	return encodeGPT2(text, nil)
}

// encodeGPT2 is Encode, calling progress (when not nil) with the bytes
// encoded so far each time the next piece in order is done, the last call
// with the text's length.
func encodeGPT2(text []byte, progress func(done int)) ([]int32, error) {
	if at, bad := tokenizer.InvalidUTF8(text); bad {
		return nil, fmt.Errorf("the gpt2 tokenizer needs UTF-8 text: invalid byte 0x%02x at offset %d (convert the file to UTF-8, or use the byte tokenizer)", text[at], at)
	}
	return encodePieces(text, gpt2Piece, runtime.GOMAXPROCS(0), progress)
}

// gpt2Piece is the length of text encodePieces hands one codec call, at
// least: the codec keeps a string per token besides its id (24 bytes a token
// in all), so whole, 2 GiB of text would take about 12 GiB; in pieces it
// takes their int32 ids.
const gpt2Piece = 1 << 20

// encodePieces encodes text in pieces that end where GPT-2's pre-tokenizer
// ends a match whatever follows (gpt2Cut), on up to workers goroutines,
// joining their ids in order. Each piece is at least size bytes, or the rest of
// the text.
func encodePieces(text []byte, size, workers int, progress func(done int)) ([]int32, error) {
	var cuts []int // the end of each piece
	for at := 0; at < len(text); {
		end := gpt2Cut(text, at+size)
		cuts = append(cuts, end)
		at = end
	}
	return tokenizer.InPieces(text, cuts, workers, func() (func([]byte, int) ([]int32, error), func()) {
		return func(piece []byte, _ int) ([]int32, error) {
			got, _, err := gpt2().Encode(string(piece))
			if err != nil {
				return nil, fmt.Errorf("gpt2 tokenizer: %w", err)
			}
			ids := make([]int32, len(got))
			for j, id := range got {
				ids[j] = int32(id)
			}
			return ids, nil
		}, func() {}
	}, progress)
}

// gpt2Cut returns the first i ≥ from where text can be cut without changing
// its tokens, or len(text): just after a newline that stands between two
// printable ASCII characters other than space ("a\nb"), as for the
// tokenizer files' patterns (tokenizer.CutAfterNewline). GPT-2's pre-tokenizer
// ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)
// puts whitespace in a match with other characters only as one leading space,
// so a match ends before the newline and the newline is a match of its own;
// with the text cut after it, \s+(?!\S) at the piece's end takes that one
// newline just as \s+ does in the whole text. A run of two or more would
// differ there (whole, "\n\n" before a letter is two matches), so it is not
// cut.
func gpt2Cut(text []byte, from int) int { return tokenizer.CutAfterNewline(text, from) }

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
