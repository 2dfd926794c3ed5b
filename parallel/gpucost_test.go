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
