package parallel

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGPUTimeModelAgainstTheH100: the GPU time model against the two training
// runs shardline made on an H100 (docs/cuda.md, 2026-11-23, world size 1,
// bf16): the 134M model at T1024 B16 trained at 366k tokens/s (make bench-gpu's
// step benchmark), and dense-125m as shipped (32 micro-batches of 8×2048) at
// 314k tokens/s through the CLI. The plan must be within 15% of each in
// tokens/s, the bar for plan fidelity. Not a held-out check: one
// figure of the model (gpuGEMMDepth) was fitted to a product of this model's
// MLP; the model's other figures were measured apart from these runs or are
// assumptions (gpucost.go). The model from the peak this one replaced planned
// both at 1.02M tokens/s, 2.8 and 3.3 times what was measured.
func TestGPUTimeModelAgainstTheH100(t *testing.T) {
	for _, c := range []struct {
		what     string
		sets     []string
		measured float64 // tokens/s
	}{
		{"134M, T1024 B16 (bench-gpu)", []string{"model.seq_len=1024", "train.micro_batch_size=16", "train.global_batch_size=16"}, 366e3},
		{"dense-125m as shipped (the CLI run)", nil, 314e3},
	} {
		t.Run(c.what, func(t *testing.T) {
			res := load(t, "../recipes/dense-125m.toml", append([]string{"parallel.world_size=1", "checkpoint.interval=0", "checkpoint.keep_last=0"}, c.sets...)...)
			p := compile(t, &res.Recipe)
			require.Equal(t, "h100-80gb", p.Topology.Device.Name)
			ratio := c.measured / p.TokensPerSPerDevice
			t.Logf("planned %.0f tokens/s, measured %.0f: measured/planned %.3f; %s", p.TokensPerSPerDevice, c.measured, ratio, p.TimeModel)
			assert.InDelta(t, 1, ratio, 0.15)
		})
	}
}

// TestGPUTimeModelIsNotThePeak: a dense 8B Llama (Llama 3 8B's shape, T8192,
// one sequence per rank) on 8 H100s under FSDP plans at an MFU within the 33–39%
// public PyTorch trainers report for that setup (issue #17), give or take a few
// points (30–45%), where the model from the peak put it at 79%.
func TestGPUTimeModelIsNotThePeak(t *testing.T) {
	res := load(t, "../recipes/llama-1b.toml", "model.layers=32", "model.hidden=4096", "model.ffn_hidden=14336", "model.seq_len=8192",
		"model.tie_embeddings=false", "train.micro_batch_size=1", "train.global_batch_size=8", "activation_checkpoint.mode=none")
	p := compile(t, &res.Recipe)
	require.Equal(t, 8, p.Mesh.World)
	t.Logf("MFU %.1f%%, step %.3f s (compute %.3f, optimizer %.4f, exposed communication %.4f)", 100*p.MFU, p.StepTimeS, p.ComputeS, p.OptimizerS, p.ExposedCommS)
	assert.Greater(t, p.MFU, 0.30)
	assert.Less(t, p.MFU, 0.45)
}

// TestNCCLTime: a collective costs its ring steps' latency per call and its
// bytes at NCCL's fraction of the link: an all-reduce twice an all-gather's
// steps and bytes, an all-to-all one step, inter-node steps slower.
func TestNCCLTime(t *testing.T) {
	ag := Collective{Kind: AllGather, Bytes: 8 << 20, Calls: 3}
	bw := 100e9
	want := 3*7*ncclIntraStepS + float64(8<<20)*3*7/8/(bw*ncclLinkFraction)
	assert.InDelta(t, want, ncclTime(ag, 8, bw, false), 1e-12)
	ar := ag
	ar.Kind = AllReduce
	assert.InDelta(t, 2*want, ncclTime(ar, 8, bw, false), 1e-12)
	a2a := ag
	a2a.Kind = AllToAll
	assert.InDelta(t, 3*ncclIntraStepS+float64(8<<20)*3*7/8/(bw*ncclLinkFraction), ncclTime(a2a, 8, bw, false), 1e-12)
	assert.Greater(t, ncclTime(ag, 8, bw, true), ncclTime(ag, 8, bw, false))
	assert.Zero(t, ncclTime(ag, 1, bw, false), "a group of one sends nothing")
}

// TestFSDPOverlapIsPerUnit: FSDP's communication hides behind compute unit by
// unit. With a link fast enough, one unit's communication is exposed; with a
// link a thousand times slower, each unit's excess over its compute is too, so
// the exposed time grows by far more than the first unit's share.
func TestFSDPOverlapIsPerUnit(t *testing.T) {
	fast := load(t, "../recipes/llama-1b.toml")
	pf := compile(t, &fast.Recipe)
	slow := load(t, "../recipes/llama-1b.toml", "parallel.device_intra_node_gbps=0.45")
	ps := compile(t, &slow.Recipe)
	units := float64(len(pf.Units))
	var comm float64
	for _, a := range pf.Comm {
		comm += a.OverlapS
	}
	require.Positive(t, comm)
	assert.Less(t, pf.ExposedCommS, 0.5*comm, "a fast link hides most of FSDP's communication")
	assert.Greater(t, ps.ExposedCommS, ps.ComputeS, "a slow link leaves most of it exposed")
	t.Logf("%v units; fast link: %.4f s exposed of %.4f; slow: %.3f s exposed, compute %.3f s", units, pf.ExposedCommS, comm, ps.ExposedCommS, ps.ComputeS)
}

// TestGPUFP8Products: an FP8 layer's products are timed at the device's dense
// FP8 peak (twice bf16's on the H100, H200 and H20), their operands a byte a
// value; on a device without FP8 tensor cores (the A100) at the bf16 peak.
// A compute-bound product (8192×4096→4096) then takes half its bf16 time on
// the H100 and H20 and as long on the A100; a recipe training in FP8 plans a
// shorter step than in bf16 by about half its FP8 layers' products, less
// the quantisation passes it adds, and says how it timed them.
func TestGPUFP8Products(t *testing.T) {
	for _, c := range []struct {
		profile string
		ratio   float64
	}{{"h100-80gb", 989.0 / 1979}, {"h200-141gb", 989.0 / 1979}, {"h20-96gb", 0.5}, {"a100-80gb", 1}} {
		g := gpuCosts{dev: Profiles[c.profile], bf16: true}
		for _, bwd := range []bool{false, true} {
			bf16, fp8 := g.gemmTimeOf(true, 8192, 4096, 4096, bwd), g.fp8GEMMTime(8192, 4096, 4096, bwd)
			assert.InEpsilon(t, c.ratio, (fp8-launches(bwd))/(bf16-launches(bwd)), 1e-9, "%s, backward %v", c.profile, bwd)
		}
		assert.InDelta(t, g.stream(StreamSwiGLU, 1e6), gpuCosts{dev: Profiles[c.profile], bf16: true, fp8: true}.stream(StreamSwiGLU, 1e6), 1e-15,
			"memory-bound kernels read the run's storage, not codes")
	}
	// Skinny products are bound by their operands' bytes: FP8's a byte each.
	g := gpuCosts{dev: Profiles["h100-80gb"], bf16: true}
	m, k, n := 1<<20, 64, 64
	assert.InEpsilon(t, float64(m*k+k*n)+4*float64(m*n), (g.fp8GEMMTime(m, k, n, false)-gpuLaunchS)*g.dev.HBMBandwidth*gpuCopyEfficiency, 1e-9)

	// The 8B shape of TestGPUTimeModelIsNotThePeak (products of 4096 and
	// 14336 wide, which FP8 speeds up) and dense-125m (768 wide: its products
	// save about what quantising their operands in separate passes costs).
	base := []string{"model.layers=32", "model.hidden=4096", "model.ffn_hidden=14336", "model.seq_len=8192", "model.tie_embeddings=false",
		"train.micro_batch_size=1", "train.global_batch_size=8", "activation_checkpoint.mode=none", "precision.bf16=true"}
	bf16 := compile(t, &load(t, "../recipes/llama-1b.toml", base...).Recipe)
	fp8 := compile(t, &load(t, "../recipes/llama-1b.toml", append(base, "precision.fp8.format=hybrid")...).Recipe)
	t.Logf("the 8B shape on 8 H100s: bf16 compute %.1f ms, FP8 %.1f ms a step; %s", 1e3*bf16.ComputeS, 1e3*fp8.ComputeS, fp8.TimeModel)
	assert.Less(t, fp8.ComputeS, 0.9*bf16.ComputeS, "at T8192 attention, which stays in bf16, takes a third of the step")
	assert.Greater(t, fp8.ComputeS, 0.5*bf16.ComputeS, "attention, the head and the memory-bound kernels stay as they were")
	assert.Contains(t, fp8.TimeModel, "FP8 layers' products at the FP8 peak (1979 TFLOP/s dense)")
	assert.NotContains(t, bf16.TimeModel, "FP8")
	small := []string{"parallel.world_size=1", "checkpoint.interval=0", "checkpoint.keep_last=0", "precision.bf16=true"}
	b125 := compile(t, &load(t, "../recipes/dense-125m.toml", small...).Recipe)
	f125 := compile(t, &load(t, "../recipes/dense-125m.toml", append(small, "precision.fp8.format=hybrid")...).Recipe)
	t.Logf("dense-125m on an H100: bf16 compute %.1f ms, FP8 %.1f ms a step", 1e3*b125.ComputeS, 1e3*f125.ComputeS)
	assert.InDelta(t, 1, f125.ComputeS/b125.ComputeS, 0.05, "768-wide products: FP8 saves about what its quantisation passes cost")
	a100 := compile(t, &load(t, "../recipes/llama-1b.toml", append(base, "precision.fp8.format=hybrid", "parallel.device_profile=a100-80gb")...).Recipe)
	a100bf16 := compile(t, &load(t, "../recipes/llama-1b.toml", append(base, "parallel.device_profile=a100-80gb")...).Recipe)
	assert.Contains(t, a100.TimeModel, "at the bf16 peak: a100-80gb has no FP8 tensor cores")
	assert.Greater(t, a100.ComputeS, a100bf16.ComputeS, "without FP8 tensor cores FP8 only adds its quantisation")
}

// launches is the launch gaps a linear layer's forward (one product) or
// backward (two) adds.
func launches(bwd bool) float64 {
	if bwd {
		return 2 * gpuLaunchS
	}
	return gpuLaunchS
}
