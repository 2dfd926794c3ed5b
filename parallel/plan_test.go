package parallel

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite golden files")

func load(t testing.TB, path string, sets ...string) *config.Resolved {
	t.Helper()
	res, diags := config.Load(path, config.Options{Sets: sets})
	require.False(t, diags.HasErrors(), "%v", diags)
	return res
}

func compile(t testing.TB, r *config.Recipe) *Plan {
	t.Helper()
	return compileWith(t, r, nil)
}

// compileWith compiles r timed by the calibration tables cals.
func compileWith(t testing.TB, r *config.Recipe, cals Calibrations) *Plan {
	t.Helper()
	topo, err := TopologyOf(r.Parallel, cals)
	require.NoError(t, err)
	p, err := Compile(r, topo)
	require.NoError(t, err)
	return p
}

// TestGoldenPlans is data-driven: each testdata/plans/*.txt holds a recipe path and
// --set overrides, a line "----", then the printed plan.
func TestGoldenPlans(t *testing.T) {
	files, err := filepath.Glob("testdata/plans/*.txt")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			require.NoError(t, err)
			head, _, found := strings.Cut(string(raw), "----\n")
			require.True(t, found, "missing ---- separator")
			var recipe string
			var sets []string
			sc := bufio.NewScanner(strings.NewReader(head))
			for sc.Scan() {
				line := strings.TrimSpace(sc.Text())
				switch {
				case line == "" || strings.HasPrefix(line, "#"):
				case strings.HasPrefix(line, "recipe "):
					recipe = strings.TrimPrefix(line, "recipe ")
				case strings.HasPrefix(line, "set "):
					sets = append(sets, strings.TrimPrefix(line, "set "))
				default:
					t.Fatalf("unknown directive %q", line)
				}
			}
			p := compile(t, &load(t, recipe, sets...).Recipe)
			var b bytes.Buffer
			require.NoError(t, p.WriteTable(&b))
			got := head + "----\n" + b.String()
			if *update {
				require.NoError(t, os.WriteFile(f, []byte(got), 0o644))
				return
			}
			require.Equal(t, string(raw), got, "run go test ./parallel -update if the change is intended")
		})
	}
}

// TestTinyByHand checks the parameter table and every memory formula against a hand
// calculation for recipes/tiny.toml at world size 4, optim_grads_params, fp32.
func TestTinyByHand(t *testing.T) {
	res := load(t, "../recipes/tiny.toml", "parallel.world_size=4", "train.global_batch_size=64")
	p := compile(t, &res.Recipe)
	const (
		V, H, F, L, heads, seq, mb = 256, 128, 384, 4, 4, 128, 16
		embed                      = V * H                    // 32,768
		layer                      = 2*H + 4*H*H + 3*H*F      // norms + q,k,v,o + w1,w3,w2 = 213,248
		output                     = H + V*H                  // final norm + head = 32,896
		total                      = embed + L*layer + output // 918,656
		shard                      = total / 4                // every buffer is a multiple of 4·16: no padding
		tokens                     = mb * seq                 // 2,048 tokens per micro-batch
		attn                       = 4*tokens*H + 2*tokens*H
		mlp                        = 2*tokens*H + 3*tokens*F
	)
	assert.EqualValues(t, total, p.ParamsTotal)
	assert.EqualValues(t, 0, p.Padding)
	assert.Equal(t, 6, len(p.Units))
	assert.Equal(t, "embed", p.Units[p.Params[0].Unit].Name)
	assert.Equal(t, "layers.2", p.Units[p.Params[1+2*9+3].Unit].Name, "layers.2.attn.wv (9 rows per dense layer)")
	assert.Equal(t, "output", p.Units[p.Params[len(p.Params)-1].Unit].Name)
	m := p.Memory
	assert.EqualValues(t, shard*4, m.Weights, "fp32 weight shard")
	assert.EqualValues(t, 0, m.MainWeights, "fp32 compute: the weights are the main weights")
	assert.EqualValues(t, shard*4, m.Grads, "fp32 gradient shard")
	assert.EqualValues(t, shard*8, m.OptimizerState, "two fp32 AdamW moments per owned element")
	// The arenas: prefetch keeps two layers' weights at once, and
	// overlap_grad_reduce one layer's gradients reducing beside the next's. Plain
	// first fit would need a head more (in backward the head's buffer, taken first
	// at offset 0, leaves a range below the layers that none fits); in slots of a
	// layer the head shares a slot, so the slots win.
	assert.EqualValues(t, 2*layer*4, m.GatheredUnits, "prefetch: two gathered layers")
	// The reduction's staging: a layer's shard of the sum (fp32), added into
	// the gradient shard.
	assert.EqualValues(t, 2*layer*4+layer/4*4, m.GradReduceBuffers, "overlap_grad_reduce: two unit grad buffers, and the staging")
	assert.Equal(t, UnitBuffers{Largest: layer, Gather: 2 * layer, Reduce: 2 * layer, GatherSlot: layer, ReduceSlot: layer,
		Stage: ReduceStage{Part: layer / 4}}, p.Buffers)
	assert.EqualValues(t, (L*(attn+mlp)+2*tokens*H)*4+(2*L+1)*tokens*4+L*heads*tokens*4+2*tokens*4, m.Activations,
		"and the norms' reciprocal RMS per row, flash attention's log-sum-exps, the token ids and targets (int32)")
	assert.EqualValues(t, tokens*V*4+tokens*4, m.Logits, "logits (the softmax written over them), token losses")
	assert.EqualValues(t, 0, m.MoEDispatch)
	// Backward's work buffers: the residual gradient and its scratch, the q,
	// attention-output, k and v gradients (4 heads of 32, no GQA), the MLP's three
	// ffn gradients, the per-token loss gradient (the logits' gradient is
	// written over the softmax), and the RoPE tables (seq × head size).
	assert.EqualValues(t, (2*tokens*H+4*tokens*H+3*tokens*F+tokens+seq*(H/heads))*4, m.Scratch, "backward's work buffers")
	assert.Equal(t, m.Weights+m.Grads+m.OptimizerState+m.GatheredUnits+m.GradReduceBuffers+m.Activations+m.Logits+m.Scratch, m.Total)
	assert.Equal(t, 1, p.MicroBatches)
}

// TestStrategyTable checks what each strategy keeps whole or sharded (bf16 compute,
// fp32 main weights, bf16 gradients as Megatron-FSDP holds them on GPUs), for 8
// ranks.
func TestStrategyTable(t *testing.T) {
	full, shard := int64(800), int64(100)
	d := dtypes{compute: 2, main: 4, grad: 2, optim: 8, act: 2, separateMain: true}
	for _, tc := range []struct {
		strategy                    string
		weights, main, grads, optim int64
	}{
		{"no_shard", full * 2, full * 4, full * 2, full * 8},
		{"optim", full * 2, shard * 4, full * 2, shard * 8},
		{"optim_grads", full * 2, shard * 4, shard * 2, shard * 8},
		{"optim_grads_params", shard * 2, shard * 4, shard * 2, shard * 8},
	} {
		m := staticMemory(ShardingOf(tc.strategy), full, shard, d)
		assert.Equal(t, []int64{tc.weights, tc.main, tc.grads, tc.optim}, []int64{m.Weights, m.MainWeights, m.Grads, m.OptimizerState}, tc.strategy)
	}
}

func TestMeshGroups(t *testing.T) {
	m, err := NewMesh(16, 2, 2, 1, 4, 1)
	require.NoError(t, err)
	assert.Equal(t, Mesh{World: 16, TP: 2, CP: 2, DP: 4, PP: 1, ETP: 1, EP: 4, EDP: 4}, m)
	assert.Equal(t, Coords{TP: 1, CP: 0, DP: 2, PP: 0, ETP: 0, EP: 1, EDP: 2}, m.Coords(9))
	assert.Equal(t, []int{8, 9}, m.Group(AxisTP, 9))
	assert.Equal(t, []int{9, 11}, m.Group(AxisCP, 9))
	assert.Equal(t, []int{1, 5, 9, 13}, m.Group(AxisDP, 9))
	assert.Equal(t, []int{1, 3, 5, 7, 9, 11, 13, 15}, m.Group(AxisDPCP, 9))
	assert.Equal(t, []int{8, 9, 10, 11}, m.Group(AxisEP, 9))
	assert.Equal(t, []int{1, 5, 9, 13}, m.Group(AxisEDP, 9))
	assert.True(t, m.SpansNodes(AxisDP, 8))
	assert.False(t, m.SpansNodes(AxisTP, 8))

	// Every axis partitions the world into equal groups that contain their rank.
	for _, shape := range [][6]int{{16, 2, 2, 1, 4, 1}, {24, 2, 1, 1, 2, 3}, {32, 1, 2, 2, 8, 2}, {8, 1, 1, 1, 1, 1}} {
		m, err := NewMesh(shape[0], shape[1], shape[2], shape[3], shape[4], shape[5])
		require.NoError(t, err)
		for _, a := range GroupAxes {
			seen := map[int]int{}
			for r := 0; r < m.World; r++ {
				g := m.Group(a, r)
				require.Len(t, g, m.Size(a))
				assert.Contains(t, g, r)
				for _, x := range g {
					seen[x]++
				}
			}
			for r := 0; r < m.World; r++ {
				assert.Equal(t, m.Size(a), seen[r], "axis %s shape %v rank %d", a, shape, r)
			}
		}
	}
	_, err = NewMesh(6, 4, 1, 1, 1, 1)
	var ke *config.Diagnostic
	require.ErrorAs(t, err, &ke)
	assert.Equal(t, "parallel.world_size", ke.Key)
}

// TestInvariantsRandomShapes is a property test over seeded random models and
// meshes: layouts verify (Compile checks that every element is owned by exactly one
// shard and padding adds up), shards sum to parameters plus padding, expert groups
// shard over edp only, EP+FSDP never needs more static memory than EP with no_shard,
// and raising EP never raises static memory.
func TestInvariantsRandomShapes(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	pick := func(xs ...int) int { return xs[rng.Intn(len(xs))] }
	for i := 0; i < 60; i++ {
		r := config.Default()
		r.Model.Hidden = pick(64, 96, 128, 256)
		r.Model.Heads = pick(2, 4, 8)
		r.Model.KVHeads = pick(0, 1, 2)
		r.Model.Layers = pick(1, 2, 3, 5)
		r.Model.FFNHidden = pick(96, 200, 344, 512)
		r.Model.VocabSize = pick(256, 1000, 4096)
		r.Model.TieEmbeddings = rng.Intn(2) == 0
		r.Model.MoE.NumExperts = pick(8, 16, 32)
		r.Model.MoE.TopK = pick(1, 2, 4)
		r.Model.MoE.ExpertFFNHidden = pick(64, 100, 256)
		r.Model.MoE.SharedExperts = pick(0, 1)
		r.Model.MoE.LayerFreq = min(pick(1, 1, 2), r.Model.Layers)
		r.Parallel.WorldSize = pick(8, 16, 32)
		r.Train.MicroBatchSize, r.Train.GlobalBatchSize = 1, 64
		r.Precision.BF16 = rng.Intn(2) == 0
		r.FSDP.FSDPUnitModules = [][]string{{"embedding", "transformer_layer", "output"}, {"attention", "moe", "mlp"}, {"transformer_layer"}}[rng.Intn(3)]
		name := fmt.Sprintf("case %d: %+v %+v", i, r.Model, r.Parallel)
		var prevStatic int64 = -1
		for _, ep := range []int{1, 2, 4, 8} {
			r.Parallel.ExpertParallel = ep
			r.FSDP.DataParallelShardingStrategy = "optim_grads_params"
			fsdp := compile(t, &r)
			r.FSDP.DataParallelShardingStrategy = "no_shard"
			epOnly := compile(t, &r)
			assert.LessOrEqual(t, fsdp.Memory.Static(), epOnly.Memory.Static(), "EP+FSDP ≤ EP alone: %s ep=%d", name, ep)
			if prevStatic >= 0 {
				assert.LessOrEqual(t, fsdp.Memory.Static(), prevStatic, "raising EP to %d raised static memory: %s", ep, name)
			}
			prevStatic = fsdp.Memory.Static()
			var sumShards, params, padding int64
			for gi := range fsdp.Groups {
				g := &fsdp.Groups[gi]
				if g.Expert {
					assert.Equal(t, AxisEDP, g.Axis)
					assert.Equal(t, fsdp.Mesh.EDP, g.Shards)
				} else {
					assert.Equal(t, AxisDPCP, g.Axis)
					assert.Equal(t, fsdp.Mesh.DP*fsdp.Mesh.CP, g.Shards)
				}
				sumShards += g.ShardNumel() * int64(g.Shards)
				params += g.Numel
				padding += g.AlignPad + g.TailPad
			}
			assert.Equal(t, params+padding, sumShards, name)
			var local int64
			for pi := range fsdp.Params {
				if !fsdp.Params[pi].IsExpert() || fsdp.Params[pi].Expert < r.Model.MoE.NumExperts/ep {
					local += fsdp.Params[pi].LocalNumel()
				}
			}
			assert.Equal(t, local, params, "a rank's groups hold exactly its parameters: %s", name)
		}
	}
}

func TestFingerprintStable(t *testing.T) {
	res := load(t, "../recipes/llama4-3bx128e.toml")
	a, b := compile(t, &res.Recipe), compile(t, &res.Recipe)
	assert.Equal(t, a.Fingerprint, b.Fingerprint)
	assert.Regexp(t, `^sha256:[0-9a-f]{64}$`, a.Fingerprint)
	r := res.Recipe
	r.Parallel.ExpertParallel = 2
	assert.NotEqual(t, a.Fingerprint, compile(t, &r).Fingerprint)
	r.Parallel.ExpertParallel = 4
	r.Train.LR *= 2 // the learning rate does not change the layout
	assert.Equal(t, a.Fingerprint, compile(t, &r).Fingerprint)
}

func TestCheck(t *testing.T) {
	// Does not fit: llama-1b on A100s with a large micro batch; the help lists
	// changes that fit with their predicted memory.
	res, diags := config.Load("../recipes/llama-1b.toml", config.Options{Flags: []config.FlagValue{{Name: "device-profile", Value: "a100-80gb"}, {Name: "micro-batch-size", Value: "32"}, {Name: "world-size", Value: "8"}}})
	require.False(t, diags.HasErrors(), "%v", diags)
	p, ds := Check(res, nil)
	require.NotNil(t, p)
	require.Len(t, ds, 1)
	assert.Equal(t, "SL501", ds[0].Code)
	assert.Equal(t, "flag --micro-batch-size", ds[0].Location())
	assert.Contains(t, ds[0].Message, "logits")
	assert.Contains(t, ds[0].Help, `activation_checkpoint.mode = "full"`)

	// A change run would refuse is not suggested (refusesMore): a cuda recipe
	// whose head size the GPU kernels lack; recomputation is never refused.
	res, diags = config.Load("../recipes/tiny.toml", config.Options{Sets: []string{"model.seq_len=512"}})
	require.False(t, diags.HasErrors(), "%v", diags)
	sel, full, odd := res.Recipe, res.Recipe, res.Recipe
	sel.ActivationCheckpoint.Mode, full.ActivationCheckpoint.Mode = "selective", "full"
	odd.Parallel.Device, odd.Model.HeadDim = "cuda", 48
	assert.False(t, refusesMore(&res.Recipe, &sel))
	assert.False(t, refusesMore(&res.Recipe, &full))
	assert.True(t, refusesMore(&res.Recipe, &odd))
	assert.False(t, refusesMore(&odd, &odd), "a setting the recipe already has is no new refusal")

	// Cannot compile: vocabulary not divisible by tp.
	res, diags = config.Load("../recipes/tiny.toml", config.Options{Sets: []string{"model.vocab_size=257", "parallel.world_size=2", "parallel.tensor_parallel=2"}})
	require.False(t, diags.HasErrors(), "%v", diags)
	p, ds = Check(res, nil)
	assert.Nil(t, p)
	require.Len(t, ds, 1)
	assert.Equal(t, "SL502", ds[0].Code)
	assert.Equal(t, "parallel.tensor_parallel", ds[0].Key)

	// Large model without meta-device init.
	res, diags = config.Load("../recipes/llama4-3bx128e.toml", config.Options{Sets: []string{"fsdp.init_model_with_meta_device=false"}})
	require.False(t, diags.HasErrors(), "%v", diags)
	_, ds = Check(res, nil)
	require.Len(t, ds, 1)
	assert.Equal(t, "SL112", ds[0].Code)
	assert.Equal(t, config.SevWarning, ds[0].Severity)
	assert.Equal(t, "flag --set fsdp.init_model_with_meta_device", ds[0].Location())
}

// TestStrategiesCommunicate checks who talks when, per Megatron-FSDP's table.
func TestStrategiesCommunicate(t *testing.T) {
	kinds := func(p *Plan) map[string]int64 {
		out := map[string]int64{}
		for _, c := range p.Collectives {
			out[string(c.Axis)+" "+c.Kind+" "+c.What] += c.Calls
		}
		return out
	}
	base := []string{"parallel.world_size=4", "train.global_batch_size=128"} // 2 micro-batches
	units := int64(6)
	for _, tc := range []struct {
		strategy string
		want     map[string]int64
	}{
		{"no_shard", map[string]int64{"dp_cp all_reduce grads": units}},
		{"optim", map[string]int64{"dp_cp reduce_scatter grads": units, "dp_cp all_gather updated params": units}},
		{"optim_grads", map[string]int64{"dp_cp reduce_scatter grads": 2 * units, "dp_cp all_gather updated params": units}},
		{"optim_grads_params", map[string]int64{"dp_cp all_gather params fwd": 2 * units, "dp_cp all_gather params bwd": 2 * units, "dp_cp reduce_scatter grads": 2 * units}},
	} {
		p := compile(t, &load(t, "../recipes/tiny.toml", append(base, "fsdp.data_parallel_sharding_strategy="+tc.strategy)...).Recipe)
		assert.Equal(t, tc.want, kinds(p), tc.strategy)
	}
}

// TestMoETokensByHand checks the routed-token counts and dispatch buffers for
// moe-tiny at 8 ranks, EP 4: 16×128 = 2,048 local tokens, top-2; and that the CPU
// engine holds no dispatch buffers at EP 1.
func TestMoETokensByHand(t *testing.T) {
	res := load(t, "../recipes/moe-tiny.toml", "parallel.world_size=8", "parallel.expert_parallel=4", "train.global_batch_size=128")
	m := compile(t, &res.Recipe).Mesh
	tk := tokensOf(&res.Recipe, m)
	assert.EqualValues(t, 2048, tk.local)
	assert.EqualValues(t, 2048*2, tk.routed, "balanced: each rank receives what it sends, local × top_k")
	assert.EqualValues(t, 4*2048*2, tk.worst, "every ep rank's copies land here: ep × local × min(top_k, E/ep = 2)")
	d := dtypesOf(&res.Recipe)
	exp, worst := dispatchBytes(&res.Recipe, m, tk, d)
	assert.EqualValues(t, 2*4096*128*4, exp, "send + receive buffers of T×h fp32")
	assert.EqualValues(t, 2*16384*128*4, worst)
	one := compile(t, &load(t, "../recipes/moe-tiny.toml", "parallel.world_size=8", "train.global_batch_size=128").Recipe).Mesh
	exp, _ = dispatchBytes(&res.Recipe, one, tk, d)
	assert.Zero(t, exp, "the CPU engine exchanges nothing without expert parallelism")

	res = load(t, "../recipes/moe-tiny.toml", "parallel.world_size=8", "parallel.expert_parallel=4", "train.global_batch_size=128", "model.moe.capacity_factor=1.25")
	tk = tokensOf(&res.Recipe, m)
	assert.EqualValues(t, 5120, tk.routed, "capacity 1.25 × 4,096")
	assert.EqualValues(t, 5120, tk.worst, "a capacity factor bounds the worst case too")
	capped := compile(t, &res.Recipe)
	assert.Equal(t, capped.Memory.Total, capped.MemoryWorstTotal, "with a capacity factor the plan's total is the worst case")
	j, err := capped.JSON(-1)
	require.NoError(t, err)
	assert.Equal(t, capped.Memory.Total, j.Memory.TotalWorst)

	dropless := compile(t, &load(t, "../recipes/moe-tiny.toml", "parallel.world_size=8", "parallel.expert_parallel=4", "train.global_batch_size=128").Recipe)
	assert.Greater(t, dropless.MemoryWorstTotal, dropless.Memory.Total)
	j, err = dropless.JSON(-1)
	require.NoError(t, err)
	assert.Equal(t, dropless.MemoryWorstTotal, j.Memory.TotalWorst, "the JSON's total_worst_case")
}

// TestProfilesMatchTheSchema: every device profile can be named in a recipe, and
// every name the recipe accepts (but auto) has a profile.
func TestProfilesMatchTheSchema(t *testing.T) {
	f, ok := config.RecipeSchema().Lookup("parallel.device_profile")
	require.True(t, ok)
	var named []string
	for _, v := range f.Enum {
		if v != "auto" && v != "custom" {
			named = append(named, v)
		}
	}
	require.ElementsMatch(t, ProfileNames(), named)
}

// TestCustomDevice: a custom device takes every figure from the recipe, refuses
// to plan without one of them (naming it), and the same keys override a named
// profile.
func TestCustomDevice(t *testing.T) {
	p := config.Default().Parallel
	p.Device, p.DeviceProfile = "cuda", "custom"
	p.DeviceMemoryGiB, p.DevicePeakTFLOPS, p.DeviceMemoryGBps, p.DeviceIntraNodeGBps = 64, 500, 3000, 400
	_, err := TopologyOf(p, nil)
	require.ErrorContains(t, err, "parallel.device_inter_node_gbps > 0")
	p.DeviceInterNodeGBps = 25
	topo, err := TopologyOf(p, nil)
	require.NoError(t, err)
	require.Equal(t, DeviceProfile{Name: "custom", MemoryBytes: 64 * GiB, PeakFLOPS: 500e12, Achievable: 0.8, FP32FLOPS: 500e12 * 67 / 989,
		FP8FLOPS: 500e12 * 1979 / 989, HBMBandwidth: 3000e9, IntraNodeBW: 400e9, InterNodeBW: 25e9}, topo.Device)
	p.DeviceProfile = "h100-80gb"
	p.DeviceMemoryGiB, p.DeviceMemoryGBps, p.DeviceIntraNodeGBps, p.DeviceInterNodeGBps = 0, 0, 0, 0
	topo, err = TopologyOf(p, nil)
	require.NoError(t, err)
	want := Profiles["h100-80gb"]
	want.PeakFLOPS = 500e12
	want.FP8FLOPS = 1979e12 * 500 / 989 // the FP8 peak keeps its ratio to the bf16 one
	require.InEpsilon(t, want.FP8FLOPS, topo.Device.FP8FLOPS, 1e-12)
	want.FP8FLOPS = topo.Device.FP8FLOPS
	require.Equal(t, want, topo.Device)
}

// TestPlanRefusesWhatLintRefuses: the plan compiler and lint share one set of shape
// rules (config.ShapeProblems): a shape lint refuses is one Compile refuses, under
// the same key. Before, the plan accepted a sequence split into cp chunks where
// lint required 2·cp, and a vocabulary tensor parallelism cannot split.
func TestPlanRefusesWhatLintRefuses(t *testing.T) {
	for _, c := range []struct {
		name, key string
		sets      []string
	}{
		{"seq by 2cp", "model.seq_len", []string{"model.seq_len=130", "parallel.world_size=2", "parallel.context_parallel=2"}},
		{"vocab by tp", "parallel.tensor_parallel", []string{"model.vocab_size=257", "parallel.world_size=2", "parallel.tensor_parallel=2"}},
		{"batch", "train.global_batch_size", []string{"parallel.world_size=4", "train.micro_batch_size=3", "train.global_batch_size=16"}},
		{"shared experts by tp", "model.moe.expert_ffn_hidden", []string{"model.moe.num_experts=4", "model.moe.shared_experts=1", "model.moe.expert_ffn_hidden=33",
			"parallel.world_size=2", "parallel.tensor_parallel=2", "train.global_batch_size=16"}},
	} {
		res := load(t, "../recipes/tiny.toml", c.sets...)
		var lintKeys []string
		for _, d := range config.Lint(res, nil) {
			if d.Severity == config.SevError {
				lintKeys = append(lintKeys, d.Key)
			}
		}
		require.Contains(t, lintKeys, c.key, c.name)
		topo, err := TopologyOf(res.Recipe.Parallel, nil)
		require.NoError(t, err)
		_, err = Compile(&res.Recipe, topo)
		var ke *config.Diagnostic
		require.ErrorAs(t, err, &ke, c.name)
		require.Equal(t, c.key, ke.Key, "%s: %v", c.name, err)
	}
}

// TestEngineDtypes: a bf16 plan counts compute weights at 2 bytes on any device
// and, with grad_reduce_in_bf16, gradients at 2 bytes (held as reduced); on
// the CPU, whose engine computes activations in fp32 but keeps what layers
// save in bf16 (docs/engine.md), activations count as bf16 stores beside one
// fp32 work set;
// the engine's ranks on GPUs keep a dense model's activations and their
// gradients in bf16; and a plan of several GPUs that shardline does not carry
// out counts Megatron-FSDP's bf16 activations and gradients.
func TestEngineDtypes(t *testing.T) {
	var r config.Recipe
	plan := func(sets ...string) *Plan {
		res := load(t, "../recipes/tiny.toml", append([]string{"parallel.world_size=2", "train.global_batch_size=32"}, sets...)...)
		r = res.Recipe
		topo, err := TopologyOf(res.Recipe.Parallel, nil)
		require.NoError(t, err)
		p, err := Compile(&res.Recipe, topo)
		require.NoError(t, err)
		return p
	}
	mem := func(sets ...string) Memory { return plan(sets...).Memory }
	fp32 := mem()
	cpuPlan := plan("precision.bf16=true", "fsdp.grad_reduce_in_bf16=true")
	cpu := cpuPlan.Memory
	assert.Equal(t, fp32.Weights/2, cpu.Weights)
	assert.Equal(t, fp32.GatheredUnits/2, cpu.GatheredUnits)
	// Gradients are held as they are reduced, in bf16: the shards, the unit
	// gradient buffers and the staging, which receives a layer's shard (the
	// largest group, 213,248 values) to add it into the gradient shard.
	assert.Equal(t, fp32.Grads/2, cpu.Grads)
	const layer = 213248
	assert.Equal(t, ReduceStage{Part: layer / 2, PartBF16: true}, cpuPlan.Buffers.Stage)
	assert.Equal(t, fp32.GradReduceBuffers/2, cpu.GradReduceBuffers)
	// tiny, per token: a layer keeps 2176 values (attention 768, MLP 1408) and
	// flash attention's 4 log-sum-exps, the final norm 256, the norms' reciprocal
	// RMS 9 (log-sum-exps and reciprocal RMS fp32 in both), and the token id
	// and target (int32) 2. fp32: 4·2176·4 + 256·4 + 9·4 + 4·4·4 + 2·4 = 35948
	// bytes. bf16: four layers' stores 4·2176·2, the
	// work set (one layer and a second residual buffer, 2304 values) ·4, the
	// final norm ·4, the reciprocal RMS and log-sum-exps ·4, the token id and
	// target ·4: 27756 bytes.
	assert.Equal(t, fp32.Activations/35948*27756, cpu.Activations)
	assert.Equal(t, fp32.Logits, cpu.Logits)
	// Two ranks of a cuda run that shardline carries out run the engine on
	// their GPUs: the same buffers as on the CPU, but for the output head's
	// work, where the GPU keeps a chunk's logits' gradient beside them
	// (cuda.Kernels.HeadWork): one more chunk of fp32 logits; and, the model
	// being dense without tensor or context parallelism, the activations and
	// their gradients in bf16 (native bf16: no fp32 work set, no stores).
	// Activations per token: 4·2176·2 + 256·2 (the final norm) + 9·4 + 4·4·4 + 2·4
	// (statistics and token ids as on the CPU) = 18028 bytes. Scratch: one
	// layer's activation gradients (residual and its scratch 2·128, q, k, v
	// and the attention output's 4·128, the MLP's 3·384 a token) at 2 bytes
	// where the CPU holds 4.
	gpuEngine := mem("parallel.device=\"cuda\"", "precision.bf16=true", "fsdp.grad_reduce_in_bf16=true")
	BT, V := int64(r.Train.MicroBatchSize*r.Model.SeqLen), int64(r.Model.VocabSize)
	chunk := HeadRows(BT, V) * V * 4
	assert.Equal(t, cpu.Logits+chunk, gpuEngine.Logits)
	assert.Equal(t, fp32.Activations/35948*18028, gpuEngine.Activations)
	grads := BT * (2*128 + 4*128 + 3*384)
	assert.Equal(t, cpu.Scratch-2*grads, gpuEngine.Scratch)
	gpuEngine.Total -= chunk + gpuEngine.Activations - cpu.Activations + gpuEngine.Scratch - cpu.Scratch
	gpuEngine.Logits, gpuEngine.Activations, gpuEngine.Scratch = cpu.Logits, cpu.Activations, cpu.Scratch
	assert.Equal(t, cpu, gpuEngine)
	// With tensor parallelism the GPU's engine keeps the CPU's fp32 work set
	// and bf16 stores (its gathers run on fp32 buffers).
	cpuTP := mem("precision.bf16=true", "fsdp.grad_reduce_in_bf16=true", "parallel.tensor_parallel=2")
	gpuTP := mem("parallel.device=\"cuda\"", "precision.bf16=true", "fsdp.grad_reduce_in_bf16=true", "parallel.tensor_parallel=2")
	assert.Equal(t, cpuTP.Activations, gpuTP.Activations)
	assert.Equal(t, cpuTP.Scratch, gpuTP.Scratch)
	// One it does not (cuda_expandable_segments is refused on GPUs) is
	// planned with Megatron-FSDP's dtypes: bf16 gradients and activations.
	gpu := mem("parallel.device=\"cuda\"", "precision.bf16=true", "fsdp.grad_reduce_in_bf16=true", "parallel.cuda_expandable_segments=true")
	gpu32 := mem("parallel.device=\"cuda\"", "parallel.cuda_expandable_segments=true")
	assert.Equal(t, gpu32.Grads/2, gpu.Grads)
	assert.Equal(t, gpu32.Activations/2, gpu.Activations)
}

// TestShardingOf: each strategy decodes to what it shards, cumulatively.
func TestShardingOf(t *testing.T) {
	assert.Equal(t, Sharding{}, ShardingOf("no_shard"))
	assert.Equal(t, Sharding{Optim: true}, ShardingOf("optim"))
	assert.Equal(t, Sharding{Optim: true, Grads: true}, ShardingOf("optim_grads"))
	assert.Equal(t, Sharding{Optim: true, Grads: true, Params: true}, ShardingOf("optim_grads_params"))
}

// TestExpertParam: under expert parallelism the plan places ep rank r's k-th
// local expert of a layer at the layer's expert r·local + k, parameter by
// parameter (w1, w3, w2 alike); dense parameters stay where they are, and
// without expert parallelism every parameter is its own.
func TestExpertParam(t *testing.T) {
	res := load(t, "../recipes/moe-tiny.toml", "parallel.world_size=4", "parallel.expert_parallel=4", "train.micro_batch_size=4", "train.global_batch_size=16")
	topo, err := TopologyOf(res.Recipe.Parallel, nil)
	require.NoError(t, err)
	p, err := Compile(&res.Recipe, topo)
	require.NoError(t, err)
	E := res.Recipe.Model.MoE.NumExperts
	local := E / 4
	index := map[string]int{}
	for i := range p.Params {
		index[p.Params[i].Name] = i
	}
	checked := 0
	for i := range p.Params {
		q := &p.Params[i]
		if !q.IsExpert() {
			for r := range 4 {
				assert.Equal(t, i, p.ExpertParam(i, r), q.Name)
			}
			continue
		}
		if q.Expert >= local {
			continue // the groups hold ep rank 0's experts
		}
		for r := range 4 {
			want := strings.Replace(q.Name, fmt.Sprintf("experts.%d.", q.Expert), fmt.Sprintf("experts.%d.", r*local+q.Expert), 1)
			assert.Equal(t, index[want], p.ExpertParam(i, r), "%s on ep rank %d", q.Name, r)
			checked++
		}
	}
	assert.Positive(t, checked)
	r1 := load(t, "../recipes/moe-tiny.toml").Recipe
	topo1, err := TopologyOf(r1.Parallel, nil)
	require.NoError(t, err)
	one, err := Compile(&r1, topo1)
	require.NoError(t, err)
	for i := range one.Params {
		assert.Equal(t, i, one.ExpertParam(i, 0))
	}
}

// TestPlanTorchtitanReport: the torchtitan report's job file, its llama4
// "3bx128e" given as keys (config's TestImportTorchtitanReport), plans on 8
// H20s at EP 1 and EP 4 with the llama4 router (expert biases, QK-norm off):
// Check finds nothing worse than a note, and the expert biases are in the
// plan (one parameter of 128 values per MoE layer, replicated, no decay).
func TestPlanTorchtitanReport(t *testing.T) {
	path := "../config/testdata/torchtitan/llama4_3bx128e.toml"
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, ep := range []string{"1", "4"} {
		res, diags := config.ImportTorchtitanWith(path, src, 8, []string{"model.layers=48", "model.hidden=2048", "model.heads=32", "model.kv_heads=4",
			"model.vocab_size=202048", "model.ffn_hidden=8192", "model.rope_theta=500000", "model.moe.num_experts=128", "model.moe.expert_ffn_hidden=768",
			"model.moe.layer_freq=1", "model.moe.top_k=8", "parallel.device_profile=h20-96gb", "parallel.expert_parallel=" + ep, "data.path=/data/c4"}) // the report's C4 (from the hub there) as a local copy
		require.False(t, diags.HasErrors(), "%v", diags)
		p, ds := Check(res, nil)
		require.NotNil(t, p, "ep %s", ep)
		for _, d := range ds {
			assert.Equal(t, config.SevNote, d.Severity, "ep %s: %s %s", ep, d.Code, d.Message)
		}
		biases := 0
		for i := range p.Params {
			if p.Params[i].Balance {
				biases++
				assert.Equal(t, []int{128}, p.Params[i].Shape)
			}
		}
		assert.Equal(t, 48, biases, "ep %s", ep)
		t.Logf("ep %s: %.1f GiB per rank planned", ep, float64(p.Memory.Total)/(1<<30))
	}
}
