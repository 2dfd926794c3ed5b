package data

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// tokResidentKB is how much of the process's mappings of files named *.tok is
// resident, from /proc/self/smaps.
func tokResidentKB(t *testing.T) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	require.NoError(t, err)
	defer f.Close()
	total, tok := 0, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) > 0 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":"):
			tok = strings.HasSuffix(fields[len(fields)-1], ".tok")
		case tok && len(fields) >= 2 && fields[0] == "Rss:":
			kb, _ := strconv.Atoi(fields[1])
			total += kb
		}
	}
	return total
}

// Training's reads do not leave the corpus resident: the kernel maps a file's
// page cache a large folio (up to 2 MiB) at a time, so 5 steps of 16 random
// sequences left 150 MB of a 300 MB corpus in the process's memory, growing
// with the corpus; each read now drops its pages (they stay in the page
// cache), and so do passes over a whole split.
func TestReadsDoNotStayResident(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "t.txt")
	require.NoError(t, os.WriteFile(src, bytes.Repeat([]byte("Of the Reflexions of Light. "), 1<<19), 0o644)) // 14 MiB
	out := filepath.Join(dir, "out")
	_, err := Prepare(PrepareOptions{Sources: []string{src}, Tokenizer: "byte"}, out)
	require.NoError(t, err)
	// Out of the page cache, so that reading brings it back as the kernel
	// reads ahead: in large folios.
	shards, _ := filepath.Glob(filepath.Join(out, "*.tok"))
	for _, p := range shards {
		f, err := os.Open(p)
		require.NoError(t, err)
		require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
		f.Close()
	}
	ds, err := Open(out, OpenOptions{Tokenizer: "byte"})
	require.NoError(t, err)
	before := tokResidentKB(t)
	s, err := NewSampler([]*Tokens{ds.Train}, nil, 1, 128)
	require.NoError(t, err)
	x, y := make([]int32, 16*128), make([]int32, 16*128)
	for step := 0; step < 20; step++ {
		s.Fill(x, y, step*16, 16)
	}
	require.Less(t, tokResidentKB(t)-before, 1024, "KiB of the shards resident after 20 steps")
	ds.Fingerprint()
	require.Less(t, tokResidentKB(t)-before, 1024, "KiB of the shards resident after a fingerprint")
}
