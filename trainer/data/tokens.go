package data

import (
	"encoding/binary"
	"fmt"
	"os"
	"sort"

	"golang.org/x/sys/unix"
)

// Tokens is one split's token stream: pieces of memory-mapped token files
// (or, for tokens built in memory, of a slice) read in order as one sequence.
// Reading a token touches only its page of the file, so a corpus larger than
// memory trains in the memory its batches take, and ranks on one machine share
// the page cache. Lengths are int (64-bit): there is no 2^31 or 2^32 limit.
type Tokens struct {
	segs   []segment
	starts []int // starts[i] is the stream offset of segs[i]
	n      int
	docs   int
}

// segment is tokens lo..lo+n of a view.
type segment struct {
	v     *view
	lo, n int
}

// view is a file's run of tokens (width bytes each, little-endian, unsigned
// unless signed), memory-mapped, or an in-memory slice (mem).
type view struct {
	mapped []byte // the tokens' bytes within the mapping
	base   []byte // the whole mapping, page-aligned
	mem    []int32
	width  int
	path   string
	off    int64 // byte offset of the first token in the file
	count  int
}

// NewTokens wraps in-memory tokens holding docs documents (0 when unknown).
func NewTokens(tokens []int32, docs int) *Tokens {
	t := &Tokens{docs: docs}
	t.append(&view{mem: tokens, count: len(tokens)}, 0, len(tokens))
	return t
}

func (t *Tokens) append(v *view, lo, n int) {
	if n <= 0 {
		return
	}
	if k := len(t.segs) - 1; k >= 0 && t.segs[k].v == v && t.segs[k].lo+t.segs[k].n == lo {
		t.segs[k].n += n // contiguous with the last piece
	} else {
		t.segs = append(t.segs, segment{v: v, lo: lo, n: n})
		t.starts = append(t.starts, t.n)
	}
	t.n += n
}

// Len is the number of tokens.
func (t *Tokens) Len() int {
	if t == nil {
		return 0
	}
	return t.n
}

// Docs is the number of documents the tokens hold (0 when not recorded).
func (t *Tokens) Docs() int {
	if t == nil {
		return 0
	}
	return t.docs
}

// Copy fills dst with tokens off..off+len(dst)−1; the range must lie inside
// the stream.
func (t *Tokens) Copy(dst []int32, off int) {
	i := sort.Search(len(t.starts), func(i int) bool { return t.starts[i] > off }) - 1
	for len(dst) > 0 {
		s := t.segs[i]
		at := off - t.starts[i]
		k := min(len(dst), s.n-at)
		s.v.read(dst[:k], s.lo+at)
		dst, off = dst[k:], off+k
		i++
	}
}

// Slice returns tokens lo..hi−1 as a new slice.
func (t *Tokens) Slice(lo, hi int) []int32 {
	out := make([]int32, hi-lo)
	t.Copy(out, lo)
	return out
}

// releaseSpan is the alignment of what read gives back after reading: the
// kernel maps a file's page cache into a process a large folio at a time (up
// to 2 MiB), not a page, so a few reads of a sequence would otherwise leave
// megabytes resident each.
const releaseSpan = 2 << 20

// read decodes tokens i..i+len(dst)−1 of the view. A mapped view then drops
// the pages around them from the process (MADV_DONTNEED: they stay in the
// page cache, shared, and fault back in when read again), so training's
// resident memory does not grow with the corpus as its batches wander over it.
func (v *view) read(dst []int32, i int) {
	if v.mem != nil {
		copy(dst, v.mem[i:])
		return
	}
	decode(dst, v.mapped[i*v.width:], v.width)
	v.release(i, i+len(dst))
}

// release drops tokens lo..hi−1 of a mapped view from the process's resident
// memory, in releaseSpan-aligned pieces of the mapping.
func (v *view) release(lo, hi int) {
	a := (int(v.off) + lo*v.width) / releaseSpan * releaseSpan
	b := min((int(v.off)+hi*v.width+releaseSpan-1)/releaseSpan*releaseSpan, len(v.base))
	if a < b {
		_ = unix.Madvise(v.base[a:b], unix.MADV_DONTNEED)
	}
}

// decode reads len(dst) little-endian tokens of width bytes from b.
func decode(dst []int32, b []byte, width int) {
	switch width {
	case 1:
		for j := range dst {
			dst[j] = int32(b[j])
		}
	case 2:
		for j := range dst {
			dst[j] = int32(binary.LittleEndian.Uint16(b[2*j:]))
		}
	case 4:
		for j := range dst {
			dst[j] = int32(binary.LittleEndian.Uint32(b[4*j:]))
		}
	case 8:
		for j := range dst {
			dst[j] = int32(binary.LittleEndian.Uint64(b[8*j:]))
		}
	}
}

// scanChunk is the number of tokens Scan hands fn at a time.
const scanChunk = 1 << 18

// Scan hands fn the tokens in order, at most scanChunk at a time. It reads a
// mapped file through the mapping and then tells the kernel the pages read are
// not needed (MADV_DONTNEED: a shared read-only mapping's pages stay in the
// page cache and fault back in when read again), so a pass over a large
// corpus (a fingerprint, token statistics) does not add the corpus to the
// process's resident memory; it needs no path, so a file removed since it was
// mapped is read as well. The slice is reused after fn returns.
func (t *Tokens) Scan(fn func([]int32) error) error {
	if t == nil {
		return nil
	}
	buf := make([]int32, scanChunk)
	for _, s := range t.segs {
		for at := 0; at < s.n; {
			k := min(scanChunk, s.n-at)
			if s.v.mem != nil {
				if err := fn(s.v.mem[s.lo+at : s.lo+at+k]); err != nil {
					return err
				}
				at += k
				continue
			}
			i := s.lo + at
			decode(buf[:k], s.v.mapped[i*s.v.width:], s.v.width)
			s.v.release(i, i+k)
			if err := fn(buf[:k]); err != nil {
				return err
			}
			at += k
		}
	}
	return nil
}

// mapTokens memory-maps count tokens of width bytes at byte off of path
// (read-only, shared: every process mapping the file shares its pages).
func mapTokens(path string, off int64, count, width int) (*view, error) {
	v := &view{width: width, path: path, off: off, count: count}
	if count == 0 {
		v.mem = []int32{}
		return v, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the mapping outlives the descriptor
	end := off + int64(count)*int64(width)
	m, err := unix.Mmap(int(f.Fd()), 0, int(end), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("cannot memory-map %s: %w", path, err)
	}
	// Batches read scattered sequences: no read-ahead beyond the page asked for.
	_ = unix.Madvise(m, unix.MADV_RANDOM)
	v.base, v.mapped = m, m[off:end]
	return v, nil
}
