package data

import (
	"fmt"

	"github.com/shardline/shardline/trainer/tokenizer"
)

// The built-in tokenizers as Hugging Face tokenizer files (ckpt export writes
// them beside the weights): each encodes UTF-8 text to the same ids.

// RankedBPE is GPT-2's BPE as its ranks (r50k_base's ids), <|endoftext|>
// (50256) and GPT-2's pattern, to be written as GPT-2's files on the Hugging
// Face Hub are (tokenizer.RankedBPE.HFFiles). The files split a
// <|endoftext|> written in the text out as the special token, as Hugging
// Face's GPT-2 tokenizer does; Encode reads it as text.
func (GPT2) RankedBPE() (tokenizer.RankedBPE, error) {
	ranks := make([][]byte, endOfText)
	id := make([]uint, 1)
	for r := range ranks {
		id[0] = uint(r)
		s, err := gpt2().Decode(id)
		if err != nil {
			return tokenizer.RankedBPE{}, fmt.Errorf("gpt2 token %d: %w", r, err)
		}
		ranks[r] = []byte(s)
	}
	return tokenizer.RankedBPE{Ranks: ranks, Specials: []tokenizer.Special{{Content: "<|endoftext|>", ID: endOfText}}, Pattern: tokenizer.GPT2Pattern, BOS: -1}, nil
}

// RankedBPE is the byte tokenizer as a byte-level BPE: the 256 bytes (token =
// byte value), no merges, no pre-tokenizer.
func (Byte) RankedBPE() (tokenizer.RankedBPE, error) {
	ranks := make([][]byte, 256)
	for b := range ranks {
		ranks[b] = []byte{byte(b)}
	}
	return tokenizer.RankedBPE{Ranks: ranks, BOS: -1}, nil
}
