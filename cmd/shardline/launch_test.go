package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMain lets launch re-execute this test binary as shardline: with
// SHARDLINE_TEST_AS_CLI=1 it runs the CLI instead of the tests.
func TestMain(m *testing.M) {
	if os.Getenv("SHARDLINE_TEST_AS_CLI") == "1" {
		os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr, os.Environ()))
	}
	os.Exit(m.Run())
}

func losses(t *testing.T, dir string) []float64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "metrics.jsonl"))
	require.NoError(t, err)
	var out []float64
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var m struct{ Loss float64 }
		require.NoError(t, json.Unmarshal(line, &m))
		out = append(out, m.Loss)
	}
	return out
}

// TestLaunchMatchesInProcess: two ranks as processes over TCP train the same
// losses as two ranks as goroutines (the ring sums in another order: 1e-5).
func TestLaunchMatchesInProcess(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "t.txt")
	require.NoError(t, os.WriteFile(text, []byte(strings.Repeat("abcd efgh ijkl mnop. ", 200)), 0o644))
	common := []string{filepath.Join(recipesDir, "tiny.toml"), "--set", "data.path=" + text, "--num-layers", "1", "--hidden-size", "32",
		"--num-attention-heads", "2", "--num-query-groups", "2", "--ffn-hidden-size", "64", "--seq-length", "16", "--micro-batch-size", "2",
		"--global-batch-size", "8", "--train-iters", "4", "--set", "train.eval_interval=0"}
	env := []string{"SHARDLINE_TEST_AS_CLI=1"}
	code, _, errs := shardline(t, env, append(append([]string{"launch", "--nproc", "2"}, common...), "--set", "run.output_dir="+dir, "--set", "run.name=tcp")...)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, errs, `"rank":1`, "every rank logs with its rank")
	code, _, errs = shardline(t, nil, append(append([]string{"run", "--nproc", "2"}, common...), "--set", "run.output_dir="+dir, "--set", "run.name=inproc")...)
	require.Equal(t, 0, code, errs)
	a, b := losses(t, filepath.Join(dir, "tcp")), losses(t, filepath.Join(dir, "inproc"))
	require.Len(t, a, 4)
	for i := range a {
		assert.InDelta(t, b[i], a[i], 1e-5*b[i], "step %d", i+1)
	}
}

// TestLaunchStopsAllWhenOneFails: rank 1's data does not exist; launch stops rank
// 0 (waiting for rank 1 at the rendezvous or a collective) and names rank 1.
func TestLaunchStopsAllWhenOneFails(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "x0.txt"), []byte(strings.Repeat("some text here. ", 100)), 0o644))
	start := time.Now()
	code, _, errs := shardline(t, []string{"SHARDLINE_TEST_AS_CLI=1"}, "launch", "--nproc", "2", "--grace", "2s", filepath.Join(recipesDir, "tiny.toml"),
		"--set", "data.path="+filepath.Join(dir, "x${RANK}.txt"), "--seq-length", "16", "--train-iters", "50", "--set", "run.output_dir="+dir)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "rank 1 exited with status 1")
	assert.Less(t, time.Since(start), 60*time.Second)
}

func TestJobEnvironment(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		rank int
		err  string
	}{
		{map[string]string{"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1", "SHARDLINE_JOB_TOKEN": "t"}, 1, ""},
		{map[string]string{"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1", "SHARDLINE_JOB_TOKEN": "t"}, 3, ""},
		{map[string]string{"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1", "SHARDLINE_JOB_TOKEN": "t"}, 2, ""},
		{map[string]string{"RANK": "1", "WORLD_SIZE": "4", "SHARDLINE_JOB_TOKEN": "t"}, 0, "MASTER_ADDR and MASTER_PORT are not set"},
		{map[string]string{"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, 0, "SHARDLINE_JOB_TOKEN is not set"},
		{map[string]string{"RANK": "5", "WORLD_SIZE": "4"}, 0, "do not name a rank"},
	} {
		j, err := detectJob(tc.env)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err)
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, tc.rank, j.rank)
		assert.Equal(t, 4, j.world)
	}
	j, err := detectJob(map[string]string{"PATH": "/bin"})
	assert.NoError(t, err)
	assert.Nil(t, j)
}
