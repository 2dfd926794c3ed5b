package main

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ckpt ls takes a checkpoint's step from its metadata.json, not from its
// directory's name, and says when the two disagree (before, a checkpoint of
// step 2 renamed step-00000009 was listed as step 9).
func TestCkptLsStepFromMetadata(t *testing.T) {
	dir := t.TempDir()
	writeText(t, dir)
	code, _, errs := shardline(t, nil, tinyArgs(dir, "r", "--set", "checkpoint.interval=2", "--train-iters", "2")...)
	require.Equal(t, 0, code, errs)
	root := filepath.Join(dir, "runs", "r", "checkpoints")
	require.NoError(t, os.Rename(filepath.Join(root, "step-00000002"), filepath.Join(root, "step-00000009")))
	code, out, errs := shardline(t, nil, "ckpt", "ls", filepath.Join(dir, "runs", "r"))
	require.Equal(t, 0, code, errs)
	assert.Regexp(t, regexp.MustCompile(`(?m)^2 +complete, but its directory is named for step 9 +1 `), out)
	assert.NotRegexp(t, regexp.MustCompile(`(?m)^9 `), out)
}
