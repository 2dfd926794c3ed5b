//go:build cuda

package cuda

import (
	"fmt"
	"math"
	"slices"
)

// Shapes of the kernels (B batch, T time, C channels, V vocabulary, NH/NKV query and
// key/value heads, HD head size). Every kernel takes its storage dtype from its
// buffers (all fp32 or all bf16, except where a comment says fp32).

// MatmulShape is out (BT,OC) = inp (BT,C) · weight (OC,C)ᵀ.
type MatmulShape struct{ BT, C, OC int }

// AttentionShape describes q (B,Tq,NH,HD) against k, v (B,Tk,NKV,HD). Query i sits
// at position QOff+i and key j at KOff+j; Causal lets a query see keys at its
// position or before. HD is 32, 64 or 128.
type AttentionShape struct {
	B, Tq, Tk, NH, NKV, HD int
	QOff, KOff             int
	Causal                 bool
}

// RopeShape is x (B,T,NH,HD) rotated with (T,HD/2) fp32 tables.
type RopeShape struct{ B, T, NH, HD int }

// AdamWConfig is one AdamW step's hyper-parameters; Step is 1-based.
type AdamWConfig struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64
	Step                               int
}

const threads = 256

func suffix(t DType) string {
	if t == BF16 {
		return "_bf16"
	}
	return "_f32"
}

// grid is the number of blocks of threads for n elements, capped at 32 per SM
// (the grid-stride loops take the rest).
func (d *Device) grid(n int) int {
	g := (n + threads - 1) / threads
	return max(1, min(g, 32*max(d.info.SMs, 1)))
}

func (d *Device) same(what string, bufs ...Buffer) bool {
	if d.err != nil {
		return false
	}
	for _, b := range bufs[1:] {
		if b.DType != bufs[0].DType {
			d.fail(what, fmt.Errorf("mixed storage dtypes %s and %s", bufs[0].DType, b.DType))
			return false
		}
	}
	return true
}

func (d *Device) need(what string, b Buffer, t DType, n int) bool {
	if d.err != nil {
		return false
	}
	if b.DType != t || b.N < n {
		d.fail(what, fmt.Errorf("needs %d %s values, has %d %s", n, t, b.N, b.DType))
		return false
	}
	return true
}

// scratch is device-owned fp32 scratch slot i of at least n values; it grows only
// when a larger size is first asked for (the steady state allocates nothing).
func (d *Device) scratch(i, n int) Buffer {
	for len(d.scratches) <= i {
		d.scratches = append(d.scratches, Buffer{DType: F32})
	}
	if d.scratches[i].N < n {
		d.Free(d.scratches[i])
		b, err := d.Alloc(F32, n)
		d.fail("scratch", err)
		d.scratches[i] = b
	}
	return d.scratches[i].Slice(0, n)
}

const (
	scratchPartial = iota
	scratchSumSq
	scratchDelta
)

// Cast converts between fp32 and bf16 buffers of one length (round to nearest even).
func (d *Device) Cast(dst, src Buffer) {
	if d.err != nil || src.N == 0 {
		return
	}
	switch {
	case dst.N != src.N:
		d.fail("cast", fmt.Errorf("%d values into %d", src.N, dst.N))
	case src.DType == F32 && dst.DType == BF16:
		d.launch("cast_f32_bf16", d.grid(src.N), 1, threads, ptr(dst), ptr(src), i64(src.N))
	case src.DType == BF16 && dst.DType == F32:
		d.launch("cast_bf16_f32", d.grid(src.N), 1, threads, ptr(dst), ptr(src), i64(src.N))
	default:
		d.Copy(dst, src)
	}
}

// Add: out = a + b.
func (d *Device) Add(out, a, b Buffer) {
	if d.same("add", out, a, b) {
		d.launch("add"+suffix(out.DType), d.grid(out.N), 1, threads, ptr(out), ptr(a), ptr(b), i64(out.N))
	}
}

// AddInto: dst += src.
func (d *Device) AddInto(dst, src Buffer) {
	if d.same("add_into", dst, src) {
		d.launch("add_into"+suffix(dst.DType), d.grid(dst.N), 1, threads, ptr(dst), ptr(src), i64(dst.N))
	}
}

// ScaleBy multiplies x by the fp32 value f[0] held on the device.
func (d *Device) ScaleBy(x, f Buffer) {
	if d.need("scale_by", f, F32, 1) {
		d.launch("scale_by"+suffix(x.DType), d.grid(x.N), 1, threads, ptr(x), ptr(f), i64(x.N))
	}
}

// Embedding: out (BT,C) = wte[tokens] (tokens: BT int32).
func (d *Device) Embedding(out, tokens, wte Buffer, BT, C int) {
	if d.same("embedding", out, wte) && d.need("embedding", tokens, I32, BT) {
		d.launch("embedding"+suffix(out.DType), d.grid(BT*C), 1, threads, ptr(out), ptr(tokens), ptr(wte), i32(BT), i32(C))
	}
}

// EmbeddingBackward: dwte (V,C, fp32) += dout rows gathered by token.
func (d *Device) EmbeddingBackward(dwte, dout, tokens Buffer, BT, C, V int) {
	if d.need("embedding backward", dwte, F32, V*C) && d.need("embedding backward", tokens, I32, BT) {
		d.launch("embedding_backward"+suffix(dout.DType), d.grid(V*C), 1, threads, ptr(dwte), ptr(dout), ptr(tokens), i32(BT), i32(C), i32(V))
	}
}

// RMSNorm: out = inp·rstd·weight per row of C; rstd (rows, fp32) is saved.
func (d *Device) RMSNorm(out, rstd, inp, weight Buffer, rows, C int, eps float64) {
	if d.same("rmsnorm", out, inp, weight) && d.need("rmsnorm", rstd, F32, rows) {
		d.launch("rmsnorm"+suffix(out.DType), rows, 1, threads, ptr(out), ptr(rstd), ptr(inp), ptr(weight), i32(C), f32(eps))
	}
}

// rmsRowsPerBlock is RMS_RPB in kernels.cu: the rows each partial sum of the weight
// gradient covers.
const rmsRowsPerBlock = 32

// RMSNormBackward: dinp = rstd·g − inp·rstd³·mean(g·inp) with g = dout·weight
// (overwritten, or added to when accumulate); dweight (C, fp32) += Σ dout·inp·rstd,
// summed in a fixed order.
func (d *Device) RMSNormBackward(dinp, dweight, dout, inp, weight, rstd Buffer, rows, C int, accumulate bool) {
	if !d.same("rmsnorm backward", dinp, dout, inp, weight) || !d.need("rmsnorm backward", dweight, F32, C) {
		return
	}
	s := suffix(dinp.DType)
	d.launch("rmsnorm_backward"+s, rows, 1, threads, ptr(dinp), ptr(dout), ptr(inp), ptr(weight), ptr(rstd), i32(rows), i32(C), flag(accumulate))
	nb := (rows + rmsRowsPerBlock - 1) / rmsRowsPerBlock
	part := d.scratch(scratchPartial, nb*C)
	d.launch("rmsnorm_dweight_partial"+s, (C+threads-1)/threads, nb, threads, ptr(part), ptr(dout), ptr(inp), ptr(rstd), i32(rows), i32(C))
	d.launch("sum_partials", (C+threads-1)/threads, 1, threads, ptr(dweight), ptr(part), i32(nb), i32(C))
}

// RopeTables uploads cos and sin tables (T, HD/2, fp32) for rotary embeddings,
// computed on the host in float64 as the CPU backend does.
func (d *Device) RopeTables(cos, sin Buffer, T, HD int, theta float64) {
	half := HD / 2
	c, s := make([]float32, T*half), make([]float32, T*half)
	for t := 0; t < T; t++ {
		for i := 0; i < half; i++ {
			a := float64(t) * math.Pow(theta, -2*float64(i)/float64(HD))
			c[t*half+i], s[t*half+i] = float32(math.Cos(a)), float32(math.Sin(a))
		}
	}
	d.Upload(cos, c)
	d.Upload(sin, s)
}

// Rope rotates x in place (rotate-half pairing); backward applies the transpose.
func (d *Device) Rope(x, cos, sin Buffer, s RopeShape, backward bool) {
	dir := 1.0
	if backward {
		dir = -1
	}
	n := s.B * s.T * s.NH * s.HD / 2
	d.launch("rope"+suffix(x.DType), d.grid(n), 1, threads, ptr(x), ptr(cos), ptr(sin), i32(s.B), i32(s.T), i32(s.NH), i32(s.HD), f32(dir))
}

// SwiGLU: out = silu(gate)·up.
func (d *Device) SwiGLU(out, gate, up Buffer) {
	if d.same("swiglu", out, gate, up) {
		d.launch("swiglu"+suffix(out.DType), d.grid(out.N), 1, threads, ptr(out), ptr(gate), ptr(up), i64(out.N))
	}
}

// SwiGLUBackward: dgate, dup from dout (overwritten, or added to when accumulate).
func (d *Device) SwiGLUBackward(dgate, dup, dout, gate, up Buffer, accumulate bool) {
	if d.same("swiglu backward", dgate, dup, dout, gate, up) {
		d.launch("swiglu_backward"+suffix(dgate.DType), d.grid(dout.N), 1, threads, ptr(dgate), ptr(dup), ptr(dout), ptr(gate), ptr(up), i64(dout.N), flag(accumulate))
	}
}

// CrossEntropy: losses (BT, fp32) = −log softmax(logits)[target] (0 where target <
// 0) and lse (BT, fp32), the log-sum-exp backward recomputes probabilities from.
func (d *Device) CrossEntropy(losses, lse, logits, targets Buffer, BT, V int) {
	if d.need("cross-entropy", losses, F32, BT) && d.need("cross-entropy", lse, F32, BT) && d.need("cross-entropy", targets, I32, BT) {
		d.launch("cross_entropy"+suffix(logits.DType), BT, 1, 1024, ptr(losses), ptr(lse), ptr(logits), ptr(targets), i32(V))
	}
}

// CrossEntropyBackward: dlogits = (softmax − onehot)·dloss (dloss: BT fp32),
// overwritten or added to when accumulate.
func (d *Device) CrossEntropyBackward(dlogits, dloss, lse, logits, targets Buffer, BT, V int, accumulate bool) {
	if d.same("cross-entropy backward", dlogits, logits) {
		d.launch("cross_entropy_backward"+suffix(logits.DType), BT, 1, 1024, ptr(dlogits), ptr(dloss), ptr(lse), ptr(logits), ptr(targets), i32(V), flag(accumulate))
	}
}

// AdamW updates fp32 params, m, v from fp32 grads scaled by gscale[0] (a device
// value; pass a zero Buffer for 1) and, when compute is a bf16 buffer, writes the
// bf16 compute weights in the same pass.
func (d *Device) AdamW(params, compute, grads, m, v, gscale Buffer, c AdamWConfig) {
	n := params.N
	if !d.need("adamw", grads, F32, n) || !d.need("adamw", m, F32, n) || !d.need("adamw", v, F32, n) || !d.need("adamw", params, F32, n) {
		return
	}
	if compute.N > 0 && !d.need("adamw", compute, BF16, n) {
		return
	}
	c1 := 1 / (1 - math.Pow(c.Beta1, float64(c.Step)))
	c2 := 1 / (1 - math.Pow(c.Beta2, float64(c.Step)))
	d.launch("adamw", d.grid(n), 1, threads, ptr(params), ptr(compute), ptr(grads), ptr(m), ptr(v), i64(n),
		f32(c.LR), f32(c.Beta1), f32(c.Beta2), f32(c.Eps), f32(c.WeightDecay), f32(c1), f32(c2), ptr(gscale))
}

// sumSqBlocks is the fixed grid of the sum of squares: the result does not depend
// on the device.
const sumSqBlocks = 512

// SumSquares sets out[0] (fp32) to Σ x² (or adds it when accumulate), in a fixed
// order; the value stays on the device.
func (d *Device) SumSquares(out, x Buffer, accumulate bool) {
	if !d.need("sum of squares", out, F32, 1) || x.N == 0 {
		return
	}
	part := d.scratch(scratchSumSq, sumSqBlocks)
	d.launch("sumsq_partial"+suffix(x.DType), sumSqBlocks, 1, threads, ptr(part), ptr(x), i64(x.N))
	d.launch("sumsq_finish", 1, 1, 1024, ptr(out), ptr(part), i32(sumSqBlocks), flag(accumulate))
}

// ClipFactor sets norm[0] = √sumsq[0] and factor[0] = min(1, maxNorm/(norm+1e-6))
// (1 when maxNorm ≤ 0), all on the device.
func (d *Device) ClipFactor(factor, norm, sumsq Buffer, maxNorm float64) {
	d.launch("clip_factor", 1, 1, 1, ptr(factor), ptr(norm), ptr(sumsq), f32(maxNorm))
}

// Matmul: out (BT,OC) = inp·weightᵀ, or += when accumulate.
func (d *Device) Matmul(out, inp, weight Buffer, s MatmulShape, accumulate bool) {
	d.gemm(true, false, s.OC, s.BT, s.C, weight, s.C, inp, s.C, beta(accumulate), out, s.OC)
}

// MatmulBackward: dinp (BT,C) = dout·weight (+= when accumulate; skipped when dinp
// is empty); dweight (OC,C) += doutᵀ·inp always (dweight may be fp32 with bf16
// operands).
func (d *Device) MatmulBackward(dinp, dweight, dout, inp, weight Buffer, s MatmulShape, accumulate bool) {
	if dinp.N > 0 {
		d.gemm(false, false, s.C, s.BT, s.OC, weight, s.C, dout, s.OC, beta(accumulate), dinp, s.C)
	}
	d.gemm(false, true, s.C, s.OC, s.BT, inp, s.C, dout, s.OC, 1, dweight, s.C)
}

func beta(accumulate bool) float32 {
	if accumulate {
		return 1
	}
	return 0
}

// flash attention tiling (FA_ROWS, FB_KEYS and the 128-thread blocks of kernels.cu;
// the tensor-core kernels take 64 query rows or 64 keys per block).
const (
	flashRows   = 16
	flashKeys   = 32
	flashTCRows = 64
)

func (d *Device) attnCheck(what string, s AttentionShape, bufs ...Buffer) bool {
	if !d.same(what, bufs...) {
		return false
	}
	switch {
	case s.HD != 32 && s.HD != 64 && s.HD != 128:
		d.fail(what, fmt.Errorf("head size %d (the kernels take 32, 64 or 128)", s.HD))
	case bufs[0].DType == BF16 && slices.ContainsFunc(bufs, func(b Buffer) bool { return b.ptr%16 != 0 }):
		d.fail(what, fmt.Errorf("bf16 buffers must start at a multiple of 8 elements (the kernels copy 16-byte pieces)"))
	case s.NKV <= 0 || s.NH%s.NKV != 0:
		d.fail(what, fmt.Errorf("%d query heads over %d key/value heads", s.NH, s.NKV))
	default:
		return true
	}
	return false
}

func (s AttentionShape) tail() []arg {
	return []arg{i32(s.Tq), i32(s.Tk), i32(s.NH), i32(s.NKV), i32(s.QOff), i32(s.KOff), flag(s.Causal), f32(1 / math.Sqrt(float64(s.HD)))}
}

// FlashAttention (fp32 on the SIMT cores, bf16 on tensor cores): o = softmax(q·kᵀ/√HD, masked)·v, saving lse (B,NH,Tq fp32) only.
func (d *Device) FlashAttention(o, lse, q, k, v Buffer, s AttentionShape) {
	if !d.attnCheck("flash attention", s, o, q, k, v) || !d.need("flash attention", lse, F32, s.B*s.NH*s.Tq) {
		return
	}
	args := append([]arg{ptr(o), ptr(lse), ptr(q), ptr(k), ptr(v)}, s.tail()...)
	if q.DType == BF16 {
		d.launch(fmt.Sprintf("flash_fwd_tc_%d", s.HD), (s.Tq+flashTCRows-1)/flashTCRows, s.B*s.NH, 128, args...)
		return
	}
	d.launch(fmt.Sprintf("flash_fwd_f32_%d", s.HD), (s.Tq+flashRows-1)/flashRows, s.B*s.NH, 128, args...)
}

// FlashAttentionBackward: dq, dk, dv (overwritten, or added to when accumulate)
// from dout, the saved o and lse, recomputing the probabilities tile by tile.
func (d *Device) FlashAttentionBackward(dq, dk, dv, dout, o, lse, q, k, v Buffer, s AttentionShape, accumulate bool) {
	if !d.attnCheck("flash attention backward", s, dq, dk, dv, dout, o, q, k, v) {
		return
	}
	sfx := suffix(q.DType)
	D := d.scratch(scratchDelta, s.B*s.NH*s.Tq)
	rows := s.B * s.Tq * s.NH
	d.launch("flash_delta"+sfx, (rows*32+threads-1)/threads, 1, threads, ptr(D), ptr(o), ptr(dout), i32(s.B), i32(s.Tq), i32(s.NH), i32(s.HD))
	args := append([]arg{ptr(dq), ptr(dout), ptr(lse), ptr(D), ptr(q), ptr(k), ptr(v)}, s.tail()...)
	args = append(args, flag(accumulate))
	kv := append([]arg{ptr(dk), ptr(dv), ptr(dout), ptr(lse), ptr(D), ptr(q), ptr(k), ptr(v)}, s.tail()...)
	kv = append(kv, flag(accumulate))
	if q.DType == BF16 {
		d.launch(fmt.Sprintf("flash_bwd_dq_tc_%d", s.HD), (s.Tq+flashTCRows-1)/flashTCRows, s.B*s.NH, 128, args...)
		d.launch(fmt.Sprintf("flash_bwd_dkdv_tc_%d", s.HD), (s.Tk+flashTCRows-1)/flashTCRows, s.B*s.NKV, 128, kv...)
		return
	}
	d.launch(fmt.Sprintf("flash_bwd_dq_f32_%d", s.HD), (s.Tq+flashRows-1)/flashRows, s.B*s.NH, 128, args...)
	d.launch(fmt.Sprintf("flash_bwd_dkdv_f32_%d", s.HD), (s.Tk+flashKeys-1)/flashKeys, s.B*s.NKV, 128, kv...)
}
