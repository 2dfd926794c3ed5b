//go:build cuda

package cuda

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/shardline/shardline/tensor"
)

// Benchmarks on the GPU, printed as TFLOP/s beside PyTorch's figures for the same
// shapes by scripts/bench-gpu.sh. Each times many launches between two
// synchronisations after a warm-up, so launch overhead is included as in training.

func benchOnDevice(b *testing.B, flops float64, setup func() func()) {
	var step func()
	dev.Do(func() { step = setup() })
	var err error
	dev.Do(func() {
		for range 3 {
			step()
		}
		err = dev.Err()
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var el time.Duration
	dev.Do(func() {
		start := time.Now()
		for range b.N {
			step()
		}
		if err := dev.Err(); err != nil {
			b.Error(err)
		}
		el = time.Since(start)
	})
	b.ReportMetric(flops*float64(b.N)/el.Seconds()/1e12, "TFLOP/s")
}

func benchBuf(b *testing.B, dt DType, n int) Buffer {
	r := rand.New(rand.NewPCG(9, uint64(n)))
	x := randn(r, n, 1)
	buf, err := dev.Alloc(dt, n) // freed with the process
	if err != nil {
		b.Error(err)
		return buf
	}
	if dt == BF16 {
		h := make([]tensor.BF16, n)
		tensor.CastToBF16(h, x)
		dev.Upload(buf, h)
	} else {
		dev.Upload(buf, x)
	}
	return buf
}

// BenchmarkMatmulBF16 is one forward and backward of a 134M-model MLP projection
// (BT 16384 = B16·T1024, C 768 → OC 3072): three GEMMs of 2·BT·C·OC each.
func BenchmarkMatmulBF16(b *testing.B) {
	BT, C, OC := 16384, 768, 3072
	benchOnDevice(b, 6*float64(BT)*float64(C)*float64(OC), func() func() {
		inp, w, out, dout := benchBuf(b, BF16, BT*C), benchBuf(b, BF16, OC*C), benchBuf(b, BF16, BT*OC), benchBuf(b, BF16, BT*OC)
		dinp, dw := benchBuf(b, BF16, BT*C), benchBuf(b, F32, OC*C)
		s := MatmulShape{BT: BT, C: C, OC: OC}
		return func() {
			dev.Matmul(out, inp, w, s, false)
			dev.MatmulBackward(dinp, dw, dout, inp, w, s, false)
		}
	})
}

// flashBench is causal attention at the 134M shape (B16, T1024, 12 heads of 64):
// the forward is 2 products of 2·B·NH·T²·HD/2 flops (the causal half), the backward
// 2.5 times that (five products). part is "forward", "backward" or "both".
func flashBench(b *testing.B, part string) {
	B, T, NH, HD := 16, 1024, 12, 64
	fwd := 4 * float64(B*NH) * float64(T) * float64(T) * float64(HD) / 2
	flops := map[string]float64{"forward": fwd, "backward": 2.5 * fwd, "both": 3.5 * fwd}[part]
	benchOnDevice(b, flops, func() func() {
		n := B * T * NH * HD
		q, k, v, o, do := benchBuf(b, BF16, n), benchBuf(b, BF16, n), benchBuf(b, BF16, n), benchBuf(b, BF16, n), benchBuf(b, BF16, n)
		dq, dk, dv := benchBuf(b, BF16, n), benchBuf(b, BF16, n), benchBuf(b, BF16, n)
		lse := benchBuf(b, F32, B*NH*T)
		s := AttentionShape{B: B, Tq: T, Tk: T, NH: NH, NKV: NH, HD: HD, Causal: true}
		dev.FlashAttention(o, lse, q, k, v, s) // a real lse for the backward
		return func() {
			if part != "backward" {
				dev.FlashAttention(o, lse, q, k, v, s)
			}
			if part != "forward" {
				dev.FlashAttentionBackward(dq, dk, dv, do, o, lse, q, k, v, s, false)
			}
		}
	})
}

func BenchmarkFlashAttentionBF16(b *testing.B)         { flashBench(b, "both") }
func BenchmarkFlashAttentionForwardBF16(b *testing.B)  { flashBench(b, "forward") }
func BenchmarkFlashAttentionBackwardBF16(b *testing.B) { flashBench(b, "backward") }
