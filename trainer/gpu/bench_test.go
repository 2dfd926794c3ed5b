//go:build cuda

package gpu

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/shardline/shardline/cuda"
	"github.com/shardline/shardline/parallel"
)

// H100PeakBF16 is the H100 SXM's dense bf16 tensor-core peak (NVIDIA's datasheet),
// the denominator of MFU.
const H100PeakBF16 = 989e12

// BenchmarkStep134M times whole training steps (forward, backward, clipping,
// AdamW) of the dense-125m recipe's model (d768, 12 layers, vocabulary 32000,
// untied head: 134M parameters) at T1024 B16 in bf16, the shape
// scripts/torch_llama.py measures PyTorch on. It reports tokens/s, MFU (6·N +
// 6·L·T·d flops per token over the bf16 peak, N the parameters a token passes
// through) and the device memory the model holds.
func BenchmarkStep134M(b *testing.B) { benchStep(b, "step", shape134M) }

// The phases of BenchmarkStep134M alone (each timed over b.N runs between two
// synchronisations), to see where a step's time goes.
func BenchmarkStep134MForward(b *testing.B)  { benchStep(b, "forward", shape134M) }
func BenchmarkStep134MBackward(b *testing.B) { benchStep(b, "backward", shape134M) }
func BenchmarkStep134MUpdate(b *testing.B)   { benchStep(b, "update", shape134M) }

// BenchmarkStep1B is the 1.24B shape of the CUDA issue's PyTorch figures (d2048,
// 24 layers, 16 heads over 8 key/value heads, ffn 5504, vocabulary 32000 untied,
// T2048 B8); scripts/torch_llama.py 1b runs PyTorch on it.
func BenchmarkStep1B(b *testing.B) { benchStep(b, "step", shape1B) }

// BenchmarkStepMoE295M is the MoE shape of those figures (d768, 8 layers, 16
// experts of ffn 768, top 2, T1024 B8), with capacity_factor 1 (every expert's
// segment holds the balanced share, so the experts' products do the work of a
// dropless balanced routing); scripts/torch_llama.py moe runs PyTorch on it.
func BenchmarkStepMoE295M(b *testing.B) { benchStep(b, "step", shapeMoE) }

// A benchmark shape: overrides of the dense-125m recipe, and the micro-batch.
type benchShape struct {
	sets []string
	B, T int
}

var (
	shape134M = benchShape{nil, 16, 1024}
	shape1B   = benchShape{[]string{"model.hidden=2048", "model.layers=24", "model.heads=16", "model.kv_heads=8", "model.ffn_hidden=5504"}, 8, 2048}
	shapeMoE  = benchShape{[]string{"model.layers=8", "model.moe.num_experts=16", "model.moe.top_k=2", "model.moe.expert_ffn_hidden=768",
		"model.moe.capacity_factor=1", "model.moe.layer_freq=1"}, 8, 1024}
)

func benchStep(b *testing.B, part string, shape benchShape) {
	r := loadRecipe(b, "dense-125m", shape.sets...)
	B, T := shape.B, shape.T
	table, err := parallel.ParamTable(r.Model, 1, 1)
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	w := make([][]float32, len(table))
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range table { // random weights of the init's scale: speed does not depend on the draw
		w[i] = make([]float32, table[i].LocalNumel())
		if table[i].Expert >= 0 { // a token passes through top_k of the experts
			n += table[i].LocalNumel() * int64(r.Model.MoE.TopK) / int64(r.Model.MoE.NumExperts)
		} else {
			n += table[i].LocalNumel()
		}
		for j := range w[i] {
			w[i][j] = float32(rng.NormFloat64() * r.Model.InitStd)
		}
	}
	m, err := New(dev, r.Model, table, w, B, T, Options{Compute: cuda.BF16})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	tokens, targets := make([]int32, B*T), make([]int32, B*T)
	for i := range tokens {
		tokens[i], targets[i] = int32(rng.IntN(r.Model.VocabSize)), int32(rng.IntN(r.Model.VocabSize))
	}
	o := Optimizer{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, ClipGrad: 1}
	step := func() {
		m.ForwardBackward(tokens, targets, 1/float64(B*T), false)
		m.Update(3e-4, o)
	}
	var serr error
	dev.Do(func() {
		for range 3 {
			step()
		}
		_, serr = m.Metrics()
	})
	if serr != nil {
		b.Fatal(serr)
	}
	phase := map[string]func(){"step": step,
		"forward":  func() { m.Forward(tokens, targets, false) },
		"backward": func() { m.Backward(1e-4, false) }, // the two-pass head's backward
		"update":   func() { m.Update(3e-4, o) },
	}[part]
	b.ResetTimer()
	var el time.Duration
	dev.Do(func() {
		start := time.Now()
		for range b.N {
			phase()
		}
		_, serr = m.Metrics()
		el = time.Since(start)
	})
	if serr != nil {
		b.Fatal(serr)
	}
	tps := float64(B*T*b.N) / el.Seconds()
	flops := 6*float64(n) + 6*float64(r.Model.Layers*T*r.Model.Hidden)
	var held int64
	for _, v := range m.HeldBytes() {
		held += v
	}
	b.ReportMetric(tps, "tokens/s")
	b.ReportMetric(100*tps*flops/H100PeakBF16, "MFU%")
	b.ReportMetric(float64(held)/(1<<30), "GiB-held")
	b.ReportMetric(float64(n)/1e6, "Mparams-active")
}
