//go:build cuda

package gpu

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shardline/shardline/cuda"
	"github.com/shardline/shardline/parallel"
	"github.com/stretchr/testify/require"
)

// TestTracksPyTorch trains the dense-125m recipe's model (134M parameters) for 200
// steps from the same initial weights and batches in shardline and in PyTorch
// (scripts/torch_track.py: fused AdamW with the same hyper-parameters and
// no-decay groups, the same clipping).
//
// By default it compares bf16 runs: shardline's (bf16 weights and activations,
// fp32 logits and loss) and PyTorch's (autocast over fp32 weights: fp32 residual
// stream, bf16 logits), each against shardline's fp32 run of the same steps. The
// two round in different places, so their curves part by a percent or two; the
// test requires shardline's bf16 curve to stay about as close to fp32 as
// PyTorch's (mean distance over 20-step windows at most PyTorch's plus half a
// percent) and within 5% of PyTorch's in every window. Measured on an H100:
// shardline bf16 0.68% from fp32 on average (at most 1.6%, below it), PyTorch
// 0.40% (at most 1%, above it); two PyTorch bf16 runs of the same inputs
// themselves differed by 0.8% at steps 81-100. With SHARDLINE_TRACK_FP32 set both sides run fp32 for 100 steps
// and must agree within 0.1% per window (measured: 1.2e-7 over steps 1-20, 4.2e-4
// over steps 81-100): the same model and optimizer, to rounding.
//
// It needs a python3 with PyTorch on CUDA: SHARDLINE_TORCH_PYTHON names it (the
// GPU machine's python3); without it the test says so and skips.
func TestTracksPyTorch(t *testing.T) {
	py := os.Getenv("SHARDLINE_TORCH_PYTHON")
	if py == "" {
		t.Skip("SHARDLINE_TORCH_PYTHON is not set: give a python3 with PyTorch on CUDA to compare with PyTorch")
	}
	fp32Only := os.Getenv("SHARDLINE_TRACK_FP32") != ""
	r := loadRecipe(t, "dense-125m")
	cfg := r.Model
	B, T, steps, lr := 16, 1024, 200, 3e-4 // 200: the fp32 reference costs about 0.4 s a step
	if fp32Only {
		steps = 100
	}
	table, err := parallel.ParamTable(cfg, 1, 1)
	require.NoError(t, err)
	w := initWeights(r, table)
	dir := t.TempDir()
	type param struct {
		Name  string `json:"name"`
		Shape []int  `json:"shape"`
		Decay bool   `json:"decay"`
	}
	o := Optimizer{Beta1: r.Train.Beta1, Beta2: r.Train.Beta2, Eps: r.Train.Eps, WeightDecay: r.Train.WeightDecay, ClipGrad: 1}
	man := map[string]any{"hidden": cfg.Hidden, "layers": cfg.Layers, "heads": cfg.Heads, "kv_heads": cfg.EffectiveKVHeads(),
		"ffn": cfg.FFNHidden, "vocab": cfg.VocabSize, "B": B, "T": T, "steps": steps, "norm_eps": cfg.NormEps, "rope_theta": cfg.RopeTheta,
		"bf16": !fp32Only, "optimizer": map[string]float64{"lr": lr, "beta1": o.Beta1, "beta2": o.Beta2, "eps": o.Eps, "weight_decay": o.WeightDecay, "clip": o.ClipGrad}}
	var ps []param
	f, err := os.Create(filepath.Join(dir, "weights.bin"))
	require.NoError(t, err)
	for i := range table {
		ps = append(ps, param{table[i].Name, table[i].LocalShape, !table[i].NoDecay})
		require.NoError(t, binary.Write(f, binary.LittleEndian, w[i]))
	}
	require.NoError(t, f.Close())
	man["params"] = ps
	js, err := json.Marshal(man)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "manifest.json"), js, 0o644))
	bf, err := os.Create(filepath.Join(dir, "batches.bin"))
	require.NoError(t, err)
	batches := make([][2][]int32, steps)
	for s := range batches {
		tok, tgt := opticks(t, B, T, s)
		batches[s] = [2][]int32{tok, tgt}
		require.NoError(t, binary.Write(bf, binary.LittleEndian, tok))
		require.NoError(t, binary.Write(bf, binary.LittleEndian, tgt))
	}
	require.NoError(t, bf.Close())

	train := func(compute cuda.DType) []float64 {
		m, err := New(dev, cfg, table, w, B, T, Options{Compute: compute})
		require.NoError(t, err)
		defer m.Close()
		losses := make([]float64, steps)
		for s := range steps {
			var met Metrics
			dev.Do(func() {
				if _, err = m.ForwardBackward(batches[s][0], batches[s][1], 1/float64(B*T), false); err == nil {
					m.Update(lr, o)
					met, err = m.Metrics()
				}
			})
			require.NoError(t, err)
			losses[s] = met.LossSum / float64(B*T)
		}
		return losses
	}
	fp32 := train(cuda.F32)

	cmd := exec.Command(py, filepath.Join("..", "..", "scripts", "torch_track.py"), dir)
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		t.Fatalf("%s: %v\n%s", py, err, ee.Stderr)
	}
	require.NoError(t, err)
	lines := strings.Fields(string(out))
	require.Len(t, lines, steps, "PyTorch printed %d losses", len(lines))
	torch := make([]float64, steps)
	for s, l := range lines {
		torch[s], err = strconv.ParseFloat(l, 64)
		require.NoError(t, err)
	}
	mean := func(x []float64, lo int) float64 {
		var s float64
		for _, v := range x[lo : lo+20] {
			s += v
		}
		return s / 20
	}
	if fp32Only {
		for s0 := 0; s0 < steps; s0 += 20 {
			a, b := mean(fp32, s0), mean(torch, s0)
			t.Logf("steps %3d-%3d: shardline fp32 %.4f, PyTorch fp32 %.4f (rel %.2g)", s0+1, s0+20, a, b, math.Abs(a-b)/b)
			require.LessOrEqual(t, math.Abs(a-b)/b, 1e-3, "steps %d-%d", s0+1, s0+20)
		}
		return
	}
	ours := train(cuda.BF16)
	var devOurs, devTorch float64
	for s0 := 0; s0 < steps; s0 += 20 {
		ref, a, b := mean(fp32, s0), mean(ours, s0), mean(torch, s0)
		do, dt := math.Abs(a-ref)/ref, math.Abs(b-ref)/ref
		devOurs, devTorch = devOurs+do/float64(steps/20), devTorch+dt/float64(steps/20)
		t.Logf("steps %3d-%3d: fp32 %.4f; bf16 shardline %.4f (%+.2g%%), PyTorch %.4f (%+.2g%%)", s0+1, s0+20, ref, a, 100*(a-ref)/ref, b, 100*(b-ref)/ref)
		require.LessOrEqual(t, math.Abs(a-b)/b, 0.05, "steps %d-%d: shardline bf16 %.4f, PyTorch bf16 %.4f", s0+1, s0+20, a, b)
	}
	t.Logf("mean distance from fp32 over 20-step windows: shardline bf16 %.3g, PyTorch bf16 %.3g", devOurs, devTorch)
	require.LessOrEqual(t, devOurs, devTorch+0.005, "shardline's bf16 run strays further from fp32 than PyTorch's autocast")
}
