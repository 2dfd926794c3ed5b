package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardline/shardline/fileio"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMain lets launch re-execute this test binary as shardline: with
// SHARDLINE_TEST_AS_CLI=1 it runs the CLI instead of the tests.
//
// With SHARDLINE_TEST_SIGNAL=SIG@N,M,... (KILL or INT) and
// SHARDLINE_TEST_SIGNAL_DIR, the CLI sends itself SIG once its log reports
// step N (rank 0 logs every step with logging.interval = 1), and again at
// step M: each step once over every restart and rerun (a marker file in the
// directory records it), so that a test kills or interrupts a run at the
// steps it chose.
func TestMain(m *testing.M) {
	if os.Getenv("SHARDLINE_TEST_AS_CLI") == "1" {
		var stderr io.Writer = os.Stderr
		if spec := os.Getenv("SHARDLINE_TEST_SIGNAL"); spec != "" {
			stderr = newSignalAtStep(os.Stderr, spec, os.Getenv("SHARDLINE_TEST_SIGNAL_DIR"))
		}
		os.Exit(Main(os.Args[1:], os.Stdout, stderr, os.Environ()))
	}
	os.Exit(m.Run())
}

// signalAtStep passes the CLI's log on, and signals this process once a
// line logs one of its steps (TestMain).
type signalAtStep struct {
	w     io.Writer
	sig   syscall.Signal
	steps map[int]bool
	dir   string
	buf   []byte
}

func newSignalAtStep(w io.Writer, spec, dir string) *signalAtStep {
	name, list, _ := strings.Cut(spec, "@")
	s := &signalAtStep{w: w, sig: map[string]syscall.Signal{"KILL": syscall.SIGKILL, "INT": syscall.SIGINT}[name], steps: map[int]bool{}, dir: dir}
	for _, f := range strings.Split(list, ",") {
		if n, err := strconv.Atoi(f); err == nil {
			s.steps[n] = true
		}
	}
	if s.sig == 0 || dir == "" {
		panic("SHARDLINE_TEST_SIGNAL needs KILL@N,... or INT@N,... and SHARDLINE_TEST_SIGNAL_DIR")
	}
	return s
}

func (s *signalAtStep) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	s.buf = append(s.buf, p...)
	for {
		i := bytes.IndexByte(s.buf, '\n')
		if i < 0 {
			break
		}
		var ev struct {
			Step    int    `json:"step"`
			Message string `json:"message"`
		}
		if json.Unmarshal(s.buf[:i], &ev) == nil && ev.Message == "step" && s.steps[ev.Step] {
			marker := filepath.Join(s.dir, fmt.Sprintf("signalled-at-%d", ev.Step))
			if f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644); err == nil {
				f.Close()
				syscall.Kill(os.Getpid(), s.sig)
				if s.sig == syscall.SIGKILL {
					select {} // the kernel ends the process
				}
			}
		}
		s.buf = s.buf[i+1:]
	}
	return n, err
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

// launchCase says whether make test runs the launch tests' case of index
// sum i (of the case's coordinates in its matrix): every case with
// SHARDLINE_LAUNCH_FULL=1 (make test-launch-full), else those of even sum,
// half of each matrix in a checkerboard, so that every strategy still meets
// every process count and mesh shape in some case, within the CI's time
// budget (each case starts its ranks as processes). The in-process tests
// (trainer) cross every case.
func launchCase(i int) bool { return os.Getenv("SHARDLINE_LAUNCH_FULL") == "1" || i%2 == 0 }

// smallCorpus writes the few kilobytes of text the launch tests train on.
func smallCorpus(t *testing.T, dir string) string {
	t.Helper()
	text := filepath.Join(dir, "t.txt")
	require.NoError(t, os.WriteFile(text, []byte(strings.Repeat("abcd efgh ijkl mnop. ", 200)), 0o644))
	return text
}

// TestLaunchMatchesInProcess: ranks as processes over TCP train the losses that
// ranks as goroutines train, dense and MoE, at 2 and 4 processes under every
// sharding strategy (the TCP ring sums in another order than the in-process rank
// order: 1e-5); make test runs half of them (launchCase).
func TestLaunchMatchesInProcess(t *testing.T) {
	dir := t.TempDir()
	text := smallCorpus(t, dir)
	common := []string{filepath.Join(recipesDir, "tiny.toml"), "--set", "data.path=" + text, "--num-layers", "1", "--hidden-size", "32",
		"--num-attention-heads", "2", "--num-query-groups", "2", "--ffn-hidden-size", "64", "--seq-length", "16", "--micro-batch-size", "2",
		"--global-batch-size", "16", "--train-iters", "4", "--set", "train.eval_interval=0"}
	env := []string{"SHARDLINE_TEST_AS_CLI=1"}
	moe := []string{"--num-experts", "4", "--moe-router-topk", "2", "--set", "model.moe.expert_ffn_hidden=32"}
	for i, n := range []string{"2", "4"} {
		for j, model := range []string{"dense", "moe"} {
			for k, strategy := range []string{"no_shard", "optim", "optim_grads", "optim_grads_params"} {
				if !launchCase(i + j + k) {
					continue
				}
				name := n + "-" + model + "-" + strategy
				args := append(append([]string{}, common...), "--data-parallel-sharding-strategy", strategy)
				if model == "moe" {
					args = append(args, moe...)
				}
				code, _, errs := shardline(t, env, append(append([]string{"launch", "--nproc", n}, args...), "--set", "run.output_dir="+dir, "--set", "run.name=tcp-"+name)...)
				require.Equal(t, 0, code, errs)
				assert.Contains(t, errs, `"rank":1`, "every rank logs with its rank")
				code, _, errs = shardline(t, nil, append(append([]string{"run", "--nproc", n}, args...), "--set", "run.output_dir="+dir, "--set", "run.name=mem-"+name)...)
				require.Equal(t, 0, code, errs)
				a, b := losses(t, filepath.Join(dir, "tcp-"+name)), losses(t, filepath.Join(dir, "mem-"+name))
				require.Len(t, a, 4)
				for i := range a {
					assert.InDelta(t, b[i], a[i], 1e-5*b[i], "%s step %d", name, i+1)
				}
			}
		}
	}
}

// TestLaunchBF16ReduceMatchesInProcess: with bf16 compute and gradients reduced in
// bf16 (2 bytes a value on the TCP wire), 2 and 4 processes train the losses the
// same ranks train in process, within 1e-5: the bf16 reduce-scatter is the same
// sum, bit for bit, and only the fp32 loss all-reduce's order differs.
func TestLaunchBF16ReduceMatchesInProcess(t *testing.T) {
	dir := t.TempDir()
	args := append(smallModel("tiny.toml", smallCorpus(t, dir)), "--bf16", "--grad-reduce-in-bf16")
	for _, n := range []string{"2", "4"} {
		for _, strategy := range []string{"no_shard", "optim_grads_params"} {
			name := n + "-" + strategy
			a := append(append([]string{}, args...), "--data-parallel-sharding-strategy", strategy, "--set", "run.output_dir="+dir)
			code, _, errs := shardline(t, []string{"SHARDLINE_TEST_AS_CLI=1"}, append(append([]string{"launch", "--nproc", n}, a...), "--set", "run.name=tcp-"+name)...)
			require.Equal(t, 0, code, errs)
			code, _, errs = shardline(t, nil, append(append([]string{"run", "--nproc", n}, a...), "--set", "run.name=mem-"+name)...)
			require.Equal(t, 0, code, errs)
			x, y := losses(t, filepath.Join(dir, "tcp-"+name)), losses(t, filepath.Join(dir, "mem-"+name))
			require.NotEmpty(t, x)
			nproc, _ := strconv.Atoi(n)
			assert.Equal(t, max(1, runtime.NumCPU()/nproc), runThreads(t, filepath.Join(dir, "tcp-"+name)),
				"launch gives each rank its share of the cores")
			for i := range x {
				assert.InDelta(t, y[i], x[i], 1e-5*y[i], "%s step %d", name, i+1)
			}
		}
	}
}

// runThreads is the GOMAXPROCS run.json records for a run's rank 0.
func runThreads(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "run.json"))
	require.NoError(t, err)
	var r struct {
		Machine struct{ Threads int }
	}
	require.NoError(t, json.Unmarshal(b, &r))
	return r.Machine.Threads
}

// TestRankThreads: launch splits the node's cores among its ranks, at least one
// each, and leaves a GOMAXPROCS the user set alone.
func TestRankThreads(t *testing.T) {
	assert.Equal(t, "8", rankThreads(map[string]string{}, 16, 2))
	assert.Equal(t, "1", rankThreads(map[string]string{}, 2, 2))
	assert.Equal(t, "1", rankThreads(map[string]string{}, 2, 4), "more ranks than cores: one thread each")
	assert.Equal(t, "5", rankThreads(map[string]string{}, 16, 3))
	assert.Equal(t, "", rankThreads(map[string]string{"GOMAXPROCS": "3"}, 16, 2), "the user's own setting is passed on")
}

// TestLaunchStopsAllWhenOneFails: rank 1's data does not exist; launch stops rank
// 0 (waiting for rank 1 at the rendezvous or a collective) and names rank 1.
func TestLaunchStopsAllWhenOneFails(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "x0.txt"), []byte(strings.Repeat("some text here. ", 100)), 0o644))
	start := time.Now()
	code, _, errs := shardline(t, []string{"SHARDLINE_TEST_AS_CLI=1"}, "launch", "--nproc", "2", "--grace", "2s", filepath.Join(recipesDir, "tiny.toml"),
		"--set", "data.path="+filepath.Join(dir, "x${RANK}.txt"), "--seq-length", "16", "--global-batch-size", "32", "--train-iters", "50", "--set", "run.output_dir="+dir)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "rank 1 exited with status 1")
	assert.Less(t, time.Since(start), 60*time.Second)
}

func TestJobEnvironment(t *testing.T) {
	job := func(kv ...string) map[string]string {
		m := map[string]string{"MASTER_ADDR": "h", "MASTER_PORT": "1", "SHARDLINE_JOB_TOKEN": "t"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		env         map[string]string
		rank, local int // local: the node index that picks a GPU (-1: none set)
		err         string
	}{
		{job("RANK", "1", "WORLD_SIZE", "4"), 1, -1, ""},
		{job("RANK", "3", "WORLD_SIZE", "4", "LOCAL_RANK", "1"), 3, 1, ""},
		{job("SLURM_PROCID", "3", "SLURM_NTASKS", "4", "SLURM_LOCALID", "3"), 3, 3, ""},
		{job("OMPI_COMM_WORLD_RANK", "2", "OMPI_COMM_WORLD_SIZE", "4", "OMPI_COMM_WORLD_LOCAL_RANK", "0"), 2, 0, ""},
		{job("RANK", "1", "WORLD_SIZE", "4", "LOCAL_RANK", "x"), 0, 0, `LOCAL_RANK="x" (torchrun) is not this process's index on its node`},
		{job("RANK", "1", "WORLD_SIZE", "4", "LOCAL_RANK", "2"), 0, 0, "0 to RANK, here 1"},
		{map[string]string{"RANK": "1", "WORLD_SIZE": "4", "SHARDLINE_JOB_TOKEN": "t"}, 0, 0, "MASTER_ADDR and MASTER_PORT are not set"},
		{map[string]string{"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, 0, 0, "SHARDLINE_JOB_TOKEN is not set"},
		{map[string]string{"RANK": "5", "WORLD_SIZE": "4"}, 0, 0, "do not name a rank"},
	} {
		j, err := detectJob(tc.env)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err)
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, tc.rank, j.rank)
		assert.Equal(t, tc.local, j.localRank)
		assert.Equal(t, 4, j.world)
	}
	j, err := detectJob(map[string]string{"PATH": "/bin"})
	assert.NoError(t, err)
	assert.Nil(t, j)
}

// TestKilledRankEndsTheJob: four processes join over TCP and train; rank 2 is
// killed; the other three stop with an error naming rank 2, well within the
// communication timeout.
func TestKilledRankEndsTheJob(t *testing.T) {
	dir := t.TempDir()
	exe, err := os.Executable()
	require.NoError(t, err)
	port := freePort(t)
	procs := make([]*exec.Cmd, 4)
	outs := make([]*bytes.Buffer, 4)
	for r := range procs {
		c := exec.Command(exe, "run", filepath.Join(recipesDir, "tiny.toml"), "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
			"--num-query-groups", "2", "--ffn-hidden-size", "64", "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "4",
			"--train-iters", "1000000", "--set", "train.eval_interval=0", "--set", "run.output_dir="+dir, "--comm-timeout", "20s")
		c.Env = append(os.Environ(), "SHARDLINE_TEST_AS_CLI=1", "RANK="+strconv.Itoa(r), "WORLD_SIZE=4", "MASTER_ADDR=127.0.0.1",
			"MASTER_PORT="+strconv.Itoa(port), "SHARDLINE_JOB_TOKEN=kill-test")
		outs[r] = &bytes.Buffer{}
		c.Stderr = outs[r]
		require.NoError(t, c.Start())
		procs[r] = c
	}
	defer func() {
		for _, c := range procs {
			c.Process.Kill()
		}
	}()
	// Wait until rank 0 has recorded a few steps: the job is running.
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join(dir, "tiny", "metrics.jsonl"))
		if bytes.Count(b, []byte("\n")) >= 3 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the job did not start: %s", outs[0])
		time.Sleep(20 * time.Millisecond)
	}
	killed := time.Now()
	require.NoError(t, procs[2].Process.Kill())
	named := false
	for _, r := range []int{0, 1, 3} {
		err := procs[r].Wait()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "rank %d should fail", r)
		named = named || strings.Contains(outs[r].String(), "rank(s) [2]")
	}
	assert.Less(t, time.Since(killed), 15*time.Second, "the others stop before the 20 s timeout: the lost connection is noticed at once")
	assert.True(t, named, "an error names rank 2:\n%s\n%s\n%s", outs[0], outs[1], outs[3])
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// weightsOf reads weights.bin's header and values.
func weightsOf(t *testing.T, dir string) (string, []float32) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "weights.bin"))
	require.NoError(t, err)
	n := int(binary.LittleEndian.Uint32(b))
	header, body := string(b[4:4+n]), b[4+n:len(b)-fileio.TrailerSize]
	w := make([]float32, len(body)/4)
	for i := range w {
		w[i] = math.Float32frombits(binary.LittleEndian.Uint32(body[4*i:]))
	}
	return header, w
}

// TestLaunchExpertParallel: moe-tiny with experts spread over processes (EP 2 on
// 2 and 4 ranks, EP 4 on 4), tokens exchanged by all-to-all over TCP on groups of
// their own, expert weights sharded over the edp group (optim_grads_params at
// every shape, the other strategies at world 4 EP 2): the losses and final
// weights of one rank, within the fp32 tolerance of the FSDP equivalence tests
// (1e-5; the rings sum in another order than one rank does).
func TestLaunchExpertParallel(t *testing.T) {
	dir := t.TempDir()
	text := smallCorpus(t, dir)
	common := []string{filepath.Join(recipesDir, "moe-tiny.toml"), "--set", "data.path=" + text, "--num-layers", "2", "--hidden-size", "32",
		"--num-attention-heads", "2", "--num-query-groups", "2", "--ffn-hidden-size", "64", "--seq-length", "16", "--micro-batch-size", "1",
		"--global-batch-size", "8", "--train-iters", "4", "--set", "train.eval_interval=0", "--num-experts", "4", "--moe-router-topk", "2",
		"--set", "model.moe.expert_ffn_hidden=32", "--set", "run.output_dir=" + dir}
	code, _, errs := shardline(t, nil, append(append([]string{"run"}, common...), "--set", "run.name=one")...)
	require.Equal(t, 0, code, errs)
	refLoss := losses(t, filepath.Join(dir, "one"))
	refHeader, refW := weightsOf(t, filepath.Join(dir, "one"))
	for _, c := range []struct{ world, ep, strategy string }{{"2", "2", "optim_grads_params"}, {"4", "2", "optim_grads_params"},
		{"4", "4", "optim_grads_params"}, {"8", "4", "optim_grads_params"}, {"4", "2", "no_shard"}, {"4", "2", "optim"}, {"4", "2", "optim_grads"}} {
		shape := [2]string{c.world, c.ep}
		name := "world" + shape[0] + "-ep" + shape[1] + "-" + c.strategy
		code, _, errs := shardline(t, []string{"SHARDLINE_TEST_AS_CLI=1"}, append(append([]string{"launch", "--nproc", shape[0]}, common...),
			"--expert-model-parallel-size", shape[1], "--data-parallel-sharding-strategy", c.strategy, "--set", "run.name="+name)...)
		require.Equal(t, 0, code, errs)
		resolved, err := os.ReadFile(filepath.Join(dir, name, "resolved.toml"))
		require.NoError(t, err)
		assert.Contains(t, string(resolved), "expert_parallel = "+shape[1], name)
		assert.Contains(t, string(resolved), "world_size = "+shape[0], name)
		assertMatches(t, filepath.Join(dir, name), refLoss, refHeader, refW, 1e-5)
	}
}

// assertMatches holds a run's losses within 1e-5 of refLoss (relative) and its
// final weights within wtol of refW, with the same weights header.
func assertMatches(t *testing.T, dir string, refLoss []float64, refHeader string, refW []float32, wtol float64) {
	t.Helper()
	name := filepath.Base(dir)
	l := losses(t, dir)
	require.Len(t, l, len(refLoss))
	for i := range l {
		assert.InDelta(t, refLoss[i], l[i], 1e-5*refLoss[i], "%s step %d", name, i+1)
	}
	header, w := weightsOf(t, dir)
	require.Equal(t, refHeader, header, name)
	worst := 0.0
	for i := range w {
		worst = math.Max(worst, math.Abs(float64(w[i]-refW[i])))
	}
	assert.Less(t, worst, wtol, "%s: largest weight difference", name)
}

// meshShape is a launch test's layout: processes and the tp, cp and ep degrees.
type meshShape struct{ world, tp, cp, ep string }

// launchMatchesOneRank trains args once on one rank and then as TCP processes at
// each shape, under optim_grads_params and no_shard, and holds every run's losses
// within 1e-5 of one rank's and its final weights within wtol.
func launchMatchesOneRank(t *testing.T, dir, name string, args []string, shapes []meshShape, wtol float64) {
	t.Helper()
	common := append(append([]string{}, args...), "--set", "run.output_dir="+dir)
	code, _, errs := shardline(t, nil, append(append([]string{"run"}, common...), "--set", "run.name=one-"+name)...)
	require.Equal(t, 0, code, errs)
	refLoss := losses(t, filepath.Join(dir, "one-"+name))
	refHeader, refW := weightsOf(t, filepath.Join(dir, "one-"+name))
	for i, sh := range shapes {
		for j, strategy := range []string{"optim_grads_params", "no_shard"} {
			if !launchCase(i + j) {
				continue
			}
			run := fmt.Sprintf("%s-world%s-tp%s-cp%s-ep%s-%s", name, sh.world, sh.tp, sh.cp, sh.ep, strategy)
			code, _, errs := shardline(t, []string{"SHARDLINE_TEST_AS_CLI=1"}, append(append([]string{"launch", "--nproc", sh.world}, common...),
				"--tensor-model-parallel-size", sh.tp, "--context-parallel-size", sh.cp, "--expert-model-parallel-size", sh.ep,
				"--data-parallel-sharding-strategy", strategy, "--set", "run.name="+run)...)
			require.Equal(t, 0, code, errs)
			resolved, err := os.ReadFile(filepath.Join(dir, run, "resolved.toml"))
			require.NoError(t, err)
			for key, v := range map[string]string{"world_size": sh.world, "tensor_parallel": sh.tp, "context_parallel": sh.cp} {
				assert.Contains(t, string(resolved), key+" = "+v, run)
			}
			assertMatches(t, filepath.Join(dir, run), refLoss, refHeader, refW, wtol)
		}
	}
}

// smallModel is the launch tests' model: 2 layers, hidden 32, 4 heads.
func smallModel(recipe, text string) []string {
	return []string{filepath.Join(recipesDir, recipe), "--set", "data.path=" + text, "--num-layers", "2", "--hidden-size", "32",
		"--num-attention-heads", "4", "--num-query-groups", "4", "--ffn-hidden-size", "64", "--seq-length", "16", "--micro-batch-size", "2",
		"--global-batch-size", "8", "--train-iters", "4", "--set", "train.eval_interval=0"}
}

// TestLaunchContextParallel: context-parallel ranks as processes over TCP (the
// K/V ring's SendRecv steps, FSDP over dp×cp) train the losses and final weights
// of one rank within 1e-5: cp 2, cp 4, cp2×dp2, and moe-tiny (8 experts) with
// cp2×ep2 on 2 and 4 processes, under optim_grads_params and no_shard.
func TestLaunchContextParallel(t *testing.T) {
	dir := t.TempDir()
	text := smallCorpus(t, dir)
	launchMatchesOneRank(t, dir, "dense", smallModel("tiny.toml", text), []meshShape{{"2", "1", "2", "1"}, {"4", "1", "4", "1"}, {"4", "1", "2", "1"}}, 1e-5)
	moe := append(smallModel("moe-tiny.toml", text), "--set", "model.moe.expert_ffn_hidden=32")
	launchMatchesOneRank(t, dir, "moe", moe, []meshShape{{"2", "1", "2", "2"}, {"4", "1", "2", "2"}}, 1e-5)
}

// TestLaunchTensorParallel: tensor-parallel ranks as processes over TCP train the
// losses of one rank within 1e-5 and its weights within 5e-5 (AdamW's steps on
// near-zero gradients; see TestTensorParallelEquivalence): tp 2, tp 4, tp2×dp2,
// tp2×cp2 and tp2×cp2×dp2 (8 processes), and moe-tiny (with a shared expert) at
// tp2×ep2 on 2 and 4 processes, under optim_grads_params and no_shard.
func TestLaunchTensorParallel(t *testing.T) {
	dir := t.TempDir()
	text := smallCorpus(t, dir)
	launchMatchesOneRank(t, dir, "tp", smallModel("tiny.toml", text), []meshShape{{"2", "2", "1", "1"}, {"4", "4", "1", "1"}, {"4", "2", "1", "1"}, {"4", "2", "2", "1"}, {"8", "2", "2", "1"}}, 5e-5)
	moe := append(smallModel("moe-tiny.toml", text), "--set", "model.moe.expert_ffn_hidden=32", "--set", "model.moe.shared_experts=1")
	launchMatchesOneRank(t, dir, "tp-moe", moe, []meshShape{{"2", "2", "1", "2"}, {"4", "2", "1", "2"}}, 5e-5)
}

// TestLaunchResumeIsBitExact: over TCP processes (MoE, expert parallelism 2),
// under every strategy, a job stopped at step 5 (--stop-after, checkpoints every 3
// steps) and resumed with --resume equals the job that was never stopped, bit for
// bit: losses, gradient norms and final weights. Then `shardline ckpt` lists,
// inspects and verifies its checkpoints.
func TestLaunchResumeIsBitExact(t *testing.T) {
	dir := t.TempDir()
	text := smallCorpus(t, dir)
	common := []string{filepath.Join(recipesDir, "moe-tiny.toml"), "--set", "data.path=" + text, "--num-layers", "2", "--hidden-size", "32",
		"--num-attention-heads", "2", "--num-query-groups", "2", "--ffn-hidden-size", "64", "--seq-length", "16", "--micro-batch-size", "1",
		"--global-batch-size", "8", "--train-iters", "8", "--set", "train.eval_interval=0", "--num-experts", "4", "--moe-router-topk", "2",
		"--set", "model.moe.expert_ffn_hidden=32", "--set", "run.output_dir=" + dir, "--save-interval", "3", "--expert-model-parallel-size", "2"}
	env := []string{"SHARDLINE_TEST_AS_CLI=1"}
	var stopped string
	for _, strategy := range []string{"no_shard", "optim", "optim_grads", "optim_grads_params"} {
		launch := append(append([]string{"launch", "--nproc", "2"}, common...), "--data-parallel-sharding-strategy", strategy)
		code, _, errs := shardline(t, env, append(launch, "--set", "run.name=whole-"+strategy)...)
		require.Equal(t, 0, code, errs)
		code, _, errs = shardline(t, env, append(launch, "--set", "run.name=stopped-"+strategy, "--stop-after", "5")...)
		require.Equal(t, 130, code, errs)
		stopped = filepath.Join(dir, "stopped-"+strategy)
		code, _, errs = shardline(t, env, append(launch, "--set", "run.name=stopped-"+strategy, "--resume", stopped)...)
		require.Equal(t, 0, code, errs)

		whole := filepath.Join(dir, "whole-"+strategy)
		a, b := must(os.ReadFile(filepath.Join(whole, "metrics.jsonl"))), must(os.ReadFile(filepath.Join(stopped, "metrics.jsonl")))
		assert.Equal(t, curveLines(a), curveLines(b), strategy)
		assert.True(t, bytes.Equal(must(os.ReadFile(filepath.Join(whole, "weights.bin"))), must(os.ReadFile(filepath.Join(stopped, "weights.bin")))), "%s: final weights", strategy)
	}

	code, out, errs := shardline(t, nil, "ckpt", "ls", stopped) // the last strategy's
	require.Equal(t, 0, code, errs)
	for _, step := range []string{"3 ", "5 ", "6 ", "8 "} {
		assert.Contains(t, out, "\n"+step, out)
	}
	code, out, errs = shardline(t, nil, "ckpt", "verify", stopped)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "step-00000008: ok")
	code, out, errs = shardline(t, nil, "ckpt", "inspect", filepath.Join(stopped, "checkpoints", "step-00000005"))
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "step 5 (optimizer steps 5), 2 ranks")
	assert.Contains(t, out, "layers.1.moe.experts.3.w2")
	assert.Contains(t, out, "rank-00001.bin")
}

// curveLines keeps each metrics line's loss and gradient norm (the timing
// fields differ between runs).
func curveLines(b []byte) []string {
	var out []string
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var m map[string]any
		if json.Unmarshal(line, &m) == nil {
			out = append(out, fmt.Sprint(m["step"], " ", m["loss"], " ", m["grad_norm"]))
		}
	}
	return out
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// newTestLineWriter is a rank's lineWriter into a buffer, with a lock of its own.
func newTestLineWriter() (*lineWriter, *bytes.Buffer) {
	out := new(bytes.Buffer)
	return &lineWriter{mu: new(sync.Mutex), w: out}, out
}

// TestLineWriterBoundsALine: whole lines go on at once; a rank writing
// without newlines is passed on once maxHeldLine bytes are held, not kept.
func TestLineWriterBoundsALine(t *testing.T) {
	l, out := newTestLineWriter()
	_, _ = l.Write([]byte("one\ntw"))
	assert.Equal(t, "one\n", out.String())
	chunk := bytes.Repeat([]byte("x"), 1000)
	for range maxHeldLine / len(chunk) {
		_, _ = l.Write(chunk)
	}
	assert.Equal(t, "one\n", out.String(), "below the bound the line is held")
	_, _ = l.Write(chunk)
	assert.Len(t, out.String(), 4+2+(maxHeldLine/len(chunk)+1)*len(chunk), "at the bound the held part goes on")
	assert.Empty(t, l.buf)
	l.flush()
	assert.Len(t, out.String(), 4+2+(maxHeldLine/len(chunk)+1)*len(chunk))
}

// TestLineWriterPassesProgress: a line redrawn after a CR (rank 0's progress
// bar) goes on as it is written; a plain partial line is still held.
func TestLineWriterPassesProgress(t *testing.T) {
	l, out := newTestLineWriter()
	_, _ = l.Write([]byte("log line\npart"))
	assert.Equal(t, "log line\n", out.String())
	_, _ = l.Write([]byte(" of it\n\r\033[K[==  ] 1/4"))
	assert.Equal(t, "log line\npart of it\n\r\033[K[==  ] 1/4", out.String())
	_, _ = l.Write([]byte("\r\033[K[=== ] 2/4"))
	assert.Equal(t, "log line\npart of it\n\r\033[K[==  ] 1/4\r\033[K[=== ] 2/4", out.String())
	assert.Empty(t, l.buf)
}

// After Ctrl-C, launch SIGKILLed the ranks still running when --grace had
// passed, then reported the first such exit as the job's failure ("killed by
// signal KILL ... most often the kernel's out-of-memory killer") and exited 1,
// though rank 0 may have been writing the interrupt's checkpoint. A rank
// launch kills after an interrupt is now named as late, not as a failure, and
// launch exits 130. The ranks here are shells: one exits 130 on SIGINT as a
// rank does, two ignore it.
func TestInterruptedLaunchKillsLateRanksQuietly(t *testing.T) {
	dir := t.TempDir()
	procs := []*exec.Cmd{ // each says it is ready once its trap is set
		exec.Command("sh", "-c", `trap 'exit 130' INT; : >"$0"/0; sleep 5 & wait`, dir),
		exec.Command("sh", "-c", `trap '' INT; : >"$0"/1; exec sleep 30`, dir),
		exec.Command("sh", "-c", `trap '' INT; : >"$0"/2; exec sleep 30`, dir),
	}
	interrupt := make(chan struct{})
	stopped := false
	go func() {
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if n, _ := os.ReadDir(dir); len(n) == len(procs) {
				break
			}
		}
		close(interrupt)
	}()
	err := superviseRanks(interrupt, func() { stopped = true }, procs, 0, time.Hour, 500*time.Millisecond, func() {})
	var ee *exitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 130, ee.code, "%v", err)
	assert.Contains(t, err.Error(), "rank [1 2] did not stop within --interrupt-grace 500ms after the interrupt and was killed")
	assert.NotContains(t, err.Error(), "out-of-memory")
	assert.True(t, stopped, "a second Ctrl-C is no longer caught")
}

// When rank 1's checkpoint write failed, rank 0 (whose own write succeeded)
// reported that another rank failed but exited 1, as a failure of its own,
// so launch could blame rank 0. It now exits 3 ("lost another rank"), and
// rank 1, whose write failed, exits 1. Rank 1's rank file cannot be written
// here because a directory stands where it goes.
func TestOtherRanksCheckpointFailureExits3(t *testing.T) {
	dir := t.TempDir()
	text := smallCorpus(t, dir)
	save := filepath.Join(dir, "ckpts")
	require.NoError(t, os.MkdirAll(filepath.Join(save, "step-00000002", "rank-00001.bin", "x"), 0o755))
	exe, err := os.Executable()
	require.NoError(t, err)
	port := freePort(t)
	procs := make([]*exec.Cmd, 2)
	outs := make([]*bytes.Buffer, 2)
	for r := range procs {
		c := exec.Command(exe, "run", filepath.Join(recipesDir, "tiny.toml"), "--num-layers", "1", "--seq-length", "16", "--train-iters", "4",
			"--micro-batch-size", "2", "--global-batch-size", "4",
			"--set", "train.eval_interval=0", "--set", "run.output_dir="+filepath.Join(dir, "runs"), "--set", "data.path="+text,
			"--save", save, "--save-interval", "2", "--comm-timeout", "20s")
		c.Env = append(os.Environ(), "SHARDLINE_TEST_AS_CLI=1", "RANK="+strconv.Itoa(r), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
			"MASTER_PORT="+strconv.Itoa(port), "SHARDLINE_JOB_TOKEN=ckpt-test")
		outs[r] = &bytes.Buffer{}
		c.Stderr = outs[r]
		require.NoError(t, c.Start())
		procs[r] = c
	}
	codes := make([]int, 2)
	for r, c := range procs {
		err := c.Wait()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "rank %d should fail: %s", r, outs[r])
		codes[r] = ee.ExitCode()
	}
	assert.Equal(t, []int{exitLostRank, 1}, codes, "rank 0 lost rank 1's checkpoint; rank 1 failed writing it\nrank 0: %s\nrank 1: %s", outs[0], outs[1])
	assert.Contains(t, outs[1].String(), "rank-00001.bin")
}
