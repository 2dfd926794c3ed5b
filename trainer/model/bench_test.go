package model

import (
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor/cpu"
)

// ShakespeareChar is the shape of nanoGPT's CPU Shakespeare-char example: 4 layers,
// 4 heads, width 128, context 64, batch 12, a 65-character vocabulary; the MLP is
// SwiGLU of width 384 (about the parameters of nanoGPT's 4×128 GELU MLP).
func ShakespeareChar() config.Model {
	m := config.Default().Model
	m.Layers, m.Heads, m.Hidden, m.FFNHidden, m.SeqLen, m.VocabSize = 4, 4, 128, 384, 64, 65
	return m
}

// BenchmarkTrainStep is one forward and backward pass of a batch of 12×64 tokens;
// tokens/s is what `make bench` compares with PyTorch on the same model. fp32 and
// bf16 are the weights' storage, with fp32 arithmetic (bf16 weights widened as
// the products pack them); bf16-dot multiplies bf16 pairs (the other operand
// rounded to bf16, VDPBF16PS), the default for bf16 weights where the CPU has
// AVX-512 BF16, and is left out where it has not.
func BenchmarkTrainStep(b *testing.B) {
	dot := cpu.BF16Dot()
	b.Run("fp32", func(b *testing.B) { benchTrainStep(b, false) })
	b.Run("bf16", func(b *testing.B) {
		defer cpu.SetBF16Dot(false)()
		benchTrainStep(b, true)
	})
	if dot {
		b.Run("bf16-dot", func(b *testing.B) { benchTrainStep(b, true) })
	}
	// What a bf16 run does: bf16 weights and bf16 stores of the saved activations.
	b.Run("bf16-run", func(b *testing.B) { benchTrainStep(b, true, WithBF16Activations()) })
}

func benchTrainStep(b *testing.B, bf16 bool, opt ...Option) {
	cfg := ShakespeareChar()
	B, T := 12, 64
	table, err := parallel.ParamTable(cfg, 1, 1)
	if err != nil {
		b.Fatal(err)
	}
	w, g := make([][]float32, len(table)), make([][]float32, len(table))
	for i := range table {
		w[i], g[i] = make([]float32, table[i].LocalNumel()), make([]float32, table[i].LocalNumel())
		InitParam(w[i], &table[i], 0, 1, cfg.InitStd, cfg.Layers)
	}
	mem, wb, gb := onMemory(w, g, bf16)
	m, err := New[float32](cfg, table, wb, gb, cpu.Backend{}, B, T, append([]Option{WithMemory(mem)}, opt...)...)
	if err != nil {
		b.Fatal(err)
	}
	tokens, targets := make([]int32, B*T), make([]int32, B*T)
	for i := range tokens {
		tokens[i], targets[i] = int32(i*7%65), int32((i*7+3)%65)
	}
	b.ReportAllocs()
	loss := lossBuffer()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m.Forward(tokens, targets, loss, false)
		m.Backward(tokens, targets, 1/float64(B*T))
	}
	b.ReportMetric(float64(B*T)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}
