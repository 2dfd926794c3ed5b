package data

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/shardline/shardline/fileio"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A shard's header is checked against the file's size before the rest is
// read: a file of 512 MiB (sparse) whose header counts 4 tokens is refused
// without reading it (before, the whole file was read into memory first),
// and so is a header counting more tokens than a shard can hold.
func TestShardHeaderCheckedBeforeReading(t *testing.T) {
	path := filepath.Join(t.TempDir(), "train.tok")
	require.NoError(t, WriteShard(path, []int32{1, 2, 3, 4}, "byte", 256))
	require.NoError(t, os.Truncate(path, 512<<20))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ReadShard(path)
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, fileio.ErrCorrupt)
	assert.ErrorContains(t, err, "header says 4 tokens (76 bytes with header and trailer) but the file holds 536870912")
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "bytes allocated")

	b := make([]byte, headerSize)
	copy(b, shardMagic)
	b[8], b[12] = shardVersion, 4
	b[16+4] = 1 // 2^32 tokens
	require.NoError(t, os.WriteFile(path, b, 0o644))
	_, err = ReadShard(path)
	require.ErrorIs(t, err, ErrNotShard)
	assert.ErrorContains(t, err, "header says 4294967296 tokens, more than the 2147483648 a shard holds")
}
