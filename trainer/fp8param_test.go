package trainer

import (
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/trainer/ckpt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fp8GatherSets are fp8Sets with FP8 compute weights gathered as FP8
// (precision.fp8.param_gather).
var fp8GatherSets = append(append([]string{}, fp8Sets...), "precision.fp8.param_gather=true")

// TestFP8ParamsAreTheMainWeightsQuantised: under param_gather the weights
// the FP8 products read (weights.bin holds them dequantised, code · scale
// inverse) are the final fp32 main weights (the step-8 checkpoint's)
// quantised to E4M3 with the whole tensor's current scale, bit for bit,
// computed here from the formats' definitions (tensor.Amax,
// E4M3.CurrentScale, E4M3.Quantize): on one rank, and sharded over 4 ranks
// (each rank quantises its shard with the amax all-reduced over the four,
// under optim_grads_params gathered per unit, under optim whole after the
// step). Every FP8 product weight of both layers (q, k, v, o, w1, w3, w2) is
// checked, and no other parameter is FP8.
func TestFP8ParamsAreTheMainWeightsQuantised(t *testing.T) {
	for _, c := range []struct {
		n        int
		strategy string
	}{{1, "optim_grads_params"}, {4, "optim_grads_params"}, {4, "optim"}} {
		res, _ := tinyRun(t, append([]string{"train.steps=8", "train.micro_batch_size=1", "train.global_batch_size=8", "train.eval_interval=0",
			"logging.sample_tokens=0", "checkpoint.interval=8", fmt.Sprintf("parallel.world_size=%d", c.n),
			"fsdp.data_parallel_sharding_strategy=" + c.strategy}, fp8GatherSets...)...)
		out, _, w := trainedResult(t, res)
		entries, err := ckpt.List(filepath.Join(out.Dir, "checkpoints"))
		require.NoError(t, err)
		require.NotEmpty(t, entries)
		last := entries[len(entries)-1]
		require.Equal(t, 8, last.Step)
		meta, err := ckpt.Open(last.Dir)
		require.NoError(t, err)
		rd := ckpt.NewReader(last.Dir, meta)
		table, err := parallel.ParamTable(res.Recipe.Model, 1, 1)
		require.NoError(t, err)
		fp8 := 0
		for i := range table {
			if !parallel.FP8Weight(&res.Recipe, &table[i]) {
				continue
			}
			fp8++
			main := make([]float32, table[i].Numel())
			require.NoError(t, rd.Read(table[i].Name, 0, 0, main))
			scale := tensor.E4M3.CurrentScale(tensor.Amax(main))
			codes := make([]uint8, len(main))
			tensor.E4M3.Quantize(codes, main, scale, true)
			want := make([]float32, len(main))
			tensor.E4M3.Dequantize(want, codes, 1/scale)
			for j := range want {
				if math.Float32bits(want[j]) != math.Float32bits(w[i][j]) {
					t.Fatalf("n=%d %s: %s[%d] is %v, the main weight %v quantised is %v", c.n, c.strategy, table[i].Name, j, w[i][j], main[j], want[j])
				}
			}
		}
		rd.Close()
		assert.Equal(t, 14, fp8, "q, k, v, o, w1, w3, w2 of 2 layers")
	}
}

// TestFP8ParamGatherEquivalence: FP8 compute weights gathered as FP8 train
// the same losses on 1, 2 and 4 ranks under optim, optim_grads and
// optim_grads_params, and nearly those of FP8 compute without param_gather.
//
// Among param_gather runs every rank quantises its shard of the same fp32
// main weights with the same whole-tensor scale (the amax all-reduced), so
// every run computes with the same FP8 weights: what differs is the order of
// the gradients' sums over ranks, as in TestBF16DataParallelEquivalence,
// whose tolerance (1e-3 relative, loss by loss) this takes; measured 2e-5.
//
// Against FP8 without param_gather the weights differ: there each product
// quantises the bf16 compute weight (the main weight rounded to bf16 first,
// with that tensor's amax), here the fp32 main weight. The bf16 rounding
// moves a weight by up to 2⁻⁹ relative, which changes its E4M3 code only
// where the value lies that close to a rounding boundary of E4M3's 2⁻⁴
// steps (and the scale by as little), so a few codes a tensor move by one
// step and the trajectories part slowly: measured 1.1e-3 relative over 8
// steps; the tolerance is 1e-2 (a weight read with a wrong scale or a stale
// copy moves the loss by 1e-1 or more), and the curves must differ.
func TestFP8ParamGatherEquivalence(t *testing.T) {
	run := eightSteps(t)
	plain := run(append([]string{"parallel.world_size=1"}, fp8Sets...)...)
	ref := run(append([]string{"parallel.world_size=1"}, fp8GatherSets...)...)
	d := maxRelDiff(plain, ref)
	t.Logf("param_gather against FP8 without it: %.3g relative", d)
	assert.Less(t, d, 1e-2, "param_gather against FP8 without it")
	assert.NotEqual(t, plain, ref, "param_gather quantises the fp32 main weights, not the bf16 compute weights")
	worst := 0.0
	for _, n := range []int{2, 4} {
		for _, strategy := range []string{"optim", "optim_grads", "optim_grads_params"} {
			l := run(append([]string{fmt.Sprintf("parallel.world_size=%d", n), "fsdp.data_parallel_sharding_strategy=" + strategy}, fp8GatherSets...)...)
			worst = max(worst, maxRelDiff(ref, l))
			assert.Less(t, maxRelDiff(ref, l), 1e-3, "n=%d %s", n, strategy)
		}
	}
	t.Logf("param_gather on 2 and 4 ranks against 1: %.3g relative at worst", worst)
}

// TestFP8ParamGatherWithBF16Wgrad: FP8 compute weights beside bf16 weight
// gradients (param_gather with wgrad = false: the input gradients read the
// FP8 weights, the weight gradients are bf16 products of the layers' inputs
// and output gradients, which do not read the weights) train as wgrad =
// false without param_gather does, within param_gather's tolerance against
// FP8 without it (1e-2: the weights' codes come from the fp32 main weights
// rather than the bf16 compute weights), on 1 rank and on 2 under
// optim_grads_params.
func TestFP8ParamGatherWithBF16Wgrad(t *testing.T) {
	run := eightSteps(t, "precision.fp8.wgrad=false")
	plain := run(append([]string{"parallel.world_size=1"}, fp8Sets...)...)
	for _, n := range []int{1, 2} {
		l := run(append([]string{fmt.Sprintf("parallel.world_size=%d", n), "fsdp.data_parallel_sharding_strategy=optim_grads_params"}, fp8GatherSets...)...)
		d := maxRelDiff(plain, l)
		t.Logf("%d ranks: param_gather with bf16 weight gradients against without param_gather: %.3g relative", n, d)
		assert.Less(t, d, 1e-2, "%d ranks", n)
		assert.Less(t, mean(l[6:]), mean(l[:2]), "%d ranks: it learns", n)
	}
}

// eightSteps returns a trainer of the test model over 8 steps of 8
// one-sequence micro-batches (warm-up 2) with the settings base and those it
// is given, returning the losses.
func eightSteps(t *testing.T, base ...string) func(sets ...string) []float64 {
	base = append([]string{"train.steps=8", "train.micro_batch_size=1", "train.global_batch_size=8", "train.eval_interval=0", "train.warmup_steps=2",
		"logging.sample_tokens=0"}, base...)
	return func(sets ...string) []float64 {
		res, _ := tinyRun(t, append(append([]string{}, base...), sets...)...)
		l, _ := trained(t, res)
		require.Len(t, l, 8)
		return l
	}
}
