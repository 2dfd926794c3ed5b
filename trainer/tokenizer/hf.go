package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// hfFile is the part of a Hugging Face tokenizer.json this package reads.
type hfFile struct {
	AddedTokens   []hfAdded       `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         hfModel         `json:"model"`
}

type hfAdded struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	Lstrip     bool   `json:"lstrip"`
	Rstrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type hfModel struct {
	Type         string           `json:"type"`
	Dropout      *float64         `json:"dropout"`
	UnkToken     *string          `json:"unk_token"`
	Prefix       *string          `json:"continuing_subword_prefix"`
	Suffix       *string          `json:"end_of_word_suffix"`
	FuseUnk      bool             `json:"fuse_unk"`
	ByteFallback bool             `json:"byte_fallback"`
	IgnoreMerges bool             `json:"ignore_merges"`
	VocabRaw     json.RawMessage  `json:"vocab"`
	Vocab        map[string]int32 `json:"-"`
	Merges       json.RawMessage  `json:"merges"`
}

// hfPart is a normalizer, pre-tokenizer, post-processor or decoder: its type
// and the fields any of them has.
type hfPart struct {
	Type           string            `json:"type"`
	Normalizers    []json.RawMessage `json:"normalizers"`
	PreTokenizers  []json.RawMessage `json:"pretokenizers"`
	Processors     []json.RawMessage `json:"processors"`
	Decoders       []json.RawMessage `json:"decoders"`
	Pattern        hfPattern         `json:"pattern"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	AddPrefixSpace *bool             `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
	Individual     bool              `json:"individual_digits"`
	Prepend        string            `json:"prepend"`
	Content        json.RawMessage   `json:"content"`
	Start          int               `json:"start"`
	Stop           int               `json:"stop"`
	Single         []json.RawMessage `json:"single"`
	Replacement    string            `json:"replacement"`
	PrependScheme  string            `json:"prepend_scheme"`
	Split          *bool             `json:"split"`
}

// replacement is a Replace part's String pattern and content (a normalizer's
// or a decoder's); a Regex pattern is refused.
func (p *hfPart) replacement() (from, content string, err error) {
	if p.Pattern.String == nil {
		return "", "", fmt.Errorf("Replace with a Regex pattern is not supported (a String pattern is)")
	}
	if err := json.Unmarshal(p.Content, &content); err != nil {
		return "", "", fmt.Errorf("Replace content: %w", err)
	}
	return *p.Pattern.String, content, nil
}

type hfPattern struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

// parseHF reads a tokenizer.json; config is tokenizer_config.json's bytes, or
// nil.
func parseHF(b []byte, config []byte) (*Tokenizer, error) {
	var f hfFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("not a Hugging Face tokenizer.json: %w", err)
	}
	t := &Tokenizer{kind: HuggingFace, bos: -1, eos: -1}
	m := f.Model
	if m.Type != "BPE" && !(m.Type == "" && m.Merges != nil) {
		return nil, fmt.Errorf("model.type %q: shardline reads BPE models only (Llama 3, Qwen2/3, GPT-NeoX, Llama 2, Mistral); WordPiece, Unigram and WordLevel are not supported", m.Type)
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return nil, fmt.Errorf("model.dropout %g: BPE dropout makes encoding random; set it to null for training data", *m.Dropout)
	}
	if m.Prefix != nil && *m.Prefix != "" || m.Suffix != nil && *m.Suffix != "" {
		return nil, fmt.Errorf("model.continuing_subword_prefix / end_of_word_suffix are set: shardline's BPE does not implement them (Llama-, Qwen- and GPT-NeoX-style tokenizers leave them null)")
	}
	if err := json.Unmarshal(m.VocabRaw, &m.Vocab); err != nil {
		return nil, fmt.Errorf("model.vocab: a BPE vocabulary maps tokens to ids: %w", err)
	}
	if len(m.Vocab) == 0 {
		return nil, fmt.Errorf("model.vocab is empty")
	}
	f.Model.Vocab = m.Vocab

	// Pre-tokenizer first: whether it is byte-level decides how the vocabulary is keyed.
	steps, byteLevel, cutSafe, err := parsePreTokenizer(f.PreTokenizer)
	if err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	t.pretok = steps
	if t.normalize, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}

	// The vocabulary and the added tokens.
	size := 0
	for tok, id := range m.Vocab {
		if id < 0 || id >= maxVocab {
			return nil, fmt.Errorf("model.vocab: token %q has id %d, outside 0..%d", tok, id, maxVocab-1)
		}
		size = max(size, int(id)+1)
	}
	for i, a := range f.AddedTokens {
		if a.ID < 0 || a.ID >= maxVocab || a.Content == "" {
			return nil, fmt.Errorf("added_tokens[%d]: id %d, content %q: ids run 0..%d and the content is not empty", i, a.ID, a.Content, maxVocab-1)
		}
		if a.SingleWord || a.Lstrip || a.Rstrip {
			return nil, fmt.Errorf("added_tokens[%d] %q: single_word, lstrip and rstrip are not implemented; set them false", i, a.Content)
		}
		size = max(size, int(a.ID)+1)
	}
	if limit := 2*(len(m.Vocab)+len(f.AddedTokens)) + 1024; size > limit {
		return nil, fmt.Errorf("token ids run to %d for %d tokens: a vocabulary with that many gaps is refused (ids above %d)", size-1, len(m.Vocab)+len(f.AddedTokens), limit-1)
	}
	t.vocabSize = size
	t.tokens = make([]string, size)
	t.special = make([]bool, size)
	for tok, id := range m.Vocab {
		if t.tokens[id] != "" {
			return nil, fmt.Errorf("model.vocab: id %d is given to both %q and %q", id, t.tokens[id], tok)
		}
		t.tokens[id] = tok
	}
	var raw, normed []addedTok
	for _, a := range f.AddedTokens {
		t.tokens[a.ID] = a.Content
		t.special[a.ID] = a.Special
		if a.Normalized && !a.Special && t.normalize != nil {
			normed = append(normed, addedTok{t.normalize(a.Content), a.ID})
		} else if a.Normalized && !a.Special {
			normed = append(normed, addedTok{a.Content, a.ID})
		} else {
			raw = append(raw, addedTok{a.Content, a.ID})
		}
	}
	t.added, t.normAdded = newAddedVocab(raw), newAddedVocab(normed)
	t.cutSafe = cutSafe && !t.added.hasNewline() && !t.normAdded.hasNewline()

	// The model.
	bm := &bpe{byteLevel: byteLevel, vocab: make(map[string]int32, len(m.Vocab)), unk: -1,
		fuseUnk: m.FuseUnk, byteFallback: m.ByteFallback, ignoreMerges: m.IgnoreMerges}
	for i := range bm.byteIDs {
		bm.byteIDs[i], bm.fallbackIDs[i] = -1, -1
	}
	for tok, id := range m.Vocab {
		key := tok
		if byteLevel {
			b, ok := fromByteLevel(tok)
			if !ok {
				return nil, fmt.Errorf("model.vocab: token %q (id %d) is not in the byte-level alphabet the ByteLevel pre-tokenizer uses", tok, id)
			}
			key = string(b)
			if len(b) == 1 {
				bm.byteIDs[b[0]] = id
			}
		}
		bm.vocab[key] = id
		if v, ok := fallbackByte(tok); ok {
			bm.fallbackIDs[v] = id
		}
	}
	if m.UnkToken != nil {
		id, ok := m.Vocab[*m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model.unk_token %q is not in model.vocab", *m.UnkToken)
		}
		bm.unk = id
	}
	pairs, err := parseMerges(m.Merges)
	if err != nil {
		return nil, err
	}
	bm.merges = make(map[uint64]merge, len(pairs))
	for rank, pr := range pairs {
		a, b := pr[0], pr[1]
		ia, oka := m.Vocab[a]
		ib, okb := m.Vocab[b]
		ic, okc := m.Vocab[a+b]
		if !oka || !okb || !okc {
			return nil, fmt.Errorf("model.merges[%d] (%q, %q): %q, %q and %q must all be in model.vocab", rank, a, b, a, b, a+b)
		}
		if _, dup := bm.merges[pairKey(ia, ib)]; !dup {
			bm.merges[pairKey(ia, ib)] = merge{rank: int32(rank), id: ic}
		}
	}
	t.model = bm

	if t.decode, err = parseDecoder(f.Decoder); err != nil {
		return nil, fmt.Errorf("decoder: %w", err)
	}
	if err := t.findSpecials(f, config); err != nil {
		return nil, err
	}
	return t, nil
}

// parseMerges reads model.merges: "a b" strings or [a, b] pairs.
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var strs []string
	if err := json.Unmarshal(raw, &strs); err == nil {
		pairs := make([][2]string, len(strs))
		for i, s := range strs {
			a, b, ok := strings.Cut(s, " ")
			if !ok || strings.Contains(b, " ") {
				return nil, fmt.Errorf("model.merges[%d] %q: a merge is two tokens separated by one space", i, s)
			}
			pairs[i] = [2]string{a, b}
		}
		return pairs, nil
	}
	var lists [][]string
	if err := json.Unmarshal(raw, &lists); err != nil {
		return nil, fmt.Errorf("model.merges: a list of \"a b\" strings or of [\"a\", \"b\"] pairs: %w", err)
	}
	pairs := make([][2]string, len(lists))
	for i, l := range lists {
		if len(l) != 2 {
			return nil, fmt.Errorf("model.merges[%d]: a pair holds 2 tokens, not %d", i, len(l))
		}
		pairs[i] = [2]string{l[0], l[1]}
	}
	return pairs, nil
}

// maxVocab bounds token ids (Llama 3 has 128,256 tokens, Gemma 262,144).
const maxVocab = 1 << 24

// parsePreTokenizer builds the pre-tokenizer steps. byteLevel is true when a
// ByteLevel pre-tokenizer (last) maps bytes to characters; cutSafe when every
// split is one that CutAfterNewline's reasoning covers.
func parsePreTokenizer(raw json.RawMessage) (steps []preStep, byteLevel, cutSafe bool, err error) {
	cutSafe = true
	var add func(raw json.RawMessage) error
	add = func(raw json.RawMessage) error {
		if isNull(raw) {
			return nil
		}
		if byteLevel {
			return fmt.Errorf("a pre-tokenizer after ByteLevel would see its byte characters; shardline takes ByteLevel last")
		}
		var p hfPart
		if err := json.Unmarshal(raw, &p); err != nil {
			return err
		}
		switch p.Type {
		case "Sequence":
			for _, q := range p.PreTokenizers {
				if err := add(q); err != nil {
					return err
				}
			}
		case "Split":
			s := &splitStep{invert: p.Invert}
			var ok bool
			if s.behavior, ok = behaviors[p.Behavior]; !ok {
				return fmt.Errorf("Split behavior %q: one of Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous", p.Behavior)
			}
			switch {
			case p.Pattern.Regex != nil:
				re, err := compilePattern(*p.Pattern.Regex)
				if err != nil {
					return fmt.Errorf("Split pattern %q: %w", *p.Pattern.Regex, err)
				}
				s.re, s.fast = re, fastPatterns[*p.Pattern.Regex]
				cutSafe = cutSafe && s.behavior == isolated && !s.invert && knownPatterns[*p.Pattern.Regex]
			case p.Pattern.String != nil:
				s.literal = *p.Pattern.String
				cutSafe = false
			default:
				return fmt.Errorf("Split pattern: neither String nor Regex")
			}
			steps = append(steps, s)
		case "ByteLevel":
			b := &byteLevelStep{addPrefixSpace: p.AddPrefixSpace != nil && *p.AddPrefixSpace}
			if p.UseRegex == nil || *p.UseRegex {
				re, err := compilePattern(gpt2Pattern)
				if err != nil {
					return err
				}
				b.re = &splitStep{re: re, fast: gpt2Next, behavior: isolated}
			}
			// add_prefix_space is per piece of text: cutting would add spaces.
			cutSafe = cutSafe && !b.addPrefixSpace
			steps = append(steps, b)
			byteLevel = true
		case "Digits":
			steps = append(steps, &digitsStep{individual: p.Individual})
		default:
			return fmt.Errorf("pre-tokenizer type %q is not supported (Sequence, Split, ByteLevel and Digits are)", p.Type)
		}
		return nil
	}
	if err := add(raw); err != nil {
		return nil, false, false, err
	}
	if len(steps) == 0 {
		cutSafe = false // no pre-tokenizer: the whole text is one word
	}
	return steps, byteLevel, cutSafe, nil
}

// knownPatterns are the split patterns CutAfterNewline's reasoning covers: GPT-2's,
// Llama 3's, Qwen2's and cl100k's.
var knownPatterns = map[string]bool{
	gpt2Pattern:   true,
	llama3Pattern: true,
	qwen2Pattern:  true,
	cl100kPattern: true,
}

const (
	// llama3Pattern is Llama 3's pre-tokenizer (Meta's tokenizer.py).
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// qwen2Pattern is Qwen2's and Qwen3's: single digits.
	qwen2Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// cl100kPattern is tiktoken's cl100k_base.
	cl100kPattern = `'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+`
)

// parseNormalizer builds the normalizer: NFC, NFD, NFKC, NFKD, Prepend,
// Replace (a literal string) and Sequence of them; nil for none.
func parseNormalizer(raw json.RawMessage) (func(string) string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var p hfPart
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, err
	}
	switch p.Type {
	case "NFC":
		return norm.NFC.String, nil
	case "NFD":
		return norm.NFD.String, nil
	case "NFKC":
		return norm.NFKC.String, nil
	case "NFKD":
		return norm.NFKD.String, nil
	case "Prepend":
		pre := p.Prepend
		return func(s string) string {
			if s == "" {
				return s
			}
			return pre + s
		}, nil
	case "Replace":
		from, content, err := p.replacement()
		if err != nil {
			return nil, err
		}
		return func(s string) string { return strings.ReplaceAll(s, from, content) }, nil
	case "Sequence":
		var fs []func(string) string
		for _, q := range p.Normalizers {
			f, err := parseNormalizer(q)
			if err != nil {
				return nil, err
			}
			if f != nil {
				fs = append(fs, f)
			}
		}
		return func(s string) string {
			for _, f := range fs {
				s = f(s)
			}
			return s
		}, nil
	}
	return nil, fmt.Errorf("normalizer type %q is not supported (NFC, NFD, NFKC, NFKD, Prepend, Replace and Sequence are)", p.Type)
}

func isNull(raw json.RawMessage) bool {
	r := bytes.TrimSpace(raw)
	return len(r) == 0 || string(r) == "null"
}

// findSpecials sets BOS and EOS: from tokenizer_config.json's bos_token and
// eos_token when given; else from the post-processor's template (the special
// token before $A is BOS, after it EOS); else from the usual names of added
// tokens (<|begin_of_text|>, <s>, <bos>; <|end_of_text|>, <|endoftext|>, </s>,
// <eos>).
func (t *Tokenizer) findSpecials(f hfFile, config []byte) error {
	added := map[string]int32{}
	for _, a := range f.AddedTokens {
		added[a.Content] = a.ID
	}
	byContent := func(s string) (int32, bool) {
		if id, ok := added[s]; ok {
			return id, true
		}
		id, ok := f.Model.Vocab[s]
		return id, ok
	}
	var err error
	if t.bos, t.eos, err = specialsFromConfig(config, byContent); err != nil {
		return err
	}
	if (t.bos < 0 || t.eos < 0) && !isNull(f.PostProcessor) {
		bos, eos := templateSpecials(f.PostProcessor, byContent)
		if t.bos < 0 {
			t.bos = bos
		}
		if t.eos < 0 {
			t.eos = eos
		}
	}
	if t.bos < 0 && config == nil {
		t.bos = firstKnown(byContent, "<|begin_of_text|>", "<s>", "<bos>")
	}
	if t.eos < 0 && config == nil {
		t.eos = firstKnown(byContent, "<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>")
	}
	return nil
}

func firstKnown(byContent func(string) (int32, bool), names ...string) int32 {
	for _, n := range names {
		if id, ok := byContent(n); ok {
			return id
		}
	}
	return -1
}

// tokenConfig is the part of tokenizer_config.json read here.
type tokenConfig struct {
	BOS         json.RawMessage            `json:"bos_token"`
	EOS         json.RawMessage            `json:"eos_token"`
	AddedTokens map[string]json.RawMessage `json:"added_tokens_decoder"`
}

// configToken reads bos_token or eos_token: a string, {"content": ...} or null.
func configToken(raw json.RawMessage) (string, bool) {
	if isNull(raw) {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var o struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &o) == nil && o.Content != "" {
		return o.Content, true
	}
	return "", false
}

func specialsFromConfig(config []byte, byContent func(string) (int32, bool)) (bos, eos int32, err error) {
	bos, eos = -1, -1
	if config == nil {
		return
	}
	var c tokenConfig
	if err := json.Unmarshal(config, &c); err != nil {
		return -1, -1, fmt.Errorf("tokenizer_config.json: %w", err)
	}
	for _, s := range []struct {
		key string
		raw json.RawMessage
		dst *int32
	}{{"bos_token", c.BOS, &bos}, {"eos_token", c.EOS, &eos}} {
		name, ok := configToken(s.raw)
		if !ok {
			continue
		}
		id, known := byContent(name)
		if !known {
			return -1, -1, fmt.Errorf("tokenizer_config.json: %s %q is not a token of the tokenizer", s.key, name)
		}
		*s.dst = id
	}
	return bos, eos, nil
}

// templateSpecials reads a TemplateProcessing post-processor (alone or in a
// Sequence): the special token before $A in "single" is BOS, one after it EOS.
func templateSpecials(raw json.RawMessage, byContent func(string) (int32, bool)) (bos, eos int32) {
	bos, eos = -1, -1
	var p hfPart
	if json.Unmarshal(raw, &p) != nil {
		return
	}
	switch p.Type {
	case "Sequence":
		for _, q := range p.Processors {
			b, e := templateSpecials(q, byContent)
			if bos < 0 {
				bos = b
			}
			if eos < 0 {
				eos = e
			}
		}
	case "TemplateProcessing":
		seenA := false
		for _, item := range p.Single {
			var it struct {
				Sequence *struct{} `json:"Sequence"`
				Special  *struct {
					ID string `json:"id"`
				} `json:"SpecialToken"`
			}
			if json.Unmarshal(item, &it) != nil {
				continue
			}
			if it.Sequence != nil {
				seenA = true
				continue
			}
			if it.Special == nil {
				continue
			}
			id, ok := byContent(it.Special.ID)
			if !ok {
				continue
			}
			if !seenA && bos < 0 {
				bos = id
			} else if seenA && eos < 0 {
				eos = id
			}
		}
	}
	return
}
