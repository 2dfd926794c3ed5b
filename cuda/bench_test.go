//go:build cuda

package cuda

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/shardline/shardline/parallel/collective"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/tensor"
)

// Benchmarks on the GPU, printed as TFLOP/s (or GB/s for memory-bound kernels)
// beside PyTorch's figures for the same shapes by make bench-gpu. Each times many
// launches between two synchronisations after a warm-up, so launch overhead is
// included as in training.

func benchOnDevice(b *testing.B, flops float64, setup func() func()) {
	benchMetric(b, flops/1e12, "TFLOP/s", setup)
}

// benchMetric times setup's step as benchOnDevice does and reports per units a
// second (per: the units of one step).
func benchMetric(b *testing.B, per float64, unit string, setup func() func()) {
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
	b.ReportMetric(per*float64(b.N)/el.Seconds(), unit)
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

// matmul1B is one forward and backward of the 1.24B model's MLP
// up-projection (scripts/torch_llama.py's 1b: BT 16384 = B8·T2048, C 2048 →
// OC 5504): three GEMMs of 2·BT·C·OC each, bf16 operands, or FP8 (E4M3
// input and weight, E5M2 output gradient, quantised before the timing, their
// scale inverses on the device) on cuBLASLt's FP8 kernels, the backward's
// transposes of the codes included; outputs bf16, the weight gradient fp32.
func matmul1B(b *testing.B, fp8 bool) {
	BT, C, OC := 16384, 2048, 5504
	benchOnDevice(b, 6*float64(BT)*float64(C)*float64(OC), func() func() {
		k := dev.Kernels()
		m := k.NewMemory()
		buf := func(dt tensor.DType, n int, scale float64, f tensor.FP8Format) (q, inv tensor.Buffer) {
			r := rand.New(rand.NewPCG(3, uint64(n)))
			x := randn(r, n, scale)
			v := m.Alloc(tensor.BFloat16, n)
			m.Write(v, x)
			if dt == tensor.BFloat16 {
				return v, tensor.Buffer{}
			}
			amax, s := m.Alloc(tensor.Float64, 1), m.Alloc(tensor.Float32, 1)
			q, inv = m.Alloc(dt, n), m.Alloc(tensor.Float32, 1)
			k.Amax(amax, v, false)
			k.FP8Scale(s, amax, f, 0)
			k.Quantize(q, inv, v, s)
			return q, inv
		}
		in, grad := tensor.BFloat16, tensor.BFloat16
		if fp8 {
			in, grad = tensor.Float8E4M3, tensor.Float8E5M2
		}
		x, xi := buf(in, BT*C, 1, tensor.E4M3)
		w, wi := buf(in, OC*C, 0.02, tensor.E4M3)
		dy, di := buf(grad, BT*OC, 1e-3, tensor.E5M2)
		out, dx, dw := m.Alloc(tensor.BFloat16, BT*OC), m.Alloc(tensor.BFloat16, BT*C), m.Alloc(tensor.Float32, OC*C)
		fwd := tensor.MatmulShape{BT: BT, C: C, OC: OC, Scales: tensor.MatmulScales{Inp: xi, Weight: wi}}
		bwd := tensor.MatmulShape{BT: BT, C: C, OC: OC, Scales: tensor.MatmulScales{Inp: xi, Weight: wi, Dout: di}}
		if err := m.Err(); err != nil {
			b.Fatal(err)
		}
		return func() {
			k.Matmul(out, x, w, fwd, false)
			k.MatmulBackward(dx, dw, dy, x, w, bwd, false)
		}
	})
}

// BenchmarkMatmul1BBF16 and BenchmarkMatmul1BFP8: matmul1B in bf16 and in
// FP8 (#47's FP8 GEMM speed against bf16 on the 1.24B shape).
func BenchmarkMatmul1BBF16(b *testing.B) { matmul1B(b, false) }
func BenchmarkMatmul1BFP8(b *testing.B)  { matmul1B(b, true) }

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

// BenchmarkMemoryBoundBF16 times the step's memory-bound kernels at the 134M
// model's shapes (BT 16384 = B16·T1024, C 768, ffn 2048, 12 heads of 64), bf16
// activations, and reports their effective bandwidth: the bytes each must move
// (every operand read or written once, the floor a fused kernel reaches) over its
// time. A device copy of the same size is the roof (the H100 copies at about 3.0
// TB/s); a kernel far below it is where the step's elementwise time goes
// (docs/cuda.md, "Speed").
func BenchmarkMemoryBoundBF16(b *testing.B) {
	const BT, C, FF, NH, HD = 16384, 768, 2048, 12, 64
	const params = 134_000_000
	act, ffn := float64(2*BT*C), float64(2*BT*FF) // bytes of one bf16 (BT, C) and (BT, FF) tensor
	cases := []struct {
		name  string
		bytes float64
		setup func() func()
	}{
		{"copy", 2 * act, func() func() {
			x, y := benchBuf(b, BF16, BT*C), benchBuf(b, BF16, BT*C)
			return func() { dev.Copy(y, x) }
		}},
		{"add", 3 * act, func() func() {
			x, y, z := benchBuf(b, BF16, BT*C), benchBuf(b, BF16, BT*C), benchBuf(b, BF16, BT*C)
			return func() { dev.Add(z, x, y) }
		}},
		{"rmsnorm", 2*act + 4*BT, func() func() {
			x, w, y, rstd := benchBuf(b, BF16, BT*C), benchBuf(b, BF16, C), benchBuf(b, BF16, BT*C), benchBuf(b, F32, BT)
			return func() { dev.RMSNorm(y, rstd, x, w, BT, C, 1e-5) }
		}},
		{"rmsnorm-backward", 3*act + 4*BT, func() func() {
			x, w, dy, dx, rstd, dw := benchBuf(b, BF16, BT*C), benchBuf(b, BF16, C), benchBuf(b, BF16, BT*C), benchBuf(b, BF16, BT*C), benchBuf(b, F32, BT), benchBuf(b, F32, C)
			dev.RMSNorm(dx, rstd, x, w, BT, C, 1e-5) // a real rstd
			return func() { dev.RMSNormBackward(dx, dw, dy, x, w, rstd, BT, C, false) }
		}},
		{"rope", 2 * act, func() func() {
			x, cos, sin := benchBuf(b, BF16, BT*C), benchBuf(b, F32, 1024*HD/2), benchBuf(b, F32, 1024*HD/2)
			return func() { dev.Rope(x, cos, sin, RopeShape{B: BT / 1024, T: 1024, NH: NH, HD: HD}, false) }
		}},
		{"swiglu", 3 * ffn, func() func() {
			g, u, y := benchBuf(b, BF16, BT*FF), benchBuf(b, BF16, BT*FF), benchBuf(b, BF16, BT*FF)
			return func() { dev.SwiGLU(y, g, u) }
		}},
		{"swiglu-backward", 5 * ffn, func() func() {
			g, u, dy, dg, du := benchBuf(b, BF16, BT*FF), benchBuf(b, BF16, BT*FF), benchBuf(b, BF16, BT*FF), benchBuf(b, BF16, BT*FF), benchBuf(b, BF16, BT*FF)
			return func() { dev.SwiGLUBackward(dg, du, dy, g, u, false) }
		}},
		// AdamW over the model's fp32 weights as the engine runs it (Kernels.AdamW:
		// adamw_stats): params, grads, m and v read, params, m and v written, the
		// bf16 compute copy written; with bf16 gradients (adamw_stats_bf16) the
		// gradients' 2 bytes a value read.
		{"adamw", float64(params) * (4*4 + 3*4 + 2), adamwBench(b, params, tensor.Float32)},
		{"adamw-bf16-grads", float64(params) * (3*4 + 2 + 3*4 + 2), adamwBench(b, params, tensor.BFloat16)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) { benchMetric(b, c.bytes/1e9, "GB/s", c.setup) })
	}
}

// adamwBench is the setup of an AdamW step over params fp32 weights with
// gradients of dtype grads.
func adamwBench(b *testing.B, params int, grads tensor.DType) func() func() {
	return func() func() {
		k := dev.Kernels()
		mem := k.NewMemory()
		fill := func(t tensor.DType, v float64) tensor.Buffer {
			buf := mem.Alloc(t, params) // freed with the process
			mem.Fill(buf, v)
			return buf
		}
		p, g, m, v, cw := fill(tensor.Float32, 0.02), fill(grads, 1e-3), fill(tensor.Float32, 1e-4), fill(tensor.Float32, 1e-6), fill(tensor.BFloat16, 0)
		st := mem.Alloc(tensor.Float64, tensor.NumStats)
		stats := make([]float64, tensor.NumStats)
		stats[tensor.StatClip], stats[tensor.StatApplied], stats[tensor.StatOptSteps] = 1, 1, 1 // a step applied, unclipped
		mem.Write(st, stats)
		step := func() { k.AdamW(p, cw, g, m, v, 1e-4, 0.9, 0.95, 1e-8, 0.1, st) }
		step()
		if err := mem.Err(); err != nil { // an operand the kernel refuses: it would time nothing
			b.Error(err)
		}
		return step
	}
}

// BenchmarkEmbeddingBackward times the embedding's backward at the 134M
// model's shapes (BT 16384 tokens, C 768, a 32000-row table, bf16 output
// gradients) into an fp32 table (embedding_backward_classes: each row's
// tokens added in turn) and into a bf16 one (a run that reduces its
// gradients in bf16: embedding_backward_links, then
// embedding_backward_chains, each row's tokens summed before its one
// rounding), in tokens a second. The tokens follow a Zipf law (s = 1.1), so
// that a few rows take many tokens, as in text: the chains of the frequent
// ones are walked one link at a time.
func BenchmarkEmbeddingBackward(b *testing.B) {
	const BT, C, N = 16384, 768, 32000
	for _, table := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
		b.Run(table.String()+" table", func(b *testing.B) {
			benchMetric(b, BT/1e6, "Mtok/s", func() func() {
				k := dev.Kernels()
				mem := k.NewMemory()
				dwte, dout, tok := mem.Alloc(table, N*C), mem.Alloc(tensor.BFloat16, BT*C), mem.Alloc(tensor.Int32, BT) // freed with the process
				mem.Fill(dwte, 0)
				mem.Fill(dout, 1e-3)
				z := rand.NewZipf(rand.New(rand.NewPCG(3, 4)), 1.1, 1, N-1)
				ids := make([]int32, BT)
				for i := range ids {
					ids[i] = int32(z.Uint64())
				}
				mem.Write(tok, ids)
				step := func() { k.EmbeddingBackward(dwte, dout, tok, tensor.EmbeddingShape{BT: BT, C: C, N: N}) }
				step()
				if err := mem.Err(); err != nil {
					b.Error(err)
				}
				return step
			})
		})
	}
}

// BenchmarkCollectives times what one GPU can measure of the collectives, for
// the plan's communication figures (docs/plan.md lists which are measured):
// NCCL in a group of one, where no link is crossed, so the time per call is
// NCCL's fixed cost of a launch (4 KiB) and its local copy rate (64 MiB); and
// two in-process ranks sharing the GPU through collective.Staged (a
// read-back, the host's in-process exchange, an upload), the path of ranks
// that share a GPU. Reported per call (µs/call) and as the full buffer's
// bytes a second (GB/s).
func BenchmarkCollectives(b *testing.B) {
	comms := ncclGroup(b, []*Device{dev})
	for _, n := range []int{1 << 10, 1 << 24} { // f32 values: 4 KiB, 64 MiB
		bytes := float64(4 * n)
		for _, op := range []string{"all_gather", "reduce_scatter", "all_reduce"} {
			b.Run(fmt.Sprintf("nccl-1/%s/%dKiB", op, 4*n>>10), func(b *testing.B) {
				var src, dst Buffer
				dev.Do(func() { src, dst = benchBuf(b, F32, n), benchBuf(b, F32, n) })
				step := func() {
					var err error
					switch op {
					case "all_gather":
						err = comms[0].AllGather(dst, src)
					case "reduce_scatter":
						err = comms[0].ReduceScatter(dst, src)
					default:
						err = comms[0].AllReduce(dst)
					}
					if err != nil {
						b.Error(err)
					}
				}
				el := timeCalls(b, func() { dev.Do(func() { step(); dev.fail("collective", dev.syncStream()) }) })
				reportCalls(b, el, bytes)
			})
			b.Run(fmt.Sprintf("staged-2/%s/%dKiB", op, 4*n>>10), func(b *testing.B) {
				const ranks = 2
				world := comm.NewWorld(ranks, time.Minute)
				mems, groups := make([]*Memory, ranks), make([]collective.Group, ranks)
				srcs, dsts := make([]tensor.Buffer, ranks), make([]tensor.Buffer, ranks)
				for r := range ranks {
					mems[r] = dev.NewMemory()
					groups[r] = collective.Staged(world.Rank(r), mems[r])
					full := n
					if op == "reduce_scatter" {
						full = ranks * n
					}
					srcs[r], dsts[r] = mems[r].Alloc(tensor.Float32, full), mems[r].Alloc(tensor.Float32, ranks*n)
				}
				step := func() {
					var wg sync.WaitGroup
					for r := range ranks {
						wg.Add(1)
						go func() {
							defer wg.Done()
							var err error
							switch op {
							case "all_gather":
								err = groups[r].AllGather(dsts[r], srcs[r])
							case "reduce_scatter":
								err = groups[r].ReduceScatter(dsts[r].Slice(0, n), srcs[r])
							default:
								err = groups[r].AllReduce(dsts[r].Slice(0, n))
							}
							if err != nil {
								b.Error(err)
							}
						}()
					}
					wg.Wait()
				}
				reportCalls(b, timeCalls(b, step), bytes)
			})
		}
	}
}

// timeCalls times b.N calls of step (each synchronised) after three.
func timeCalls(b *testing.B, step func()) time.Duration {
	for range 3 {
		step()
	}
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		step()
	}
	return time.Since(start)
}

// reportCalls reports µs a call and bytes a second for b.N calls in el.
func reportCalls(b *testing.B, el time.Duration, bytes float64) {
	per := el.Seconds() / float64(b.N)
	b.ReportMetric(per*1e6, "µs/call")
	b.ReportMetric(bytes/per/1e9, "GB/s")
}
