package fileio

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestReadRegularRefusesWhatIsNotAFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	for name, path := range map[string]string{"device": "/dev/zero", "directory": dir, "named pipe": fifo} {
		t.Run(name, func(t *testing.T) {
			_, err := ReadRegular(path, 1<<20)
			require.ErrorIs(t, err, ErrNotRegular)
			require.Contains(t, err.Error(), "a "+name)
			require.Contains(t, err.Error(), path)
		})
	}
}

func TestReadRegularCapsSize(t *testing.T) {
	// A sparse file: 3 GiB long, no disk used. It is refused from its size alone.
	path := filepath.Join(t.TempDir(), "big.txt")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(3<<30))
	require.NoError(t, f.Close())
	_, err = ReadRegular(path, 1<<30)
	require.ErrorIs(t, err, ErrTooLarge)
	require.Contains(t, err.Error(), "3221225472 bytes")

	small := filepath.Join(t.TempDir(), "small.txt")
	require.NoError(t, os.WriteFile(small, []byte("hello"), 0o644))
	b, err := ReadRegular(small, 5)
	require.NoError(t, err)
	require.Equal(t, "hello", string(b))
	_, err = ReadRegular(small, 4)
	require.ErrorIs(t, err, ErrTooLarge)
}

func TestSealedRefusesAnyChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.bin")
	body := []byte("the contents of a weights file, or of a token shard")
	require.NoError(t, WriteSealed(path, append([]byte(nil), body...)))
	got, err := ReadSealed(path, 1<<20)
	require.NoError(t, err)
	require.Equal(t, body, got)

	sealed, err := os.ReadFile(path)
	require.NoError(t, err)
	for i := range sealed { // every single flipped bit of every byte, trailer included
		for bit := 0; bit < 8; bit++ {
			b := append([]byte(nil), sealed...)
			b[i] ^= 1 << bit
			_, err := Unseal("x.bin", b)
			require.ErrorIs(t, err, ErrCorrupt, "byte %d bit %d", i, bit)
		}
	}
	for _, n := range []int{0, 1, len(sealed) - 1, len(sealed) - TrailerSize} {
		_, err := Unseal("x.bin", sealed[:n])
		require.ErrorIs(t, err, ErrCorrupt, "truncated to %d bytes", n)
		require.Contains(t, err.Error(), "x.bin")
	}
}

func TestWriteAtomicLeavesNoTemporaries(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "out.json")
	require.NoError(t, WriteAtomic(path, []byte("one")))
	require.NoError(t, WriteAtomic(path, []byte("two")))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	b, _ := os.ReadFile(path)
	require.Equal(t, "two", string(b))
	// A directory that cannot be written fails without touching the old file.
	err = WriteAtomic(filepath.Join(dir, "missing", "out.json"), []byte("x"))
	require.Error(t, err)
	require.True(t, errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), "no such"))
}

// TestSealedWriterWritesWhatWriteSealedWrites: pieces written out of order and
// committed give the same bytes as WriteSealed of the whole contents (an
// unwritten gap reads as zeros); a piece past the size is refused; an aborted
// writer leaves the old file and no temporaries.
func TestSealedWriterWritesWhatWriteSealedWrites(t *testing.T) {
	dir := t.TempDir()
	data := []byte("0123456789abcdef\x00\x00\x00\x00xyz")
	want := filepath.Join(dir, "want.bin")
	require.NoError(t, WriteSealed(want, data))

	path := filepath.Join(dir, "got.bin")
	w, err := CreateSealed(path, int64(len(data)))
	require.NoError(t, err)
	require.NoError(t, w.WriteAt(data[20:], 20))
	require.NoError(t, w.WriteAt(data[8:16], 8))
	require.NoError(t, w.WriteAt(data[:8], 0))
	require.Error(t, w.WriteAt([]byte("toolong"), int64(len(data))-3), "a piece past the size")
	require.Error(t, w.WriteAt([]byte("x"), -1))
	require.NoError(t, w.Commit())
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	wantBytes, _ := os.ReadFile(want)
	require.Equal(t, wantBytes, got)
	body, err := ReadSealed(path, 1<<20)
	require.NoError(t, err)
	require.Equal(t, data, body)

	w, err = CreateSealed(path, 4)
	require.NoError(t, err)
	require.NoError(t, w.WriteAt([]byte("new!"), 0))
	w.Abort()
	again, _ := os.ReadFile(path)
	require.Equal(t, got, again, "an aborted writer leaves the file as it was")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 2, "no temporaries left")
}

// OpenRegular checked the path with stat and then opened it blocking: a named
// pipe swapped in between (by rename, here again and again) made the open wait
// for a writer that never comes. The open is now non-blocking and the opened
// file's own mode is checked, so every call returns: the file's bytes or
// ErrNotRegular.
func TestOpenRegularNeverBlocksOnASwappedFIFO(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(path, []byte("text"), 0o644))
	stop := make(chan struct{})
	swapped := make(chan struct{})
	go func() { // path is the regular file and the FIFO in turn
		defer close(swapped)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tmp := filepath.Join(dir, "tmp")
			var err error
			if i%2 == 0 {
				err = os.WriteFile(tmp, []byte("text"), 0o644)
			} else {
				err = syscall.Mkfifo(tmp, 0o600)
			}
			if err == nil {
				os.Rename(tmp, path)
			}
		}
	}()
	done := make(chan error, 1)
	go func() {
		for range 20000 {
			f, _, err := OpenRegular(path)
			if err == nil {
				f.Close()
			} else if !errors.Is(err, ErrNotRegular) && !errors.Is(err, os.ErrNotExist) {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		close(stop)
		<-swapped
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		close(stop)
		<-swapped
		// Release the blocked open: a writer on the FIFO it opened, if path
		// is still that one.
		if w, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
		t.Fatal("OpenRegular blocked opening a named pipe swapped in after its stat")
	}
}
