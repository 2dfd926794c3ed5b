package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// restartJob is the restart tests' command line after the command: a small
// tiny on 24 steps, a checkpoint every 2, every step logged (the signal hook
// of TestMain reads the step lines).
func restartJob(t *testing.T, dir string) []string {
	return []string{filepath.Join(recipesDir, "tiny.toml"), "--set", "data.path=" + smallCorpus(t, dir), "--num-layers", "1", "--hidden-size", "32",
		"--num-attention-heads", "2", "--num-query-groups", "2", "--ffn-hidden-size", "64", "--seq-length", "16", "--micro-batch-size", "1",
		"--global-batch-size", "4", "--train-iters", "24", "--set", "train.eval_interval=0", "--set", "logging.sample_tokens=0",
		"--log-interval", "1", "--save-interval", "2", "--resume", "auto"}
}

// seededSteps are n distinct steps from 2 to last-2, ascending, drawn from seed.
func seededSteps(seed uint64, n, last int) []int {
	rng := rand.New(rand.NewPCG(seed, 44))
	var out []int
	for len(out) < n {
		s := 2 + rng.IntN(last-3)
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// TestLaunchRestartsAfterKills: a launched 2-rank job whose rank 0 is killed
// (SIGKILL) three times, at seeded steps, finishes with --max-restarts 3,
// every rank restarted from the newest checkpoint; its losses and final
// weights equal an uninterrupted job's bit for bit. Each restart is logged,
// naming the killed rank, the signal and the checkpoint.
func TestLaunchRestartsAfterKills(t *testing.T) {
	dir := t.TempDir()
	job := append(restartJob(t, dir), "--set", "run.output_dir="+dir)
	env := []string{"SHARDLINE_TEST_AS_CLI=1"}
	code, _, errs := shardline(t, env, append([]string{"launch", "--nproc", "2"}, append(job, "--set", "run.name=whole")...)...)
	require.Equal(t, 0, code, errs)

	steps := seededSteps(44, 3, 24)
	markers := t.TempDir()
	env = append(env, "SHARDLINE_TEST_SIGNAL=KILL@"+joinInts(steps), "SHARDLINE_TEST_SIGNAL_DIR="+markers)
	code, _, errs = shardline(t, env, append([]string{"launch", "--nproc", "2", "--max-restarts", "3", "--restart-backoff", "50ms"},
		append(job, "--set", "run.name=killed")...)...)
	require.Equal(t, 0, code, errs)
	for i, s := range steps {
		assert.FileExists(t, filepath.Join(markers, "signalled-at-"+strconv.Itoa(s)), "rank 0 was killed at step %d", s)
		assert.Contains(t, errs, "restart "+strconv.Itoa(i+1)+" of 3 (--max-restarts)")
	}
	assert.Contains(t, errs, "rank 0 was killed by signal KILL")
	assert.Contains(t, errs, "every rank restarts from checkpoint "+filepath.Join(dir, "killed", "checkpoints", "step-"))
	assert.NotContains(t, errs, "restart 4 ")
	t.Logf("kills at steps %v:\n%s", steps, grepLines(errs, "shardline launch: restart", "resumed from checkpoint"))

	whole, killed := filepath.Join(dir, "whole"), filepath.Join(dir, "killed")
	a, b := must(os.ReadFile(filepath.Join(whole, "metrics.jsonl"))), must(os.ReadFile(filepath.Join(killed, "metrics.jsonl")))
	assert.Equal(t, curveLines(a), curveLines(b))
	assert.Len(t, curveLines(b), 24)
	assert.True(t, bytes.Equal(must(os.ReadFile(filepath.Join(whole, "weights.bin"))), must(os.ReadFile(filepath.Join(killed, "weights.bin")))), "final weights")
	info := must(os.ReadFile(filepath.Join(killed, "run.json")))
	assert.Contains(t, string(info), `"resumed_from": "`+filepath.Join(killed, "checkpoints", "step-"))
	assert.Contains(t, string(info), `"resumed_from_step": `)
}

// grepLines keeps the lines of s holding any of subs.
func grepLines(s string, subs ...string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		for _, sub := range subs {
			if strings.Contains(line, sub) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// TestLaunchDoesNotRestartOwnFailure: rank 1's data does not exist, so it
// exits 1 (a finding a restart cannot mend): launch ends the job at once
// under --max-restarts 3, saying why it did not restart.
func TestLaunchDoesNotRestartOwnFailure(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "x0.txt"), []byte(strings.Repeat("some text here. ", 100)), 0o644))
	code, _, errs := shardline(t, []string{"SHARDLINE_TEST_AS_CLI=1"}, "launch", "--nproc", "2", "--grace", "2s", "--max-restarts", "3", filepath.Join(recipesDir, "tiny.toml"),
		"--set", "data.path="+filepath.Join(dir, "x${RANK}.txt"), "--seq-length", "16", "--global-batch-size", "32", "--train-iters", "50",
		"--set", "run.output_dir="+dir, "--save-interval", "10", "--resume", "auto")
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "rank 1 exited with status 1")
	assert.Contains(t, errs, "; not restarted: a rank failed on its own account")
	assert.NotContains(t, errs, "restart 1 of 3")
}

// TestMaxRestartsNeedsResumeAuto: --max-restarts without the ranks' --resume
// auto (or with --resume naming one checkpoint) is refused before any rank
// starts, as are negative counts and back-offs; --resume auto on a recipe
// that writes no checkpoints is refused too.
func TestMaxRestartsNeedsResumeAuto(t *testing.T) {
	dir := t.TempDir()
	tiny := filepath.Join(recipesDir, "tiny.toml")
	out := "run.output_dir=" + dir
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"launch", "--nproc", "2", "--max-restarts", "2", tiny, "--global-batch-size", "32", "--set", out, "--save-interval", "5"}, "give --resume auto after the recipe"},
		{[]string{"launch", "--nproc", "2", "--max-restarts", "2", tiny, "--global-batch-size", "32", "--set", out, "--save-interval", "5", "--resume", "latest"}, "--resume latest names one checkpoint, which every restart would go back to"},
		{[]string{"launch", "--nproc", "2", "--max-restarts", "-1", tiny}, "--max-restarts -1 must not be negative"},
		{[]string{"launch", "--nproc", "2", "--restart-backoff", "-1s", tiny}, "--restart-backoff -1s must not be negative"},
		{[]string{"run", tiny, "--set", out, "--resume", "auto"}, "--resume auto: the recipe writes no checkpoints"},
	} {
		code, _, errs := shardline(t, nil, c.args...)
		assert.Equal(t, 2, code, "%v: %s", c.args, errs)
		assert.Contains(t, errs, c.want, "%v", c.args)
	}
}

// TestRestartDelay: the back-off doubles from the first wait and stops at
// maxBackoff.
func TestRestartDelay(t *testing.T) {
	var got []time.Duration
	for n := range 8 {
		got = append(got, restartDelay(time.Second, n))
	}
	assert.Equal(t, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute}, got)
	assert.Equal(t, time.Duration(0), restartDelay(0, 3))
	assert.Equal(t, time.Minute, restartDelay(time.Hour, 0))
	assert.Equal(t, time.Minute, restartDelay(time.Second, 1000), "no overflow")
}

// runCLI runs this test binary as the shardline CLI (TestMain) with env
// added, and returns its exit status and output.
func runCLI(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	c := exec.Command(exe, args...)
	c.Env = append(append(os.Environ(), "SHARDLINE_TEST_AS_CLI=1"), env...)
	out, err := c.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	require.NoError(t, err)
	return 0, string(out)
}

// TestResumeAutoTwice: one command line with --resume auto, run twice, the
// first run interrupted (SIGINT at a seeded step: it saves and exits 130),
// equals one uninterrupted run bit for bit, on one rank and on two in
// process. The second run continues the first's directory in place, and its
// log and run.json name the checkpoint and step. A first run killed
// (SIGKILL) before its first checkpoint leaves an unfinished run directory,
// which the next run retakes rather than starting beside it.
func TestResumeAutoTwice(t *testing.T) {
	dir := t.TempDir()
	job := restartJob(t, dir)
	for _, nproc := range []string{"1", "2"} {
		whole, stopped := filepath.Join(dir, "whole"+nproc), filepath.Join(dir, "stopped"+nproc)
		args := append([]string{"run", "--nproc", nproc}, job...)
		code, out := runCLI(t, nil, append(args, "--set", "run.output_dir="+whole)...)
		require.Equal(t, 0, code, out)

		step := seededSteps(uint64(len(nproc))+7, 1, 24)[0]
		line := append(args, "--set", "run.output_dir="+stopped)
		code, out = runCLI(t, []string{"SHARDLINE_TEST_SIGNAL=INT@" + strconv.Itoa(step), "SHARDLINE_TEST_SIGNAL_DIR=" + t.TempDir()}, line...)
		require.Equal(t, 130, code, out)
		code, out = runCLI(t, nil, line...)
		require.Equal(t, 0, code, out)
		assert.Contains(t, out, `"message":"resumed from checkpoint"`)
		assert.Contains(t, out, `"continues":"its run directory, in place"`)

		a, b := must(os.ReadFile(filepath.Join(whole, "tiny", "metrics.jsonl"))), must(os.ReadFile(filepath.Join(stopped, "tiny", "metrics.jsonl")))
		assert.Equal(t, curveLines(a), curveLines(b), "nproc %s, interrupted at step %d", nproc, step)
		assert.True(t, bytes.Equal(must(os.ReadFile(filepath.Join(whole, "tiny", "weights.bin"))), must(os.ReadFile(filepath.Join(stopped, "tiny", "weights.bin")))),
			"nproc %s: final weights", nproc)
		var info struct {
			ResumedFrom     string `json:"resumed_from"`
			ResumedFromStep *int   `json:"resumed_from_step"`
		}
		require.NoError(t, json.Unmarshal(must(os.ReadFile(filepath.Join(stopped, "tiny", "run.json"))), &info))
		require.NotNil(t, info.ResumedFromStep)
		assert.Equal(t, filepath.Join(stopped, "tiny", "checkpoints", fmt.Sprintf("step-%08d", *info.ResumedFromStep)), info.ResumedFrom)
		assert.NoDirExists(t, filepath.Join(stopped, "tiny-2"), "the second run continued the first's directory")
	}

	// Killed before its first checkpoint (step 1; checkpoints every 2 steps):
	// the next run retakes tiny/ and finishes there.
	killed := filepath.Join(dir, "killed")
	line := append(append([]string{"run"}, job...), "--set", "run.output_dir="+killed)
	code, out := runCLI(t, []string{"SHARDLINE_TEST_SIGNAL=KILL@1", "SHARDLINE_TEST_SIGNAL_DIR=" + t.TempDir()}, line...)
	require.Equal(t, -1, code, "killed by SIGKILL: %s", out)
	code, out = runCLI(t, nil, line...)
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "--resume auto: no complete checkpoint under the checkpoint root; starting a new run")
	assert.NoDirExists(t, filepath.Join(killed, "tiny-2"))
	assert.True(t, bytes.Equal(must(os.ReadFile(filepath.Join(dir, "whole1", "tiny", "weights.bin"))), must(os.ReadFile(filepath.Join(killed, "tiny", "weights.bin")))))
}

// TestRunFromAnyDirectory: `shardline run` with no recipe, in a directory
// that holds no recipes/ (a fresh temporary one), trains the default recipe
// shipped inside the binary, and run.json says so (recipe_files); an unknown
// shipped: name is refused, listing the shipped ones.
func TestRunFromAnyDirectory(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	cwd := t.TempDir()
	c := exec.Command(exe, "run", "--train-iters", "3", "--set", "logging.sample_tokens=0", "--set", "train.eval_interval=0")
	c.Dir = cwd
	c.Env = append(os.Environ(), "SHARDLINE_TEST_AS_CLI=1")
	out, err := c.CombinedOutput()
	require.NoError(t, err, "%s", out)
	var info struct {
		RecipeFiles []string `json:"recipe_files"`
		Name        string   `json:"name"`
	}
	require.NoError(t, json.Unmarshal(must(os.ReadFile(filepath.Join(cwd, "runs", "tiny", "run.json"))), &info))
	assert.Equal(t, []string{"shipped:tiny.toml"}, info.RecipeFiles)
	assert.Equal(t, "tiny", info.Name)
	assert.Len(t, curveLines(must(os.ReadFile(filepath.Join(cwd, "runs", "tiny", "metrics.jsonl")))), 3)

	code, _, errs := shardline(t, nil, "run", "shipped:nope")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "this shardline ships no recipe nope.toml; the shipped ones are shipped:dense-125m, ")
}

// TestResumeAutoWithInitFrom: --init-from with --resume auto starts from the
// Hugging Face weights when there is no checkpoint, and continues the
// checkpoint when there is one (saying that --init-from is not applied):
// the same command line run twice, the first time interrupted, equals one
// uninterrupted fine-tuning run bit for bit. --init-from with any other
// --resume is refused.
func TestResumeAutoWithInitFrom(t *testing.T) {
	dir := t.TempDir()
	job := restartJob(t, dir)
	base := filepath.Join(dir, "base")
	code, out := runCLI(t, nil, append(append([]string{"run"}, job...), "--set", "run.output_dir="+base, "--train-iters", "4")...)
	require.Equal(t, 0, code, out)
	hf := filepath.Join(dir, "hf")
	code, _, errs := shardline(t, nil, "ckpt", "export", filepath.Join(base, "tiny"), "-o", hf)
	require.Equal(t, 0, code, errs)

	line := append(append([]string{"run"}, job...), "--init-from", hf)
	whole, stopped := filepath.Join(dir, "whole"), filepath.Join(dir, "stopped")
	code, out = runCLI(t, nil, append(line, "--set", "run.output_dir="+whole)...)
	require.Equal(t, 0, code, out)
	again := append(line, "--set", "run.output_dir="+stopped)
	code, out = runCLI(t, []string{"SHARDLINE_TEST_SIGNAL=INT@9", "SHARDLINE_TEST_SIGNAL_DIR=" + t.TempDir()}, again...)
	require.Equal(t, 130, code, out)
	code, out = runCLI(t, nil, again...)
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "--init-from applies only to a run that starts")
	assert.Equal(t, curveLines(must(os.ReadFile(filepath.Join(whole, "tiny", "metrics.jsonl")))), curveLines(must(os.ReadFile(filepath.Join(stopped, "tiny", "metrics.jsonl")))))
	assert.True(t, bytes.Equal(must(os.ReadFile(filepath.Join(whole, "tiny", "weights.bin"))), must(os.ReadFile(filepath.Join(stopped, "tiny", "weights.bin")))), "final weights")

	code, _, errs = shardline(t, nil, "run", filepath.Join(recipesDir, "tiny.toml"), "--init-from", hf, "--resume", "latest")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "--init-from and --resume latest both say where to start")
}

// TestLaunchRestartsRunOut: killed twice under --max-restarts 1, the job
// restarts once and then ends, saying that no restart is left.
func TestLaunchRestartsRunOut(t *testing.T) {
	dir := t.TempDir()
	env := []string{"SHARDLINE_TEST_AS_CLI=1", "SHARDLINE_TEST_SIGNAL=KILL@3,6", "SHARDLINE_TEST_SIGNAL_DIR=" + t.TempDir()}
	code, _, errs := shardline(t, env, append([]string{"launch", "--nproc", "2", "--max-restarts", "1", "--restart-backoff", "10ms"},
		append(restartJob(t, dir), "--set", "run.output_dir="+dir)...)...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "restart 1 of 1 (--max-restarts)")
	assert.Contains(t, errs, "rank 0 was killed by signal KILL")
	assert.Contains(t, errs, "; not restarted: --max-restarts 1: no restart is left")
}

// TestNotRestarted: why launch ends a failed job rather than restart it.
func TestNotRestarted(t *testing.T) {
	crash, own := &rankFailure{restartable: true}, &rankFailure{}
	assert.Equal(t, "", crash.notRestarted(0, 3, false))
	assert.Equal(t, "", crash.notRestarted(2, 3, false))
	assert.Equal(t, "--max-restarts 3: no restart is left", crash.notRestarted(3, 3, false))
	assert.Equal(t, "launch was interrupted", crash.notRestarted(1, 3, true))
	assert.Contains(t, own.notRestarted(0, 3, false), "a rank failed on its own account")
	assert.Contains(t, own.notRestarted(3, 3, true), "a rank failed on its own account", "the cause comes first")
}
