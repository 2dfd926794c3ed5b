package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/shardline/shardline/trainer/ckpt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// smallRun is a run of the tiny recipe on text, into dir, quick per step.
func smallRun(text, dir string, extra ...string) []string {
	return append([]string{"run", filepath.Join(recipesDir, "tiny.toml"), "--set", "data.path=" + text, "--seq-length", "16", "--micro-batch-size", "2",
		"--global-batch-size", "2", "--set", "train.eval_interval=0", "--set", "run.output_dir=" + dir, "--set", "logging.sample_tokens=0"}, extra...)
}

// The example: two processes resuming the same run directory at once
// both ran, and left "complete" checkpoints that failed ckpt verify. The
// second is now refused while the first runs, naming the first's pid, and
// every checkpoint the first leaves verifies.
func TestTwoProcessesCannotResumeOneRunDirectory(t *testing.T) {
	dir := t.TempDir()
	text := smallCorpus(t, dir)
	code, _, errs := shardline(t, nil, smallRun(text, dir, "--train-iters", "4", "--save-interval", "2")...)
	require.Equal(t, 0, code, errs)
	run := filepath.Join(dir, "tiny")

	first, out := startCLI(t, "run", "--resume", run, "--train-iters", "1000000", "--set", "data.path="+text, "--set", "logging.format=json")
	waitForSteps(t, dir, 6, out)
	code, _, errs = shardline(t, nil, "run", "--resume", run, "--train-iters", "8", "--set", "data.path="+text)
	assert.NotEqual(t, 0, code, "the second writer of %s ran", run)
	assert.Contains(t, errs, fmt.Sprintf("process %d", first.Process.Pid))
	assert.Contains(t, errs, fmt.Sprintf("kill %d", first.Process.Pid))

	require.NoError(t, first.Process.Signal(syscall.SIGTERM))
	err := first.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	assert.Equal(t, 130, ee.ExitCode(), "%s", out)
	es, err := ckpt.List(filepath.Join(run, "checkpoints"))
	require.NoError(t, err)
	for _, e := range es {
		if e.Complete {
			_, err := ckpt.Verify(e.Dir)
			assert.NoError(t, err, e.Dir)
		}
	}
}
