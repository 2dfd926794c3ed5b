package comm

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"unsafe"
)

// Fact is one thing every rank of a job must hold alike: a setting and its
// value, the fingerprint of the data.
type Fact struct{ Key, Value string }

// MaxFactBytes bounds the facts one rank brings to Agree, encoded (a resolved
// recipe is a few kilobytes): a rank announcing more is refused before anything
// of that size is allocated.
const MaxFactBytes = 1 << 20

// ErrDisagree marks ranks that do not run the same job.
var ErrDisagree = errors.New("the ranks do not run the same job")

// Disagreement is a fact the ranks hold differently: rank 0's value, and every
// other value with the ranks holding it ("" and Missing: the rank lacks the key).
type Disagreement struct {
	Key    string
	Rank0  string
	Others []Holders
}

// Holders are the ranks that hold one value of a fact.
type Holders struct {
	Value   string
	Missing bool
	Ranks   []int
}

// DisagreeError lists every fact the ranks disagree on, in rank 0's order (then
// facts rank 0 lacks), the same on every rank.
type DisagreeError struct{ Facts []Disagreement }

func (e *DisagreeError) Error() string {
	const shown = 8
	var parts []string
	for i, d := range e.Facts {
		if i == shown {
			parts = append(parts, fmt.Sprintf("and %d more", len(e.Facts)-shown))
			break
		}
		s := fmt.Sprintf("%s: rank 0 has %s", d.Key, d.Rank0)
		if d.Rank0 == "" {
			s = fmt.Sprintf("%s: rank 0 has none", d.Key)
		}
		for _, h := range d.Others {
			who := fmt.Sprintf("rank %d has", h.Ranks[0])
			if len(h.Ranks) > 1 {
				who = fmt.Sprintf("ranks %s have", joinInts(h.Ranks))
			}
			if h.Missing {
				s += fmt.Sprintf(", %s none", who)
			} else {
				s += fmt.Sprintf(", %s %s", who, h.Value)
			}
		}
		parts = append(parts, s)
	}
	return fmt.Sprintf("%v: %s", ErrDisagree, strings.Join(parts, "; "))
}

func (e *DisagreeError) Unwrap() error { return ErrDisagree }

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}

// Agree proves that every member of c holds the same facts (keys unique), or
// fails every member alike with a *DisagreeError naming each fact that differs
// and which ranks hold which value. It is collective: every member calls it
// with its own facts. The members first compare a digest of their facts
// (32 bytes each); only when the digests differ are the facts themselves
// gathered, their sizes checked against MaxFactBytes before the buffer is made.
func Agree(c Communicator, facts []Fact) error {
	own := encodeFacts(facts)
	sum := sha256.Sum256(own)
	n := c.Size()
	digests := make([]float32, n*len(sum)/4)
	if err := c.AllGather(digests, bytesToWords(sum[:])); err != nil {
		return err
	}
	view := wordsAsBytes(digests)
	same := true
	for r := 1; r < n; r++ {
		same = same && string(view[r*len(sum):(r+1)*len(sum)]) == string(view[:len(sum)])
	}
	if same {
		return nil
	}
	lens := make([]float32, n)
	if err := c.AllGather(lens, []float32{math.Float32frombits(uint32(len(own)))}); err != nil {
		return err
	}
	longest := 0
	for r, l := range lens {
		got := int(math.Float32bits(l))
		if got > MaxFactBytes {
			return &RankError{Op: "agree", Err: fmt.Errorf("%w: rank %d announces %d bytes of facts, more than %d", ErrMismatch, r, got, MaxFactBytes)}
		}
		longest = max(longest, got)
	}
	words := (longest + 3) / 4
	padded := make([]float32, words)
	copy(wordsAsBytes(padded), own)
	all := make([]float32, n*words)
	if err := c.AllGather(all, padded); err != nil {
		return err
	}
	held := make([][]Fact, n)
	var err error
	for r := range held {
		b := wordsAsBytes(all[r*words : (r+1)*words])[:int(math.Float32bits(lens[r]))]
		if held[r], err = decodeFacts(b); err != nil {
			return &RankError{Op: "agree", Err: fmt.Errorf("%w: rank %d's facts: %v", ErrMismatch, r, err)}
		}
	}
	return disagreement(held)
}

// disagreement compares every rank's facts with rank 0's.
func disagreement(held [][]Fact) error {
	maps := make([]map[string]string, len(held))
	var order []string
	seen := map[string]bool{}
	for r, fs := range held {
		maps[r] = make(map[string]string, len(fs))
		for _, f := range fs {
			maps[r][f.Key] = f.Value
			if !seen[f.Key] {
				seen[f.Key] = true
				order = append(order, f.Key)
			}
		}
	}
	var out []Disagreement
	for _, k := range order {
		v0, ok0 := maps[0][k]
		var others []Holders
		for r := 1; r < len(held); r++ {
			v, ok := maps[r][k]
			if ok == ok0 && v == v0 {
				continue
			}
			i := slices.IndexFunc(others, func(h Holders) bool { return h.Missing == !ok && h.Value == v })
			if i < 0 {
				others = append(others, Holders{Value: v, Missing: !ok})
				i = len(others) - 1
			}
			others[i].Ranks = append(others[i].Ranks, r)
		}
		if len(others) > 0 {
			out = append(out, Disagreement{Key: k, Rank0: v0, Others: others})
		}
	}
	if len(out) == 0 {
		// Equal facts in another order, or a key given twice: the digests
		// differed, so the ranks' lists do too.
		return &RankError{Op: "agree", Err: fmt.Errorf("%w: the ranks list the same facts in another order", ErrMismatch)}
	}
	return &DisagreeError{Facts: out}
}

// encodeFacts writes each fact as two length-prefixed strings (uvarint lengths).
// Facts longer than MaxFactBytes in all are encoded too: Agree refuses them on
// every rank alike, once the lengths are gathered.
func encodeFacts(facts []Fact) []byte {
	var b []byte
	for _, f := range facts {
		b = binary.AppendUvarint(b, uint64(len(f.Key)))
		b = append(b, f.Key...)
		b = binary.AppendUvarint(b, uint64(len(f.Value)))
		b = append(b, f.Value...)
	}
	return b
}

// decodeFacts reads encodeFacts's bytes; every length is checked against what
// is left before it is used.
func decodeFacts(b []byte) ([]Fact, error) {
	var out []Fact
	next := func() (string, error) {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return "", errors.New("malformed")
		}
		s := string(b[n : n+int(l)])
		b = b[n+int(l):]
		return s, nil
	}
	for len(b) > 0 {
		k, err := next()
		if err != nil {
			return nil, err
		}
		v, err := next()
		if err != nil {
			return nil, err
		}
		out = append(out, Fact{k, v})
	}
	return out, nil
}

// bytesToWords copies b (a multiple of 4 bytes long) into float32 words, bit for
// bit: gathers copy them exactly, as BroadcastBytes relies on.
func bytesToWords(b []byte) []float32 {
	w := make([]float32, len(b)/4)
	copy(wordsAsBytes(w), b)
	return w
}

// wordsAsBytes is w's bytes, in place.
func wordsAsBytes(w []float32) []byte {
	if len(w) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), 4*len(w))
}
