package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardline/shardline/trainer/ckpt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// longJob is a launch of two ranks that trains until stopped.
func longJob(t *testing.T, dir string, extra ...string) []string {
	return append([]string{"launch", "--nproc", "2", "--grace", "30s", filepath.Join(recipesDir, "tiny.toml"), "--num-layers", "1", "--hidden-size", "32",
		"--num-attention-heads", "2", "--num-query-groups", "2", "--ffn-hidden-size", "64", "--seq-length", "16", "--micro-batch-size", "1",
		"--global-batch-size", "2", "--train-iters", "1000000", "--set", "train.eval_interval=0", "--set", "run.output_dir=" + dir}, extra...)
}

// waitForSteps waits until rank 0 of the job in dir has recorded n steps.
func waitForSteps(t *testing.T, dir string, n int, out fmt.Stringer) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join(dir, "tiny", "metrics.jsonl"))
		if bytes.Count(b, []byte("\n")) >= n {
			return
		}
		require.True(t, time.Now().Before(deadline), "the job did not start: %s", out)
		time.Sleep(20 * time.Millisecond)
	}
}

// childWithEnv finds the child process of parent whose environment holds kv.
func childWithEnv(t *testing.T, parent int, kv string) int {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*")
	require.NoError(t, err)
	for _, d := range dirs {
		stat, err := os.ReadFile(filepath.Join(d, "stat"))
		if err != nil {
			continue
		}
		var pid, ppid int
		var state string
		after := stat[bytes.LastIndexByte(stat, ')')+2:]
		if _, err := fmt.Sscan(string(stat[:bytes.IndexByte(stat, ' ')]), &pid); err != nil {
			continue
		}
		if _, err := fmt.Sscan(string(after), &state, &ppid); err != nil || ppid != parent {
			continue
		}
		env, err := os.ReadFile(filepath.Join(d, "environ"))
		if err == nil && bytes.Contains(append([]byte{0}, env...), []byte("\x00"+kv+"\x00")) {
			return pid
		}
	}
	t.Fatalf("no child of %d has %s", parent, kv)
	return 0
}

// startCLI starts this test binary as the shardline CLI with args, its output
// collected in the returned buffer; the process is killed when the test ends.
func startCLI(t *testing.T, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	c := exec.Command(exe, args...)
	c.Env = append(os.Environ(), "SHARDLINE_TEST_AS_CLI=1")
	out := &bytes.Buffer{}
	c.Stdout, c.Stderr = out, out
	require.NoError(t, c.Start())
	t.Cleanup(func() { c.Process.Kill() })
	return c, out
}

// A rank that is stopped (SIGSTOP) ends the job within --comm-timeout, not after
// the grace period, and launch names it.
func TestStoppedRankEndsTheJob(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc to find and inspect the ranks")
	}
	dir := t.TempDir()
	launch, out := startCLI(t, longJob(t, dir, "--comm-timeout", "3s")...)
	waitForSteps(t, dir, 3, out)
	rank1 := childWithEnv(t, launch.Process.Pid, "RANK=1")
	require.NoError(t, syscall.Kill(rank1, syscall.SIGSTOP))
	stopped := time.Now()
	err := launch.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	assert.Equal(t, 1, ee.ExitCode())
	// The bound is the 3 s timeout plus slack for a loaded machine; before, every
	// later collective waited out a timeout of its own (5 × 3 s) and the stopped
	// rank got the 30 s grace.
	assert.Less(t, time.Since(stopped), 10*time.Second, "%s", out)
	assert.Contains(t, out.String(), "rank [1] was stopped (process state T")
	assert.ErrorIs(t, syscall.Kill(rank1, 0), syscall.ESRCH, "rank 1 was killed (and reaped)")
	t.Logf("the job ended %v after rank 1 stopped", time.Since(stopped).Round(time.Millisecond))
}

// Ctrl-C (SIGINT) to launch stops every rank, and launch exits 130, as run does.
func TestLaunchInterruptExits130(t *testing.T) {
	dir := t.TempDir()
	launch, out := startCLI(t, longJob(t, dir)...)
	waitForSteps(t, dir, 3, out)
	require.NoError(t, launch.Process.Signal(os.Interrupt))
	err := launch.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	assert.Equal(t, 130, ee.ExitCode(), "%s", out)
	assert.Contains(t, out.String(), "interrupted")
	assert.True(t, strings.Contains(out.String(), "weights") || strings.Contains(out.String(), "run directory"), "rank 0 wrote its outputs: %s", out)
}

// Misused commands name the real problem, and refuse before any work starts.
func TestMisusedCommandsNameTheProblem(t *testing.T) {
	dir := t.TempDir()
	tiny := filepath.Join(recipesDir, "tiny.toml")
	text := smallCorpus(t, dir)
	short := []string{"--train-iters", "1", "--set", "run.output_dir=" + dir, "--set", "data.path=" + text}
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"nproc 0", append([]string{"run", tiny, "--nproc", "0"}, short...), 2, "--nproc 0: give a positive rank count"},
		{"nproc -1", append([]string{"run", tiny, "--nproc", "-1"}, short...), 2, "--nproc -1: give a positive rank count"},
		// The rank count a recipe's batch cannot split over is blamed on --nproc, the flag given.
		{"nproc the batch does not divide", append([]string{"run", tiny, "--nproc", "3"}, short...), 1, "flag --nproc: error[SL206]"},
		{"trace in a missing directory", append([]string{"run", tiny, "--trace", filepath.Join(dir, "no", "such", "trace.json")}, short...), 2, "--trace"},
		{"trace is a directory", append([]string{"run", tiny, "--trace", dir}, short...), 2, "is a directory"},
		{"comm timeout 0", append([]string{"run", tiny, "--comm-timeout", "0s"}, short...), 2, "--comm-timeout 0s must be positive"},
		{"prepare a missing text", []string{"data", "prepare", "-o", filepath.Join(dir, "out"), filepath.Join(dir, "missing.txt")}, 2, "source " + filepath.Join(dir, "missing.txt") + " does not exist"},
		{"prepare a device", []string{"data", "prepare", "-o", filepath.Join(dir, "out"), "/dev/zero"}, 2, "source /dev/zero is not a regular file (a device)"},
		{"prepare NaN validation", []string{"data", "prepare", "--val-fraction", "NaN", "-o", filepath.Join(dir, "out"), text}, 2, "--val-fraction NaN"},
		{"sample at NaN temperature", []string{"sample", "--temperature", "NaN", dir}, 2, "--temperature NaN must be a finite number"},
		{"sample at infinite temperature", []string{"sample", "--temperature", "+Inf", dir}, 2, "--temperature +Inf must be a finite number"},
		{"lint a device", []string{"lint", "/dev/zero"}, 2, "recipe /dev/zero is not a regular file (a device)"},
		{"train on a device", []string{"run", tiny, "--train-iters", "1", "--set", "run.output_dir=" + dir, "--set", "data.path=/dev/zero"}, 1, "not a regular file (a device)"},
		{"NaN learning rate", append([]string{"run", tiny, "--lr", "NaN"}, short...), 1, "train.lr (nan) must be a finite number"},
		{"run name escapes", append([]string{"run", tiny, "--set", "run.name=../out"}, short...), 1, "SL009"},
		{"torch_dist checkpoints asked for", append([]string{"run", tiny, "--save-interval", "5", "--ckpt-format", "torch_dist"}, short...), 1, `checkpoint.ckpt_format ("torch_dist") must be "fsdp_dtensor" with Megatron-FSDP`},
		{"resume from nothing", append([]string{"run", tiny, "--resume", filepath.Join(dir, "nothing")}, short...), 2, "--resume " + filepath.Join(dir, "nothing") + ": no checkpoints"},
		{"resume latest without checkpoints", append([]string{"run", tiny, "--resume", "latest"}, short...), 2, "--resume latest: no checkpoints"},
		{"negative stop-after", append([]string{"run", tiny, "--stop-after", "-1"}, short...), 2, "--stop-after -1 must not be negative"},
		{"ten thousand layers", []string{"lint", tiny, "--num-layers", "10000"}, 1, "model.layers (10000) must be ≤ 4096"},
		{"hidden and vocabulary of 2^62", []string{"lint", tiny, "--hidden-size", "4611686018427387904", "--vocab-size", "4611686018427387904"}, 1, "must be ≤ 262144"},
		{"a million sampled tokens and more", []string{"sample", "--tokens", "1048577", dir}, 2, "--tokens 1048577 must be between 1 and 1048576"},
		{"negative grace", []string{"launch", "--nproc", "2", "--grace", "-1s", tiny}, 2, "--grace -1s must not be negative"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, errs := shardline(t, nil, c.args...)
			assert.Equal(t, c.code, code, errs)
			assert.Contains(t, out+errs, c.want) // lint's findings go to stdout
		})
	}
	_, err := os.Stat(filepath.Join(dir, "tiny"))
	assert.ErrorIs(t, err, os.ErrNotExist, "no refused command started a run")
}

// A run killed (SIGKILL) at an arbitrary moment of its saves leaves its newest
// complete checkpoint whole: it opens, verifies and resumes. SIGTERM (a cluster's
// preemption) saves the state at the step it stops and exits 130.
func TestKilledDuringSavesLeavesCheckpointsWhole(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			text := smallCorpus(t, dir)
			c, out := startCLI(t, "run", filepath.Join(recipesDir, "tiny.toml"), "--set", "data.path="+text, "--seq-length", "16", "--micro-batch-size", "2",
				"--global-batch-size", "2", "--train-iters", "1000000", "--set", "train.eval_interval=0", "--set", "run.output_dir="+dir,
				"--save-interval", "1", "--set", "checkpoint.keep_last=3", "--set", "logging.format=json")
			waitForSteps(t, dir, 6, out)
			require.NoError(t, c.Process.Signal(sig))
			err := c.Wait()
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee)
			root := filepath.Join(dir, "tiny", "checkpoints")
			latest, err := ckpt.Latest(root)
			require.NoError(t, err, "%s", out)
			_, err = ckpt.Verify(latest)
			require.NoError(t, err)
			if sig == syscall.SIGTERM {
				assert.Equal(t, 130, ee.ExitCode(), "%s", out)
				m, err := ckpt.Open(latest)
				require.NoError(t, err)
				b, _ := os.ReadFile(filepath.Join(dir, "tiny", "metrics.jsonl"))
				assert.Equal(t, bytes.Count(b, []byte("\n")), m.Step, "the stop's step is saved")
			}
			code, _, errs := shardline(t, nil, "run", "--resume", filepath.Join(dir, "tiny"), "--train-iters", "12", "--set", "data.path="+text)
			require.Equal(t, 0, code, errs)
		})
	}
}
