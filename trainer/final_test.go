package trainer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEndOfRunStaysInThePlan: the end of a run on several ranks (its final
// weights sent to rank 0 a parameter at a time, its sample drawn under the
// host's policy or the GPUs') allocates nothing in any rank's backend memory
// beyond what the run held for its steps: at the end each rank's memory holds
// the plan's components as run.json reports them plus the small buffers
// TestStateLivesInBackendMemory counts, and it never held more. Before, every
// rank gathered the whole model at the end. Under the host's policy rank 0
// samples alone from its host copy, and the sample is the one `shardline
// sample` draws from weights.bin with the run's seed, exactly. Under the GPUs'
// (samplesLikeDevices) rank 0 samples alone with the training model where it
// holds the whole model (optim_grads here), and every rank together where the
// model is split; the sample is again shardline sample's: the logits of the
// window's last token are put together right from the context-parallel rank
// that holds the position (20 tokens after a one-token prompt cross every
// chunk of a 32-token sequence over cp 2) and every tensor-parallel rank's
// vocabulary rows (in fp32 the forwards agree to rounding, far too little to
// change a draw at these logits; MoE and bf16 runs are left out of that
// comparison: the one routes the batch's other tokens, the other computes in
// bf16 where sampling from weights.bin does not).
func TestEndOfRunStaysInThePlan(t *testing.T) {
	const n = 20
	moe := []string{"model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.expert_ffn_hidden=32", "model.moe.capacity_factor=1.0"}
	defer func(v bool, room func() int64) { samplesLikeDevices, hostRoom = v, room }(samplesLikeDevices, hostRoom)
	hostRoom = func() int64 { return 64 << 30 } // room for the host's policy to sample alone, on any machine the tests run on
	for _, together := range []bool{false, true} {
		for _, c := range []struct {
			name        string
			sets        []string
			fp32, split bool // split: the model is split over the ranks
		}{
			{"optim_grads_params", nil, true, true},
			{"optim_grads", []string{"fsdp.data_parallel_sharding_strategy=optim_grads"}, true, false},
			{"bf16 optim_grads_params", []string{"precision.bf16=true"}, false, true},
			{"tp2", []string{"parallel.tensor_parallel=2"}, true, true},
			{"cp2", []string{"parallel.context_parallel=2"}, true, true},
			{"moe ep2", append([]string{"parallel.expert_parallel=2"}, moe...), false, true},
		} {
			name := "host/" + c.name
			if together {
				name = "devices/" + c.name
			}
			t.Run(name, func(t *testing.T) {
				samplesLikeDevices = together
				sets := append([]string{"parallel.world_size=2", "train.steps=3", "train.eval_interval=0", fmt.Sprintf("logging.sample_tokens=%d", n)}, c.sets...)
				res, _ := tinyRun(t, sets...)
				be := &countingBackend{}
				o := opts()
				o.Backend = be
				out, err := Run(context.Background(), res, o)
				require.NoError(t, err)
				require.GreaterOrEqual(t, len(be.mems), 2)
				want := out.Held.Total + smallBuffers(&res.Recipe)
				for i, m := range be.mems[:2] {
					mem := m.(*cpu.Memory)
					assert.Equal(t, want, mem.Held(), "rank memory %d at the end: the components and small buffers", i)
					assert.Equal(t, mem.Held(), mem.Peak(), "rank memory %d never held more than at the end", i)
				}
				assert.Equal(t, out.Predicted.GatheredUnits, out.Held.GatheredUnits, "nothing allocated apart from the FSDP arena")
				require.Len(t, out.Sample, 1+n, "%q", out.Sample)
				if c.fp32 || !together {
					again, err := SampleRun(cpu.Backend{}, out.Dir, out.Sample[:1], n, sampleTemperature, res.Recipe.Run.Seed)
					require.NoError(t, err)
					assert.Equal(t, out.Sample[1:], again, "the sample drawn and shardline sample's from weights.bin")
				}
				log := string(must(os.ReadFile(filepath.Join(out.Dir, "run.log"))))
				if together && c.split {
					assert.Contains(t, log, "sampling with every rank")
				} else {
					assert.NotContains(t, log, "sampling with every rank")
				}
			})
		}
	}
}

// TestMemoryAvailable: the room rank 0 judges a sample by is the host's
// MemAvailable, capped by what a cgroup memory limit (v2 or v1) leaves; no
// limit ("max", or v1's near 2^63) caps nothing, and nothing readable gives 0.
func TestMemoryAvailable(t *testing.T) {
	dir := t.TempDir()
	meminfo := filepath.Join(dir, "meminfo")
	require.NoError(t, os.WriteFile(meminfo, []byte("MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n"), 0o644))
	host := int64(20000000) * 1024
	write := func(cg, name, v string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(cg, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(cg, name), []byte(v+"\n"), 0o644))
	}
	none := filepath.Join(dir, "none")
	assert.Equal(t, host, memoryAvailable(meminfo, none), "no cgroup files")
	v2 := filepath.Join(dir, "v2")
	write(v2, "memory.max", "8589934592")
	write(v2, "memory.current", "1073741824")
	assert.Equal(t, int64(7<<30), memoryAvailable(meminfo, v2), "v2: the limit less what the group uses")
	write(v2, "memory.max", "max")
	assert.Equal(t, host, memoryAvailable(meminfo, v2), "v2 without a limit")
	v1 := filepath.Join(dir, "v1")
	write(v1, "memory/memory.limit_in_bytes", "4294967296")
	write(v1, "memory/memory.usage_in_bytes", "5368709120")
	assert.Equal(t, int64(0), memoryAvailable(meminfo, v1), "v1 over its limit: no room")
	write(v1, "memory/memory.limit_in_bytes", "9223372036854771712")
	assert.Equal(t, host, memoryAvailable(meminfo, v1), "v1 without a limit")
	assert.Equal(t, int64(0), memoryAvailable(filepath.Join(dir, "missing"), none), "nothing readable")
	write(v2, "memory.max", "8589934592")
	assert.Equal(t, int64(7<<30), memoryAvailable(filepath.Join(dir, "missing"), v2), "a limit without meminfo")
}

// TestSampleWithoutRoom: a host without room for the whole model twice (a
// GiB to spare, in half of what it has) makes the ranks sample together even
// under the host's policy; rank 0 decides and every rank follows.
func TestSampleWithoutRoom(t *testing.T) {
	defer func(room func() int64) { hostRoom = room }(hostRoom)
	for _, c := range []struct {
		room     int64
		together bool
	}{{64 << 30, false}, {2 << 30, true}, {0, true}} {
		hostRoom = func() int64 { return c.room }
		res, _ := tinyRun(t, "parallel.world_size=2", "train.steps=2", "train.eval_interval=0", "logging.sample_tokens=5")
		out, err := Run(context.Background(), res, opts())
		require.NoError(t, err)
		require.Len(t, out.Sample, 6)
		log := string(must(os.ReadFile(filepath.Join(out.Dir, "run.log"))))
		assert.Equal(t, c.together, strings.Contains(log, "sampling with every rank"), "room %d", c.room)
	}
}

// TestWeightsFailureEndsEveryRank: when rank 0 cannot start weights.bin, or
// a write into it fails part-way (under the GPUs' policy, where the ranks
// would sample together next), it still takes part in the final gathers,
// then tells the world there is nothing to sample; the run ends, failing
// with the weights' error and its cause, and nothing of weights.bin is left
// in the run directory.
func TestWeightsFailureEndsEveryRank(t *testing.T) {
	defer func(v bool, c func(string, int64) (*fileio.SealedWriter, error)) {
		samplesLikeDevices, createSealed = v, c
	}(samplesLikeDevices, createSealed)
	samplesLikeDevices = true // the ranks sample together after the weights
	for _, c := range []struct {
		name, cause string
		create      func(path string, n int64) (*fileio.SealedWriter, error)
	}{
		{"at the start", "no space left on device", func(path string, n int64) (*fileio.SealedWriter, error) {
			return nil, fmt.Errorf("%s: no space left on device (a test's)", path)
		}},
		// A file of half the size: the header and the first parameters fit,
		// a later write lies past the end and fails.
		{"part-way", "of a file of", func(path string, n int64) (*fileio.SealedWriter, error) {
			return fileio.CreateSealed(path, n/2)
		}},
	} {
		createSealed = c.create
		res, _ := tinyRun(t, "parallel.world_size=2", "train.steps=2", "train.eval_interval=0", "logging.sample_tokens=5")
		done := make(chan error, 1)
		go func() {
			_, err := Run(context.Background(), res, opts())
			done <- err
		}()
		select {
		case err := <-done:
			require.Error(t, err, c.name)
			assert.Contains(t, err.Error(), "saving weights", c.name)
			assert.Contains(t, err.Error(), c.cause, c.name)
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s: the ranks did not end after rank 0 failed to write weights.bin", c.name)
		}
		entries, err := os.ReadDir(filepath.Join(res.Recipe.Run.OutputDir, res.Recipe.Run.Name))
		require.NoError(t, err)
		for _, e := range entries {
			assert.NotContains(t, e.Name(), "weights", "%s: nothing of weights.bin is left", c.name)
		}
	}
}
