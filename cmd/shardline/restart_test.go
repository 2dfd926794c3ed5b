package main

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

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
