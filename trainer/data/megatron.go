package data

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shardline/shardline/fileio"
)

// Megatron-LM's indexed dataset (MMIDIDX), as its documentation lays it out:
// PREFIX.bin holds the tokens of every sequence back to back; PREFIX.idx,
// little-endian, holds
//
//	magic     [9]byte  "MMIDIDX\x00\x00"
//	version   uint64   1
//	dtype     uint8    token type code (megatronDTypes)
//	sequences uint64   S
//	documents uint64   D (document index entries: documents + 1)
//	sizes     [S]int32 tokens of each sequence
//	pointers  [S]int64 byte offset of each sequence in the .bin
//	docs      [D]int64 sequence index where each document begins, then S
//
// shardline writes one sequence per document; it reads any layout whose
// sequences lie back to back in the .bin, as Megatron's writer leaves them.
const (
	megatronMagic   = "MMIDIDX\x00\x00"
	megatronHeader  = 9 + 8 + 1 + 8 + 8
	megatronVersion = 1
)

// megatronDTypes maps Megatron's dtype codes to token widths in bytes; the
// floating-point codes (6 float64, 7 float32) hold no tokens.
var megatronDTypes = map[uint8]struct {
	width int
	name  string
}{1: {1, "uint8"}, 2: {1, "int8"}, 3: {2, "int16"}, 4: {4, "int32"}, 5: {8, "int64"}, 8: {2, "uint16"}}

// megatronCode is the dtype Megatron's preprocessing picks for a vocabulary:
// uint16 below 65500 tokens, int32 otherwise.
func megatronCode(vocab int) (uint8, int) {
	if vocab < 65500 {
		return 8, 2
	}
	return 4, 4
}

// MegatronPrefix says whether path names a Megatron indexed dataset: PREFIX
// with PREFIX.bin and PREFIX.idx beside it, or one of those two files. It
// returns the prefix.
func MegatronPrefix(path string) (string, bool) {
	prefix := path
	if ext := strings.ToLower(path); strings.HasSuffix(ext, ".bin") || strings.HasSuffix(ext, ".idx") {
		prefix = path[:len(path)-4]
	}
	for _, ext := range []string{".bin", ".idx"} {
		if st, err := os.Stat(prefix + ext); err != nil || st.IsDir() {
			return "", false
		}
	}
	return prefix, true
}

// megatronIndex is a read .idx: the .bin's token view and where each
// document's tokens begin (docStart(d), d = 0..docs; docStart(docs) is the
// token count).
type megatronIndex struct {
	tokens *view
	idx    []byte // the mapped .idx
	seqs   int
	docs   int
	width  int
}

// seqStart is the token offset of sequence s (s = seqs: the end).
func (m *megatronIndex) seqStart(s int) int {
	if s == m.seqs {
		return m.tokens.count
	}
	p := megatronHeader + 4*m.seqs + 8*s
	return int(binary.LittleEndian.Uint64(m.idx[p:]) / uint64(m.width))
}

// docStart is the token offset of document d (d = docs: the end).
func (m *megatronIndex) docStart(d int) int {
	p := megatronHeader + 12*m.seqs + 8*d
	return m.seqStart(int(binary.LittleEndian.Uint64(m.idx[p:])))
}

// openMegatron reads PREFIX.idx, checks it against the layout and PREFIX.bin,
// checks every token is below vocab, and maps the tokens.
func openMegatron(prefix string, vocab int) (*megatronIndex, error) {
	idxPath, binPath := prefix+".idx", prefix+".bin"
	f, size, err := fileio.OpenRegular(idxPath)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", idxPath, unwrapPath(err))
	}
	defer f.Close()
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%s: %w: not a Megatron indexed dataset index: %s", idxPath, fileio.ErrCorrupt, fmt.Sprintf(format, a...))
	}
	if size < megatronHeader {
		return nil, bad("%d bytes, shorter than its %d-byte header", size, megatronHeader)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("cannot memory-map %s: %w", idxPath, err)
	}
	ok := false
	defer func() {
		if !ok {
			unix.Munmap(m)
		}
	}()
	if string(m[:9]) != megatronMagic {
		return nil, bad("magic %q, want %q", m[:9], megatronMagic)
	}
	if v := binary.LittleEndian.Uint64(m[9:]); v != megatronVersion {
		return nil, bad("version %d, shardline reads version %d", v, megatronVersion)
	}
	dt, known := megatronDTypes[m[17]]
	if !known {
		return nil, bad("dtype code %d is not an integer token type (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16)", m[17])
	}
	seqs, docs := binary.LittleEndian.Uint64(m[18:]), binary.LittleEndian.Uint64(m[26:])
	if seqs > uint64(size)/12 || docs > uint64(size)/8 || docs < 1 {
		return nil, bad("header counts %d sequences and %d document entries, which a %d-byte index cannot hold", seqs, docs, size)
	}
	if want := uint64(megatronHeader) + 12*seqs + 8*docs; uint64(size) != want {
		return nil, bad("%d sequences and %d document entries take %d bytes, the file has %d (truncated, extended, or multimodal)", seqs, docs, want, size)
	}
	mi := &megatronIndex{idx: m, seqs: int(seqs), docs: int(docs) - 1, width: dt.width}
	// Sequences back to back: each pointer is the sum of the sizes before it.
	var off uint64
	for s := 0; s < mi.seqs; s++ {
		sz := binary.LittleEndian.Uint32(m[megatronHeader+4*s:])
		if int32(sz) < 0 {
			return nil, bad("sequence %d has size %d", s, int32(sz))
		}
		if p := binary.LittleEndian.Uint64(m[megatronHeader+4*mi.seqs+8*s:]); p != off {
			return nil, bad("sequence %d begins at byte %d of the .bin, shardline reads sequences back to back (it would begin at %d)", s, p, off)
		}
		off += uint64(sz) * uint64(dt.width)
	}
	prev := uint64(0)
	for d := 0; d <= mi.docs; d++ {
		s := binary.LittleEndian.Uint64(m[megatronHeader+12*mi.seqs+8*d:])
		if (d == 0 && s != 0) || s < prev || s > seqs || (d == mi.docs && s != seqs) {
			return nil, bad("document index entry %d is %d (entries run from 0 up to the sequence count %d)", d, s, seqs)
		}
		prev = s
	}
	st, err := os.Stat(binPath)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s does not exist beside %s", binPath, idxPath)
		}
		return nil, err
	}
	if uint64(st.Size()) != off {
		return nil, fmt.Errorf("%s: %w: %d bytes, but %s counts %d tokens of %s (%d bytes)", binPath, fileio.ErrCorrupt, st.Size(), idxPath, off/uint64(dt.width), dt.name, off)
	}
	if err := checkTokenFile(binPath, 0, int(off)/dt.width, dt.width, vocab); err != nil {
		return nil, err
	}
	if mi.tokens, err = mapTokens(binPath, 0, int(off)/dt.width, dt.width); err != nil {
		return nil, err
	}
	ok = true
	return mi, nil
}

// checkTokenFile reads count tokens of width bytes at byte off of path (with
// ordinary reads, a piece at a time) and checks each is below vocab; a signed
// negative token fails as a huge unsigned one.
func checkTokenFile(path string, off int64, count, width, vocab int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r := bufio.NewReaderSize(io.NewSectionReader(f, off, int64(count)*int64(width)), 1<<20)
	buf := make([]byte, 1<<20)
	for i := 0; i < count; {
		k := min(len(buf)/width, count-i)
		if _, err := io.ReadFull(r, buf[:k*width]); err != nil {
			return fmt.Errorf("%s: %w: it ended at token %d of %d", path, fileio.ErrCorrupt, i, count)
		}
		if j := badToken(buf[:k*width], width, vocab); j >= 0 {
			return fmt.Errorf("%s: %w: token %d (at byte %d) is %d, not below the vocabulary size %d; use the tokenizer the data was made with", path, ErrBadToken, i+j, off+int64(i+j)*int64(width), rawToken(buf[j*width:], width), vocab)
		}
		i += k
	}
	return nil
}

// badToken is the index of the first token of b not below vocab, or −1.
func badToken(b []byte, width, vocab int) int {
	for j := 0; j < len(b)/width; j++ {
		if rawToken(b[j*width:], width) >= uint64(vocab) {
			return j
		}
	}
	return -1
}

// rawToken reads one little-endian unsigned token of width bytes.
func rawToken(b []byte, width int) uint64 {
	switch width {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.LittleEndian.Uint16(b))
	case 4:
		return uint64(binary.LittleEndian.Uint32(b))
	}
	return binary.LittleEndian.Uint64(b)
}

// splitMegatron divides a Megatron dataset's documents into training and
// validation streams (SplitDoc).
func splitMegatron(mi *megatronIndex, valFraction float64) (train, val *Tokens) {
	train, val = &Tokens{}, &Tokens{}
	for d := 0; d < mi.docs; d++ {
		lo, hi := mi.docStart(d), mi.docStart(d+1)
		dst := train
		if SplitDoc(d, valFraction) {
			dst = val
		}
		dst.docs++
		dst.append(mi.tokens, lo, hi-lo)
	}
	return train, val
}

// megatronWriter writes a split as PREFIX.bin and PREFIX.idx, one sequence per
// document. The sizes go to a temporary file as they come; the index is
// written from it at the end, so memory does not grow with the documents.
type megatronWriter struct {
	out      *fileio.OutputDir
	prefix   string
	code     uint8
	width    int
	bin      *fileio.SealedStream
	sizes    *os.File
	sizesW   *bufio.Writer
	cur      int // tokens of the document being written; −1 before the first
	n, ndocs int
}

func newMegatronWriter(out *fileio.OutputDir, prefix string, vocab int) (*megatronWriter, error) {
	w := &megatronWriter{out: out, prefix: prefix, cur: -1}
	w.code, w.width = megatronCode(vocab)
	var err error
	if w.bin, err = fileio.CreateStream(out.Path(prefix + ".bin")); err != nil {
		return nil, err
	}
	if w.sizes, err = os.CreateTemp(out.Path(""), "."+prefix+"-sizes-*"); err != nil {
		w.bin.Abort()
		return nil, err
	}
	w.sizesW = bufio.NewWriterSize(w.sizes, 1<<16)
	return w, nil
}

// endDoc records the size of the document being written.
func (w *megatronWriter) endDoc() error {
	if w.cur < 0 {
		return nil
	}
	if w.cur > 1<<31-1 {
		return fmt.Errorf("%s.bin: a document of %d tokens; Megatron's index holds at most 2^31−1 tokens a sequence", w.prefix, w.cur)
	}
	_, err := w.sizesW.Write(binary.LittleEndian.AppendUint32(nil, uint32(w.cur)))
	w.cur = -1
	return err
}

func (w *megatronWriter) startDoc() error {
	if err := w.endDoc(); err != nil {
		return err
	}
	w.cur = 0
	w.ndocs++
	return nil
}

func (w *megatronWriter) write(tokens []int32) error {
	buf := make([]byte, 0, len(tokens)*w.width)
	for _, t := range tokens {
		if w.width == 2 {
			buf = binary.LittleEndian.AppendUint16(buf, uint16(t))
		} else {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
		}
	}
	w.cur += len(tokens)
	w.n += len(tokens)
	_, err := w.bin.Write(buf)
	return err
}

func (w *megatronWriter) commit() error {
	if err := w.endDoc(); err != nil {
		return err
	}
	if err := w.sizesW.Flush(); err != nil {
		return err
	}
	idx, err := fileio.CreateStream(w.out.Path(w.prefix + ".idx"))
	if err != nil {
		return err
	}
	hdr := append([]byte(megatronMagic), binary.LittleEndian.AppendUint64(nil, megatronVersion)...)
	hdr = append(hdr, w.code)
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(w.ndocs))
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(w.ndocs+1))
	idx.Write(hdr)
	// sizes, then pointers from them, then the document index 0..ndocs.
	sizes := func(fn func(uint32)) error {
		r := bufio.NewReaderSize(io.NewSectionReader(w.sizes, 0, int64(4*w.ndocs)), 1<<16)
		var b [4]byte
		for range w.ndocs {
			if _, err := io.ReadFull(r, b[:]); err != nil {
				return err
			}
			fn(binary.LittleEndian.Uint32(b[:]))
		}
		return nil
	}
	var b [8]byte
	err = sizes(func(s uint32) { binary.LittleEndian.PutUint32(b[:], s); idx.Write(b[:4]) })
	var ptr uint64
	if err == nil {
		err = sizes(func(s uint32) {
			binary.LittleEndian.PutUint64(b[:], ptr)
			idx.Write(b[:])
			ptr += uint64(s) * uint64(w.width)
		})
	}
	if err != nil {
		idx.Abort()
		return err
	}
	for d := 0; d <= w.ndocs; d++ {
		binary.LittleEndian.PutUint64(b[:], uint64(d))
		idx.Write(b[:])
	}
	if err := w.bin.Commit(); err != nil {
		idx.Abort()
		return err
	}
	w.closeSizes()
	return idx.Commit()
}

func (w *megatronWriter) closeSizes() {
	if w.sizes != nil {
		w.sizes.Close()
		os.Remove(w.sizes.Name())
		w.sizes = nil
	}
}

func (w *megatronWriter) abort() {
	w.bin.Abort()
	w.closeSizes()
}
func (w *megatronWriter) tokens() int { return w.n }
func (w *megatronWriter) docs() int   { return w.ndocs }
