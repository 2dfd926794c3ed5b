//go:build cudaemu

package trainer

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/shardline/shardline/cuda"
	"github.com/shardline/shardline/tensor"
)

// BenchmarkFP8TracksBF16OnGPU is BenchmarkFP8TracksBF16 on the host
// emulator's GPU (compute capability 9.0: the FP8 products on cuBLASLt's FP8
// kernels' rules, the backward's operands transposed): recipes/tiny.toml
// trained FP8_EMU_STEPS steps (default 200) in bf16 and with its linear
// layers in FP8 (hybrid, tensorwise) from the same initialisation and data,
// at a smaller shape than the CPU's (sequences of 64, micro-batches of 2:
// the emulator runs its kernels as plain loops), and each FP8 curve's worst
// per-step and 20-step-mean loss difference from bf16's. Run by
// scripts/bench-fp8.sh (make bench).
func BenchmarkFP8TracksBF16OnGPU(b *testing.B) {
	steps := 200
	if v := os.Getenv("FP8_EMU_STEPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 20 {
			b.Fatalf("FP8_EMU_STEPS=%q: want a whole number of steps, 20 or more", v)
		}
		steps = n
	}
	curve := func(format string) ([]float64, *Result) {
		sets := []string{fmt.Sprintf("train.steps=%d", steps), "model.layers=2", "model.hidden=64", "model.heads=2", "model.kv_heads=2",
			"model.ffn_hidden=192", "model.seq_len=64", "train.micro_batch_size=2", "train.global_batch_size=2", "train.warmup_steps=10",
			"train.eval_interval=0", "train.eval_steps=4", "precision.bf16=true", "fsdp.grad_reduce_in_bf16=true", "logging.sample_tokens=0",
			"parallel.device=cuda"}
		if format != "none" {
			sets = append(sets, "precision.fp8.format="+format, "precision.fp8.recipe=tensorwise")
		}
		o := opts()
		o.RankBackend = func(rank int) (tensor.Backend, func(), error) {
			d, err := cuda.Open(0)
			if err != nil {
				return nil, nil, err
			}
			return d.Kernels(), d.Close, nil
		}
		return benchCurve(b, "tiny.toml", o, sets...)
	}
	for range b.N {
		ref, bo := curve("none")
		fmt.Printf("emulator, bf16: final validation loss %.4f\n", *bo.FinalValLoss)
		for _, format := range []string{"hybrid", "e4m3"} {
			got, out := curve(format)
			worst, worstMean := fp8Curves(ref, got, 20)
			fmt.Printf("emulator, %s: worst per-step loss difference %.2f%%, of 20-step means %.2f%%; final validation loss %.4f (%+.2f%% against bf16)\n",
				format, 100*worst, 100*worstMean, *out.FinalValLoss, 100*(*out.FinalValLoss-*bo.FinalValLoss) / *bo.FinalValLoss)
			b.ReportMetric(100*worst, format+"-worst-step-%")
			b.ReportMetric(100*worstMean, format+"-worst-mean-%")
		}
	}
}
