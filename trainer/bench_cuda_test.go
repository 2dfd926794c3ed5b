//go:build cuda || cudaemu

package trainer

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/cuda"
	"github.com/stretchr/testify/require"
)

// h100PeakBF16 is the H100 SXM's dense bf16 tensor-core peak (NVIDIA's
// datasheet), the denominator of the benchmarks' MFU.
const h100PeakBF16 = 989e12

// BenchmarkEngineStep134M times whole training steps of the engine (the FSDP
// runtime and trainer/model over cuda.Kernels) at world size 1 on the
// dense-125m recipe's model (d768, 12 layers, vocabulary 32000, untied head:
// 134M parameters) at B16 T1024 in bf16, the shape scripts/torch_llama.py
// measures PyTorch on (and TestStepTrafficOnGPU counts). It reports tokens/s,
// MFU (the plan's model FLOPs per step over the time and the H100's bf16
// peak), and the bytes the rank holds beside the plan's.
func BenchmarkEngineStep134M(b *testing.B) { benchEngineStep(b, 16, 1024) }

// BenchmarkEngineStep134MRecompute is the same step with full recomputation
// (each layer's forward again in the backward).
func BenchmarkEngineStep134MRecompute(b *testing.B) {
	benchEngineStep(b, 16, 1024, "activation_checkpoint.mode=full")
}

// BenchmarkEngineStep1B is the 1.24B shape (d2048, 24 layers, 16 heads over 8
// key/value heads, ffn 5504, vocabulary 32000 untied) at B8 T2048;
// scripts/torch_llama.py 1b runs PyTorch on it.
func BenchmarkEngineStep1B(b *testing.B) {
	benchEngineStep(b, 8, 2048, "model.hidden=2048", "model.layers=24", "model.heads=16", "model.kv_heads=8", "model.ffn_hidden=5504")
}

// BenchmarkEngineStep1BFP8 is BenchmarkEngineStep1B with the dense layers'
// products in FP8 (hybrid, tensorwise current scaling: cuBLASLt's FP8 kernels
// on compute capability 8.9 and later); scripts/torch_llama.py 1b float8 runs
// PyTorch with torchao's float8 training on the same shape.
func BenchmarkEngineStep1BFP8(b *testing.B) {
	benchEngineStep(b, 8, 2048, "model.hidden=2048", "model.layers=24", "model.heads=16", "model.kv_heads=8", "model.ffn_hidden=5504",
		"precision.fp8.format=hybrid", "precision.fp8.recipe=tensorwise")
}

// BenchmarkEngineStepMoE295M is the MoE shape (d768, 8 layers, 16 experts of
// ffn 768, top 2) at B8 T1024, with capacity_factor 1 (each expert's segment
// holds the balanced share); scripts/torch_llama.py moe runs PyTorch on it.
func BenchmarkEngineStepMoE295M(b *testing.B) {
	benchEngineStep(b, 8, 1024, "model.layers=8", "model.moe.num_experts=16", "model.moe.top_k=2", "model.moe.expert_ffn_hidden=768",
		"model.moe.capacity_factor=1", "model.moe.layer_freq=1")
}

// BenchmarkEngineStepTiny is the tiny recipe's step: small enough for the
// host emulator, where make test runs it once so that the benchmark's code
// keeps working between GPU sessions (its figures mean nothing there).
func BenchmarkEngineStepTiny(b *testing.B) {
	benchEngineStep(b, 2, 0, "model.layers=1", "model.seq_len=32")
}

// benchEngineStep loads dense-125m (tiny when T is 0) with the overrides at
// micro-batch B of T tokens on GPU 0, takes three steps, then times b.N more
// until the device is idle.
func benchEngineStep(b *testing.B, B, T int, sets ...string) {
	recipe := "dense-125m"
	if T == 0 {
		recipe = "tiny"
	}
	sets = append([]string{"parallel.world_size=1", fmt.Sprintf("train.micro_batch_size=%d", B), fmt.Sprintf("train.global_batch_size=%d", B),
		"run.output_dir=" + b.TempDir()}, sets...)
	if T > 0 {
		sets = append(sets, fmt.Sprintf("model.seq_len=%d", T))
	}
	if p := os.Getenv("SHARDLINE_OPTICKS"); p != "" { // a GPU machine without Go (scripts/gpu-session.sh)
		sets = append(sets, "data.path="+p)
	}
	res, diags := config.Load(filepath.Join("..", "recipes", recipe+".toml"), config.Options{Sets: sets})
	require.False(b, diags.HasErrors(), "%v", diags)
	d, err := cuda.Open(0)
	require.NoError(b, err)
	defer d.Close()
	step, runs := rankStepsWith(b, res, b.TempDir(), false, Options{Backend: d.Kernels(), Version: "bench"})
	for range 3 {
		step()
	}
	mem := runs[0].st.mem
	mem.Sync()
	require.NoError(b, d.Err())
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		step()
	}
	mem.Sync()
	el := time.Since(start)
	require.NoError(b, d.Err())
	T = res.Recipe.Model.SeqLen
	b.ReportMetric(float64(B*T*b.N)/el.Seconds(), "tokens/s")
	b.ReportMetric(100*runs[0].plan.ModelFLOPs*float64(b.N)/el.Seconds()/h100PeakBF16, "MFU%")
	b.ReportMetric(float64(runs[0].held().Total)/(1<<30), "GiB-held")
	b.ReportMetric(float64(runs[0].plan.Memory.Total)/(1<<30), "GiB-plan")
}
