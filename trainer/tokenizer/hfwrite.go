package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// Special is an added special token of a tokenizer written as Hugging Face
// files: its text and its id.
type Special struct {
	Content string
	ID      int32
}

// RankedBPE is a byte-level BPE as tiktoken defines one: ranked byte strings
// (a token's rank is its id), a pre-tokenizer pattern and special tokens. A
// word that is a token is that token; otherwise its bytes are merged, the
// adjacent pair whose joined bytes have the lowest rank first.
type RankedBPE struct {
	// Ranks[r] is the bytes of the token of rank r; nil where no token has
	// that rank. Every single byte must have a rank.
	Ranks [][]byte
	// Specials are split out of the text before anything else; their ids
	// follow the ranks.
	Specials []Special
	// Pattern is the pre-tokenizer's regular expression: GPT2Pattern is
	// written as ByteLevel's own (use_regex, as GPT-2's files on the Hub),
	// another as a Split before ByteLevel (as Llama 3's), "" as none (the
	// text is one word).
	Pattern string
	// BOS, where >= 0, is prepended by the post-processor (transformers'
	// tokenizer(text) begins with it, as Llama 3's does).
	BOS int32
}

// GPT2Pattern is GPT-2's pre-tokenizer (Hugging Face's ByteLevel applies it
// when use_regex is true).
const GPT2Pattern = gpt2Pattern

// Llama3Pattern is Llama 3's pre-tokenizer, which a tiktoken rank file is read
// with.
const Llama3Pattern = llama3Pattern

// HFFiles are a tokenizer written as Hugging Face files.
type HFFiles struct {
	// TokenizerJSON is tokenizer.json, which transformers' fast tokenizers
	// (PreTrainedTokenizerFast, GPT2TokenizerFast...) and the tokenizers
	// library read.
	TokenizerJSON []byte
	// VocabJSON (vocab.json, the vocabulary with the special tokens) and
	// MergesTXT (merges.txt: a "#version: 0.2" line, then a merge a line) are
	// the byte-level BPE as GPT-2's slow tokenizer reads it.
	VocabJSON, MergesTXT []byte
	// Merges is the number of merges written; Unreachable the tokens no merge
	// makes (a word that is the whole token still becomes it:
	// ignore_merges, as tiktoken does).
	Merges      int
	Unreachable []int32
}

// HFFiles writes b as a Hugging Face byte-level BPE: the vocabulary is the
// ranks in GPT-2's byte-to-unicode alphabet, and each token's merge is the
// pair its bytes end as when byte-pair encoded with the tokens ranked below
// it (transformers' TikTokenConverter does the same), in rank order; a token
// whose bytes end as more than two parts gets none. With ignore_merges set
// (a word in the vocabulary is its token), the merges give tiktoken's ids: a
// pair merges in tiktoken only where the bytes it spans have become exactly
// the two parts they end as alone, which is the one merge written for it.
func (b RankedBPE) HFFiles() (*HFFiles, error) {
	ranks := make(map[string]int32, len(b.Ranks))
	for r, tok := range b.Ranks {
		if tok == nil {
			continue
		}
		if len(tok) == 0 {
			return nil, fmt.Errorf("rank %d is an empty token", r)
		}
		if prev, dup := ranks[string(tok)]; dup {
			return nil, fmt.Errorf("token %q has ranks %d and %d", tok, prev, r)
		}
		ranks[string(tok)] = int32(r)
	}
	for c := range 256 {
		if _, ok := ranks[string([]byte{byte(c)})]; !ok {
			return nil, fmt.Errorf("the single byte 0x%02x has no rank: a byte-level BPE needs all 256", c)
		}
	}
	vocab := make([]vocabEntry, 0, len(ranks)+len(b.Specials))
	merges := []string{}
	var unreachable []int32
	for r, tok := range b.Ranks {
		if tok == nil {
			continue
		}
		vocab = append(vocab, vocabEntry{toByteLevel(tok), int32(r)})
		if len(tok) == 1 {
			continue
		}
		x, y, ok := lastMerge(tok, int32(r), ranks)
		if !ok {
			unreachable = append(unreachable, int32(r))
			continue
		}
		merges = append(merges, toByteLevel(x)+" "+toByteLevel(y))
	}
	keys := make(map[string]bool, len(vocab)) // the vocabulary as written
	for _, v := range vocab {
		keys[v.tok] = true
	}
	added, err := addedTokens(b.Specials, len(b.Ranks), func(s string) bool { _, in := ranks[s]; return in || keys[s] })
	if err != nil {
		return nil, err
	}
	var bosName string
	if b.BOS >= 0 {
		for _, s := range b.Specials {
			if s.ID == b.BOS {
				bosName = s.Content
			}
		}
		if bosName == "" {
			return nil, fmt.Errorf("BOS %d is not a special token", b.BOS)
		}
	}
	for _, s := range b.Specials {
		vocab = append(vocab, vocabEntry{s.Content, s.ID})
	}

	byteLevel := func(useRegex bool) hfOutPart {
		return hfOutPart{Type: "ByteLevel", AddPrefixSpace: ptr(false), TrimOffsets: ptr(true), UseRegex: ptr(useRegex)}
	}
	var pre hfOutPart
	switch b.Pattern {
	case gpt2Pattern:
		pre = byteLevel(true)
	case "":
		pre = byteLevel(false)
	default:
		if _, err := compilePattern(b.Pattern); err != nil {
			return nil, fmt.Errorf("pattern %q: %w", b.Pattern, err)
		}
		pre = hfOutPart{Type: "Sequence", PreTokenizers: []hfOutPart{
			{Type: "Split", Pattern: &hfOutRegex{Regex: b.Pattern}, Behavior: "Isolated", Invert: ptr(false)},
			byteLevel(false),
		}}
	}
	post := hfOutPart{Type: "ByteLevel", AddPrefixSpace: ptr(true), TrimOffsets: ptr(false), UseRegex: ptr(true)}
	if bosName != "" {
		post = hfOutPart{Type: "Sequence", Processors: []hfOutPart{post, bosTemplate(bosName, b.BOS)}}
	}
	tj, err := writeHF(hfOut{
		AddedTokens:   added,
		PreTokenizer:  &pre,
		PostProcessor: &post,
		Decoder:       &hfOutPart{Type: "ByteLevel", AddPrefixSpace: ptr(true), TrimOffsets: ptr(true), UseRegex: ptr(true)},
		Model:         hfOutModel{Type: "BPE", IgnoreMerges: true, Vocab: vocab[:len(ranks)], Merges: merges},
	})
	if err != nil {
		return nil, err
	}
	vj, err := marshalNoEscape(orderedVocab(vocab))
	if err != nil {
		return nil, err
	}
	var mt strings.Builder
	mt.WriteString("#version: 0.2\n")
	for _, m := range merges {
		mt.WriteString(m)
		mt.WriteByte('\n')
	}
	return &HFFiles{TokenizerJSON: tj, VocabJSON: vj, MergesTXT: []byte(mt.String()), Merges: len(merges), Unreachable: unreachable}, nil
}

// CharHF writes a character-level tokenizer (token i is chars[i]) as a Hugging
// Face tokenizer.json: a BPE model of the characters without merges, no
// pre-tokenizer, and the Fuse decoder (joining the characters). A character
// outside the vocabulary is dropped, as Hugging Face's BPE drops one when it
// has no unk_token.
func CharHF(chars []rune) ([]byte, error) {
	if len(chars) == 0 {
		return nil, fmt.Errorf("the character vocabulary is empty")
	}
	vocab := make([]vocabEntry, len(chars))
	seen := make(map[rune]bool, len(chars))
	for i, r := range chars {
		if seen[r] || !utf8.ValidRune(r) {
			return nil, fmt.Errorf("character %q (index %d) is repeated or not a valid code point", r, i)
		}
		seen[r] = true
		vocab[i] = vocabEntry{string(r), int32(i)}
	}
	return writeHF(hfOut{
		AddedTokens: []hfAdded{},
		Decoder:     &hfOutPart{Type: "Fuse"},
		Model:       hfOutModel{Type: "BPE", Vocab: vocab, Merges: []string{}},
	})
}

// lastMerge byte-pair encodes tok with the tokens ranked below rank (the
// lowest-ranked adjacent pair first, the leftmost of equals) and returns the
// two parts it ends as; ok is false when it ends as more.
func lastMerge(tok []byte, rank int32, ranks map[string]int32) (x, y []byte, ok bool) {
	const none = math.MaxInt32
	var sbuf [65]int
	var pbuf [64]int32
	starts := sbuf[:0] // part i is tok[starts[i]:starts[i+1]]
	for i := 0; i <= len(tok); i++ {
		starts = append(starts, i)
	}
	pair := func(i int) int32 { // the rank below rank of parts i and i+1 joined
		if r, in := ranks[string(tok[starts[i]:starts[i+2]])]; in && r < rank {
			return r
		}
		return none
	}
	pairs := pbuf[:0]
	for i := 0; i+2 < len(starts); i++ {
		pairs = append(pairs, pair(i))
	}
	for len(starts) > 3 {
		best := -1
		for i, r := range pairs {
			if r != none && (best < 0 || r < pairs[best]) {
				best = i
			}
		}
		if best < 0 {
			return nil, nil, false
		}
		starts = append(starts[:best+1], starts[best+2:]...)
		pairs = append(pairs[:best], pairs[best+1:]...)
		if best < len(pairs) {
			pairs[best] = pair(best)
		}
		if best > 0 {
			pairs[best-1] = pair(best - 1)
		}
	}
	return tok[:starts[1]], tok[starts[1]:], len(starts) == 3
}

// addedTokens are the special tokens as tokenizer.json's added_tokens, in id
// order; their ids must follow the ranks and their contents be no token of
// the vocabulary (its bytes, or its key in vocab.json).
func addedTokens(specials []Special, ranks int, inVocab func(string) bool) ([]hfAdded, error) {
	out := make([]hfAdded, 0, len(specials))
	ids := map[int32]bool{}
	contents := map[string]bool{}
	for _, s := range specials {
		switch {
		case s.Content == "":
			return nil, fmt.Errorf("special token %d has no content", s.ID)
		case s.ID < int32(ranks) || s.ID >= maxVocab:
			return nil, fmt.Errorf("special token %q has id %d: special ids run from %d (past the ranks) to %d", s.Content, s.ID, ranks, maxVocab-1)
		case ids[s.ID] || contents[s.Content]:
			return nil, fmt.Errorf("special token %q (id %d) is given twice", s.Content, s.ID)
		case inVocab(s.Content):
			return nil, fmt.Errorf("special token %q is also a ranked token (its bytes, or its key in vocab.json)", s.Content)
		}
		ids[s.ID], contents[s.Content] = true, true
		out = append(out, hfAdded{ID: s.ID, Content: s.Content, Special: true})
	}
	for i := 1; i < len(out); i++ { // insertion sort by id: a few hundred at most
		for j := i; j > 0 && out[j].ID < out[j-1].ID; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out, nil
}

// bosTemplate is the TemplateProcessing post-processor that begins every
// sequence with BOS (as Llama 3's tokenizer.json).
func bosTemplate(name string, id int32) hfOutPart {
	type item map[string]any
	tok := func(typeID int) item { return item{"SpecialToken": item{"id": name, "type_id": typeID}} }
	seq := func(s string, typeID int) item { return item{"Sequence": item{"id": s, "type_id": typeID}} }
	return hfOutPart{
		Type:          "TemplateProcessing",
		Single:        []any{tok(0), seq("A", 0)},
		Pair:          []any{tok(0), seq("A", 0), tok(1), seq("B", 1)},
		SpecialTokens: map[string]any{name: item{"id": name, "ids": []int32{id}, "tokens": []string{name}}},
	}
}

// hfOut is a tokenizer.json in the order the tokenizers library writes its
// keys.
type hfOut struct {
	Version       string     `json:"version"`
	Truncation    *struct{}  `json:"truncation"`
	Padding       *struct{}  `json:"padding"`
	AddedTokens   []hfAdded  `json:"added_tokens"`
	Normalizer    *struct{}  `json:"normalizer"`
	PreTokenizer  *hfOutPart `json:"pre_tokenizer"`
	PostProcessor *hfOutPart `json:"post_processor"`
	Decoder       *hfOutPart `json:"decoder"`
	Model         hfOutModel `json:"model"`
}

// hfOutPart is a pre-tokenizer, post-processor or decoder as written.
type hfOutPart struct {
	Type           string         `json:"type"`
	PreTokenizers  []hfOutPart    `json:"pretokenizers,omitempty"`
	Processors     []hfOutPart    `json:"processors,omitempty"`
	Pattern        *hfOutRegex    `json:"pattern,omitempty"`
	Behavior       string         `json:"behavior,omitempty"`
	Invert         *bool          `json:"invert,omitempty"`
	AddPrefixSpace *bool          `json:"add_prefix_space,omitempty"`
	TrimOffsets    *bool          `json:"trim_offsets,omitempty"`
	UseRegex       *bool          `json:"use_regex,omitempty"`
	Single         []any          `json:"single,omitempty"`
	Pair           []any          `json:"pair,omitempty"`
	SpecialTokens  map[string]any `json:"special_tokens,omitempty"`
}

// hfOutRegex is a Split pattern that is a regular expression.
type hfOutRegex struct {
	Regex string `json:"Regex"`
}

type hfOutModel struct {
	Type         string       `json:"type"`
	Dropout      *float64     `json:"dropout"`
	UnkToken     *string      `json:"unk_token"`
	Prefix       *string      `json:"continuing_subword_prefix"`
	Suffix       *string      `json:"end_of_word_suffix"`
	FuseUnk      bool         `json:"fuse_unk"`
	ByteFallback bool         `json:"byte_fallback"`
	IgnoreMerges bool         `json:"ignore_merges"`
	Vocab        orderedVocab `json:"vocab"`
	Merges       []string     `json:"merges"`
}

type vocabEntry struct {
	tok string
	id  int32
}

// orderedVocab marshals as a JSON object in its order (by id, as the
// tokenizers library writes a vocabulary).
type orderedVocab []vocabEntry

func (v orderedVocab) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, e := range v {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := marshalNoEscape(e.tok)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		fmt.Fprintf(&b, ":%d", e.id)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// marshalNoEscape is json.Marshal without HTML escaping (<|endoftext|> stays
// as it is written), no trailing newline.
func marshalNoEscape(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

func writeHF(f hfOut) ([]byte, error) {
	f.Version = "1.0"
	b, err := marshalNoEscape(f)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func ptr[T any](v T) *T { return &v }

// CharHFVocab returns the characters of a tokenizer.json that CharHF wrote
// (the same bytes); ok is false for any other file.
func CharHFVocab(b []byte) (chars []rune, ok bool) {
	var f struct {
		Decoder *hfOutPart `json:"decoder"`
		Model   struct {
			Vocab map[string]int32 `json:"vocab"`
		} `json:"model"`
	}
	if json.Unmarshal(b, &f) != nil || f.Decoder == nil || f.Decoder.Type != "Fuse" || len(f.Model.Vocab) == 0 || len(f.Model.Vocab) > maxVocab {
		return nil, false
	}
	chars = make([]rune, len(f.Model.Vocab))
	for s, id := range f.Model.Vocab {
		r, n := utf8.DecodeRuneInString(s)
		if n != len(s) || id < 0 || int(id) >= len(chars) {
			return nil, false
		}
		chars[id] = r
	}
	want, err := CharHF(chars)
	if err != nil || !bytes.Equal(want, b) {
		return nil, false
	}
	return chars, true
}
