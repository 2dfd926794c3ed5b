package parallel

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFP8ParamGatherHalves: recipes/llama-1b.toml (the 1.24B shape, 8 GPUs,
// optim_grads_params, overlap on) in FP8, with and without param_gather.
// With it each layer's unit lays its FP8 products' weights (q, k, v, o, w1,
// w3, w2; all but 8 KiB of a layer) out in an FP8 group of their own, the
// norms staying in the dense group; the embedding's unit has none. Then:
//
//   - the all-gathers move the same elements, the FP8 groups' a byte a value
//     (half their bf16 bytes), beside one small all-reduce of the tensors'
//     amaxes a step;
//   - the compute weights shrink by the FP8 shards' bytes less the scales'
//     (FP8ScaleBytes);
//   - the gathered units hold the FP8 parts in an arena of their own, a byte
//     a value: under prefetch it holds two layers' FP8 parts, as bf16's arena
//     holds two whole layers where the layers set its peak (vocab_size 16384
//     here, the embedding smaller than a layer), so the FP8 part of the
//     gathered units halves. The bf16 arena then holds the largest unit left
//     in it, the embedding's, beside the next layer's norms (the arenas peak
//     apart: each is one allocation of its own dtype), so the whole falls by
//     less than the FP8 part's half: measured 243 MB to 189 MB. As shipped, the
//     tied 128k-row embedding (262M elements against a layer's 61M) sets the
//     bf16 arena's peak in both runs: the gathered units take no more than in
//     bf16 (as much, measured), and the saving is the traffic's.
func TestFP8ParamGatherHalves(t *testing.T) {
	recipe := filepath.Join("..", "recipes", "llama-1b.toml")
	sets := []string{"precision.bf16=true", "precision.fp8.format=hybrid", "precision.fp8.recipe=tensorwise", "fsdp.data_parallel_sharding_strategy=optim_grads_params"}
	small := func(s []string) []string { return append(append([]string{}, s...), "model.vocab_size=16384") }
	sb := compile(t, &load(t, recipe, small(sets)...).Recipe)
	s8 := compile(t, &load(t, recipe, small(append(sets, "precision.fp8.param_gather=true"))...).Recipe)
	var layer, layer8 int64 // a layer unit's padded elements, and its FP8 group's
	for _, g := range s8.Groups {
		if g.FP8 {
			layer8 = max(layer8, g.Padded)
		}
	}
	for _, g := range sb.Groups {
		if sb.Units[g.Unit].Name == "layers.0" {
			layer = g.Padded
		}
	}
	require.Positive(t, layer8)
	assert.Equal(t, 2*layer, sb.Buffers.Gather, "bf16: two layers under prefetch")
	assert.Equal(t, 2*layer8, s8.Buffers.GatherFP8, "param_gather: two layers' FP8 parts")
	assert.Equal(t, 2*s8.Buffers.Gather+s8.Buffers.GatherFP8, s8.Memory.GatheredUnits, "the FP8 part a byte a value")
	assert.Less(t, s8.Memory.GatheredUnits, sb.Memory.GatheredUnits)
	t.Logf("vocabulary 16384: gathered units bf16 %d bytes, param_gather %d (its FP8 part %d bytes, %d in bf16)",
		sb.Memory.GatheredUnits, s8.Memory.GatheredUnits, s8.Buffers.GatherFP8, 2*s8.Buffers.GatherFP8)

	pb := compile(t, &load(t, recipe, sets...).Recipe)
	r8 := load(t, recipe, append(sets, "precision.fp8.param_gather=true")...)
	p8 := compile(t, &r8.Recipe)
	assert.LessOrEqual(t, p8.Memory.GatheredUnits, pb.Memory.GatheredUnits)
	t.Logf("as shipped: gathered units bf16 %d bytes, param_gather %d", pb.Memory.GatheredUnits, p8.Memory.GatheredUnits)

	var fp8Elems, fp8Shard, tensors int64
	for _, g := range p8.Groups {
		if !g.FP8 {
			continue
		}
		require.Equal(t, "e4m3", g.Dtype)
		fp8Elems, fp8Shard, tensors = fp8Elems+g.Padded, fp8Shard+g.ShardNumel(), tensors+int64(len(g.Entries))
		for _, e := range g.Entries {
			require.True(t, FP8Weight(&r8.Recipe, &p8.Params[e.Param]), p8.Params[e.Param].Name)
		}
	}
	require.Equal(t, int64(16*7), tensors, "7 FP8 products in each of 16 layers")

	// All-gathers: the FP8 groups' bytes halve.
	gathered := func(p *Plan, dtype string) (n int64) {
		for _, c := range p.Collectives {
			if c.Kind == AllGather && (dtype == "" || c.Dtype == dtype) {
				n += c.StepBytes()
			}
		}
		return n
	}
	micro := int64(p8.MicroBatches)
	assert.Equal(t, 2*micro*fp8Elems, gathered(p8, "fp8"), "FP8 groups: gathered before forward and backward, a byte a value")
	assert.Equal(t, gathered(pb, "")-2*micro*fp8Elems, gathered(p8, ""), "the FP8 groups' all-gathers halve; the rest stay")
	t.Logf("all-gather bytes a step: bf16 %d, param_gather %d", gathered(pb, ""), gathered(p8, ""))
	var amaxes int64
	for _, c := range p8.Collectives {
		if c.What == "fp8 amaxes" {
			amaxes += c.StepBytes()
		}
	}
	assert.Equal(t, 4*tensors*8, amaxes, "one all-reduce of each rank's amax of each tensor, f32")

	// Compute weights: the FP8 shards a byte a value, and their scales.
	assert.Equal(t, pb.Memory.Weights-fp8Shard+FP8ScaleBytes(tensors, 8), p8.Memory.Weights)
}
