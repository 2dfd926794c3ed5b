package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
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

// A lost rank (rank 1 of a launched job, SIGKILLed mid-run) left run.json
// with neither result nor failure and run.log silent. Rank 0 now records
// the failure in both.
func TestLostRankOfAJobIsRecorded(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc to find the ranks")
	}
	dir := t.TempDir()
	launch, out := startCLI(t, longJob(t, dir, "--set", "logging.format=json")...)
	waitForSteps(t, dir, 3, out)
	require.NoError(t, syscall.Kill(childWithEnv(t, launch.Process.Pid, "RANK=1"), syscall.SIGKILL))
	err := launch.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)

	var info map[string]any
	require.NoError(t, json.Unmarshal(must(os.ReadFile(filepath.Join(dir, "tiny", "run.json"))), &info))
	assert.Nil(t, info["result"], "%s", out)
	assert.NotEmpty(t, info["failure"], "run.json says how the run ended: %s", out)
	lines := bytes.Split(bytes.TrimSpace(must(os.ReadFile(filepath.Join(dir, "tiny", "run.log")))), []byte("\n"))
	var last map[string]any
	require.NoError(t, json.Unmarshal(lines[len(lines)-1], &last))
	assert.Equal(t, "error", last["level"], "run.log says why: %s", lines[len(lines)-1])
	assert.Equal(t, info["failure"], last["error"])
	t.Logf("run.json failure: %v", info["failure"])
}
