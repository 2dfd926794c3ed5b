package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardline/shardline/trainer/ckpt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// syncBuffer is an output buffer a test can read while a process writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor waits until out holds want, failing after a minute (the process did
// not get there at all).
func waitFor(t *testing.T, out *syncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(out.String(), want) {
		require.True(t, time.Now().Before(deadline), "no %q in:\n%s", want, out)
		time.Sleep(20 * time.Millisecond)
	}
}

// exitOf waits up to two minutes for c to exit and returns its exit status;
// a process still running then is killed and the test fails: a signal it was
// given was swallowed.
func exitOf(t *testing.T, c *exec.Cmd, out *syncBuffer) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err == nil {
			return 0
		}
		require.ErrorAs(t, err, &ee)
		return ee.ExitCode()
	case <-time.After(2 * time.Minute):
		c.Process.Kill()
		<-done
		t.Fatalf("still running two minutes after the signal:\n%s", out)
		return 0
	}
}

// rankCmd is rank `rank` of a job of `world` processes running `shardline run
// args` with the job's rendezvous at port.
func rankCmd(t *testing.T, rank, world, port int, out *syncBuffer, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	c := exec.Command(exe, append([]string{"run"}, args...)...)
	c.Env = append(os.Environ(), "SHARDLINE_TEST_AS_CLI=1", "RANK="+strconv.Itoa(rank), "WORLD_SIZE="+strconv.Itoa(world), "MASTER_ADDR=127.0.0.1",
		"MASTER_PORT="+strconv.Itoa(port), "SHARDLINE_JOB_TOKEN=ranks-test")
	c.Stdout, c.Stderr = out, out
	t.Cleanup(func() {
		if c.Process != nil {
			c.Process.Kill()
		}
	})
	return c
}

// smallJobArgs is a small model that trains until stopped, saving a checkpoint
// under dir/ckpt when it stops (the end's, or an interrupt's).
func smallJobArgs(dir string, extra ...string) []string {
	return append([]string{filepath.Join(recipesDir, "tiny.toml"), "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
		"--num-query-groups", "2", "--ffn-hidden-size", "64", "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "2",
		"--train-iters", "1000000", "--set", "train.eval_interval=0", "--set", "run.output_dir=" + dir, "--save", filepath.Join(dir, "ckpt"),
		"--set", "logging.format=json"}, extra...)
}

// stoppedAtOneStep checks the job in dir stopped on an interrupt with one
// checkpoint, of the step its metrics end at, and returns that step.
func stoppedAtOneStep(t *testing.T, dir string, out *syncBuffer) int {
	t.Helper()
	latest, err := ckpt.Latest(filepath.Join(dir, "ckpt"))
	require.NoError(t, err, "%s", out)
	_, err = ckpt.Verify(latest)
	require.NoError(t, err)
	m, err := ckpt.Open(latest)
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(dir, "tiny", "metrics.jsonl"))
	require.NoError(t, err)
	assert.Equal(t, bytes.Count(b, []byte("\n")), m.Step, "the checkpoint is of the step every rank stopped at")
	assert.Contains(t, out.String(), `"ranks_interrupted":1`, "rank 0 says one rank was interrupted")
	return m.Step
}

// SIGTERM to rank 1 of a launched job, after rank 0 has logged step 3, stops
// every rank at one step with one checkpoint, and launch exits 130. It was
// swallowed: the job ran to its end (here, a million steps) and took no
// checkpoint.
func TestSignalToAnyRankStopsTheJob(t *testing.T) {
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("needs /proc to find the ranks")
	}
	dir := t.TempDir()
	text := smallCorpus(t, dir)
	out := &syncBuffer{}
	launch := exec.Command(mustExe(t), append([]string{"launch", "--nproc", "2", "--grace", "60s"}, smallJobArgs(dir, "--set", "data.path="+text, "--log-interval", "1")...)...)
	launch.Env = append(os.Environ(), "SHARDLINE_TEST_AS_CLI=1")
	launch.Stdout, launch.Stderr = out, out
	require.NoError(t, launch.Start())
	t.Cleanup(func() { launch.Process.Kill() })
	waitFor(t, out, `"step":3,`)
	require.NoError(t, syscall.Kill(childWithEnv(t, launch.Process.Pid, "RANK=1"), syscall.SIGTERM))
	assert.Equal(t, 130, exitOf(t, launch, out), "%s", out)
	assert.Contains(t, out.String(), "a rank was signalled")
	assert.GreaterOrEqual(t, stoppedAtOneStep(t, dir, out), 3)
}

// SIGTERM to rank 1 while it waits at the rendezvous for rank 0 (start-up)
// stops the job at its first step boundary: both ranks exit 130, with one
// checkpoint of step 0.
func TestSignalAtStartUpStopsTheJob(t *testing.T) {
	dir := t.TempDir()
	text := smallCorpus(t, dir)
	port := freePort(t)
	out0, out1 := &syncBuffer{}, &syncBuffer{}
	args := smallJobArgs(dir, "--set", "data.path="+text)
	r1 := rankCmd(t, 1, 2, port, out1, args...)
	require.NoError(t, r1.Start())
	waitFor(t, out1, "joining the job") // rank 1 is at the rendezvous, rank 0 not started
	require.NoError(t, r1.Process.Signal(syscall.SIGTERM))
	r0 := rankCmd(t, 0, 2, port, out0, args...)
	require.NoError(t, r0.Start())
	assert.Equal(t, 130, exitOf(t, r0, out0), "rank 0: %s", out0)
	assert.Equal(t, 130, exitOf(t, r1, out1), "rank 1: %s", out1)
	assert.Equal(t, 0, stoppedAtOneStep(t, dir, out0), "stopped before the first step")
}

// A rank killed by SIGKILL is named with the signal and what it usually means
// (it was "rank 1 exited with status -1").
func TestKilledRankIsNamedWithItsSignal(t *testing.T) {
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("needs /proc to find the ranks")
	}
	dir := t.TempDir()
	launch, out := startCLI(t, longJob(t, dir)...)
	waitForSteps(t, dir, 3, out)
	require.NoError(t, syscall.Kill(childWithEnv(t, launch.Process.Pid, "RANK=1"), syscall.SIGKILL))
	err := launch.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	assert.Equal(t, 1, ee.ExitCode())
	assert.Contains(t, out.String(), "rank 1 was killed by signal KILL, which cannot be caught: most often the kernel's out-of-memory killer")
	assert.NotContains(t, out.String(), "status -1")
}

// launch checks the command line and recipe once, before starting any rank: an
// error is printed once (it was printed by each of the N ranks), and a world
// size the batch does not divide is blamed on --nproc, the flag typed (it was
// "flag --world-size").
func TestLaunchLintsOnceBeforeStarting(t *testing.T) {
	dir := t.TempDir()
	text := smallCorpus(t, dir)
	tiny := filepath.Join(recipesDir, "tiny.toml")
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown key", []string{"launch", "--nproc", "4", tiny, "--set", "model.hiden=3"}, "flag --set model.hiden: error[SL002]"},
		{"world size", []string{"launch", "--nproc", "3", tiny}, "flag --nproc: error[SL206]"},
		{"world size over nodes", []string{"launch", "--nproc", "3", "--nnodes", "2", "--master-port", "1", tiny}, "flag --nproc × --nnodes: error[SL206]"},
		{"run flag misused", []string{"launch", "--nproc", "2", tiny, "--nproc", "2"}, "--nproc runs ranks in this process, but shardline launch started it"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append(c.args, "--set", "data.path="+text, "--set", "run.output_dir="+dir, "--train-iters", "2")
			code, stdout, stderr := shardline(t, []string{"SHARDLINE_TEST_AS_CLI=1", "SHARDLINE_JOB_TOKEN=t"}, args...)
			assert.NotEqual(t, 0, code)
			all := stdout + stderr
			assert.Equal(t, 1, strings.Count(all, c.want), "printed once: %s", all)
			assert.NotContains(t, all, "flag --world-size")
			assert.NotContains(t, all, `"rank":`, "no rank started")
		})
	}
	_, err := os.Stat(filepath.Join(dir, "tiny"))
	assert.ErrorIs(t, err, os.ErrNotExist, "no rank started a run")
}

// A rank that another launcher started (torchrun, SLURM, mpirun) blames a
// world size the batch does not divide on that launcher's variable, which
// set it, not on a --world-size flag no one typed.
func TestLauncherWorldSizeNamesItsVariable(t *testing.T) {
	dir := t.TempDir()
	text := smallCorpus(t, dir)
	tiny := filepath.Join(recipesDir, "tiny.toml")
	for _, c := range [][3]string{{"RANK", "WORLD_SIZE", "env WORLD_SIZE: error[SL206]"}, {"SLURM_PROCID", "SLURM_NTASKS", "env SLURM_NTASKS: error[SL206]"},
		{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "env OMPI_COMM_WORLD_SIZE: error[SL206]"}} {
		env := []string{c[0] + "=0", c[1] + "=3", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1", "SHARDLINE_JOB_TOKEN=t"}
		code, _, stderr := shardline(t, env, "run", tiny, "--set", "data.path="+text, "--set", "run.output_dir="+dir, "--train-iters", "2")
		assert.Equal(t, 1, code, stderr)
		assert.Contains(t, stderr, c[2])
		assert.NotContains(t, stderr, "--world-size")
	}
}

// Ranks of one job (processes over TCP) given different recipes fail before
// the first step, naming the key and each rank's value.
func TestRanksWithDifferentRecipesNameTheKey(t *testing.T) {
	dir := t.TempDir()
	text := smallCorpus(t, dir)
	port := freePort(t)
	outs := []*syncBuffer{{}, {}}
	cmds := make([]*exec.Cmd, 2)
	for r := range cmds {
		args := smallJobArgs(dir, "--set", "data.path="+text, "--train-iters", "3")
		if r == 1 {
			args = append(args, "--hidden-size", "64")
		}
		cmds[r] = rankCmd(t, r, 2, port, outs[r], args...)
		require.NoError(t, cmds[r].Start())
	}
	for r, c := range cmds {
		assert.Equal(t, 1, exitOf(t, c, outs[r]), "rank %d", r)
		assert.Contains(t, outs[r].String(), "the ranks do not run the same job: model.hidden: rank 0 has 32, rank 1 has 64; give every rank the same recipe", "rank %d", r)
	}
	_, err := os.Stat(filepath.Join(dir, "tiny"))
	assert.ErrorIs(t, err, os.ErrNotExist, "the job stopped before rank 0 made its run directory")
}

func mustExe(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	return exe
}

// launch's own counts say what a bad value likely was: an unexpanded shell
// substitution, or one that printed nothing (so the next flag became the
// value), and which flag is out of range.
func TestLaunchCountsNameTheProblem(t *testing.T) {
	tiny := filepath.Join(recipesDir, "tiny.toml")
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--nproc", "$(nvidia-smi -L|wc -l)", "--nnodes", "4"}, 2, `invalid argument "$(nvidia-smi -L|wc -l)" for "--nproc" flag: a shell substitution that was not expanded`},
		{[]string{"--nproc", "--nnodes", "4"}, 2, `invalid argument "--nnodes" for "--nproc" flag: --nproc has no value, so it took the next argument`},
		{[]string{"--nproc", ""}, 2, `invalid argument "" for "--nproc" flag: empty: give the number`},
		{[]string{"--nproc", "0"}, 2, "--nproc 0: give at least 1 rank for this node (a count from $(nvidia-smi -L | wc -l) is 0 where no GPU is listed)"},
		{[]string{"--nproc", "2", "--nnodes", "2", "--node-rank", "2"}, 2, "--node-rank 2: give this node's index, 0 to 1 (--nnodes 2)"},
		{[]string{"--nproc", "99999999999999999999"}, 2, "give a whole number from 0 to 1048576"},
		{[]string{"--nproc", "1048576", "--nnodes", "2"}, 2, "--nproc 1048576 × --nnodes 2 is 2097152 ranks, more than parallel.world_size allows (1048576)"},
	} {
		code, _, errs := shardline(t, nil, append(append([]string{"launch"}, c.args...), tiny)...)
		assert.Equal(t, c.code, code, "%v: %s", c.args, errs)
		assert.Contains(t, errs, c.want, "%v", c.args)
	}
}

// launch run inside another launcher's allocation (srun shardline launch: its
// SLURM_* variables name a job without MASTER_ADDR) checks the recipe as its
// own ranks will see it, and trains.
func TestLaunchInsideSlurm(t *testing.T) {
	dir := t.TempDir()
	code, _, errs := shardline(t, []string{"SHARDLINE_TEST_AS_CLI=1", "SLURM_PROCID=0", "SLURM_NTASKS=4"},
		append([]string{"launch", "--nproc", "2"}, smallJobArgs(dir, "--set", "data.path="+smallCorpus(t, dir), "--train-iters", "2")...)...)
	assert.Equal(t, 0, code, errs)
}
