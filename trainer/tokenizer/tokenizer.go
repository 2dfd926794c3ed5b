package tokenizer

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// Kind names a tokenizer file's format.
type Kind string

const (
	// HuggingFace is a Hugging Face tokenizer.json.
	HuggingFace Kind = "tokenizer.json"
	// Tiktoken is a tiktoken rank file (Llama 3's tokenizer.model).
	Tiktoken Kind = "tiktoken"
	// SentencePiece is a SentencePiece ModelProto (.model).
	SentencePiece Kind = "sentencepiece"
)

// Tokenizer encodes text to token ids and back as the file it was read from
// says. It is safe for concurrent use.
type Tokenizer struct {
	kind        Kind
	fingerprint string // sha256 of the source files, hex
	vocabSize   int
	bos, eos    int32 // -1 where none

	added     *addedVocab         // split out of the raw text
	normAdded *addedVocab         // split out of normalized text (may be nil)
	normalize func(string) string // nil: none
	pretok    []preStep           // applied in order; nil: the whole text is one word
	model     wordModel
	cutSafe   bool // text may be cut at cut without changing its tokens
	// cut is where text may be cut (CutAfterNewline where nil); normalizeRest
	// normalizes the pieces after the first (normalize where nil).
	cut           func(text []byte, from int) int
	normalizeRest func(string) string

	tokens  []string // id → its string as the file writes it ("" where none)
	special []bool   // id is an added special token
	decode  func([]string) string

	sources []Source
	scratch sync.Pool // *scratch
}

// Source is a file a tokenizer was read from: its name as it should be stored
// beside prepared data (tokenizer.json, tokenizer.model,
// tokenizer_config.json) and its bytes.
type Source struct {
	Name string
	Data []byte
}

// wordModel maps one pre-tokenized word (normalized UTF-8) to token ids,
// appending them to out.
type wordModel interface {
	encodeWord(word string, out []int32) ([]int32, error)
}

// scratch is one encoder's reusable state: its word cache and buffers.
type scratch struct {
	cache      map[string][]int32
	words, tmp []string
}

// maxCache bounds a word cache's entries (it is emptied when full); maxCachedWord
// bounds the words it keeps.
const (
	maxCache      = 1 << 16
	maxCachedWord = 128
)

func (t *Tokenizer) getScratch() *scratch {
	if s, ok := t.scratch.Get().(*scratch); ok {
		return s
	}
	return &scratch{cache: make(map[string][]int32, 1024)}
}

// Kind is the format of the file the tokenizer was read from.
func (t *Tokenizer) Kind() Kind { return t.kind }

// Fingerprint is the sha256 of the files the tokenizer was read from
// ("sha256:" and 64 hex digits): the same files give the same fingerprint.
func (t *Tokenizer) Fingerprint() string { return "sha256:" + t.fingerprint }

// Name is a short name that identifies the tokenizer by its fingerprint (at
// most 16 bytes, as token shards record it): "hf-", "tt-" or "spm-" and the
// fingerprint's first hex digits.
func (t *Tokenizer) Name() string {
	prefix := map[Kind]string{HuggingFace: "hf-", Tiktoken: "tt-", SentencePiece: "spm-"}[t.kind]
	return prefix + t.fingerprint[:16-len(prefix)]
}

// VocabSize is one more than the largest token id, added tokens included.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// BOS and EOS are the ids of the begin- and end-of-text tokens, -1 where the
// tokenizer has none.
func (t *Tokenizer) BOS() int32 { return t.bos }

// EOS: see BOS.
func (t *Tokenizer) EOS() int32 { return t.eos }

// Token is the string the tokenizer's file writes for id ("" where none).
func (t *Tokenizer) Token(id int32) string {
	if id < 0 || int(id) >= len(t.tokens) {
		return ""
	}
	return t.tokens[id]
}

// Sources are the files the tokenizer was read from.
func (t *Tokenizer) Sources() []Source { return t.sources }

// Encode tokenizes UTF-8 text. Long text is encoded in pieces on every core
// where the tokenizer allows (equal to encoding it whole).
func (t *Tokenizer) Encode(text []byte) ([]int32, error) {
	return t.EncodeProgress(text, nil)
}

// Cut returns the first i ≥ from where text may be cut so that encoding the
// pieces with Encode gives the whole's tokens, or len(text) where the
// tokenizer allows no such cut (data prepare streams a large text file a
// piece at a time through it). A tokenizer whose later pieces normalize
// otherwise than the first (SentencePiece's dummy prefix: normalizeRest)
// allows none here, since Encode treats every piece as a first.
func (t *Tokenizer) Cut(text []byte, from int) int {
	from = min(max(from, 0), len(text))
	switch {
	case !t.cutSafe || t.normalizeRest != nil:
		return len(text)
	case t.cut != nil:
		return min(t.cut(text, from), len(text))
	}
	return min(CutAfterNewline(text, from), len(text))
}

// PieceBytes is the length of text one core encodes at a time, at least.
const PieceBytes = 1 << 20

// EncodeProgress is Encode, calling progress (when not nil) with the bytes
// encoded so far each time the next piece in order is done, the last call with
// the text's length.
func (t *Tokenizer) EncodeProgress(text []byte, progress func(done int)) ([]int32, error) {
	if at, bad := InvalidUTF8(text); bad {
		return nil, fmt.Errorf("the tokenizer needs UTF-8 text: invalid byte 0x%02x at offset %d (convert the file to UTF-8, or use the byte tokenizer)", text[at], at)
	}
	workers := runtime.GOMAXPROCS(0)
	if !t.cutSafe {
		workers = 1
	}
	return t.encodePieces(text, PieceBytes, workers, progress)
}

// encodePieces encodes text in pieces of at least size bytes that end at a cut
// point (where cutting does not change the tokens; the whole text when the
// tokenizer allows none) on up to workers goroutines, joining their ids in order.
func (t *Tokenizer) encodePieces(text []byte, size, workers int, progress func(done int)) ([]int32, error) {
	var cuts []int
	for at := 0; at < len(text); {
		end := len(text)
		if t.cutSafe && t.cut != nil {
			end = t.cut(text, at+size)
		} else if t.cutSafe {
			end = CutAfterNewline(text, at+size)
		}
		cuts = append(cuts, end)
		at = end
	}
	if len(cuts) <= 1 || workers <= 1 {
		s := t.getScratch()
		defer t.scratch.Put(s)
		var out []int32
		for i, end := range cuts {
			lo := 0
			if i > 0 {
				lo = cuts[i-1]
			}
			var err error
			if out, err = t.encodeText(string(text[lo:end]), s, out, i > 0); err != nil {
				return nil, err
			}
			if progress != nil {
				progress(end)
			}
		}
		return out, nil
	}
	return InPieces(text, cuts, workers, func() (func(piece []byte, i int) ([]int32, error), func()) {
		s := t.getScratch()
		return func(piece []byte, i int) ([]int32, error) { return t.encodeText(string(piece), s, nil, i > 0) }, func() { t.scratch.Put(s) }
	}, progress)
}

// InvalidUTF8 reports whether text is not UTF-8 and, if so, the offset of
// its first byte that does not start a valid sequence.
func InvalidUTF8(text []byte) (at int, bad bool) {
	if utf8.Valid(text) {
		return 0, false
	}
	for at < len(text) {
		r, n := utf8.DecodeRune(text[at:])
		if r == utf8.RuneError && n <= 1 {
			break
		}
		at += n
	}
	return at, true
}

// InPieces encodes text cut into pieces at cuts (each piece's end, ascending,
// the last len(text)) on up to workers goroutines and joins their ids in
// order. Each goroutine takes its encoder from worker (encode piece i; done,
// when the goroutine ends); progress, when not nil, is called with each
// piece's end as the next piece in order is done. The first error in order is
// returned, once the pieces begun before it are done.
func InPieces(text []byte, cuts []int, workers int, worker func() (encode func(piece []byte, i int) ([]int32, error), done func()), progress func(done int)) ([]int32, error) {
	ids := make([][]int32, len(cuts))
	errs := make([]error, len(cuts))
	finished := make([]chan struct{}, len(cuts))
	for i := range finished {
		finished[i] = make(chan struct{})
	}
	var next atomic.Int64
	for range min(max(workers, 1), len(cuts)) {
		go func() {
			encode, done := worker()
			defer done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(cuts) {
					return
				}
				lo := 0
				if i > 0 {
					lo = cuts[i-1]
				}
				ids[i], errs[i] = encode(text[lo:cuts[i]], i)
				close(finished[i])
			}
		}()
	}
	n := 0
	for i := range cuts {
		<-finished[i]
		if errs[i] != nil {
			for _, f := range finished[i+1:] { // let the workers finish before returning
				<-f
			}
			return nil, errs[i]
		}
		n += len(ids[i])
		if progress != nil {
			progress(cuts[i])
		}
	}
	if len(ids) == 1 {
		return ids[0], nil
	}
	out := make([]int32, 0, n)
	for _, p := range ids {
		out = append(out, p...)
	}
	return out, nil
}

// CutAfterNewline returns the first i ≥ from where text can be cut without changing
// its tokens under the pre-tokenizers marked cutSafe, or len(text): just after
// a newline that stands between two printable ASCII characters other than
// space ("a\nb"). In GPT-2's, Llama 3's, Qwen2's and cl100k's patterns a match
// that takes a newline ends with it when a printable character follows, the
// newline after a printable character starts no match that takes more than
// newlines, and nothing looks behind; so every match ends at the cut in the
// whole text as in the pieces. NFC and the other normalizations never join
// across an ASCII character, and no added token marked cutSafe holds a newline.
func CutAfterNewline(text []byte, from int) int {
	printable := func(c byte) bool { return c > ' ' && c < 0x7f }
	for i := max(from, 2); i < len(text); i++ {
		if text[i-1] == '\n' && printable(text[i]) && printable(text[i-2]) {
			return i
		}
	}
	return len(text)
}

// encodeText encodes one piece of text with s's cache, appending to out; rest
// says it is not the text's first piece.
func (t *Tokenizer) encodeText(text string, s *scratch, out []int32, rest bool) ([]int32, error) {
	normalize := t.normalize
	if rest && t.normalizeRest != nil {
		normalize = t.normalizeRest
	}
	var err error
	t.added.each(text, func(seg string, id int32) {
		if err != nil {
			return
		}
		if id >= 0 {
			out = append(out, id)
			return
		}
		if normalize != nil {
			seg = normalize(seg)
		}
		t.normAdded.each(seg, func(seg string, id int32) {
			if err != nil {
				return
			}
			if id >= 0 {
				out = append(out, id)
				return
			}
			out, err = t.encodeWords(seg, s, out)
		})
	})
	return out, err
}

// encodeWords pre-tokenizes normalized text and encodes its words.
func (t *Tokenizer) encodeWords(text string, s *scratch, out []int32) ([]int32, error) {
	if text == "" {
		return out, nil
	}
	words := append(s.words[:0], text)
	for _, step := range t.pretok {
		var err error
		s.tmp, err = step.split(words, s.tmp[:0])
		if err != nil {
			return nil, err
		}
		words, s.tmp = s.tmp, words
	}
	s.words = words
	for _, w := range words {
		if w == "" {
			continue
		}
		if ids, ok := s.cache[w]; ok {
			out = append(out, ids...)
			continue
		}
		start := len(out)
		var err error
		if out, err = t.model.encodeWord(w, out); err != nil {
			return nil, err
		}
		if len(w) <= maxCachedWord {
			if len(s.cache) >= maxCache {
				clear(s.cache)
			}
			s.cache[strings.Clone(w)] = append([]int32(nil), out[start:]...)
		}
	}
	return out, nil
}

// Decode maps tokens back to text as the tokenizer's decoder does; an id
// outside the vocabulary, and bytes that do not form UTF-8, become U+FFFD.
func (t *Tokenizer) Decode(ids []int32) string {
	toks := make([]string, len(ids))
	for i, id := range ids {
		if id < 0 || int(id) >= len(t.tokens) || t.tokens[id] == "" && !t.special[id] {
			toks[i] = "\uFFFD"
			continue
		}
		toks[i] = t.tokens[id]
	}
	return strings.ToValidUTF8(t.decode(toks), "\uFFFD")
}
