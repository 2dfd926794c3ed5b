package tokenizer

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
)

// llama3Ranks is the number of ranks in Llama 3's tokenizer.model; its 256
// special tokens follow them.
const llama3Ranks = 128000

// llama3Specials are Llama 3's special tokens, ids 128000 on (Meta's
// tokenizer.py): begin and end of text, the chat headers, end of turn and the
// reserved ones.
func llama3Specials() []string {
	names := []string{"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
		"<|reserved_special_token_2|>", "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
		"<|reserved_special_token_4|>", "<|eot_id|>"}
	for i := 5; len(names) < 256; i++ {
		names = append(names, fmt.Sprintf("<|reserved_special_token_%d|>", i))
	}
	return names
}

// looksTiktoken reports whether b starts like a rank file: a base64 token, a
// space and a number.
func looksTiktoken(b []byte) bool {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	tok, rank, ok := bytes.Cut(bytes.TrimRight(line, "\r"), []byte(" "))
	if !ok || len(tok) == 0 {
		return false
	}
	if _, err := base64.StdEncoding.DecodeString(string(tok)); err != nil {
		return false
	}
	_, err := strconv.Atoi(string(rank))
	return err == nil
}

// parseTiktoken reads a tiktoken rank file with Llama 3's pattern. Its special
// tokens are tokenizer_config.json's added tokens at ids past the ranks when
// config is given, else Llama 3's when the file has Llama 3's 128,000 ranks.
func parseTiktoken(b []byte, config []byte) (*Tokenizer, error) {
	ranks := map[string]int32{}
	var toks []string
	lineNo := 0
	maxRank := bytes.Count(b, []byte("\n")) + 1 // ranks are dense: at most one a line
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte("\n"))
		lineNo++
		line = bytes.TrimRight(line, "\r")
		if len(line) == 0 {
			continue
		}
		tok, rs, ok := bytes.Cut(line, []byte(" "))
		raw, err := base64.StdEncoding.DecodeString(string(tok))
		if !ok || err != nil || len(raw) == 0 {
			return nil, fmt.Errorf("line %d: %q is not a base64 token, a space and a rank", lineNo, truncate(line))
		}
		rank, err := strconv.Atoi(string(rs))
		if err != nil || rank < 0 || rank >= maxVocab || rank > maxRank {
			return nil, fmt.Errorf("line %d: rank %q is not a number in 0..%d (the file's lines)", lineNo, truncate(rs), min(maxVocab-1, maxRank))
		}
		if _, dup := ranks[string(raw)]; dup {
			return nil, fmt.Errorf("line %d: token %q is ranked twice", lineNo, tok)
		}
		ranks[string(raw)] = int32(rank)
		for len(toks) <= rank {
			toks = append(toks, "")
		}
		if toks[rank] != "" {
			return nil, fmt.Errorf("line %d: rank %d is given twice", lineNo, rank)
		}
		toks[rank] = string(raw)
	}
	if len(ranks) == 0 {
		return nil, fmt.Errorf("the rank file is empty")
	}
	for c := range 256 {
		if _, ok := ranks[string([]byte{byte(c)})]; !ok {
			return nil, fmt.Errorf("the rank file lacks the single byte 0x%02x: every byte needs a rank", c)
		}
	}
	t := &Tokenizer{kind: Tiktoken, bos: -1, eos: -1}
	// Special tokens.
	var specials []addedTok
	if config != nil {
		var c tokenConfig
		if err := json.Unmarshal(config, &c); err != nil {
			return nil, fmt.Errorf("tokenizer_config.json: %w", err)
		}
		for k, v := range c.AddedTokens {
			id, err := strconv.Atoi(k)
			var a hfAdded
			if err != nil || json.Unmarshal(v, &a) != nil || id < len(toks) || id >= len(toks)+2*len(c.AddedTokens)+1024 || a.Content == "" {
				return nil, fmt.Errorf("tokenizer_config.json: added_tokens_decoder %q: a special token's id follows the rank file's %d ranks and names its content", k, len(toks))
			}
			specials = append(specials, addedTok{a.Content, int32(id)})
		}
		sort.Slice(specials, func(i, j int) bool { return specials[i].id < specials[j].id })
	} else if len(toks) == llama3Ranks {
		for i, n := range llama3Specials() {
			specials = append(specials, addedTok{n, int32(llama3Ranks + i)})
		}
	}
	size := len(toks)
	for _, s := range specials {
		size = max(size, int(s.id)+1)
	}
	t.vocabSize = size
	t.tokens = make([]string, size)
	copy(t.tokens, toks)
	t.special = make([]bool, size)
	byContent := map[string]int32{}
	for _, s := range specials {
		t.tokens[s.id], t.special[s.id] = s.content, true
		byContent[s.content] = s.id
	}
	t.added = newAddedVocab(specials)
	re, err := compilePattern(llama3Pattern)
	if err != nil {
		return nil, err
	}
	t.pretok = []preStep{&splitStep{re: re, fast: fastPatterns[llama3Pattern], behavior: isolated}}
	t.cutSafe = !t.added.hasNewline()
	t.model = &tiktokenBPE{ranks: ranks}
	t.decode = func(toks []string) string {
		n := 0
		for _, s := range toks {
			n += len(s)
		}
		b := make([]byte, 0, n)
		for _, s := range toks {
			b = append(b, s...)
		}
		return string(b)
	}
	lookup := func(s string) (int32, bool) { id, ok := byContent[s]; return id, ok }
	if t.bos, t.eos, err = specialsFromConfig(config, lookup); err != nil {
		return nil, err
	}
	if t.bos < 0 && config == nil {
		t.bos = firstKnown(lookup, "<|begin_of_text|>")
	}
	if t.eos < 0 && config == nil {
		t.eos = firstKnown(lookup, "<|end_of_text|>")
	}
	return t, nil
}

func truncate(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "…"
	}
	return string(b)
}

// RankedBPE is a rank file's tokenizer as a RankedBPE, to be written as
// Hugging Face files (HFFiles): its ranks, special tokens, Llama 3's pattern
// and BOS. ok is false for a tokenizer of another kind.
func (t *Tokenizer) RankedBPE() (b RankedBPE, ok bool) {
	if t.kind != Tiktoken {
		return RankedBPE{}, false
	}
	n := 0
	for id, s := range t.tokens {
		if !t.special[id] && s != "" {
			n = id + 1
		}
	}
	b = RankedBPE{Ranks: make([][]byte, n), Pattern: llama3Pattern, BOS: t.bos}
	for id, s := range t.tokens {
		switch {
		case t.special[id]:
			b.Specials = append(b.Specials, Special{Content: s, ID: int32(id)})
		case s != "":
			b.Ranks[id] = []byte(s)
		}
	}
	return b, true
}
