package trainer

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/trainer/ckpt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// curveOf is a run's metrics.jsonl: per step, the loss, gradient norm and
// validation loss as exact bit patterns (float64 round-trips through JSON).
func curveOf(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, line := range bytes.Split(bytes.TrimSpace(must(os.ReadFile(filepath.Join(dir, "metrics.jsonl")))), []byte("\n")) {
		var m Metrics
		require.NoError(t, json.Unmarshal(line, &m))
		v := "-"
		if m.ValLoss != nil {
			v = ftoa(*m.ValLoss)
		}
		out = append(out, ftoa(float64(m.Step))+" "+ftoa(m.Loss)+" "+ftoa(m.GradNorm)+" "+v)
	}
	return out
}

var moeSets = []string{"model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.expert_ffn_hidden=32", "model.moe.shared_experts=1"}

// TestResumeIsBitExact: a run stopped at step 5 (checkpoints every 3 steps and on
// the stop) and resumed equals the run that was never stopped, bit for bit: every
// later loss, gradient norm and validation loss, and the final weights. Dense and
// MoE, every strategy, 2 ranks (4 with expert parallelism 2), 2 ranks of
// context or of tensor parallelism, and bf16 storage with bf16 reduction (the
// resumed run rounds the loaded fp32 main weights to the same bf16 compute
// weights), and FP8 compute (hybrid, tensorwise: no scaling state to save;
// delayed: the scales and amax histories saved and restored), with FP8
// compute weights too (param_gather: requantised from the loaded main
// weights).
func TestResumeIsBitExact(t *testing.T) {
	all := []string{"no_shard", "optim", "optim_grads", "optim_grads_params"}
	for _, c := range []struct {
		name       string
		sets       []string
		strategies []string // nil: all
	}{
		{"dense", []string{"parallel.world_size=2"}, nil},
		{"dense-bf16", []string{"parallel.world_size=2", "precision.bf16=true", "fsdp.grad_reduce_in_bf16=true"}, nil},
		// FP8 under current scaling has no state: the resumed run's
		// products quantise what the never-stopped run's did.
		{"dense-fp8", append([]string{"parallel.world_size=2"}, fp8Sets...), nil},
		// FP8 compute weights (param_gather) are not saved: the resumed
		// run quantises the loaded main weights into the same codes. Under
		// no_shard nothing is gathered: lint refuses param_gather (SL117).
		{"dense-fp8-param-gather", append([]string{"parallel.world_size=2"}, fp8GatherSets...), []string{"optim", "optim_grads", "optim_grads_params"}},
		// Delayed scaling's scales and amax histories are restored bit for
		// bit (metadata.json's fp8_scaling), which no strategy shards: the
		// two ends of the range of strategies suffice.
		{"dense-fp8-delayed", append([]string{"parallel.world_size=2"}, fp8DelayedSets...), []string{"no_shard", "optim_grads_params"}},
		{"dense-cp2", []string{"parallel.world_size=2", "parallel.context_parallel=2"}, nil},
		{"dense-tp2", []string{"parallel.world_size=2", "parallel.tensor_parallel=2", "model.heads=4", "model.kv_heads=4"}, nil},
		{"moe-ep2", append([]string{"parallel.world_size=4", "parallel.expert_parallel=2", "train.global_batch_size=16"}, moeSets...), nil},
		// DeepSeek-V3's router: the expert biases are restored bit for bit.
		{"router-ep2", append([]string{"parallel.world_size=4", "parallel.expert_parallel=2", "train.global_batch_size=16"}, deepseekSets...), nil},
	} {
		strategies := c.strategies
		if strategies == nil {
			strategies = all
		}
		for _, strategy := range strategies {
			t.Run(c.name+"/"+strategy, func(t *testing.T) {
				sets := append([]string{"train.steps=8", "train.eval_interval=4", "checkpoint.interval=3", "checkpoint.keep_last=2",
					"fsdp.data_parallel_sharding_strategy=" + strategy, "fsdp.use_megatron_fsdp=" + ftoa(b2f(strategy != "no_shard" && strategy != "optim"))}, c.sets...)
				whole, _ := tinyRun(t, sets...)
				ref, err := Run(context.Background(), whole, opts())
				require.NoError(t, err)

				stopped, _ := tinyRun(t, sets...)
				o := opts()
				o.StopAfter = 5
				first, err := Run(context.Background(), stopped, o)
				require.NoError(t, err)
				require.True(t, first.Interrupted)
				entries, err := ckpt.List(filepath.Join(first.Dir, "checkpoints"))
				require.NoError(t, err)
				require.Len(t, entries, 2, "keep_last = 2 of the saves at steps 3 and 5")
				assert.Equal(t, []int{3, 5}, []int{entries[0].Step, entries[1].Step})
				_, err = ckpt.Verify(entries[1].Dir)
				require.NoError(t, err)

				o = opts()
				o.Resume = entries[1].Dir
				again, err := Run(context.Background(), stopped, o)
				require.NoError(t, err)
				assert.Equal(t, first.Dir, again.Dir, "the resumed run continues in its run directory")
				assert.Equal(t, curveOf(t, ref.Dir), curveOf(t, again.Dir))
				assert.True(t, bytes.Equal(must(os.ReadFile(filepath.Join(ref.Dir, "weights.bin"))), must(os.ReadFile(filepath.Join(again.Dir, "weights.bin")))), "final weights differ")
			})
		}
	}
}

// tpSets give the test model heads and kv heads that 4 tensor-parallel ranks split.
var tpSets = []string{"model.heads=4", "model.kv_heads=4"}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// TestResumeReshards: a checkpoint saved by 2 ranks under optim_grads_params is
// loaded by 4 ranks under optim, by 1 rank under no_shard, by cp 2 × dp 2 and by
// tp 2 × dp 2; one saved at tp 4 by tp 2 × cp 2 (and, for MoE, by expert
// parallelism 2 from 4 ranks of ep 1, and by ep 2 from tp 2 × ep 2): the state each loads,
// saved again at once, holds exactly the values saved, tensor by tensor; and
// training goes on along the curve of the run that was never stopped (the
// reduction order differs with the world size: 1e-5 relative, the FSDP
// equivalence tolerance).
func TestResumeReshards(t *testing.T) {
	for _, c := range []struct {
		name      string
		from, to  []string
		extraSets []string
	}{
		{"dense 2 to 4", []string{"parallel.world_size=2", "fsdp.data_parallel_sharding_strategy=optim_grads_params"}, []string{"parallel.world_size=4", "fsdp.data_parallel_sharding_strategy=optim"}, nil},
		{"dense 2 to 1", []string{"parallel.world_size=2", "fsdp.data_parallel_sharding_strategy=optim_grads_params"}, []string{"parallel.world_size=1", "fsdp.data_parallel_sharding_strategy=no_shard", "fsdp.use_megatron_fsdp=false"}, nil},
		{"dense dp 2 to cp2 x dp2", []string{"parallel.world_size=2", "fsdp.data_parallel_sharding_strategy=optim_grads_params"}, []string{"parallel.world_size=4", "parallel.context_parallel=2", "fsdp.data_parallel_sharding_strategy=optim_grads_params"}, nil},
		{"dense dp 2 to tp2 x dp2", []string{"parallel.world_size=2", "fsdp.data_parallel_sharding_strategy=optim_grads_params"}, []string{"parallel.world_size=4", "parallel.tensor_parallel=2", "fsdp.data_parallel_sharding_strategy=optim_grads_params"}, tpSets},
		{"dense tp 4 to tp 2 x cp 2", []string{"parallel.world_size=4", "parallel.tensor_parallel=4", "fsdp.data_parallel_sharding_strategy=no_shard", "fsdp.use_megatron_fsdp=false"}, []string{"parallel.world_size=4", "parallel.tensor_parallel=2", "parallel.context_parallel=2", "fsdp.data_parallel_sharding_strategy=optim"}, tpSets},
		{"moe tp 2 ep 2 to ep 2", []string{"parallel.world_size=4", "parallel.tensor_parallel=2", "parallel.expert_parallel=2", "fsdp.data_parallel_sharding_strategy=optim_grads_params"}, []string{"parallel.world_size=2", "parallel.expert_parallel=2", "fsdp.data_parallel_sharding_strategy=optim_grads_params"}, append(append([]string{}, tpSets...), moeSets...)},
		// Delayed FP8 scaling's state, which every rank holds alike, goes to
		// one rank as it was.
		{"dense fp8 delayed 2 to 1", []string{"parallel.world_size=2", "fsdp.data_parallel_sharding_strategy=optim_grads_params"}, []string{"parallel.world_size=1", "fsdp.data_parallel_sharding_strategy=no_shard", "fsdp.use_megatron_fsdp=false"}, fp8DelayedSets},
		{"moe ep1 to ep2", []string{"parallel.world_size=4", "fsdp.data_parallel_sharding_strategy=optim_grads_params"}, []string{"parallel.world_size=4", "parallel.expert_parallel=2", "fsdp.data_parallel_sharding_strategy=optim_grads"}, moeSets},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := append([]string{"train.steps=8", "train.eval_interval=0", "checkpoint.interval=4", "train.global_batch_size=16", "fsdp.calculate_per_token_loss=true"}, c.extraSets...)
			whole, _ := tinyRun(t, append(append([]string(nil), base...), c.from...)...)
			ref, err := Run(context.Background(), whole, opts())
			require.NoError(t, err)
			want := lossesOf(t, ref.Dir) // read now: a resumed run continues in this directory
			saved := filepath.Join(ref.Dir, "checkpoints", "step-00000004")

			// Load at the new shape and save at once (stop before any step), into a
			// checkpoint root of its own.
			root := filepath.Join(t.TempDir(), "resaved")
			moved, _ := tinyRun(t, append(append(append([]string(nil), base...), c.to...), "checkpoint.dir="+root)...)
			o := opts()
			o.Resume, o.StopAfter = saved, 4
			_, err = Run(context.Background(), moved, o)
			require.NoError(t, err)
			resaved := filepath.Join(root, "step-00000004")
			require.NotEqual(t, saved, resaved)
			m, err := ckpt.Open(resaved)
			require.NoError(t, err)
			require.Equal(t, moved.Recipe.Parallel.WorldSize, m.WorldSize, "saved by the new layout")
			assertSameState(t, saved, resaved)

			// And training goes on from there, along the uninterrupted curve.
			o = opts()
			o.Resume = resaved
			out, err := Run(context.Background(), moved, o)
			require.NoError(t, err)
			got := lossesOf(t, out.Dir)
			require.Len(t, got, len(want))
			t.Logf("loss against the uninterrupted run: %.2e relative at most", maxRelDiff(want, got))
			assert.Less(t, maxRelDiff(want, got), 1e-5)
			es, err := ckpt.List(root)
			require.NoError(t, err)
			assert.Equal(t, 8, es[len(es)-1].Step, "the continued run trained to step 8 at the new layout and saved there")
		})
	}
}

func lossesOf(t testing.TB, dir string) []float64 {
	var out []float64
	for _, line := range bytes.Split(bytes.TrimSpace(must(os.ReadFile(filepath.Join(dir, "metrics.jsonl")))), []byte("\n")) {
		var m Metrics
		require.NoError(t, json.Unmarshal(line, &m))
		out = append(out, m.Loss)
	}
	return out
}

// assertSameState compares two checkpoints tensor by tensor, every state kind,
// exactly.
func assertSameState(t *testing.T, a, b string) {
	t.Helper()
	ma, err := ckpt.Open(a)
	require.NoError(t, err)
	mb, err := ckpt.Open(b)
	require.NoError(t, err)
	assert.Equal(t, ma.Step, mb.Step)
	assert.Equal(t, ma.OptimizerSteps, mb.OptimizerSteps)
	ra, rb := ckpt.NewReader(a, ma), ckpt.NewReader(b, mb)
	defer ra.Close()
	defer rb.Close()
	require.Len(t, mb.Tensors, len(ma.Tensors))
	assert.Equal(t, ma.FP8, mb.FP8, "delayed FP8 scaling's state")
	for _, tn := range ma.Tensors {
		for k := range ckpt.States {
			x, y := make([]float32, tn.Numel()), make([]float32, tn.Numel())
			require.NoError(t, ra.Read(tn.Name, k, 0, x))
			require.NoError(t, rb.Read(tn.Name, k, 0, y))
			require.Equal(t, x, y, "%s %s", tn.Name, ckpt.States[k])
		}
	}
}

// A checkpoint refuses a resume whose recipe changes the trajectory, naming the
// key; a changed byte in a rank file is refused naming file, tensor and offset;
// a save that never committed is not a checkpoint.
func TestResumeRefusals(t *testing.T) {
	res, _ := tinyRun(t, "train.steps=4", "train.eval_interval=0", "checkpoint.interval=2", "parallel.world_size=2")
	out, err := Run(context.Background(), res, opts())
	require.NoError(t, err)
	root := filepath.Join(out.Dir, "checkpoints")
	dir := filepath.Join(root, "step-00000004")

	other, _ := tinyRun(t, "train.steps=4", "train.eval_interval=0", "checkpoint.interval=2", "run.seed=7")
	o := opts()
	o.Resume = dir
	_, err = Run(context.Background(), other, o)
	var ke *config.Diagnostic
	require.ErrorAs(t, err, &ke)
	assert.Equal(t, "run.seed", ke.Key)

	// Another model is refused by the key that changed, not by the first
	// tensor whose shape differs.
	wider, _ := tinyRun(t, "train.steps=4", "train.eval_interval=0", "checkpoint.interval=2", "model.hidden=64")
	_, err = Run(context.Background(), wider, o)
	require.ErrorAs(t, err, &ke)
	assert.Equal(t, "model.hidden", ke.Key)
	assert.Contains(t, err.Error(), "was trained with")

	changed := filepath.Join(dir, ckpt.RankFile(1))
	b := must(os.ReadFile(changed))
	b[len(b)/2] ^= 1
	require.NoError(t, os.WriteFile(changed, b, 0o644))
	_, err = ckpt.Verify(dir)
	require.ErrorIs(t, err, fileio.ErrCorrupt)
	assert.Contains(t, err.Error(), changed)
	assert.Contains(t, err.Error(), "byte offset")
	_, err = Run(context.Background(), res, o)
	require.ErrorIs(t, err, fileio.ErrCorrupt)

	require.NoError(t, os.Truncate(changed, int64(len(b)-4)))
	_, err = ckpt.Open(dir)
	assert.ErrorIs(t, err, fileio.ErrCorrupt)

	// A save killed before its metadata: the previous checkpoint is the latest.
	require.NoError(t, os.Remove(filepath.Join(dir, ckpt.MetadataFile)))
	latest, err := ckpt.Latest(root)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(root, "step-00000002"), latest)
	_, err = ckpt.Open(dir)
	assert.ErrorContains(t, err, "not a complete checkpoint")
}

// A non-finite step is never checkpointed: with skipped steps the run keeps only
// the saves of finite steps, and fails without a final one.
func TestNonFiniteIsNeverCheckpointed(t *testing.T) {
	res, _ := tinyRun(t, "train.lr=1e30", "train.steps=4", "train.warmup_steps=0", "train.clip_grad=0", "train.skip_nonfinite=true",
		"train.eval_interval=0", "checkpoint.interval=1")
	_, err := Run(context.Background(), res, opts())
	require.ErrorIs(t, err, ErrNonFinite)
	assert.Contains(t, err.Error(), "the last checkpoint is "+filepath.Join(res.Recipe.Run.OutputDir, "t", "checkpoints", "step-00000001"))
	es, err := ckpt.List(filepath.Join(res.Recipe.Run.OutputDir, "t", "checkpoints"))
	require.NoError(t, err)
	require.Len(t, es, 1)
	assert.Equal(t, 1, es[0].Step)
	assert.True(t, es[0].Complete)
}

// TestCheckpointIntervalMinutes: checkpoint.interval_minutes saves after the
// step whose boundary finds that many minutes passed on rank 0's clock since
// the last save began (or the start), beside checkpoint.interval, and every
// rank saves after that same step (2 ranks in process, optim_grads_params:
// each rank writes its shard, and a save only some ranks took would never
// commit). The clock is the test's: 25 s a reading, so with 1 minute a save
// is due at every third boundary. Without an interval the saves fall at
// steps 3, 6 and 9 (and the end, 10); with interval 4 the step saves restart
// the clock: 3 (time), 4 (steps), 7 (time), 8 (steps), 10 (end).
func TestCheckpointIntervalMinutes(t *testing.T) {
	for _, c := range []struct {
		interval string
		want     []int
	}{{"0", []int{3, 6, 9, 10}}, {"4", []int{3, 4, 7, 8, 10}}} {
		res, _ := tinyRun(t, "train.steps=10", "train.eval_interval=0", "logging.sample_tokens=0", "parallel.world_size=2",
			"fsdp.data_parallel_sharding_strategy=optim_grads_params", "checkpoint.interval_minutes=1", "checkpoint.interval="+c.interval)
		var mu sync.Mutex
		readings := 0
		o := opts()
		o.clock = func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			readings++
			return time.Unix(0, 0).Add(time.Duration(readings-1) * 25 * time.Second)
		}
		out, err := Run(context.Background(), res, o)
		require.NoError(t, err)
		entries, err := ckpt.List(filepath.Join(out.Dir, "checkpoints"))
		require.NoError(t, err)
		var steps []int
		for _, e := range entries {
			assert.True(t, e.Complete, e.Dir)
			steps = append(steps, e.Step)
		}
		assert.Equal(t, c.want, steps, "checkpoint.interval = %s", c.interval)
		assert.Equal(t, 11, readings, "rank 0 alone reads the clock: once at the start and at each of the 10 boundaries")
	}
}

// TestCheckpointerTimeUp: only rank 0 reads the clock; a save restarts the
// time from the boundary before its step.
func TestCheckpointerTimeUp(t *testing.T) {
	now := time.Unix(1000, 0)
	c := &checkpointer{every: time.Minute, clock: func() time.Time { return now }, lead: true, since: now, checked: now}
	assert.False(t, c.timeUp())
	now = now.Add(59 * time.Second)
	assert.False(t, c.timeUp())
	now = now.Add(time.Second)
	assert.True(t, c.timeUp(), "a minute since the start")
	c.timeDue = true
	assert.True(t, c.due(7))
	c.restartClock()
	assert.False(t, c.timeDue)
	assert.False(t, c.due(7))
	assert.False(t, c.timeUp(), "the clock restarted at the boundary before the save")
	other := &checkpointer{every: time.Minute, clock: func() time.Time { t.Fatal("only rank 0 reads its clock"); return now }}
	assert.False(t, other.timeUp())
	var none *checkpointer
	assert.False(t, none.timeUp())
	assert.False(t, none.due(3))
}
