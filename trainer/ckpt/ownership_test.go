package ckpt

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/shardline/shardline/fileio"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// commitAs makes a complete checkpoint of run id at step under root (its
// metadata only: Prune reads no more).
func commitAs(t *testing.T, root string, step int, id string) string {
	t.Helper()
	dir := StepDir(root, step)
	require.NoError(t, Claim(dir, id))
	require.NoError(t, os.WriteFile(filepath.Join(dir, MetadataFile), []byte(`{"run_id":"`+id+`"}`), 0o644))
	return dir
}

// Prune removes only checkpoints of the run that asks: not another run's,
// complete or not, not an unfinished save of no known run, not a symbolic
// link (nor what it points to), even when they lie among the run's own.
func TestPruneRemovesOnlyItsOwn(t *testing.T) {
	root := t.TempDir()
	victim := commitAs(t, t.TempDir(), 7, "me") // a checkpoint of "me" reached through a link
	commitAs(t, root, 1, "me")
	commitAs(t, root, 2, "other")
	require.NoError(t, Claim(StepDir(root, 3), "other"))     // another run's unfinished save
	require.NoError(t, os.MkdirAll(StepDir(root, 4), 0o755)) // an unfinished save of no known run
	require.NoError(t, Claim(StepDir(root, 5), "me"))        // this run's unfinished save
	commitAs(t, root, 6, "me")
	require.NoError(t, os.Symlink(victim, StepDir(root, 7)))
	commitAs(t, root, 8, "me")

	require.Empty(t, Prune(root, 1, "me"))
	var left []string
	des, err := os.ReadDir(root)
	require.NoError(t, err)
	for _, de := range des {
		left = append(left, de.Name())
	}
	assert.Equal(t, []string{"step-00000002", "step-00000003", "step-00000004", "step-00000007", "step-00000008"}, left)
	assert.FileExists(t, filepath.Join(victim, MetadataFile), "what a link points to is never removed")
}

// A checkpoint Prune cannot remove is reported, and the others are still
// removed.
func TestPruneGoesOnPastAFailure(t *testing.T) {
	root := t.TempDir()
	for s := 1; s <= 4; s++ {
		commitAs(t, root, s, "me")
	}
	errs := PruneWith(root, 1, "me", func(path string) error {
		if path == StepDir(root, 2) {
			return &os.PathError{Op: "unlinkat", Path: path, Err: syscall.EPERM}
		}
		return os.RemoveAll(path)
	})
	require.Len(t, errs, 1)
	assert.ErrorIs(t, errs[0], syscall.EPERM)
	assert.Contains(t, errs[0].Error(), StepDir(root, 2))
	es, err := List(root)
	require.NoError(t, err)
	require.Len(t, es, 2)
	assert.Equal(t, []int{2, 4}, []int{es[0].Step, es[1].Step})
}

// A save never writes into a complete checkpoint.
func TestSaveNeverReplacesACheckpoint(t *testing.T) {
	dir := writeCheckpoint(t)
	before, err := os.ReadFile(filepath.Join(dir, RankFile(0)))
	require.NoError(t, err)
	require.ErrorIs(t, WriteRankFile(dir, 0, []byte("other bytes")), ErrCommitted)
	require.ErrorIs(t, Claim(dir, "another run"), ErrCommitted)
	after, err := os.ReadFile(filepath.Join(dir, RankFile(0)))
	require.NoError(t, err)
	assert.Equal(t, before, after)
	_, err = Verify(dir)
	assert.NoError(t, err)
}

// The metadata's checksum covers every field; a version 1 checkpoint (no
// checksum) is refused naming its format.
func TestMetadataChecksum(t *testing.T) {
	dir := writeCheckpoint(t)
	path := filepath.Join(dir, MetadataFile)
	orig, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, edit := range [][2]string{{`"step": 7`, `"step": 3`}, {`"run_id": "test-run"`, `"run_id": "mine now"`}, {`"world_size": 1`, `"world_size": 2`}} {
		require.Contains(t, string(orig), edit[0])
		require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(orig), edit[0], edit[1], 1)), 0o644))
		_, err := Open(dir)
		require.ErrorIs(t, err, fileio.ErrCorrupt, edit[1])
	}
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(orig), Format, formatV1, 1)), 0o644))
	_, err = Open(dir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), formatV1)
	assert.False(t, errors.Is(err, fileio.ErrCorrupt))
	require.NoError(t, os.WriteFile(path, orig, 0o644))
	_, err = Open(dir)
	require.NoError(t, err)
}

// Commit replaced an existing metadata.json: a second run writing the same
// step directory (two runs given one checkpoint root) made the first run's
// complete checkpoint its own. A second Commit is refused (ErrCommitted) and
// the checkpoint stays the first run's.
func TestCommitNeverReplacesACheckpoint(t *testing.T) {
	dir := writeCheckpoint(t)
	before, err := os.ReadFile(filepath.Join(dir, MetadataFile))
	require.NoError(t, err)
	m, err := Open(dir)
	require.NoError(t, err)
	m.RunID, m.Checksum = "another run", ""
	err = Commit(dir, m)
	require.ErrorIs(t, err, ErrCommitted)
	assert.Contains(t, err.Error(), dir)
	after, err := os.ReadFile(filepath.Join(dir, MetadataFile))
	require.NoError(t, err)
	assert.Equal(t, string(before), string(after))
	left, err := filepath.Glob(filepath.Join(dir, ".*tmp*"))
	require.NoError(t, err)
	assert.Empty(t, left, "no temporary file is left behind")
}
