package fileio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"syscall"
)

// ErrNotRegular marks a path that is not a regular file (a device, FIFO, socket or
// directory): readers refuse it, since its size is unknown or unbounded.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge marks a file larger than its reader accepts.
var ErrTooLarge = errors.New("file too large")

// ErrCorrupt marks a file whose checksum or trailer does not match its contents.
var ErrCorrupt = errors.New("corrupt file")

// OpenRegular opens path for reading if it is a regular file (symbolic links are
// followed: a reader may take a file through a link, as in a Hugging Face
// cache), and returns its size. What is not a regular file is refused from
// stat before it is opened; the open itself is non-blocking (O_NONBLOCK) and
// the opened file's mode is checked again, so a named pipe swapped in between
// is refused at once, never waited on for a writer.
func OpenRegular(path string) (*os.File, int64, error) {
	if st, err := os.Stat(path); err != nil {
		return nil, 0, err
	} else if !st.Mode().IsRegular() {
		return nil, 0, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w (%s)", ErrNotRegular, kind(st.Mode()))}
	}
	// O_NONBLOCK: opening a named pipe would block until a writer appears.
	// (On a regular file it changes nothing.)
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w (%s)", ErrNotRegular, kind(st.Mode()))}
	}
	return f, st.Size(), nil
}

func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeDevice != 0 || m&fs.ModeCharDevice != 0:
		return "a device"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	}
	return "mode " + m.String()
}

// ReadRegular reads a regular file of at most limit bytes. A larger file, or one
// that grows past limit while it is read, is refused with ErrTooLarge.
func ReadRegular(path string, limit int64) ([]byte, error) {
	f, size, err := OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if size > limit {
		return nil, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w: %d bytes, at most %d are read", ErrTooLarge, size, limit)}
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w: it grew past %d bytes while being read", ErrTooLarge, limit)}
	}
	return b, nil
}

// WriteAtomic writes data to path through a temporary file in the same directory,
// fsynced before it is renamed over path (and the directory fsynced after), so a
// crash leaves either the old file or the new one. A path that is a symbolic
// link, or not a regular file, is refused (ErrLink, ErrNotRegular): no output
// goes through a link.
func WriteAtomic(path string, data []byte) error {
	tmp, err := writeTemp(path, data)
	if err != nil {
		return err
	}
	return commit(tmp, path)
}

// WriteNew writes data to path as WriteAtomic does, but only when path does
// not exist: the written temporary file is hard-linked to path, which fails
// (fs.ErrExist) when anything is there, so of two writers racing for one path
// exactly one succeeds and nothing is replaced.
func WriteNew(path string, data []byte) error {
	tmp, err := writeTemp(path, data)
	if err != nil {
		return err
	}
	return place(tmp, path, os.Link)
}

// writeTemp writes data to a new temporary file beside path (createTemp),
// removed again when the write fails.
func writeTemp(path string, data []byte) (*os.File, error) {
	tmp, err := createTemp(path)
	if err != nil {
		return nil, err
	}
	if _, err := tmp.Write(data); err != nil {
		discard(tmp)
		return nil, err
	}
	return tmp, nil
}

// createTemp makes the temporary file a write to path goes through, beside it
// (O_EXCL: never through a link), once path is found to be no link.
func createTemp(path string) (*os.File, error) {
	if err := checkTarget(path); err != nil {
		return nil, err
	}
	return os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
}

// discard closes and removes a temporary file createTemp made.
func discard(tmp *os.File) {
	tmp.Close()
	os.Remove(tmp.Name())
}

// commit makes a written temporary file path, renamed over whatever is
// there (place).
func commit(tmp *os.File, path string) error { return place(tmp, path, os.Rename) }

// place makes a written temporary file path by put (os.Rename, over what is
// there; os.Link, only where nothing is): it is made readable by all,
// fsynced, closed and put in place, its temporary name removed, and the
// directory fsynced. On an error the temporary file is removed.
func place(tmp *os.File, path string, put func(oldpath, newpath string) error) error {
	err := tmp.Chmod(0o644)
	if err == nil {
		err = tmp.Sync()
	}
	if err != nil {
		discard(tmp)
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	err = put(tmp.Name(), path)
	os.Remove(tmp.Name()) // gone after a rename; the second name after a link
	if err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync() // best effort: some file systems refuse to sync a directory
		d.Close()
	}
	return nil
}

// SealedWriter writes a sealed file of a known size in pieces, in any order
// (WriteAt), without holding its contents: the pieces go to a temporary file
// beside the path, and Commit checksums what was written, appends the trailer
// Seal would and renames the file over the path, as WriteSealed does. A
// writer that is not committed must be aborted, which removes the temporary
// file.
type SealedWriter struct {
	tmp  *os.File
	path string
	size int64
}

// CreateSealed starts a sealed file of size bytes (before its trailer) at path;
// it refuses what WriteAtomic refuses.
func CreateSealed(path string, size int64) (*SealedWriter, error) {
	if size < 0 {
		return nil, fmt.Errorf("%s: a sealed file of %d bytes", path, size)
	}
	tmp, err := createTemp(path)
	if err != nil {
		return nil, err
	}
	return &SealedWriter{tmp: tmp, path: path, size: size}, nil
}

// WriteAt writes b at byte off of the file's contents; b must lie inside the
// size given to CreateSealed.
func (w *SealedWriter) WriteAt(b []byte, off int64) error {
	if off < 0 || off+int64(len(b)) > w.size {
		return fmt.Errorf("%s: writing bytes %d..%d of a file of %d", w.path, off, off+int64(len(b)), w.size)
	}
	_, err := w.tmp.WriteAt(b, off)
	return err
}

// Commit reads the contents back to checksum them (a piece never written
// reads as zeros), appends the trailer and renames the file over the path.
func (w *SealedWriter) Commit() error {
	h := crc32.New(castagnoli)
	if _, err := io.Copy(h, io.NewSectionReader(w.tmp, 0, w.size)); err != nil {
		discard(w.tmp)
		return err
	}
	if _, err := w.tmp.WriteAt(appendTrailer(make([]byte, 0, TrailerSize), h.Sum32(), w.size), w.size); err != nil {
		discard(w.tmp)
		return err
	}
	return commit(w.tmp, w.path)
}

// Abort removes the temporary file; the path is left as it was.
func (w *SealedWriter) Abort() { discard(w.tmp) }

// AppendFloat32s appends x to b as little-endian float32 values: the layout of
// every float file shardline writes (weights, checkpoints, safetensors).
func AppendFloat32s(b []byte, x []float32) []byte {
	for _, v := range x {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

// The trailer Seal appends: magic "SHLCRC32", the CRC-32C (Castagnoli) of every
// byte before the trailer, and that byte count, little-endian.
const (
	trailerMagic = "SHLCRC32"
	// TrailerSize is the number of bytes Seal appends.
	TrailerSize = 8 + 4 + 8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Seal appends the checksum trailer to b (in b's spare capacity when it has some)
// and returns the result.
func Seal(b []byte) []byte {
	return appendTrailer(b, crc32.Checksum(b, castagnoli), int64(len(b)))
}

// appendTrailer appends the trailer of n bytes whose checksum is sum.
func appendTrailer(b []byte, sum uint32, n int64) []byte {
	b = append(b, trailerMagic...)
	b = binary.LittleEndian.AppendUint32(b, sum)
	return binary.LittleEndian.AppendUint64(b, uint64(n))
}

// Unseal checks the trailer of a sealed file's bytes and returns the contents
// before it. name is used in errors.
func Unseal(name string, b []byte) ([]byte, error) {
	if len(b) < TrailerSize || string(b[len(b)-TrailerSize:len(b)-TrailerSize+8]) != trailerMagic {
		return nil, fmt.Errorf("%s: %w: no checksum trailer in its last %d bytes (truncated, or not written by this shardline)", name, ErrCorrupt, TrailerSize)
	}
	body := b[:len(b)-TrailerSize]
	t := b[len(body)+8:]
	want, n := binary.LittleEndian.Uint32(t), binary.LittleEndian.Uint64(t[4:])
	if n != uint64(len(body)) {
		return nil, fmt.Errorf("%s: %w: the trailer covers %d bytes, the file holds %d before it (truncated or extended)", name, ErrCorrupt, n, len(body))
	}
	if got := crc32.Checksum(body, castagnoli); got != want {
		return nil, fmt.Errorf("%s: %w: checksum of bytes 0..%d is %08x, the trailer says %08x (a changed byte)", name, ErrCorrupt, len(body), got, want)
	}
	return body, nil
}

// ReadSealed reads a sealed regular file of at most limit bytes and returns its
// checked contents.
func ReadSealed(path string, limit int64) ([]byte, error) {
	b, err := ReadRegular(path, limit)
	if err != nil {
		return nil, err
	}
	return Unseal(path, b)
}

// WriteSealed seals data and writes it atomically to path.
func WriteSealed(path string, data []byte) error {
	return WriteAtomic(path, Seal(data))
}
