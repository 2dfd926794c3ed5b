package model

import (
	"sort"
	"testing"
	"time"

	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
)

// timed wraps a backend and sums the wall time of each kernel.
type timed struct {
	tensor.Backend
	t map[string]time.Duration
}

func (k timed) rec(name string, start time.Time) { k.t[name] += time.Since(start) }
func (k timed) Matmul(out, inp, weight tensor.Buffer, s tensor.MatmulShape, acc bool) {
	defer k.rec("Matmul", time.Now())
	k.Backend.Matmul(out, inp, weight, s, acc)
}
func (k timed) MatmulBackward(dinp, dweight, dout, inp, weight tensor.Buffer, s tensor.MatmulShape, acc bool) {
	defer k.rec("MatmulBackward", time.Now())
	k.Backend.MatmulBackward(dinp, dweight, dout, inp, weight, s, acc)
}
func (k timed) FlashAttention(out, lse, q, kk, v tensor.Buffer, s tensor.AttentionShape) {
	defer k.rec("FlashAttention", time.Now())
	k.Backend.FlashAttention(out, lse, q, kk, v, s)
}
func (k timed) FlashAttentionBackward(dq, dk, dv, dout, out, lse, q, kk, v tensor.Buffer, s tensor.AttentionShape, accumulate bool) {
	defer k.rec("FlashAttentionBackward", time.Now())
	k.Backend.FlashAttentionBackward(dq, dk, dv, dout, out, lse, q, kk, v, s, accumulate)
}
func (k timed) SwiGLU(out, g, u tensor.Buffer, n int) {
	defer k.rec("SwiGLU", time.Now())
	k.Backend.SwiGLU(out, g, u, n)
}
func (k timed) SwiGLUBackward(dg, du, do, g, u tensor.Buffer, n int, acc bool) {
	defer k.rec("SwiGLUBackward", time.Now())
	k.Backend.SwiGLUBackward(dg, du, do, g, u, n, acc)
}
func (k timed) RMSNorm(out, rstd, inp, w tensor.Buffer, BT, C int, eps float64) {
	defer k.rec("RMSNorm", time.Now())
	k.Backend.RMSNorm(out, rstd, inp, w, BT, C, eps)
}
func (k timed) RMSNormBackward(dinp, dw, dout, inp, w, rstd tensor.Buffer, BT, C int, accumulate bool) {
	defer k.rec("RMSNormBackward", time.Now())
	k.Backend.RMSNormBackward(dinp, dw, dout, inp, w, rstd, BT, C, accumulate)
}
func (k timed) Rope(x, c, sn tensor.Buffer, s tensor.RopeShape) {
	defer k.rec("Rope", time.Now())
	k.Backend.Rope(x, c, sn, s)
}
func (k timed) RopeBackward(x, c, sn tensor.Buffer, s tensor.RopeShape) {
	defer k.rec("Rope", time.Now())
	k.Backend.RopeBackward(x, c, sn, s)
}
func (k timed) CrossEntropy(l, p, lg, t tensor.Buffer, s tensor.VocabShape) {
	defer k.rec("CrossEntropy", time.Now())
	k.Backend.CrossEntropy(l, p, lg, t, s)
}
func (k timed) CrossEntropyBackward(d, dl, p, t tensor.Buffer, s tensor.VocabShape) {
	defer k.rec("CrossEntropy", time.Now())
	k.Backend.CrossEntropyBackward(d, dl, p, t, s)
}

// BenchmarkStepBreakdown reports where a Shakespeare-char step's wall time goes:
// ms/step of each kernel (the backend is wrapped in a timer) and of the whole step.
func BenchmarkStepBreakdown(b *testing.B) {
	cfg := ShakespeareChar()
	B, T := 12, 64
	table, _ := parallel.ParamTable(cfg, 1, 1)
	w, g := make([][]float32, len(table)), make([][]float32, len(table))
	for i := range table {
		w[i], g[i] = make([]float32, table[i].LocalNumel()), make([]float32, table[i].LocalNumel())
		InitParam(w[i], &table[i], 0, 1, cfg.InitStd, cfg.Layers)
	}
	k := timed{cpu.Backend{}, map[string]time.Duration{}}
	mem, wb, gb := onMemory(w, g, false)
	m, err := New[float32](cfg, table, wb, gb, k, B, T, WithMemory(mem))
	if err != nil {
		b.Fatal(err)
	}
	tokens := make([]int32, B*T)
	loss := lossBuffer()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m.Forward(tokens, tokens, loss, false)
		m.Backward(tokens, tokens, 1/float64(B*T))
	}
	var names []string
	for n := range k.t {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		b.ReportMetric(float64(k.t[n].Microseconds())/1e3/float64(b.N), n+"-ms/step")
	}
}
