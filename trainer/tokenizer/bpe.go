package tokenizer

import (
	"fmt"
	"math"
	"unicode/utf8"
)

// merge is one entry of a BPE merge list: its rank (its place in the list)
// and the token the pair becomes.
type merge struct {
	rank, id int32
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// bpe is Hugging Face's BPE model: the word's characters (byte-level: its
// bytes) become tokens, then the pair with the lowest merge rank, the leftmost
// of equals, is merged until no pair in the list remains.
type bpe struct {
	byteLevel    bool
	byteIDs      [256]int32       // byte-level: each byte's token, -1 where none
	vocab        map[string]int32 // byte-level: keyed by the token's bytes
	merges       map[uint64]merge
	ignoreMerges bool  // a word in the vocabulary is its token, whatever the merges
	unk          int32 // -1: none (an unknown character is dropped, as Hugging Face does)
	fuseUnk      bool
	byteFallback bool
	fallbackIDs  [256]int32 // <0xXX> tokens
}

func (m *bpe) encodeWord(word string, out []int32) ([]int32, error) {
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			return append(out, id), nil
		}
	}
	var buf [64]int32
	syms := buf[:0]
	if m.byteLevel {
		for i := 0; i < len(word); i++ {
			if id := m.byteIDs[word[i]]; id >= 0 {
				syms = append(syms, id)
			} else if m.unk >= 0 && !(m.fuseUnk && len(syms) > 0 && syms[len(syms)-1] == m.unk) {
				syms = append(syms, m.unk)
			}
		}
	} else {
		for i, r := range word {
			n := utf8.RuneLen(r)
			if id, ok := m.vocab[word[i:i+n]]; ok {
				syms = append(syms, id)
				continue
			}
			if m.byteFallback {
				all := true
				for j := i; j < i+n; j++ {
					all = all && m.fallbackIDs[word[j]] >= 0
				}
				if all {
					for j := i; j < i+n; j++ {
						syms = append(syms, m.fallbackIDs[word[j]])
					}
					continue
				}
			}
			if m.unk >= 0 && !(m.fuseUnk && len(syms) > 0 && syms[len(syms)-1] == m.unk) {
				syms = append(syms, m.unk)
			}
		}
	}
	return append(out, mergePairs(syms, m.merges)...), nil
}

// mergePairs merges syms in place by the merge list and returns them. Long
// words (a text without a pre-tokenizer is one word) take the heap, O(n log n);
// short ones a scan of the pairs, which is faster for them.
func mergePairs(syms []int32, merges map[uint64]merge) []int32 {
	if len(syms) < 2 {
		return syms
	}
	if len(syms) > 64 {
		return mergeLong(syms, merges)
	}
	return mergeShort(syms, merges)
}

// mergeShort is mergePairs by scanning every pair for the lowest rank.
func mergeShort(syms []int32, merges map[uint64]merge) []int32 {
	if len(syms) < 2 {
		return syms
	}
	const none = math.MaxInt32
	var rbuf [64]merge
	ranks := rbuf[:0] // ranks[i]: the pair syms[i], syms[i+1]
	at := func(i int) merge {
		if mg, ok := merges[pairKey(syms[i], syms[i+1])]; ok {
			return mg
		}
		return merge{rank: none}
	}
	for i := 0; i+1 < len(syms); i++ {
		ranks = append(ranks, at(i))
	}
	for {
		best := -1
		for i, r := range ranks {
			if r.rank != none && (best < 0 || r.rank < ranks[best].rank) {
				best = i
			}
		}
		if best < 0 {
			return syms
		}
		syms[best] = ranks[best].id
		syms = append(syms[:best+1], syms[best+2:]...)
		ranks = append(ranks[:best], ranks[best+1:]...)
		if best < len(ranks) {
			ranks[best] = at(best)
		}
		if best > 0 {
			ranks[best-1] = at(best - 1)
		}
	}
}

// tiktokenBPE is tiktoken's byte-pair encoding: a word in the ranks is its
// token; otherwise its bytes are merged, the adjacent pair whose joined bytes
// have the lowest rank first (the leftmost of equals), until no joined pair
// has a rank.
type tiktokenBPE struct {
	ranks map[string]int32
}

func (m *tiktokenBPE) encodeWord(word string, out []int32) ([]int32, error) {
	if id, ok := m.ranks[word]; ok {
		return append(out, id), nil
	}
	if len(word) > 64 {
		return m.mergeLong(word, out)
	}
	return m.scan(word, out)
}

// scan is tiktoken's merge as tiktoken writes it: after each merge, every pair
// is scanned for the lowest rank.
func (m *tiktokenBPE) scan(word string, out []int32) ([]int32, error) {
	const none = math.MaxInt32
	// starts[i] is where part i begins; part i ends where part i+1 begins.
	var sbuf [65]int
	starts := sbuf[:0]
	for i := 0; i <= len(word); i++ {
		starts = append(starts, i)
	}
	var rbuf [64]int32
	ranks := rbuf[:0] // ranks[i]: the rank of parts i and i+1 joined
	rank := func(i int) int32 {
		if i+2 >= len(starts) {
			return none
		}
		if r, ok := m.ranks[word[starts[i]:starts[i+2]]]; ok {
			return r
		}
		return none
	}
	for i := 0; i+2 < len(starts); i++ {
		ranks = append(ranks, rank(i))
	}
	for {
		best := -1
		for i, r := range ranks {
			if r != none && (best < 0 || r < ranks[best]) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		starts = append(starts[:best+1], starts[best+2:]...)
		ranks = append(ranks[:best], ranks[best+1:]...)
		if best < len(ranks) {
			ranks[best] = rank(best)
		}
		if best > 0 {
			ranks[best-1] = rank(best - 1)
		}
	}
	for i := 0; i+1 < len(starts); i++ {
		id, ok := m.ranks[word[starts[i]:starts[i+1]]]
		if !ok {
			return nil, fmt.Errorf("tiktoken: the byte 0x%02x has no rank (the rank file lacks single bytes)", word[starts[i]])
		}
		out = append(out, id)
	}
	return out, nil
}

// mergeLong is mergePairs on a heap of candidate pairs ordered by rank, then
// position (Hugging Face's merge_all): a popped pair whose symbols have
// changed since it was pushed is skipped.
func mergeLong(syms []int32, merges map[uint64]merge) []int32 {
	n := len(syms)
	next, prev := make([]int, n), make([]int, n)
	alive := make([]bool, n)
	for i := range n {
		next[i], prev[i], alive[i] = i+1, i-1, true
	}
	next[n-1] = -1
	type cand struct {
		rank, id    int32
		left, right int
		a, b        int32 // the symbols when pushed
	}
	h := minHeap[cand]{less: func(x, y cand) bool { return x.rank < y.rank || x.rank == y.rank && x.left < y.left }}
	push, pop := h.push, h.pop
	try := func(l int) {
		if l < 0 || next[l] < 0 {
			return
		}
		r := next[l]
		if mg, ok := merges[pairKey(syms[l], syms[r])]; ok {
			push(cand{rank: mg.rank, id: mg.id, left: l, right: r, a: syms[l], b: syms[r]})
		}
	}
	for i := 0; i+1 < n; i++ {
		try(i)
	}
	for len(h.items) > 0 {
		c := pop()
		if !alive[c.left] || !alive[c.right] || next[c.left] != c.right || syms[c.left] != c.a || syms[c.right] != c.b {
			continue
		}
		syms[c.left] = c.id
		alive[c.right] = false
		next[c.left] = next[c.right]
		if next[c.right] >= 0 {
			prev[next[c.right]] = c.left
		}
		try(prev[c.left])
		try(c.left)
	}
	out := syms[:0]
	for i := 0; i >= 0; i = next[i] {
		out = append(out, syms[i])
	}
	return out
}

// mergeLong is tiktoken's merge on a heap (by rank, then position) for long
// words, where scanning every pair after each merge is quadratic: a popped
// candidate whose parts have changed since it was pushed is skipped.
func (m *tiktokenBPE) mergeLong(word string, out []int32) ([]int32, error) {
	n := len(word)
	next, prev, end := make([]int, n), make([]int, n), make([]int, n)
	alive := make([]bool, n)
	for i := range n {
		next[i], prev[i], end[i], alive[i] = i+1, i-1, i+1, true
	}
	next[n-1] = -1
	type cand struct {
		rank           int32
		left, right, e int
	}
	h := minHeap[cand]{less: func(x, y cand) bool { return x.rank < y.rank || x.rank == y.rank && x.left < y.left }}
	push, pop := h.push, h.pop
	try := func(l int) {
		if l < 0 || next[l] < 0 {
			return
		}
		r := next[l]
		if rank, ok := m.ranks[word[l:end[r]]]; ok {
			push(cand{rank: rank, left: l, right: r, e: end[r]})
		}
	}
	for i := 0; i+1 < n; i++ {
		try(i)
	}
	for len(h.items) > 0 {
		c := pop()
		if !alive[c.left] || !alive[c.right] || next[c.left] != c.right || end[c.right] != c.e {
			continue
		}
		end[c.left] = end[c.right]
		alive[c.right] = false
		next[c.left] = next[c.right]
		if next[c.right] >= 0 {
			prev[next[c.right]] = c.left
		}
		try(prev[c.left])
		try(c.left)
	}
	for i := 0; i >= 0; i = next[i] {
		id, ok := m.ranks[word[i:end[i]]]
		if !ok {
			return nil, fmt.Errorf("tiktoken: the byte 0x%02x has no rank (the rank file lacks single bytes)", word[i])
		}
		out = append(out, id)
	}
	return out, nil
}

// minHeap is a binary min-heap under less: the merges a long word has left,
// lowest rank (then leftmost) first.
type minHeap[T any] struct {
	items []T
	less  func(a, b T) bool
}

func (h *minHeap[T]) push(c T) {
	h.items = append(h.items, c)
	for i := len(h.items) - 1; i > 0; {
		p := (i - 1) / 2
		if !h.less(h.items[i], h.items[p]) {
			break
		}
		h.items[i], h.items[p] = h.items[p], h.items[i]
		i = p
	}
}

func (h *minHeap[T]) pop() T {
	it := h.items
	top := it[0]
	it[0] = it[len(it)-1]
	it = it[:len(it)-1]
	for i := 0; ; {
		l, r, b := 2*i+1, 2*i+2, i
		if l < len(it) && h.less(it[l], it[b]) {
			b = l
		}
		if r < len(it) && h.less(it[r], it[b]) {
			b = r
		}
		if b == i {
			break
		}
		it[i], it[b] = it[b], it[i]
		i = b
	}
	h.items = it
	return top
}
