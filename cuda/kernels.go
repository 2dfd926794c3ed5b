//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"math"
	"slices"

	"github.com/shardline/shardline/tensor"
)

// Shapes of the kernels (B batch, T time, C channels, V vocabulary, NH/NKV query and
// key/value heads, HD head size). Every kernel takes its storage dtype from its
// buffers (all fp32 or all bf16, except where a comment says fp32).

// MatmulShape is out (BT,OC) = inp (BT,C) · weight (OC,C)ᵀ: the CPU backend's
// shape, so the two backends' kernels take the same shapes.
type MatmulShape = tensor.MatmulShape

// AttentionShape describes q (B,Tq,NH,HD) against k, v (B,Tk,NKV,HD). Query i sits
// at position QOff+i and key j at KOff+j; Causal lets a query see keys at its
// position or before. HD is 32, 64 or 128 here.
type AttentionShape = tensor.AttentionShape

// RopeShape is x (B,T,NH,HD) rotated with (T,HD/2) fp32 tables.
type RopeShape = tensor.RopeShape

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
	scratchDelta
	scratchGemm // an fp32 product bound for a bf16 C (gemmIntoBF16)
)

// Cast converts between float buffers (f32, bf16, f64, FP8 E4M3 and E5M2) of
// one length: to f32, bf16 and FP8 to nearest, ties to even (f64 to bf16 and
// FP8 by way of f32; FP8 saturating at its largest value), as the CPU memory
// rounds, widening exactly. Like dtypes copy.
func (d *Device) Cast(dst, src Buffer) {
	if d.err != nil || src.N == 0 {
		return
	}
	if dst.N != src.N {
		d.fail("cast", fmt.Errorf("%d values into %d", src.N, dst.N))
		return
	}
	if dst.DType == src.DType {
		d.Copy(dst, src)
		return
	}
	name, ok := castKernels[[2]DType{src.DType, dst.DType}]
	if !ok {
		d.fail("cast", fmt.Errorf("%s into %s: no conversion", src.DType, dst.DType))
		return
	}
	d.launch(name, d.grid(src.N), 1, threads, d.wr(dst), d.rd(src), i64(src.N))
}

// castKernels names the conversion kernel of each (source, destination) pair.
var castKernels = map[[2]DType]string{
	{F32, BF16}: "cast_f32_bf16", {BF16, F32}: "cast_bf16_f32",
	{F64, F32}: "cast_f64_f32", {F32, F64}: "cast_f32_f64",
	{F64, BF16}: "cast_f64_bf16", {BF16, F64}: "cast_bf16_f64",
	{F32, F8E4M3}: "cast_f32_e4m3", {F32, F8E5M2}: "cast_f32_e5m2",
	{BF16, F8E4M3}: "cast_bf16_e4m3", {BF16, F8E5M2}: "cast_bf16_e5m2",
	{F64, F8E4M3}: "cast_f64_e4m3", {F64, F8E5M2}: "cast_f64_e5m2",
	{F8E5M2, F8E4M3}: "cast_e5m2_e4m3", {F8E4M3, F8E5M2}: "cast_e4m3_e5m2",
	{F8E4M3, F32}: "cast_e4m3_f32", {F8E5M2, F32}: "cast_e5m2_f32",
	{F8E4M3, BF16}: "cast_e4m3_bf16", {F8E5M2, BF16}: "cast_e5m2_bf16",
	{F8E4M3, F64}: "cast_e4m3_f64", {F8E5M2, F64}: "cast_e5m2_f64",
}

// Add: out = a + b.
func (d *Device) Add(out, a, b Buffer) {
	if d.same("add", out, a, b) {
		d.launch("add"+suffix(out.DType), d.grid(out.N), 1, threads, d.wr(out), d.rd(a), d.rd(b), i64(out.N))
	}
}

// AddInto: dst += src.
func (d *Device) AddInto(dst, src Buffer) {
	if d.same("add_into", dst, src) {
		d.launch("add_into"+suffix(dst.DType), d.grid(dst.N), 1, threads, d.rw(dst), d.rd(src), i64(dst.N))
	}
}

// RMSNorm: out = inp·rstd·weight per row of C; rstd (rows, fp32) is saved.
func (d *Device) RMSNorm(out, rstd, inp, weight Buffer, rows, C int, eps float64) {
	if d.same("rmsnorm", out, inp, weight) && d.need("rmsnorm", rstd, F32, rows) {
		d.launch("rmsnorm"+suffix(out.DType), warpRows(rows), 1, threads, d.wr(out), d.wr(rstd), d.rd(inp), d.rd(weight), i32(rows), i32(C), f32(eps))
	}
}

// warpRows is the grid of a kernel that gives each row a warp: blocks of
// threads/32 rows.
func warpRows(rows int) int { return max(1, (rows+threads/32-1)/(threads/32)) }

// rmsRowsPerBlock is RMS_RPB in kernels.cu: the rows each partial sum of the weight
// gradient covers.
const rmsRowsPerBlock = 32

// RMSNormBackward: dinp = rstd·g − inp·rstd³·mean(g·inp) with g = dout·weight
// (overwritten, or added to when accumulate); dweight (C, fp32 or bf16) += Σ
// dout·inp·rstd, summed in fp32 in a fixed order and added once (a bf16 dweight
// rounded once).
func (d *Device) RMSNormBackward(dinp, dweight, dout, inp, weight, rstd Buffer, rows, C int, accumulate bool) {
	if !d.same("rmsnorm backward", dinp, dout, inp, weight) || !d.needFloat("rmsnorm backward", dweight, C) {
		return
	}
	s := suffix(dinp.DType)
	d.launch("rmsnorm_backward"+s, warpRows(rows), 1, threads, d.acc(dinp, accumulate), d.rd(dout), d.rd(inp), d.rd(weight), d.rd(rstd), i32(rows), i32(C), flag(accumulate))
	nb := (rows + rmsRowsPerBlock - 1) / rmsRowsPerBlock
	part := d.scratch(scratchPartial, nb*C)
	d.launch("rmsnorm_dweight_partial"+s, (C+threads-1)/threads, nb, threads, d.wr(part), d.rd(dout), d.rd(inp), d.rd(rstd), i32(rows), i32(C))
	if dweight.DType == BF16 {
		d.launch("sum_partials_bf16", (C+threads-1)/threads, 1, threads, d.rw(dweight.Slice(0, C)), d.rd(part), i32(nb), i32(C))
		return
	}
	d.launch("sum_partials", (C+threads-1)/threads, 1, threads, d.rw(dweight.Slice(0, C)), d.rd(part), i32(nb), i32(C))
}

// needFloat is need for a parameter gradient: n fp32 or bf16 values.
func (d *Device) needFloat(what string, b Buffer, n int) bool {
	if b.DType == BF16 {
		return d.need(what, b, BF16, n)
	}
	return d.need(what, b, F32, n)
}

// RopeTables uploads cos and sin tables (T, len(inv), fp32) for rotary
// embeddings at the inverse frequencies inv (tensor.RopeInvFreq), computed on the
// host in float64 as the CPU backend does.
func (d *Device) RopeTables(cos, sin Buffer, T int, inv []float64) {
	half := len(inv)
	c, s := make([]float32, T*half), make([]float32, T*half)
	for t := 0; t < T; t++ {
		for i, f := range inv {
			a := float64(t) * f
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
	d.launch("rope"+suffix(x.DType), d.grid(n), 1, threads, d.rw(x), d.rd(cos), d.rd(sin), i32(s.B), i32(s.T), i32(s.NH), i32(s.HD), f32(dir))
}

// SwiGLU: out = silu(gate)·up.
func (d *Device) SwiGLU(out, gate, up Buffer) {
	if d.same("swiglu", out, gate, up) {
		d.launch("swiglu"+suffix(out.DType), d.grid(out.N), 1, threads, d.wr(out), d.rd(gate), d.rd(up), i64(out.N))
	}
}

// SwiGLUBackward: dgate, dup from dout (overwritten, or added to when accumulate).
func (d *Device) SwiGLUBackward(dgate, dup, dout, gate, up Buffer, accumulate bool) {
	if d.same("swiglu backward", dgate, dup, dout, gate, up) {
		d.launch("swiglu_backward"+suffix(dgate.DType), d.grid(dout.N), 1, threads, d.acc(dgate, accumulate), d.acc(dup, accumulate), d.rd(dout), d.rd(gate), d.rd(up), i64(dout.N), flag(accumulate))
	}
}

// CrossEntropy: losses (BT, fp32) = −log softmax(logits)[target] (0 where target <
// 0) and lse (BT, fp32), the log-sum-exp backward recomputes probabilities from.
func (d *Device) CrossEntropy(losses, lse, logits, targets Buffer, BT, V int) {
	if d.need("cross-entropy", losses, F32, BT) && d.need("cross-entropy", lse, F32, BT) && d.need("cross-entropy", targets, I32, BT) {
		d.launch("cross_entropy"+suffix(logits.DType), BT, 1, 1024, d.wr(losses), d.wr(lse), d.rd(logits), d.rd(targets), i32(V))
	}
}

// HeadShape is the output head and loss: x (BT,C) · w (V,C)ᵀ.
type HeadShape struct{ BT, C, V int }

// HeadScratch is what HeadCrossEntropyTrain needs besides its inputs: Logits
// (fp32) and DLogits (the operands' dtype), each at least one row of V.
type HeadScratch struct{ Logits, DLogits Buffer }

// inputs checks the head's operands.
func (s HeadShape) inputs(d *Device, x, w, targets Buffer) bool {
	return d.same("output head", x, w) && d.need("output head", x, x.DType, s.BT*s.C) && d.need("output head", w, x.DType, s.V*s.C) &&
		d.need("output head", targets, I32, s.BT)
}

// MoEShape is tensor's (the kernels here take up to 1024 experts, top 32): with
// Padded, expert e's segment sits at rows e·Capacity.. (static shapes for
// ExpertsMatmul); otherwise segments are packed in expert order.
type MoEShape = tensor.MoEShape

// MoERouting is one layer's routing state, all on the device: Probs (BT,E) and
// Gates (BT,K) fp32; Idx, Row, Rank (BT,K), Tok (Rows), Counts (E) and Offsets (E+1)
// int32.
type MoERouting struct{ Probs, Gates, Idx, Row, Rank, Tok, Counts, Offsets Buffer }

func (d *Device) moeCheck(what string, r MoERouting, s MoEShape) bool {
	n := s.BT * s.K
	switch {
	case d.err != nil:
		return false
	case s.E > 1024 || s.K > 32 || s.K > s.E || s.Capacity <= 0:
		d.fail(what, fmt.Errorf("%d experts, top %d, capacity %d (the kernels take up to 1024 experts, top 32)", s.E, s.K, s.Capacity))
		return false
	}
	return d.need(what, r.Probs, F32, s.BT*s.E) && d.need(what, r.Gates, F32, n) && d.need(what, r.Idx, I32, n) &&
		d.need(what, r.Row, I32, n) && d.need(what, r.Rank, I32, n) && d.need(what, r.Tok, I32, s.Rows()) &&
		d.need(what, r.Counts, I32, s.E) && d.need(what, r.Offsets, I32, s.E+1)
}

// Router: probs = softmax(logits (BT,E)), idx the top K experts (ties to the lower
// index), gates the softmax of the selected logits.
func (d *Device) Router(r MoERouting, logits Buffer, s MoEShape) {
	if d.moeCheck("router", r, s) {
		d.launch("moe_router"+suffix(logits.DType), (s.BT+3)/4, 1, 128, d.wr(r.Probs), d.wr(r.Idx), d.wr(r.Gates), d.rd(logits), i32(s.BT), i32(s.E), i32(s.K))
	}
}

// Dispatch ranks every copy within its expert, keeps the first Capacity, lays the
// segments out (Counts, Offsets, Row, Tok) and gathers the kept tokens' rows of x
// (BT,C) into xperm (Rows, C); with Padded the unused rows are zero. Nothing comes
// back to the host.
func (d *Device) Dispatch(xperm Buffer, r MoERouting, x Buffer, s MoEShape) {
	if !d.moeCheck("dispatch", r, s) || !d.same("dispatch", xperm, x) || !d.need("dispatch", xperm, x.DType, s.Rows()*s.C) {
		return
	}
	n := s.BT * s.K
	d.launch("moe_rank", s.E, 1, 1024, d.wr(r.Rank), d.wr(r.Counts), d.rd(r.Idx), i32(n), i32(s.Capacity))
	d.launch("moe_offsets", 1, 1, 32, d.wr(r.Offsets), d.rd(r.Counts), i32(s.E), i32(s.Capacity), flag(s.Padded))
	d.launch("moe_place", d.grid(n), 1, threads, d.wr(r.Row), d.wr(r.Tok), d.rd(r.Rank), d.rd(r.Idx), d.rd(r.Offsets), i32(n), i32(s.K), i32(s.Capacity))
	if s.Padded {
		d.Zero(xperm.Slice(0, s.Rows()*s.C))
	}
	d.launch("moe_gather"+suffix(x.DType), d.grid(n*s.C), 1, threads, d.wr(xperm), d.rd(x), d.rd(r.Row), i32(n), i32(s.K), i32(s.C))
}

// DispatchBackward: dx (BT,C) = Σ over each token's kept copies of dxperm[row]
// (added to dx when accumulate), per token in copy order.
func (d *Device) DispatchBackward(dx, dxperm Buffer, r MoERouting, s MoEShape, accumulate bool) {
	if d.moeCheck("dispatch backward", r, s) && d.same("dispatch backward", dx, dxperm) {
		d.launch("moe_scatter_back"+suffix(dx.DType), d.grid(s.BT*s.C), 1, threads, d.acc(dx, accumulate), d.rd(dxperm), d.rd(r.Row), i32(s.BT), i32(s.K), i32(s.C), flag(accumulate))
	}
}

// Combine: out[t] += Σ_j gates[t,j]·y[row[t,j]] over kept copies.
func (d *Device) Combine(out, y Buffer, r MoERouting, s MoEShape) {
	if d.moeCheck("combine", r, s) && d.same("combine", out, y) {
		d.launch("moe_combine"+suffix(out.DType), d.grid(s.BT*s.C), 1, threads, d.rw(out), d.rd(y), d.rd(r.Gates), d.rd(r.Row), i32(s.BT), i32(s.K), i32(s.C))
	}
}

// CombineBackward: dy[row] = gate·dout[t] for kept copies (other rows untouched) and
// dgates (BT,K fp32) = dout[t]·y[row] (0 for dropped copies).
func (d *Device) CombineBackward(dy, dgates, dout, y Buffer, r MoERouting, s MoEShape) {
	if d.moeCheck("combine backward", r, s) && d.same("combine backward", dy, dout, y) && d.need("combine backward", dgates, F32, s.BT*s.K) {
		n := s.BT * s.K
		d.launch("moe_combine_backward"+suffix(dy.DType), (n*32+threads-1)/threads, 1, threads, d.wr(dy), d.wr(dgates), d.rd(dout), d.rd(y), d.rd(r.Gates), d.rd(r.Row), i32(n), i32(s.K), i32(s.C))
	}
}

// ExpertsShape is E products of Rows rows each (padded segments): out_e (Rows,OC)
// = inp_e (Rows,C) · w_e (OC,C)ᵀ, with w_e at e·WStride elements of w.
type ExpertsShape struct{ E, Rows, C, OC, WStride int }

// ExpertsMatmul runs every expert's product as one strided batch (or += when
// accumulate).
func (d *Device) ExpertsMatmul(out, inp, w Buffer, s ExpertsShape, accumulate bool) {
	d.gemmBatched(true, false, s.OC, s.Rows, s.C, w, s.C, s.WStride, inp, s.C, s.Rows*s.C, beta(accumulate), out, s.OC, s.Rows*s.OC, s.E)
}

// HeadCrossEntropyTrain is the head, the loss and the loss's gradient in one pass,
// for a step whose gradient scale (dloss, BT fp32) is known in the forward: rows
// of logits are made a chunk of rows at a time (as many whole rows as
// sc.Logits holds), and each chunk's losses, lse, dx rows (overwritten, or added
// to when accumulate) and dw (fp32 or bf16, +=; a bf16 dw is rounded once a
// chunk) follow from it at once: no second product or pass over the logits in
// a backward.
func (d *Device) HeadCrossEntropyTrain(losses, lse, dx, dw, x, w, targets, dloss Buffer, s HeadShape, sc HeadScratch, accumulate bool) {
	if !s.inputs(d, x, w, targets) || !d.need("output head", losses, F32, s.BT) || !d.need("output head", lse, F32, s.BT) ||
		!d.needFloat("output head", dw, s.V*s.C) || !d.need("output head", dloss, F32, s.BT) ||
		!d.need("output head logits", sc.Logits, F32, s.V) || !d.need("output head logits", sc.DLogits, x.DType, s.V) {
		return
	}
	rc := min(s.BT, sc.Logits.N/s.V, sc.DLogits.N/s.V)
	if rc < 1 {
		d.fail("output head", fmt.Errorf("the logits buffers (%d values) hold no whole row of %d", min(sc.Logits.N, sc.DLogits.N), s.V))
		return
	}
	for r0 := 0; r0 < s.BT; r0 += rc {
		n := min(rc, s.BT-r0)
		L, dL := sc.Logits.Slice(0, n*s.V), sc.DLogits.Slice(0, n*s.V)
		xr := x.Slice(r0*s.C, (r0+n)*s.C)
		d.Matmul(L, xr, w, MatmulShape{BT: n, C: s.C, OC: s.V}, false)
		d.launch("ce_rows"+suffix(x.DType), n, 1, 1024, d.wr(losses.Slice(r0, r0+n)), d.wr(lse.Slice(r0, r0+n)), d.wr(dL), d.rd(L),
			d.rd(targets.Slice(r0, r0+n)), d.rd(dloss.Slice(r0, r0+n)), i32(s.V))
		d.MatmulBackward(dx.Slice(r0*s.C, (r0+n)*s.C), dw, dL, xr, w, MatmulShape{BT: n, C: s.C, OC: s.V}, accumulate)
	}
}

// Matmul: out (BT,OC) = inp·weightᵀ, or += when accumulate.
func (d *Device) Matmul(out, inp, weight Buffer, s MatmulShape, accumulate bool) {
	d.gemm(true, false, s.OC, s.BT, s.C, weight, s.C, inp, s.C, beta(accumulate), out, s.OC)
}

// MatmulBackward: dinp (BT,C) = dout·weight (+= when accumulate; skipped when dinp
// is empty); dweight (OC,C) += doutᵀ·inp always (dweight fp32 or bf16, of
// either operands' dtype: gemmBatched).
func (d *Device) MatmulBackward(dinp, dweight, dout, inp, weight Buffer, s MatmulShape, accumulate bool) {
	if dinp.N > 0 {
		d.gemm(false, false, s.C, s.BT, s.OC, weight, s.C, dout, s.OC, beta(accumulate), dinp, s.C)
	}
	d.gemm(false, true, s.C, s.OC, s.BT, inp, s.C, dout, s.OC, 1, dweight, s.C)
}

// gemm is the column-major product C (m×n) = op(A)·op(B) + beta·C, A and B of one
// dtype, C of its own, accumulated in fp32 (gemmBatched with one product).
func (d *Device) gemm(ta, tb bool, m, n, k int, A Buffer, lda int, B Buffer, ldb int, beta float32, Cb Buffer, ldc int) {
	d.gemmBatched(ta, tb, m, n, k, A, lda, 0, B, ldb, 0, beta, Cb, ldc, 0, 1)
}

// gemmBatched is batch column-major products C (m×n) = op(A)·op(B) + beta·C,
// the i-th reading A, B and C at i·sa, i·sb and i·sc elements: A and B of one
// float dtype, C fp32 or bf16, accumulated in fp32 and rounded once into a
// bf16 C. It checks the operands once for both drivers (cuBLASLt on a GPU,
// plain loops on the emulator) and does nothing after an error or for an
// empty product. cuBLASLt writes a bf16 C beside bf16 operands only: fp32
// operands into a bf16 C go through gemmIntoBF16, on both drivers.
func (d *Device) gemmBatched(ta, tb bool, m, n, k int, A Buffer, lda, sa int, B Buffer, ldb, sb int, beta float32, Cb Buffer, ldc, sc, batch int) {
	if d.err != nil || batch == 0 || m == 0 || n == 0 {
		return
	}
	if A.DType != B.DType || A.DType == I32 || Cb.DType == I32 {
		d.fail("gemm", fmt.Errorf("operands %s·%s into %s", A.DType, B.DType, Cb.DType))
		return
	}
	if d.drv.onComm {
		d.fail("gemm", fmt.Errorf("a matrix product inside Background: cuBLASLt's handle is bound to the compute stream"))
		return
	}
	if A.DType == F32 && Cb.DType == BF16 {
		d.gemmIntoBF16(ta, tb, m, n, k, A, lda, sa, B, ldb, sb, beta, Cb, ldc, sc, batch)
		return
	}
	ab, cb := int64(A.DType.Size()), int64(Cb.DType.Size())
	c := int64(m) * int64(n) * cb * int64(batch)
	read := (int64(m)*int64(k) + int64(k)*int64(n)) * ab * int64(batch)
	if beta != 0 {
		read += c
	}
	if d.counted("gemm "+A.DType.String()+"·"+B.DType.String()+"→"+Cb.DType.String(), read, c); d.tr.dry {
		return
	}
	d.batchedProduct(ta, tb, m, n, k, A, lda, sa, B, ldb, sb, beta, Cb, ldc, sc, batch)
}

// gemmScratchValues bounds the fp32 scratch of gemmIntoBF16 (64 MiB): a
// larger product runs in pieces of whole products, or of columns of one. A
// variable so that a test can take the pieces with small products.
var gemmScratchValues = 1 << 24

// gemmIntoBF16 is gemmBatched's fp32 products into a bf16 C: each product into
// fp32 scratch (β = 0), then gemm_epilogue_bf16 adds C in fp32 (β·C) and
// rounds once, as cuBLASLt's epilogue does for a bf16 C beside bf16 operands.
// The scratch holds at most gemmScratchValues values (one column at least):
// the products are taken a few at a time, and a product larger than that a
// few of its columns at a time (a column's sums are whole in either case).
func (d *Device) gemmIntoBF16(ta, tb bool, m, n, k int, A Buffer, lda, sa int, B Buffer, ldb, sb int, beta float32, Cb Buffer, ldc, sc, batch int) {
	piece := func(b0, nb, j0, cols int) {
		// B's column j0 starts at j0·ldb (j0 with tb: op(B) reads Bᵀ's rows),
		// C's at j0·ldc.
		bOff := j0 * ldb
		if tb {
			bOff = j0
		}
		a := A.Slice(b0*sa, A.N)
		bb := B.Slice(b0*sb+bOff, B.N)
		c := Cb.Slice(b0*sc+j0*ldc, b0*sc+j0*ldc+(nb-1)*sc+(cols-1)*ldc+m)
		s := d.scratch(scratchGemm, nb*m*cols)
		d.gemmBatched(ta, tb, m, cols, k, a, lda, sa, bb, ldb, sb, 0, s, m, m*cols, nb)
		d.launch("gemm_epilogue_bf16", d.grid(nb*m*cols), 1, threads, d.acc(c, beta != 0), d.rd(s), i32(m), i32(cols), i64(ldc), i64(sc), i32(nb), f32(float64(beta)))
	}
	if per := gemmScratchValues / (m * n); per >= 1 {
		for b0 := 0; b0 < batch; b0 += per {
			piece(b0, min(per, batch-b0), 0, n)
		}
		return
	}
	// Pieces of a multiple of 64 columns (where the product has that many),
	// so that every piece's operands start 256-byte aligned when the whole's
	// do: cuBLASLt's fastest algorithms ask it.
	cols := max(gemmScratchValues/m, 1)
	if cols >= 64 {
		cols &^= 63
	}
	for b0 := 0; b0 < batch; b0++ {
		for j0 := 0; j0 < n; j0 += cols {
			piece(b0, 1, j0, min(cols, n-j0))
		}
	}
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

// attnTail is the attention kernels' trailing arguments: the shape, then the
// block masks (the document starts, null for none, and the chunk).
func (d *Device) attnTail(s AttentionShape, starts Buffer) []arg {
	return []arg{i32(s.Tq), i32(s.Tk), i32(s.NH), i32(s.NKV), i32(s.QOff), i32(s.KOff), flag(s.Causal), f32(1 / math.Sqrt(float64(s.HD))),
		d.rd(starts), i32(s.Chunk)}
}

// maskCheck checks the block masks: starts (int32, one per query: B·Tq; the
// null Buffer for none) and the chunk need a causal mask, and s.Starts, a
// tensor.Buffer, is the engine's to resolve (the Masked methods take starts).
func (d *Device) maskCheck(what string, s AttentionShape, starts Buffer) bool {
	switch {
	case s.Starts.Len() > 0:
		d.fail(what, fmt.Errorf("the shape's Starts is a tensor.Buffer: pass the document starts as a device buffer (FlashAttentionMasked)"))
	case s.Chunk < 0:
		d.fail(what, fmt.Errorf("chunk %d (0: none)", s.Chunk))
	case (starts.N > 0 || s.Chunk > 0) && !s.Causal:
		d.fail(what, fmt.Errorf("chunks and document starts narrow a causal mask, and the shape is not causal"))
	case starts.N > 0 && (starts.DType != I32 || starts.N != s.B*s.Tq):
		d.fail(what, fmt.Errorf("document starts of %d %s values for %d queries (B·Tq int32)", starts.N, starts.DType, s.B*s.Tq))
	default:
		return true
	}
	return false
}

// FlashAttention (fp32 on the SIMT cores, bf16 on tensor cores): o = softmax(q·kᵀ/√HD, masked)·v, saving lse (B,NH,Tq fp32) only.
// The mask is causal (s.Causal), within chunks of s.Chunk positions (when above 0).
func (d *Device) FlashAttention(o, lse, q, k, v Buffer, s AttentionShape) {
	d.FlashAttentionMasked(o, lse, q, k, v, Buffer{}, s)
}

// FlashAttentionMasked is FlashAttention with each query's document start
// (starts, int32 (B,Tq), global positions: tensor.AttentionShape.Starts; the
// null Buffer for none).
func (d *Device) FlashAttentionMasked(o, lse, q, k, v, starts Buffer, s AttentionShape) {
	if !d.attnCheck("flash attention", s, o, q, k, v) || !d.need("flash attention", lse, F32, s.B*s.NH*s.Tq) || !d.maskCheck("flash attention", s, starts) {
		return
	}
	if q.DType == BF16 && Emulated && !d.tr.dry {
		w, ow := d.emuFlashOperands(q, k, v), d.scratch(scratchEmuFlash+3, o.N)
		d.FlashAttentionMasked(ow, lse, w[0], w[1], w[2], starts, s)
		d.Cast(o, ow)
		return
	}
	args := append([]arg{d.wr(o), d.wr(lse), d.rd(q), d.rd(k), d.rd(v)}, d.attnTail(s, starts)...)
	if q.DType == BF16 {
		d.launch(fmt.Sprintf("flash_fwd_tc_%d", s.HD), (s.Tq+flashTCRows-1)/flashTCRows, s.B*s.NH, 128, args...)
		return
	}
	d.launch(fmt.Sprintf("flash_fwd_f32_%d", s.HD), (s.Tq+flashRows-1)/flashRows, s.B*s.NH, 128, args...)
}

// FlashAttentionBackward: dq, dk, dv (overwritten, or added to when accumulate)
// from dout, the saved o and lse, recomputing the probabilities tile by tile.
func (d *Device) FlashAttentionBackward(dq, dk, dv, dout, o, lse, q, k, v Buffer, s AttentionShape, accumulate bool) {
	d.FlashAttentionBackwardMasked(dq, dk, dv, dout, o, lse, q, k, v, Buffer{}, s, accumulate)
}

// FlashAttentionBackwardMasked is FlashAttentionBackward with the forward's
// document starts (FlashAttentionMasked).
func (d *Device) FlashAttentionBackwardMasked(dq, dk, dv, dout, o, lse, q, k, v, starts Buffer, s AttentionShape, accumulate bool) {
	if !d.attnCheck("flash attention backward", s, dq, dk, dv, dout, o, q, k, v) || !d.maskCheck("flash attention backward", s, starts) {
		return
	}
	if q.DType == BF16 && Emulated && !d.tr.dry {
		in := []Buffer{dout, o, q, k, v}
		if accumulate { // the gradients' values are added to: widened too
			in = append(in, dq, dk, dv)
		}
		w := d.emuFlashOperands(in...)
		if !accumulate {
			w = append(w, d.scratch(scratchEmuFlash+5, dq.N), d.scratch(scratchEmuFlash+6, dk.N), d.scratch(scratchEmuFlash+7, dv.N))
		}
		d.FlashAttentionBackwardMasked(w[5], w[6], w[7], w[0], w[1], lse, w[2], w[3], w[4], starts, s, accumulate)
		d.Cast(dq, w[5])
		d.Cast(dk, w[6])
		d.Cast(dv, w[7])
		return
	}
	sfx := suffix(q.DType)
	D := d.scratch(scratchDelta, s.B*s.NH*s.Tq)
	rows := s.B * s.Tq * s.NH
	d.launch("flash_delta"+sfx, (rows*32+threads-1)/threads, 1, threads, d.wr(D), d.rd(o), d.rd(dout), i32(s.B), i32(s.Tq), i32(s.NH), i32(s.HD))
	// Each launch's arguments are made just before it, so that each counts its
	// own operands (traffic.go).
	dqArgs := func() []arg {
		return append(append([]arg{d.acc(dq, accumulate), d.rd(dout), d.rd(lse), d.rd(D), d.rd(q), d.rd(k), d.rd(v)}, d.attnTail(s, starts)...), flag(accumulate))
	}
	kvArgs := func() []arg {
		return append(append([]arg{d.acc(dk, accumulate), d.acc(dv, accumulate), d.rd(dout), d.rd(lse), d.rd(D), d.rd(q), d.rd(k), d.rd(v)}, d.attnTail(s, starts)...), flag(accumulate))
	}
	if q.DType == BF16 {
		d.launch(fmt.Sprintf("flash_bwd_dq_tc_%d", s.HD), (s.Tq+flashTCRows-1)/flashTCRows, s.B*s.NH, 128, dqArgs()...)
		d.launch(fmt.Sprintf("flash_bwd_dkdv_tc_%d", s.HD), (s.Tk+flashTCRows-1)/flashTCRows, s.B*s.NKV, 128, kvArgs()...)
		return
	}
	d.launch(fmt.Sprintf("flash_bwd_dq_f32_%d", s.HD), (s.Tq+flashRows-1)/flashRows, s.B*s.NH, 128, dqArgs()...)
	d.launch(fmt.Sprintf("flash_bwd_dkdv_f32_%d", s.HD), (s.Tk+flashKeys-1)/flashKeys, s.B*s.NKV, 128, kvArgs()...)
}

// scratchEmuFlash is the first of the eight scratch slots of the host
// emulator's bf16 flash attention (after the engine's own, engine.go).
const scratchEmuFlash = scratchRouterDS + 1

// emuFlashOperands widens bf16 attention operands into fp32 scratch slots
// (scratchEmuFlash, in order), for the host emulator, which has no
// tensor-core kernels: it runs bf16 flash attention as the fp32 kernels over
// the widened operands and rounds their outputs to bf16. Its numerics are
// close to the tensor cores', not the same: the tensor-core kernels round
// each tile's probabilities (and in backward their gradients) to bf16 before
// the products with v (and k, q), where the fp32 kernels keep them in fp32.
// A dry run counts the tensor-core kernels, as a GPU runs them.
func (d *Device) emuFlashOperands(bufs ...Buffer) []Buffer {
	out := make([]Buffer, len(bufs))
	for i, b := range bufs {
		out[i] = d.scratch(scratchEmuFlash+i, b.N)
		d.Cast(out[i], b)
	}
	return out
}
