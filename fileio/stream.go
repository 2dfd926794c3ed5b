package fileio

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"os"
)

// SealedStream writes a sealed file whose size is not known in advance: bytes
// are appended (through a buffer) to a temporary file beside the path while
// their CRC-32C is kept, and Commit appends the trailer Seal would and renames
// the file over the path, as WriteSealed does. Its memory is the buffer's, not
// the file's. A stream that is not committed must be aborted.
type SealedStream struct {
	tmp  *os.File
	w    *bufio.Writer
	crc  hash.Hash32
	path string
	n    int64
	// plain: no trailer (a file another program reads, such as Megatron's .bin).
	plain bool
}

// CreateSealedStream starts a sealed file at path; it refuses what WriteAtomic
// refuses.
func CreateSealedStream(path string) (*SealedStream, error) {
	tmp, err := createTemp(path)
	if err != nil {
		return nil, err
	}
	return &SealedStream{tmp: tmp, w: bufio.NewWriterSize(tmp, 1<<20), crc: crc32.New(castagnoli), path: path}, nil
}

// CreateStream starts a file at path written as CreateSealedStream's are,
// atomically and through a buffer, but with no trailer: a file in another
// program's format.
func CreateStream(path string) (*SealedStream, error) {
	s, err := CreateSealedStream(path)
	if s != nil {
		s.plain = true
	}
	return s, err
}

// Write appends b.
func (s *SealedStream) Write(b []byte) (int, error) {
	s.crc.Write(b)
	s.n += int64(len(b))
	return s.w.Write(b)
}

// Len is the number of bytes written so far.
func (s *SealedStream) Len() int64 { return s.n }

// Commit appends the trailer (none for CreateStream's), fsyncs and renames the file over the path.
func (s *SealedStream) Commit() error {
	if s.plain {
		if err := s.w.Flush(); err != nil {
			discard(s.tmp)
			return err
		}
		return commit(s.tmp, s.path)
	}
	if _, err := s.w.Write(appendTrailer(nil, s.crc.Sum32(), s.n)); err != nil {
		discard(s.tmp)
		return err
	}
	if err := s.w.Flush(); err != nil {
		discard(s.tmp)
		return err
	}
	return commit(s.tmp, s.path)
}

// Abort removes the temporary file; the path is left as it was.
func (s *SealedStream) Abort() { discard(s.tmp) }

// ScanSealed reads the sealed regular file at path a piece at a time (never
// all of it at once), handing each piece of its contents before the trailer to
// fn with its byte offset, and checks the trailer and checksum at the end
// (ErrCorrupt, naming the byte range, when they do not match). fn's error
// stops the scan and is returned. The pieces are at most 1 MiB and are not
// kept after fn returns. It returns the size of the contents.
func ScanSealed(path string, fn func(off int64, b []byte) error) (int64, error) {
	f, size, err := OpenRegular(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if size < TrailerSize {
		return 0, fmt.Errorf("%s: %w: no checksum trailer in its last %d bytes (truncated, or not written by this shardline)", path, ErrCorrupt, TrailerSize)
	}
	body := size - TrailerSize
	t := make([]byte, TrailerSize)
	if _, err := f.ReadAt(t, body); err != nil {
		return 0, err
	}
	if string(t[:8]) != trailerMagic {
		return 0, fmt.Errorf("%s: %w: no checksum trailer in its last %d bytes (truncated, or not written by this shardline)", path, ErrCorrupt, TrailerSize)
	}
	want, n := binary.LittleEndian.Uint32(t[8:]), binary.LittleEndian.Uint64(t[12:])
	if n != uint64(body) {
		return 0, fmt.Errorf("%s: %w: the trailer covers %d bytes, the file holds %d before it (truncated or extended)", path, ErrCorrupt, n, body)
	}
	h := crc32.New(castagnoli)
	buf := make([]byte, 1<<20)
	for off := int64(0); off < body; {
		k := min(int64(len(buf)), body-off)
		if _, err := f.ReadAt(buf[:k], off); err != nil {
			if err == io.EOF {
				return 0, fmt.Errorf("%s: %w: it shrank while being read", path, ErrCorrupt)
			}
			return 0, err
		}
		h.Write(buf[:k])
		if err := fn(off, buf[:k]); err != nil {
			return 0, err
		}
		off += k
	}
	if got := h.Sum32(); got != want {
		return 0, fmt.Errorf("%s: %w: checksum of bytes 0..%d is %08x, the trailer says %08x (a changed byte)", path, ErrCorrupt, body, got, want)
	}
	return body, nil
}
