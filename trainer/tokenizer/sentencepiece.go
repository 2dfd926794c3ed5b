package tokenizer

import (
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// SentencePiece piece types (sentencepiece_model.proto).
const (
	spmNormal      = 1
	spmUnknown     = 2
	spmControl     = 3
	spmUserDefined = 4
	spmUnused      = 5
	spmByte        = 6
)

// spmSpace is SentencePiece's whitespace, U+2581.
const spmSpace = "▁"

// spmProto is the part of a SentencePiece ModelProto read here.
type spmProto struct {
	pieces []spmPieceProto
	// TrainerSpec
	modelType                      int64
	byteFallback, whitespaceSuffix bool
	unkID, bosID, eosID            int64
	// NormalizerSpec
	normName                                string
	charsmap                                []byte
	addDummyPrefix, removeExtraWS, escapeWS bool
}

type spmPieceProto struct {
	piece string
	score float32
	typ   int64
}

// parseSpmProto reads the ModelProto's fields with protowire: pieces (1),
// trainer_spec (2) and normalizer_spec (3); the rest is skipped.
func parseSpmProto(b []byte) (*spmProto, error) {
	p := &spmProto{modelType: 1, unkID: 0, bosID: 1, eosID: 2, addDummyPrefix: true, removeExtraWS: true, escapeWS: true}
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			sp := spmPieceProto{typ: spmNormal}
			err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch {
				case num == 1 && typ == protowire.BytesType:
					sp.piece = string(v)
				case num == 2 && typ == protowire.Fixed32Type:
					sp.score = math.Float32frombits(uint32(x))
				case num == 3 && typ == protowire.VarintType:
					sp.typ = int64(x)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("piece %d: %w", len(p.pieces), err)
			}
			p.pieces = append(p.pieces, sp)
		case num == 2 && typ == protowire.BytesType:
			return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				if typ != protowire.VarintType {
					return nil
				}
				switch num {
				case 3:
					p.modelType = int64(x)
				case 24:
					p.whitespaceSuffix = x != 0
				case 35:
					p.byteFallback = x != 0
				case 40:
					p.unkID = int64(int32(x))
				case 41:
					p.bosID = int64(int32(x))
				case 42:
					p.eosID = int64(int32(x))
				}
				return nil
			})
		case num == 3 && typ == protowire.BytesType:
			return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch {
				case num == 1 && typ == protowire.BytesType:
					p.normName = string(v)
				case num == 2 && typ == protowire.BytesType:
					p.charsmap = v
				case num == 3 && typ == protowire.VarintType:
					p.addDummyPrefix = x != 0
				case num == 4 && typ == protowire.VarintType:
					p.removeExtraWS = x != 0
				case num == 5 && typ == protowire.VarintType:
					p.escapeWS = x != 0
				}
				return nil
			})
		}
		return nil
	})
	return p, err
}

// eachField calls fn for each field of a protobuf message: its number, wire
// type, and its bytes (length-delimited) or value (varint, fixed).
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("not a protobuf message: %w", protowire.ParseError(n))
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var y uint32
			y, n = protowire.ConsumeFixed32(b)
			x = uint64(y)
		case protowire.Fixed64Type:
			x, n = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("not a protobuf message: field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
		if err := fn(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}

// spmModel is SentencePiece's BPE: a word's characters (user-defined symbols
// whole) are merged, the adjacent pair whose joined piece has the highest
// score first (the leftmost of equals), while the joined piece is in the
// vocabulary; pieces of type UNUSED are split back into what made them;
// a piece left outside the vocabulary becomes its bytes' <0xXX> pieces (byte
// fallback) or the unknown piece.
type spmModel struct {
	ids          map[string]int32 // NORMAL, USER_DEFINED and UNUSED pieces
	scores       []float32
	types        []int64
	unk          int32
	byteFallback bool
	byteIDs      [256]int32
	userDefined  *addedVocab
}

type spmSym struct {
	start, end int
	prev, next int
}

type spmPair struct {
	score       float32
	left, right int
	size        int
}

func (m *spmModel) encodeWord(word string, out []int32) ([]int32, error) {
	if id, ok := m.ids[word]; ok && m.types[id] == spmUserDefined {
		return append(out, id), nil
	}
	var syms []spmSym
	for i := 0; i < len(word); {
		_, n := utf8.DecodeRuneInString(word[i:])
		syms = append(syms, spmSym{start: i, end: i + n, prev: len(syms) - 1, next: len(syms) + 1})
		i += n
	}
	if len(syms) == 0 {
		return out, nil
	}
	syms[len(syms)-1].next = -1
	var heap []spmPair
	less := func(a, b spmPair) bool { // a before b
		return a.score > b.score || a.score == b.score && a.left < b.left
	}
	push := func(p spmPair) {
		heap = append(heap, p)
		for i := len(heap) - 1; i > 0; {
			parent := (i - 1) / 2
			if !less(heap[i], heap[parent]) {
				break
			}
			heap[i], heap[parent] = heap[parent], heap[i]
			i = parent
		}
	}
	pop := func() spmPair {
		top := heap[0]
		last := len(heap) - 1
		heap[0] = heap[last]
		heap = heap[:last]
		for i := 0; ; {
			l, r, best := 2*i+1, 2*i+2, i
			if l < len(heap) && less(heap[l], heap[best]) {
				best = l
			}
			if r < len(heap) && less(heap[r], heap[best]) {
				best = r
			}
			if best == i {
				break
			}
			heap[i], heap[best] = heap[best], heap[i]
			i = best
		}
		return top
	}
	var revMerge map[string][2]string // an UNUSED piece: the two that made it (its last merge)
	maybeAdd := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		piece := word[syms[l].start:syms[r].end]
		if id, ok := m.ids[piece]; ok {
			push(spmPair{score: m.scores[id], left: l, right: r, size: len(piece)})
			if m.types[id] == spmUnused {
				if revMerge == nil {
					revMerge = map[string][2]string{}
				}
				revMerge[piece] = [2]string{word[syms[l].start:syms[l].end], word[syms[r].start:syms[r].end]}
			}
		}
	}
	for i := 0; i+1 < len(syms); i++ {
		maybeAdd(i, i+1)
	}
	for len(heap) > 0 {
		p := pop()
		l, r := &syms[p.left], &syms[p.right]
		if l.end <= l.start || r.end <= r.start || l.next != p.right || r.end-l.start != p.size {
			continue // a symbol of the pair was merged since
		}
		l.end = r.end
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = p.left
		}
		r.start, r.end = 0, 0
		maybeAdd(l.prev, p.left)
		maybeAdd(p.left, l.next)
	}
	for i := 0; i >= 0; i = syms[i].next {
		out = m.resegment(word[syms[i].start:syms[i].end], revMerge, out)
	}
	return out, nil
}

// resegment appends a merged piece's id: an UNUSED piece is split back into
// the two pieces that made it, an unknown one falls back to bytes (or the
// unknown piece).
func (m *spmModel) resegment(piece string, revMerge map[string][2]string, out []int32) []int32 {
	id, ok := m.ids[piece]
	if ok && m.types[id] == spmUnused {
		if lr, split := revMerge[piece]; split {
			out = m.resegment(lr[0], revMerge, out)
			return m.resegment(lr[1], revMerge, out)
		}
	}
	if ok {
		return append(out, id)
	}
	if m.byteFallback {
		for i := 0; i < len(piece); i++ {
			out = append(out, m.byteIDs[piece[i]])
		}
		return out
	}
	return append(out, m.unk)
}

// spmSplit cuts SentencePiece's normalized text into words the merges cannot
// cross: user-defined symbols, and (where no piece holds ▁ after another
// character) before each ▁ that follows a character other than ▁.
type spmSplit struct {
	userDefined *addedVocab
	atSpaces    bool
}

func (s *spmSplit) split(words, out []string) ([]string, error) {
	for _, w := range words {
		s.userDefined.each(w, func(seg string, id int32) {
			if id >= 0 || !s.atSpaces {
				out = append(out, seg)
				return
			}
			start := 0
			for i := 1; i < len(seg); i++ {
				if strings.HasPrefix(seg[i:], spmSpace) && !strings.HasSuffix(seg[:i], spmSpace) {
					out = append(out, seg[start:i])
					start = i
				}
			}
			out = append(out, seg[start:])
		})
	}
	return out, nil
}

// spmCut returns the first i ≥ from where a space follows another character,
// or len(text).
func spmCut(text []byte, from int) int {
	for i := max(from, 1); i < len(text); i++ {
		if text[i] == ' ' && text[i-1] != ' ' {
			return i
		}
	}
	return len(text)
}

// parseSentencePiece reads a SentencePiece ModelProto: BPE models whose
// normalizer is identity (as Llama 2's and Mistral 7B's), with
// add_dummy_prefix, remove_extra_whitespaces and byte fallback as the model
// sets them.
func parseSentencePiece(b []byte, config []byte) (*Tokenizer, error) {
	p, err := parseSpmProto(b)
	if err != nil {
		return nil, err
	}
	if p.modelType != 2 {
		return nil, fmt.Errorf("SentencePiece model type %d: shardline reads BPE models (type 2) only, as Llama 2 and Mistral use; Unigram (1) is not supported", p.modelType)
	}
	if len(p.charsmap) > 0 || (p.normName != "" && p.normName != "identity") {
		return nil, fmt.Errorf("SentencePiece normalizer %q: shardline reads models with the identity normalizer only (as Llama 2 and Mistral 7B); give the model's tokenizer.json instead", p.normName)
	}
	if p.whitespaceSuffix {
		return nil, fmt.Errorf("SentencePiece treat_whitespace_as_suffix is set: not supported")
	}
	if len(p.pieces) == 0 || len(p.pieces) >= maxVocab {
		return nil, fmt.Errorf("SentencePiece model has %d pieces", len(p.pieces))
	}
	n := len(p.pieces)
	m := &spmModel{ids: make(map[string]int32, n), scores: make([]float32, n), types: make([]int64, n), unk: -1, byteFallback: p.byteFallback}
	t := &Tokenizer{kind: SentencePiece, vocabSize: n, bos: -1, eos: -1, tokens: make([]string, n), special: make([]bool, n)}
	for i := range m.byteIDs {
		m.byteIDs[i] = -1
	}
	var user []addedTok
	atSpaces := true
	for i, sp := range p.pieces {
		id := int32(i)
		m.scores[i], m.types[i] = sp.score, sp.typ
		t.tokens[i] = sp.piece
		switch sp.typ {
		case spmNormal, spmUserDefined, spmUnused:
			if _, dup := m.ids[sp.piece]; dup {
				return nil, fmt.Errorf("SentencePiece piece %q appears twice", sp.piece)
			}
			m.ids[sp.piece] = id
			if sp.typ == spmUserDefined {
				user = append(user, addedTok{sp.piece, id})
			}
			for j := 1; j < len(sp.piece); j++ {
				if strings.HasPrefix(sp.piece[j:], spmSpace) && !strings.HasSuffix(sp.piece[:j], spmSpace) {
					atSpaces = false
				}
			}
		case spmUnknown:
			m.unk = id
		case spmControl:
			t.special[i] = true
			t.tokens[i] = ""
		case spmByte:
			v, ok := fallbackByte(sp.piece)
			if !ok {
				return nil, fmt.Errorf("SentencePiece byte piece %q is not <0xXX>", sp.piece)
			}
			m.byteIDs[v] = id
		default:
			return nil, fmt.Errorf("SentencePiece piece %q has type %d", sp.piece, sp.typ)
		}
	}
	if m.unk < 0 {
		return nil, fmt.Errorf("SentencePiece model has no unknown piece")
	}
	if m.byteFallback {
		for c, id := range m.byteIDs {
			if id < 0 {
				return nil, fmt.Errorf("SentencePiece model has byte_fallback but no piece <0x%02X>", c)
			}
		}
	}
	m.userDefined = newAddedVocab(user)
	t.model = m
	addPrefix, removeWS, escape := p.addDummyPrefix, p.removeExtraWS, p.escapeWS
	t.normalize = func(s string) string {
		if removeWS {
			s = strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == ' ' }), " ")
		}
		if s == "" {
			return s
		}
		if addPrefix {
			s = " " + s
		}
		if escape {
			s = strings.ReplaceAll(s, " ", spmSpace)
		}
		return s
	}
	t.pretok = []preStep{&spmSplit{userDefined: m.userDefined, atSpaces: atSpaces}}
	// Words end before a space that follows another character; text cut there
	// encodes as the whole does when nothing else joins across the cut: no
	// extra-whitespace removal (it looks at both sides), no user-defined symbol
	// holding a space, and the dummy prefix only on the first piece.
	userSpace := false
	for _, u := range user {
		userSpace = userSpace || strings.Contains(u.content, spmSpace)
	}
	if atSpaces && escape && !removeWS && !userSpace {
		t.cutSafe = true
		t.cut = spmCut
		t.normalizeRest = func(s string) string { return strings.ReplaceAll(s, " ", spmSpace) }
	}
	unkPiece := t.tokens[m.unk]
	t.decode = func(toks []string) string {
		var b []byte
		first := true
		for _, s := range toks {
			if s == "" {
				continue // control pieces decode to nothing
			}
			if v, ok := fallbackByte(s); ok {
				b = append(b, v)
				first = false
				continue
			}
			if s == unkPiece {
				s = " ⁇ "
			} else {
				s = strings.ReplaceAll(s, spmSpace, " ")
			}
			if first && addPrefix {
				s = strings.TrimPrefix(s, " ")
			}
			first = false
			b = append(b, s...)
		}
		return string(b)
	}
	if id := p.bosID; id >= 0 && id < int64(n) {
		t.bos = int32(id)
	}
	if id := p.eosID; id >= 0 && id < int64(n) {
		t.eos = int32(id)
	}
	if config != nil {
		lookup := func(s string) (int32, bool) {
			for i, tok := range p.pieces {
				if tok.piece == s {
					return int32(i), true
				}
			}
			return 0, false
		}
		bos, eos, err := specialsFromConfig(config, lookup)
		if err != nil {
			return nil, err
		}
		if bos >= 0 {
			t.bos = bos
		}
		if eos >= 0 {
			t.eos = eos
		}
	}
	return t, nil
}
