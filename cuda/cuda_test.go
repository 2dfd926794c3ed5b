//go:build cuda

package cuda

// These tests need an NVIDIA GPU: build them with `make cuda-test` (a test binary
// carried to the GPU machine) and run bin/cuda.test there. Each kernel is checked
// against the CPU backend (tensor/cpu) on random inputs; bf16 runs feed both sides
// the same bf16-rounded inputs. The tolerances are rows_test.go's (its helpers
// too): the tests there run on the host emulator as well.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
)

func TestMatmul(t *testing.T) {
	for _, dt := range dtypes {
		r := rand.New(rand.NewPCG(1, uint64(dt)))
		BT, C, OC := 96, 160, 224
		inp, w := roundTo(dt, randn(r, BT*C, 1)), roundTo(dt, randn(r, OC*C, 0.1))
		dout := roundTo(dt, randn(r, BT*OC, 1))
		prev := roundTo(dt, randn(r, BT*OC, 1))
		dw0 := randn(r, OC*C, 1)
		want := append([]float32(nil), prev...)
		cpu.Matmul(want, tensor.FloatWeights(inp), tensor.FloatWeights(w), tensor.MatmulShape{BT: BT, C: C, OC: OC}, true)
		wantDinp := make([]float32, BT*C)
		wantDw := append([]float32(nil), dw0...)
		cpu.MatmulBackward(wantDinp, wantDw, dout, tensor.FloatWeights(inp), tensor.FloatWeights(w), tensor.MatmulShape{BT: BT, C: C, OC: OC}, false)
		wantFresh := make([]float32, BT*OC)
		cpu.Matmul(wantFresh, tensor.FloatWeights(inp), tensor.FloatWeights(w), tensor.MatmulShape{BT: BT, C: C, OC: OC}, false)
		onDevice(t, func() {
			s := MatmulShape{BT: BT, C: C, OC: OC}
			bi, bw, bo, bd := put(t, dt, inp), put(t, dt, w), put(t, dt, prev), put(t, dt, dout)
			fresh := poisoned(t, dt, BT*OC)
			dev.Matmul(bo, bi, bw, s, true)
			dev.Matmul(fresh, bi, bw, s, false)
			dinp, dw := poisoned(t, dt, BT*C), put(t, F32, dw0)
			dev.MatmulBackward(dinp, dw, bd, bi, bw, s, false)
			check(t, "matmul accumulate", dt, get(bo), want, 1e-5)
			check(t, "matmul", dt, get(fresh), wantFresh, 1e-5)
			check(t, "matmul dinp", dt, get(dinp), wantDinp, 1e-5)
			check(t, "matmul dweight (fp32)", F32, get(dw), wantDw, 1e-5)
		})
	}
}

// TestHeadCrossEntropy checks the one-pass training head (the engine's HeadLoss
// runs it) against the CPU's matmul, cross-entropy and their backward, in row
// chunks of 7 (the buffers hold 7 whole rows of 1000), the last chunk shorter.
func TestHeadCrossEntropy(t *testing.T) {
	for _, dt := range dtypes {
		r := rand.New(rand.NewPCG(8, uint64(dt)))
		BT, C, V := 40, 64, 1000
		x, w := roundTo(dt, randn(r, BT*C, 1)), roundTo(dt, randn(r, V*C, 0.2))
		targets := make([]int32, BT)
		for i := range targets {
			targets[i] = int32(r.IntN(V))
		}
		targets[7] = -1
		logits := make([]float32, BT*V)
		cpu.Matmul(logits, tensor.FloatWeights(x), tensor.FloatWeights(w), tensor.MatmulShape{BT: BT, C: C, OC: V}, false)
		losses, probs := make([]float32, BT), make([]float32, BT*V)
		cpu.CrossEntropy(losses, probs, logits, targets, BT, V)
		dloss := randn(r, BT, 1)
		dlogits := make([]float32, BT*V)
		cpu.CrossEntropyBackward(dlogits, dloss, probs, targets, BT, V)
		dx0 := roundTo(dt, randn(r, BT*C, 1))
		dx, dw0 := append([]float32(nil), dx0...), randn(r, V*C, 1)
		dw := append([]float32(nil), dw0...)
		cpu.MatmulBackward(dx, dw, dlogits, tensor.FloatWeights(x), tensor.FloatWeights(w), tensor.MatmulShape{BT: BT, C: C, OC: V}, true)
		onDevice(t, func() {
			s := HeadShape{BT, C, V}
			sc := HeadScratch{Logits: poisoned(t, F32, 7*V), DLogits: poisoned(t, dt, 7*V)}
			bx, bw, bt := put(t, dt, x), put(t, dt, w), putI32(t, targets)
			bl, blse, bdx, bdw := poisoned(t, F32, BT), poisoned(t, F32, BT), put(t, dt, dx0), put(t, F32, dw0)
			dev.HeadCrossEntropyTrain(bl, blse, bdx, bdw, bx, bw, bt, put(t, F32, dloss), s, sc, true)
			check(t, "one-pass head losses", dt, get(bl), losses, 1e-5)
			check(t, "one-pass head dx", dt, get(bdx), dx, 1e-5)
			check(t, "one-pass head dw", dt, get(bdw), dw, 1e-5)
		})
	}
}

// naiveAttention is the float64 formula for rows [lo, hi) of o (B,Tq,NH,HD), with
// positions and masking as AttentionShape says; it also returns each row's lse.
func naiveAttention(s AttentionShape, q, k, v []float32, lo, hi int) (o []float64, lse []float64) {
	scale := 1 / math.Sqrt(float64(s.HD))
	group := s.NH / s.NKV
	for b := 0; b < s.B; b++ {
		for i := lo; i < hi; i++ {
			for h := 0; h < s.NH; h++ {
				kh := h / group
				qi := ((b*s.Tq+i)*s.NH + h) * s.HD
				sc := make([]float64, s.Tk)
				m := math.Inf(-1)
				for j := 0; j < s.Tk; j++ {
					sc[j] = math.Inf(-1)
					if s.Causal && s.KOff+j > s.QOff+i {
						continue
					}
					kj := ((b*s.Tk+j)*s.NKV + kh) * s.HD
					var dot float64
					for d := 0; d < s.HD; d++ {
						dot += float64(q[qi+d]) * float64(k[kj+d])
					}
					sc[j] = dot * scale
					m = math.Max(m, sc[j])
				}
				var z float64
				for j := range sc {
					if !math.IsInf(sc[j], -1) {
						z += math.Exp(sc[j] - m)
					}
				}
				row := make([]float64, s.HD)
				for j := range sc {
					if math.IsInf(sc[j], -1) {
						continue
					}
					p := math.Exp(sc[j]-m) / z
					kj := ((b*s.Tk+j)*s.NKV + kh) * s.HD
					for d := range row {
						row[d] += p * float64(v[kj+d])
					}
				}
				o = append(o, row...)
				lse = append(lse, m+math.Log(z))
			}
		}
	}
	return o, lse
}

// TestFlashAttention checks forward and backward against the CPU backend's
// flash attention (itself checked against materialised attention in
// tensor/cpu), causal with GQA, T not a multiple of the tiles, for each head
// size.
func TestFlashAttention(t *testing.T) {
	for _, dt := range dtypes {
		for _, HD := range []int{32, 64, 128} {
			r := rand.New(rand.NewPCG(5, uint64(HD)+uint64(dt)))
			B, T, NH, NKV := 2, 77, 4, 2
			s := AttentionShape{B: B, Tq: T, Tk: T, NH: NH, NKV: NKV, HD: HD, Causal: true}
			q, k, v := roundTo(dt, randn(r, B*T*NH*HD, 1)), roundTo(dt, randn(r, B*T*NKV*HD, 1)), roundTo(dt, randn(r, B*T*NKV*HD, 1))
			dout := roundTo(dt, randn(r, B*T*NH*HD, 1))
			out, lse := make([]float32, B*T*NH*HD), make([]float32, B*NH*T)
			cs := tensor.AttentionShape{B: B, Tq: T, Tk: T, NH: NH, NKV: NKV, HD: HD, Causal: true}
			cpu.FlashAttention(out, lse, q, k, v, cs)
			dq, dk, dv := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
			cpu.FlashAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, cs)
			name := fmt.Sprintf("flash HD=%d", HD)
			onDevice(t, func() {
				bq, bk, bv, bd := put(t, dt, q), put(t, dt, k), put(t, dt, v), put(t, dt, dout)
				bo, blse := poisoned(t, dt, len(q)), poisoned(t, F32, B*NH*T)
				dev.FlashAttention(bo, blse, bq, bk, bv, s)
				check(t, name+" forward", dt, get(bo), out, 1e-5)
				bdq, bdk, bdv := poisoned(t, dt, len(q)), poisoned(t, dt, len(k)), poisoned(t, dt, len(v))
				dev.FlashAttentionBackward(bdq, bdk, bdv, bd, bo, blse, bq, bk, bv, s, false)
				gq, gk, gv := get(bdq), get(bdk), get(bdv)
				check(t, name+" dq", dt, gq, dq, 1e-4)
				check(t, name+" dk", dt, gk, dk, 1e-4)
				check(t, name+" dv", dt, gv, dv, 1e-4)
				// the same bits on a second run (no atomics, fixed order)
				dev.FlashAttentionBackward(bdq, bdk, bdv, bd, bo, blse, bq, bk, bv, s, false)
				if relErr(get(bdk), gk) != 0 || relErr(get(bdq), gq) != 0 {
					t.Errorf("%s: backward differs between runs", name)
				}
			})
		}
	}
}

// naiveAttentionBackward is the float64 gradient of Σ o·dout through
// naiveAttention's formula: dV = Pᵀ·dO, dP = dO·Vᵀ, dS = P∘(dP − rowsum(P∘dP)),
// dQ = scale·dS·K, dK = scale·dSᵀ·Q (summed over the query heads of a group).
func naiveAttentionBackward(s AttentionShape, q, k, v, dout []float32) (dq, dk, dv []float64) {
	scale := 1 / math.Sqrt(float64(s.HD))
	group := s.NH / s.NKV
	dq, dk, dv = make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
	HD := s.HD
	for b := 0; b < s.B; b++ {
		for i := 0; i < s.Tq; i++ {
			for h := 0; h < s.NH; h++ {
				kh := h / group
				qi := ((b*s.Tq+i)*s.NH + h) * HD
				p := make([]float64, s.Tk)
				m := math.Inf(-1)
				for j := range p {
					p[j] = math.Inf(-1)
					if s.Causal && s.KOff+j > s.QOff+i {
						continue
					}
					kj := ((b*s.Tk+j)*s.NKV + kh) * HD
					var dot float64
					for d := 0; d < HD; d++ {
						dot += float64(q[qi+d]) * float64(k[kj+d])
					}
					p[j] = dot * scale
					m = math.Max(m, p[j])
				}
				var z float64
				for j := range p {
					if !math.IsInf(p[j], -1) {
						p[j] = math.Exp(p[j] - m)
						z += p[j]
					} else {
						p[j] = 0
					}
				}
				dp := make([]float64, s.Tk)
				var rs float64
				for j := range p {
					p[j] /= z
					kj := ((b*s.Tk+j)*s.NKV + kh) * HD
					for d := 0; d < HD; d++ {
						dp[j] += float64(dout[qi+d]) * float64(v[kj+d])
						dv[kj+d] += p[j] * float64(dout[qi+d])
					}
					rs += p[j] * dp[j]
				}
				for j := range p {
					ds := p[j] * (dp[j] - rs) * scale
					kj := ((b*s.Tk+j)*s.NKV + kh) * HD
					for d := 0; d < HD; d++ {
						dq[qi+d] += ds * float64(k[kj+d])
						dk[kj+d] += ds * float64(q[qi+d])
					}
				}
			}
		}
	}
	return dq, dk, dv
}

func f32s(x []float64) []float32 {
	y := make([]float32, len(x))
	for i, v := range x {
		y[i] = float32(v)
	}
	return y
}

// TestFlashAttentionOffsets checks a block of queries attending to keys held
// elsewhere (context parallelism), forward, lse and backward, against the float64
// formula: queries at positions 60..107 and keys at 10..109 with GQA, so some rows
// see part of the keys and the tiles end mid-way.
func TestFlashAttentionOffsets(t *testing.T) {
	for _, dt := range dtypes {
		r := rand.New(rand.NewPCG(6, uint64(dt)))
		B, NH, NKV, HD := 2, 4, 2, 64
		Tq, Tk := 48, 100
		s := AttentionShape{B: B, Tq: Tq, Tk: Tk, NH: NH, NKV: NKV, HD: HD, QOff: 60, KOff: 10, Causal: true}
		q, k, v := roundTo(dt, randn(r, B*Tq*NH*HD, 1)), roundTo(dt, randn(r, B*Tk*NKV*HD, 1)), roundTo(dt, randn(r, B*Tk*NKV*HD, 1))
		dout := roundTo(dt, randn(r, B*Tq*NH*HD, 1))
		wo, wl := naiveAttention(s, q, k, v, 0, Tq)
		wq, wk, wv := naiveAttentionBackward(s, q, k, v, dout)
		onDevice(t, func() {
			bq, bk, bv := put(t, dt, q), put(t, dt, k), put(t, dt, v)
			bo, bl := poisoned(t, dt, len(q)), poisoned(t, F32, B*NH*Tq)
			dev.FlashAttention(bo, bl, bq, bk, bv, s)
			// naiveAttention orders rows (b, i, h) like o, and lse as (b, i, h)
			wantL := make([]float32, len(wl))
			for b := 0; b < B; b++ {
				for i := 0; i < Tq; i++ {
					for h := 0; h < NH; h++ {
						wantL[(b*NH+h)*Tq+i] = float32(wl[(b*Tq+i)*NH+h])
					}
				}
			}
			check(t, "flash with offsets", dt, get(bo), f32s(wo), 1e-5)
			check(t, "flash lse with offsets", F32, get(bl), wantL, 1e-6)
			bdq, bdk, bdv := poisoned(t, dt, len(q)), poisoned(t, dt, len(k)), poisoned(t, dt, len(v))
			dev.FlashAttentionBackward(bdq, bdk, bdv, put(t, dt, dout), bo, bl, bq, bk, bv, s, false)
			check(t, "flash dq with offsets", dt, get(bdq), f32s(wq), 1e-4)
			check(t, "flash dk with offsets", dt, get(bdk), f32s(wk), 1e-4)
			check(t, "flash dv with offsets", dt, get(bdv), f32s(wv), 1e-4)
		})
	}
}

// TestFlashAttentionLong checks T = 8192 against the float64 formula on a sample
// of query rows (the formula costs T² per row set; the kernel keeps no (T,T)).
func TestFlashAttentionLong(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 0))
	B, T, NH, NKV, HD := 1, 8192, 2, 1, 64
	s := AttentionShape{B: B, Tq: T, Tk: T, NH: NH, NKV: NKV, HD: HD, Causal: true}
	q, k, v := roundTo(BF16, randn(r, T*NH*HD, 1)), roundTo(BF16, randn(r, T*NKV*HD, 1)), roundTo(BF16, randn(r, T*NKV*HD, 1))
	onDevice(t, func() {
		bo, bl := poisoned(t, BF16, len(q)), poisoned(t, F32, NH*T)
		dev.FlashAttention(bo, bl, put(t, BF16, q), put(t, BF16, k), put(t, BF16, v), s)
		o := get(bo)
		for _, lo := range []int{0, 31, 4095, 8160} {
			wo, _ := naiveAttention(s, q, k, v, lo, lo+32)
			check(t, fmt.Sprintf("flash T=8192 rows %d..%d", lo, lo+31), BF16, o[lo*NH*HD:(lo+32)*NH*HD], f32s(wo), 0)
		}
	})
}

func TestReadbacksCounted(t *testing.T) {
	onDevice(t, func() {
		b := put(t, F32, []float32{1, 2, 3})
		n := dev.Readbacks()
		dev.AddInto(b, b)
		if dev.Readbacks() != n {
			t.Errorf("a kernel counted as a read-back")
		}
		got := get(b)
		if dev.Readbacks() != n+1 || got[2] != 6 {
			t.Errorf("read-backs %d (want %d), values %v", dev.Readbacks(), n+1, got)
		}
	})
}

func TestErrorsAreSticky(t *testing.T) {
	var err error
	dev.Do(func() {
		b, _ := dev.Alloc(F32, 4)
		defer dev.Free(b)
		dev.FlashAttention(b, b, b, b, b, AttentionShape{B: 1, Tq: 1, Tk: 1, NH: 1, NKV: 1, HD: 48})
		dev.AddInto(b, b) // skipped
		err = dev.Err()
		if dev.Err() != nil {
			t.Errorf("the error was not cleared by Err")
		}
	})
	if err == nil {
		t.Fatal("a head size of 48 was accepted")
	}
	t.Log(err)
}
