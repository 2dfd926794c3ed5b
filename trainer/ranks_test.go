package trainer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/trainer/ckpt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// processRanks runs one trainer.Run per rank, each as the rank of a job of
// processes would (Options.Process), joined by an in-process world: rank r
// trains res[r] under ctxs[r], logging to logs[r] when set. A failing rank
// aborts the world, as a lost process would.
func processRanks(t *testing.T, res []*config.Resolved, ctxs []context.Context, logs []*lineWatch) ([]*Result, []error) {
	t.Helper()
	n := len(res)
	world := comm.NewWorld(n, time.Minute)
	out, errs := make([]*Result, n), make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := opts()
			o.Process = &Process{Rank: r, World: n, Comm: world.Rank(r)}
			if logs != nil && logs[r] != nil {
				o.LogOut = logs[r]
			}
			out[r], errs[r] = Run(ctxs[r], res[r], o)
			if errs[r] != nil {
				world.Abort(fmt.Errorf("rank %d: %w", r, errs[r]))
			}
		}()
	}
	wg.Wait()
	return out, errs
}

// lineWatch is a log that calls on(line) for every JSON line written to it.
type lineWatch struct {
	mu  sync.Mutex
	buf bytes.Buffer
	on  func(line map[string]any)
}

func (w *lineWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for _, l := range bytes.Split(bytes.TrimSpace(p), []byte("\n")) {
		var m map[string]any
		if json.Unmarshal(l, &m) == nil && w.on != nil {
			w.on(m)
		}
	}
	return len(p), nil
}

// twoRanks is the tiny recipe for a job of two ranks, plus sets.
func twoRanks(t *testing.T, sets ...string) *config.Resolved {
	res, _ := tinyRun(t, append([]string{"parallel.world_size=2", "train.eval_interval=0"}, sets...)...)
	return res
}

func background(n int) []context.Context {
	ctxs := make([]context.Context, n)
	for i := range ctxs {
		ctxs[i] = context.Background()
	}
	return ctxs
}

// Ranks of one job that were given different recipes, or different data, fail
// before the first step, every one of them naming the keys that differ and each
// rank's value (it was "ranks disagree on a collective: rank 1 sent 65792
// bytes", or whatever the first mismatched collective said).
func TestRanksThatDisagreeNameTheKeys(t *testing.T) {
	t.Run("recipe", func(t *testing.T) {
		a, b := twoRanks(t), twoRanks(t, "model.hidden=64", "train.lr=0.02")
		_, errs := processRanks(t, []*config.Resolved{a, b}, background(2), nil)
		for r, err := range errs {
			require.ErrorIs(t, err, comm.ErrDisagree, "rank %d", r)
			assert.ErrorContains(t, err, "model.hidden: rank 0 has 32, rank 1 has 64; train.lr: rank 0 has 0.01, rank 1 has 0.02; give every rank the same recipe", "rank %d", r)
		}
		_, err := os.Stat(a.Recipe.Run.OutputDir)
		assert.ErrorIs(t, err, os.ErrNotExist, "no run directory was made")
	})
	t.Run("data", func(t *testing.T) {
		a, b := twoRanks(t), twoRanks(t)
		other := filepath.Join(t.TempDir(), "other.txt")
		require.NoError(t, os.WriteFile(other, bytes.ReplaceAll([]byte(corpus()), []byte("fox"), []byte("cat")), 0o644))
		b.Recipe.Data.Path = other // the same length, other tokens
		_, errs := processRanks(t, []*config.Resolved{a, b}, background(2), nil)
		for r, err := range errs {
			require.ErrorIs(t, err, comm.ErrDisagree, "rank %d", r)
			assert.Regexp(t, `: data \(the tokens of data.path\): rank 0 has sha256:[0-9a-f]{64}, rank 1 has sha256:[0-9a-f]{64}; give every rank`, err.Error(), "rank %d", r)
			assert.NotContains(t, err.Error(), "data.path:", "the path itself may differ between ranks")
		}
	})
	t.Run("same", func(t *testing.T) {
		a, b := twoRanks(t, "train.steps=2"), twoRanks(t, "train.steps=2")
		b.Recipe.Run.OutputDir = t.TempDir() // only rank 0 writes: the others' output_dir may differ
		out, errs := processRanks(t, []*config.Resolved{a, b}, background(2), nil)
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		assert.NotEmpty(t, out[0].Dir)
	})
}

// A signal to a rank other than 0 stops the whole job at one step, with one
// checkpoint of that step, in every phase: during start-up (before the first
// step) and mid-training (after rank 0 has logged step 3). It was swallowed:
// only rank 0's interrupt was all-reduced, and the job ran to its end.
func TestInterruptOnAnyRankStopsTheJob(t *testing.T) {
	for _, phase := range []string{"start-up", "training"} {
		t.Run(phase, func(t *testing.T) {
			sets := []string{"train.steps=200", "checkpoint.interval=0", "logging.interval=1"}
			res := []*config.Resolved{twoRanks(t, sets...), twoRanks(t, sets...)}
			ctx1, interrupt := context.WithCancel(context.Background())
			defer interrupt()
			log0 := &lineWatch{}
			if phase == "start-up" {
				interrupt()
			} else {
				log0.on = func(l map[string]any) {
					if l["message"] == "step" && l["step"] == 3.0 {
						interrupt() // rank 1's SIGTERM, once rank 0 has logged step 3
					}
				}
			}
			// Checkpoints go to the run directory's checkpoints/ (keep_last
			// unset, the interval 0: only the end's).
			for _, r := range res {
				r.Recipe.Checkpoint.Dir = filepath.Join(res[0].Recipe.Run.OutputDir, "ckpt")
			}
			out, errs := processRanks(t, res, []context.Context{context.Background(), ctx1}, []*lineWatch{log0, nil})
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			assert.True(t, out[0].Interrupted, "rank 0 stopped on rank 1's interrupt")
			assert.True(t, out[1].Interrupted, "rank 1 stopped")
			latest, err := ckpt.Latest(res[0].Recipe.Checkpoint.Dir)
			require.NoError(t, err)
			m, err := ckpt.Open(latest)
			require.NoError(t, err)
			b, err := os.ReadFile(filepath.Join(out[0].Dir, "metrics.jsonl"))
			require.NoError(t, err)
			steps := bytes.Count(b, []byte("\n"))
			assert.Equal(t, steps, m.Step, "the checkpoint is of the step the job stopped at")
			if phase == "start-up" {
				assert.Zero(t, steps, "interrupted before the first step")
			} else {
				// Rank 1 is at most one step ahead of rank 0 (the interrupt
				// flag is all-reduced every step): it sees its interrupt at the
				// boundary after step 3 or 4.
				assert.GreaterOrEqual(t, steps, 3)
				assert.LessOrEqual(t, steps, 5)
			}
			assert.True(t, strings.Contains(log0.buf.String(), `"ranks_interrupted":1`), "rank 0 logs that one rank was interrupted")
		})
	}
}

// lyingRoot is rank 1's view of a world whose rank 0 announces a length
// (the first broadcast) of its choosing.
type lyingRoot struct {
	comm.Communicator
	length float32
}

func (l lyingRoot) Broadcast(buf []float32, root int) error {
	buf[0] = l.length
	return nil
}

// TestSharedPathIsBounded: a rank takes the run directory's path from rank 0
// (shareString) only up to maxShared bytes, and refuses a larger or
// malformed announced length before allocating for it (an authenticated
// but faulty peer could otherwise make every rank allocate 4·2^31 bytes).
func TestSharedPathIsBounded(t *testing.T) {
	for _, n := range []float32{1 << 31, -1, 2.5} {
		_, err := shareString(lyingRoot{length: n}, "")
		require.Error(t, err, "length %v", n)
		assert.Contains(t, err.Error(), "at most 65536 are taken")
	}
	_, err := shareString(lyingRoot{length: 3}, strings.Repeat("x", maxShared+1))
	require.ErrorContains(t, err, "at most 65536")
}
