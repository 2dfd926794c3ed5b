//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"math"

	"github.com/shardline/shardline/tensor"
)

// Kernels is the engine's kernel set (tensor.Backend) on a device: the model
// and the FSDP runtime, written against tensor.Kernels and tensor.Memory, run on
// the GPU with it and the device's Memory. Every operand is a buffer of one
// Memory of the device (NewMemory), whose stream the work is issued on; calls
// may come from any goroutine: each runs on the device's goroutine (at once
// when called there, through Device.Do otherwise), so the trainer's ranks and
// its overlap goroutines drive the device as they drive the CPU. A kernel handed a buffer of
// another memory, of the wrong dtype or too short keeps the failure in the
// memory's sticky error and does nothing, as the CPU's kernels do.
//
// Activations and activation gradients are fp32 (the engine's F) or bf16:
// the kernel set declares tensor.BF16Storage, so a bf16 run's model hands the
// dense layers' kernels bf16 activations and gradients throughout
// (trainer/model's native bf16, docs/engine.md), with statistics (reciprocal
// RMS, log-sum-exps, losses) fp32. Parameter gradients are fp32, or bf16 in a
// run that reduces them in bf16 (tensor.Kernels' contract): a kernel adds
// into a bf16 one in fp32 and rounds each element once per call (a product
// through cuBLASLt's bf16 C with β = 1, or an fp32 product's epilogue,
// Device.gemmBatched; the embedding's rows summed along chains of their
// tokens; the norm's partial sums reduced first). A kernel's
// activation operands are of one dtype, fp32 or bf16; weights and the
// products' inputs may be bf16 beside fp32 activations. A product with a bf16
// weight rounds an fp32 operand to bf16 and runs on the tensor cores, as the
// CPU's dot-product path does; a bf16 input to an fp32 weight is widened
// (exact), as the CPU widens it. A weight gradient's product runs in its
// output gradient's dtype: bf16 (tensor cores) when the gradient is bf16,
// with an fp32 input rounded; fp32 otherwise, with a bf16 input widened. Norm
// weights are widened before an fp32 norm and rounded before a bf16 one.
// FP8 operands of the products are dequantised into fp32 scratch, the first
// operand times its product's scale inverses, read on the device (fp8.go).
//
// The mixture-of-experts kernels run on the device's routing kernels
// (Device.Router, Dispatch, Combine and the last two's backward), whose ranks and
// counts live in device scratch; the experts' products read the segments'
// offsets back once per call (counted), since cuBLASLt takes each product's
// rows from the host. tensor/kerneltest is the check every kernel here
// passes on a GPU (TestKernelConformance in bin/cuda.test).
type Kernels struct{ k kernels }

// kernels is Kernels' implementation, whose methods run on the device's
// goroutine (Kernels' methods take them there).
type kernels struct{ d *Device }

var (
	_ tensor.Backend     = (*Kernels)(nil)
	_ tensor.BF16Storage = (*Kernels)(nil)
)

// ComputesInBF16 is true: the dense layers' kernels take bf16 activations and
// activation gradients (tensor.BF16Storage).
func (k *Kernels) ComputesInBF16() bool { return true }

// Kernels is the device's kernel set for the engine.
func (d *Device) Kernels() *Kernels { return &Kernels{k: kernels{d: d}} }

// Name names the device and its libraries.
func (k *kernels) Name() string { return "cuda (" + k.d.info.String() + ")" }

// NewMemory is a new memory of the device (one per rank).
func (k *kernels) NewMemory() tensor.Memory { return k.d.NewMemory() }

// Scratch slots of the engine's kernels (after the Device's own).
const (
	scratchOperand    = iota + scratchGemm + 1 // an operand converted for a product or a norm
	scratchLSE                                 // the loss's log-sum-exp per row
	scratchSum64                               // f64 partial sums
	scratchRank                                // MoE: each copy's rank within its expert
	scratchCounts                              // MoE: each expert's kept copies
	scratchTok                                 // MoE: the padded layout's row tokens
	scratchMoEUnused                           // MoE: stand-ins for fields a call does not read
	scratchPadOffsets                          // MoE: the padded layout's static segments
	scratchRouterDS                            // MoE: router_general_backward's score gradients
	scratchEmbedLink                           // EmbeddingBackward into bf16: each token's next of its row
	scratchEmbedLast                           // EmbeddingBackward into bf16: each row's first token
)

// routerMaxGroups is router_general's bound on a router's groups (its
// ROUTER_MAXG: a thread keeps each group's score).
const routerMaxGroups = 64

// plainRouter reports whether s and r route as moe_router does: softmax,
// renormalised, unscaled, no bias, no groups.
func plainRouter(r tensor.Routing, s tensor.MoEShape) bool {
	return (s.Router == tensor.RouterSpec{} || s.Router == tensor.RouterSpec{Scale: 1}) && r.Bias.Len() == 0
}

// as is b's memory seen as n values of t (a scratch slot holds fp32; the bf16
// and f64 views of it are the same bytes).
func as(b Buffer, t DType, n int) Buffer { return Buffer{ptr: b.ptr, N: n, DType: t} }

// operands resolves one kernel call's buffers to device buffers of one memory:
// the memory of the first buffer it is given; bad is set (with the failure
// kept) as soon as one buffer is not that memory's, or not as the kernel
// reads it.
type operands struct {
	k   *kernels
	op  string
	mem *Memory
	bad bool
}

func (k *kernels) ops(op string) operands { return operands{k: k, op: op} }

// failf keeps a failure of the call: in its memory, or on the device when no
// buffer of this device's was given.
func (o *operands) failf(format string, args ...any) {
	o.bad = true
	err := fmt.Errorf("cuda: %s: "+format, append([]any{o.op}, args...)...)
	if o.mem != nil {
		o.mem.fail(err)
		return
	}
	if o.k.d.err == nil {
		o.k.d.err = err
	}
}

// buf is b on the device, of one of the dtypes ts and at least n values.
func (o *operands) buf(b tensor.Buffer, n int, ts ...DType) Buffer {
	if o.bad {
		return Buffer{}
	}
	if o.mem == nil {
		s, ok := b.Storage().(*storage)
		if !ok || s.mem.d != o.k.d {
			backend := "none (the empty buffer)"
			if b.Storage() != nil {
				backend = b.Storage().Backend()
			}
			o.failf("a buffer of %d %s that is not this device's (its backend: %s)", b.Len(), b.DType(), backend)
			return Buffer{}
		}
		o.mem = s.mem
	}
	d, ok := o.mem.Device(o.op, b)
	if !ok {
		o.bad = true
		return Buffer{}
	}
	want := false
	for _, t := range ts {
		want = want || d.DType == t
	}
	switch {
	case !want:
		o.failf("a %s buffer where the kernel reads %v", d.DType, ts)
	case d.N < n:
		o.failf("a buffer of %d %s values where the kernel reads %d", d.N, d.DType, n)
	default:
		return d.Slice(0, n)
	}
	return Buffer{}
}

// f is an fp32 buffer of n values; w an fp32 or bf16 one (a weight, a
// product's input, an activation or activation gradient, or a parameter
// gradient); i an int32 one;
// st an f64 one. as is one of n values in x's dtype (a kernel's activations
// are of one dtype).
func (o *operands) f(b tensor.Buffer, n int) Buffer { return o.buf(b, n, F32) }
func (o *operands) w(b tensor.Buffer, n int) Buffer { return o.buf(b, n, F32, BF16) }
func (o *operands) as(b tensor.Buffer, n int, x Buffer) Buffer {
	if o.bad {
		return Buffer{}
	}
	return o.buf(b, n, x.DType)
}
func (o *operands) i(b tensor.Buffer, n int) Buffer  { return o.buf(b, n, I32) }
func (o *operands) st(b tensor.Buffer, n int) Buffer { return o.buf(b, n, F64) }

// compute is an optimizer's optional bf16 output of exactly n values: the null
// buffer for the empty Buffer.
func (o *operands) compute(b tensor.Buffer, n int) Buffer {
	if b.Len() == 0 {
		return Buffer{}
	}
	if b.Len() != n && !o.bad {
		o.failf("a compute copy of %d values for %d parameters", b.Len(), n)
	}
	return o.buf(b, n, BF16)
}

// ok reports whether the call may run: every operand resolved and the memory
// (with the device's stream) free of failures.
func (o *operands) ok() bool { return !o.bad && o.mem != nil && o.mem.ok() }

// widened is x as fp32 (itself, or widened into scratch slot).
func (k *kernels) widened(x Buffer, slot int) Buffer {
	if x.DType == F32 {
		return x
	}
	s := k.d.scratch(slot, x.N)
	k.d.Cast(s, x)
	return s
}

// rounded is x as bf16 (itself, or rounded into scratch slot).
func (k *kernels) rounded(x Buffer, slot int) Buffer {
	if x.DType == BF16 {
		return x
	}
	s := as(k.d.scratch(slot, (x.N+1)/2), BF16, x.N)
	k.d.Cast(s, x)
	return s
}

// pair is a product's operand x and weight w in one dtype: as they are when
// they agree; with a bf16 weight, x rounded to bf16 (the tensor-core path, as
// the CPU's dot-product path rounds it); with an fp32 weight, a bf16 x widened
// (exact, as the CPU widens it).
func (k *kernels) pair(x, w Buffer) (Buffer, Buffer) {
	switch {
	case x.DType == w.DType:
		return x, w
	case w.DType == BF16:
		return k.rounded(x, scratchOperand), w
	default:
		return k.widened(x, scratchOperand), w
	}
}

// like is x in t: itself, rounded or widened into scratch slot (a norm's
// weight beside its activations, a weight gradient's input beside its output
// gradient).
func (k *kernels) like(x Buffer, t DType, slot int) Buffer {
	if t == BF16 {
		return k.rounded(x, slot)
	}
	return k.widened(x, slot)
}

func (k *kernels) Matmul(out, inp, weight tensor.Buffer, s tensor.MatmulShape, accumulate bool) {
	if fp8Product(s, inp, weight) {
		k.matmulFP8(out, inp, weight, s, accumulate)
		return
	}
	o := k.ops("Matmul")
	y, x, w := o.w(out, s.BT*s.OC), o.w(inp, s.BT*s.C), o.w(weight, s.OC*s.C)
	if o.ok() {
		x, w = k.pair(x, w)
		k.d.Matmul(y, x, w, s, accumulate)
	}
}

func (k *kernels) MatmulBackward(dinp, dweight, dout, inp, weight tensor.Buffer, s tensor.MatmulShape, accumulate bool) {
	if fp8Product(s, dout, inp, weight) {
		k.matmulBackwardFP8(dinp, dweight, dout, inp, weight, s, accumulate)
		return
	}
	o := k.ops("MatmulBackward")
	dy, w := o.w(dout, s.BT*s.OC), o.w(weight, s.OC*s.C)
	var dx, dw, x Buffer
	if dinp.Len() > 0 {
		dx = o.as(dinp, s.BT*s.C, dy)
	}
	if dweight.Len() > 0 { // none: the input gradient alone, inp unread
		dw, x = o.w(dweight, s.OC*s.C), o.w(inp, s.BT*s.C)
	}
	if !o.ok() {
		return
	}
	if dx.N > 0 {
		g, wt := k.pair(dy, w)
		k.d.gemm(false, false, s.C, s.BT, s.OC, wt, s.C, g, s.OC, beta(accumulate), dx, s.C)
	}
	if dw.N > 0 {
		k.d.gemm(false, true, s.C, s.OC, s.BT, k.like(x, dy.DType, scratchOperand), s.C, dy, s.OC, 1, dw, s.C)
	}
}

func (k *kernels) Embedding(out, tokens, wte tensor.Buffer, s tensor.EmbeddingShape) {
	o := k.ops("Embedding")
	y, t, w := o.w(out, s.BT*s.C), o.i(tokens, s.BT), o.w(wte, s.N*s.C)
	if !o.ok() {
		return
	}
	name := "embedding_range" + suffix(w.DType)
	if y.DType == BF16 {
		// bf16 rows: from a bf16 table (embedding_range_bf16_bf16), an fp32
		// one rounded first.
		w, name = k.rounded(w, scratchOperand), "embedding_range_bf16_bf16"
	}
	k.d.launch(name, k.d.grid(s.BT*s.C), 1, threads, k.d.wr(y), k.d.rd(t), k.d.rd(w), i32(s.BT), i32(s.C), i32(s.Lo), i32(s.N))
}

// embeddingClasses is the row classes of EmbeddingBackward (gridDim.y of
// embedding_backward_classes): each class's blocks walk every token.
const embeddingClasses = 64

// embeddingLinkClasses is EMB_LINK_CLASSES in kernels.cu: the threads of
// embedding_backward_links, each owning the table rows of one residue.
const embeddingLinkClasses = 1024

// EmbeddingBackward adds dout's rows into the table rows their tokens pick.
// Into an fp32 table, embedding_backward_classes adds each token in token
// order; into a bf16 one each row's tokens are summed in fp32 first, so that
// the row is rounded once: embedding_backward_links chains each row's tokens
// (in scratch: a link per token, a first token per row) and
// embedding_backward_chains sums each chain into its row.
func (k *kernels) EmbeddingBackward(dwte, dout, tokens tensor.Buffer, s tensor.EmbeddingShape) {
	o := k.ops("EmbeddingBackward")
	dw, dy, t := o.w(dwte, s.N*s.C), o.w(dout, s.BT*s.C), o.i(tokens, s.BT)
	if o.ok() && s.BT > 0 && dw.DType == BF16 {
		if s.N > 0 && s.C > 0 {
			link := as(k.d.scratch(scratchEmbedLink, s.BT), I32, s.BT)
			last := as(k.d.scratch(scratchEmbedLast, s.N), I32, s.N)
			k.d.launch("embedding_backward_links", embeddingLinkClasses/threads, 1, threads, k.d.wr(link), k.d.rw(last), k.d.rd(t), i32(s.BT), i32(s.Lo), i32(s.N))
			k.d.launch("embedding_backward_chains_bf16"+suffix(dy.DType), k.d.grid(s.BT*s.C), 1, threads, k.d.rw(dw), k.d.rd(dy), k.d.rd(t), k.d.rd(link), k.d.rd(last),
				i32(s.BT), i32(s.C), i32(s.Lo), i32(s.N))
		}
		return
	}
	if o.ok() && s.BT > 0 {
		name := "embedding_backward_classes"
		if dy.DType == BF16 {
			name += "_bf16"
		}
		k.d.launch(name, (s.C+127)/128, min(embeddingClasses, max(s.N, 1)), 128, k.d.rw(dw), k.d.rd(dy), k.d.rd(t), i32(s.BT), i32(s.C), i32(s.Lo), i32(s.N))
	}
}

func (k *kernels) RMSNorm(out, rstd, inp, weight tensor.Buffer, BT, C int, eps float64) {
	o := k.ops("RMSNorm")
	x := o.w(inp, BT*C)
	y, r, w := o.as(out, BT*C, x), o.f(rstd, BT), o.w(weight, C)
	if o.ok() {
		k.d.RMSNorm(y, r, x, k.like(w, x.DType, scratchOperand), BT, C, eps)
	}
}

func (k *kernels) RMSNormBackward(dinp, dweight, dout, inp, weight, rstd tensor.Buffer, BT, C int, accumulate bool) {
	o := k.ops("RMSNormBackward")
	x := o.w(inp, BT*C)
	dx, dw, dy, w, r := o.as(dinp, BT*C, x), o.w(dweight, C), o.as(dout, BT*C, x), o.w(weight, C), o.f(rstd, BT)
	if o.ok() {
		k.d.RMSNormBackward(dx, dw, dy, x, k.like(w, x.DType, scratchOperand), r, BT, C, accumulate)
	}
}

func (k *kernels) RopeTables(cos, sin tensor.Buffer, T int, inv []float64) {
	o := k.ops("RopeTables")
	c, s := o.f(cos, T*len(inv)), o.f(sin, T*len(inv))
	if o.ok() {
		k.d.RopeTables(c, s, T, inv)
	}
}

func (k *kernels) rope(op string, x, cos, sin tensor.Buffer, s tensor.RopeShape, backward bool) {
	o := k.ops(op)
	xs, c, sn := o.w(x, s.B*s.T*s.NH*s.HD), o.f(cos, s.T*s.HD/2), o.f(sin, s.T*s.HD/2)
	if o.ok() {
		k.d.Rope(xs, c, sn, s, backward)
	}
}

func (k *kernels) Rope(x, cos, sin tensor.Buffer, s tensor.RopeShape) {
	k.rope("Rope", x, cos, sin, s, false)
}

func (k *kernels) RopeBackward(dx, cos, sin tensor.Buffer, s tensor.RopeShape) {
	k.rope("RopeBackward", dx, cos, sin, s, true)
}

// attention resolves attention's operands: q-shaped and kv-shaped buffers of
// one dtype, fp32 or bf16 (the first's), and lse-shaped ones, fp32.
func (o *operands) attention(s tensor.AttentionShape, q, kv, lse []tensor.Buffer) (qs, kvs, lses []Buffer) {
	nq, nkv, nl := s.B*s.Tq*s.NH*s.HD, s.B*s.Tk*s.NKV*s.HD, s.B*s.NH*s.Tq
	first := o.w(q[0], nq)
	for _, b := range q {
		qs = append(qs, o.as(b, nq, first))
	}
	for _, b := range kv {
		kvs = append(kvs, o.as(b, nkv, first))
	}
	for _, b := range lse {
		lses = append(lses, o.f(b, nl))
	}
	return qs, kvs, lses
}

// starts resolves an attention's document starts (s.Starts: int32, one per
// query; the null Buffer for none) and returns the shape without them, as the
// device's Masked kernels take it.
func (o *operands) starts(s tensor.AttentionShape) (Buffer, tensor.AttentionShape) {
	var b Buffer
	if s.Starts.Len() > 0 {
		b = o.i(s.Starts, s.B*s.Tq)
	}
	s.Starts = tensor.Buffer{}
	return b, s
}

func (k *kernels) FlashAttention(out, lse, q, kb, v tensor.Buffer, s tensor.AttentionShape) {
	o := k.ops("FlashAttention")
	qs, kvs, l := o.attention(s, []tensor.Buffer{out, q}, []tensor.Buffer{kb, v}, []tensor.Buffer{lse})
	st, s := o.starts(s)
	if o.ok() {
		k.d.FlashAttentionMasked(qs[0], l[0], qs[1], kvs[0], kvs[1], st, s)
	}
}

func (k *kernels) FlashAttentionBackward(dq, dk, dv, dout, out, lse, q, kb, v tensor.Buffer, s tensor.AttentionShape, accumulate bool) {
	o := k.ops("FlashAttentionBackward")
	qs, kvs, l := o.attention(s, []tensor.Buffer{dq, dout, out, q}, []tensor.Buffer{dk, dv, kb, v}, []tensor.Buffer{lse})
	st, s := o.starts(s)
	if o.ok() {
		k.d.FlashAttentionBackwardMasked(qs[0], kvs[0], kvs[1], qs[1], qs[2], l[0], qs[3], kvs[2], kvs[3], st, s, accumulate)
	}
}

func (k *kernels) MergeAttention(out, lse, outB, lseB tensor.Buffer, s tensor.AttentionShape) {
	o := k.ops("MergeAttention")
	qs, _, l := o.attention(s, []tensor.Buffer{out, outB}, nil, []tensor.Buffer{lse, lseB})
	if !o.bad && qs[0].DType != F32 {
		o.failf("a %s buffer where the kernel reads f32 (ring attention runs in fp32)", qs[0].DType)
	}
	if o.ok() {
		rows := s.B * s.NH * s.Tq
		k.d.launch("merge_attention", k.d.grid(rows), 1, threads, k.d.rw(qs[0]), k.d.rw(l[0]), k.d.rd(qs[1]), k.d.rd(l[1]), i32(s.B), i32(s.Tq), i32(s.NH), i32(s.HD))
	}
}

func (k *kernels) SwiGLU(out, gate, up tensor.Buffer, n int) {
	o := k.ops("SwiGLU")
	y := o.w(out, n)
	g, u := o.as(gate, n, y), o.as(up, n, y)
	if o.ok() {
		k.d.SwiGLU(y, g, u)
	}
}

func (k *kernels) SwiGLUBackward(dgate, dup, dout, gate, up tensor.Buffer, n int, accumulate bool) {
	o := k.ops("SwiGLUBackward")
	dy := o.w(dout, n)
	dg, du, g, u := o.as(dgate, n, dy), o.as(dup, n, dy), o.as(gate, n, dy), o.as(up, n, dy)
	if o.ok() {
		k.d.SwiGLUBackward(dg, du, dy, g, u, accumulate)
	}
}

func (k *kernels) CrossEntropy(losses, probs, logits, targets tensor.Buffer, s tensor.VocabShape) {
	o := k.ops("CrossEntropy")
	l, p, z, t := o.f(losses, s.BT), o.f(probs, s.BT*s.V), o.f(logits, s.BT*s.V), o.i(targets, s.BT)
	if o.ok() {
		lse := k.d.scratch(scratchLSE, s.BT)
		k.d.CrossEntropy(l, lse, z, t, s.BT, s.V)
		k.d.launch("softmax_from_lse", k.d.grid(s.BT*s.V), 1, threads, k.d.wr(p), k.d.rd(z), k.d.rd(lse), i32(s.BT), i32(s.V))
	}
}

// HeadWork is one chunk's fp32 logits and their gradient (the products'
// operand dtype, at most fp32) after them. It is counted in fp32 values
// whatever the activations' dtype: the logits are fp32.
func (k *kernels) HeadWork(s tensor.HeadShape) int { return 2 * s.Rows * s.V }

// HeadLoss runs Device.HeadCrossEntropyTrain (the logits, loss and gradient of
// a chunk of rows in one pass) over x and w in one dtype (pair), or, for the
// loss alone, a product and the cross-entropy kernel per chunk.
func (k *kernels) HeadLoss(losses, dx, dw, work, x, w, targets, dloss tensor.Buffer, s tensor.HeadShape) {
	o := k.ops("HeadLoss")
	n := s.Rows * s.V
	l, wk, xs, ws, t := o.f(losses, s.BT), o.f(work, 2*n), o.w(x, s.BT*s.C), o.w(w, s.V*s.C), o.i(targets, s.BT)
	train := dx.Len() > 0
	var dxs, dws, dl Buffer
	if train {
		// dx fp32 or bf16 (a bf16-native run's input gradient), whatever
		// the operands' dtype: the products write either.
		dxs, dws, dl = o.w(dx, s.BT*s.C), o.w(dw, s.V*s.C), o.f(dloss, s.BT)
	}
	if !o.ok() || s.BT == 0 {
		return
	}
	xs, ws = k.pair(xs, ws)
	lse := k.d.scratch(scratchLSE, s.BT)
	L := wk.Slice(0, n)
	if train {
		dL := as(wk.Slice(n, 2*n), xs.DType, n) // bf16 operands take a bf16 gradient: the work's second half holds it
		k.d.HeadCrossEntropyTrain(l, lse, dxs, dws, xs, ws, t, dl, HeadShape{BT: s.BT, C: s.C, V: s.V},
			HeadScratch{Logits: L, DLogits: dL}, false)
		return
	}
	for r0 := 0; r0 < s.BT; r0 += s.Rows {
		rows := min(s.Rows, s.BT-r0)
		z := L.Slice(0, rows*s.V)
		k.d.Matmul(z, xs.Slice(r0*s.C, (r0+rows)*s.C), ws, MatmulShape{BT: rows, C: s.C, OC: s.V}, false)
		k.d.CrossEntropy(l.Slice(r0, r0+rows), lse.Slice(r0, r0+rows), z, t.Slice(r0, r0+rows), rows, s.V)
	}
}

func (k *kernels) CrossEntropyParts(lse, tlogit, logits, targets tensor.Buffer, s tensor.VocabShape) {
	o := k.ops("CrossEntropyParts")
	l, tl, z, t := o.f(lse, s.BT), o.f(tlogit, s.BT), o.f(logits, s.BT*s.V), o.i(targets, s.BT)
	if o.ok() && s.BT > 0 {
		k.d.launch("ce_parts", s.BT, 1, threads, k.d.wr(l), k.d.wr(tl), k.d.rd(z), k.d.rd(t), i32(s.V), i32(s.Lo))
	}
}

func (k *kernels) CrossEntropyCombine(losses, probs, logits, lseAll, tlogit, targets tensor.Buffer, s tensor.VocabShape) {
	o := k.ops("CrossEntropyCombine")
	l, p, z := o.f(losses, s.BT), o.f(probs, s.BT*s.V), o.f(logits, s.BT*s.V)
	la, tl, t := o.f(lseAll, s.Parts*s.BT), o.f(tlogit, s.BT), o.i(targets, s.BT)
	if o.ok() && s.BT > 0 {
		k.d.launch("ce_combine", s.BT, 1, threads, k.d.wr(l), k.d.wr(p), k.d.rd(z), k.d.rd(la), k.d.rd(tl), k.d.rd(t), i32(s.BT), i32(s.V), i32(s.Parts))
	}
}

func (k *kernels) CrossEntropyBackward(dlogits, dloss, probs, targets tensor.Buffer, s tensor.VocabShape) {
	o := k.ops("CrossEntropyBackward")
	dz, dl, p, t := o.f(dlogits, s.BT*s.V), o.f(dloss, s.BT), o.f(probs, s.BT*s.V), o.i(targets, s.BT)
	if o.ok() {
		k.d.launch("ce_backward_probs", k.d.grid(s.BT*s.V), 1, threads, k.d.wr(dz), k.d.rd(dl), k.d.rd(p), k.d.rd(t), i32(s.BT), i32(s.V), i32(s.Lo))
	}
}

func (k *kernels) Add(out, a, b tensor.Buffer, n int) {
	o := k.ops("Add")
	y := o.w(out, n)
	x1, x2 := o.as(a, n, y), o.as(b, n, y)
	if o.ok() {
		k.d.Add(y, x1, x2)
	}
}

// AddInto adds src into dst, each fp32 or bf16: in fp32, a bf16 dst's sums
// rounded.
func (k *kernels) AddInto(dst, src tensor.Buffer, n int) {
	o := k.ops("AddInto")
	y, x := o.w(dst, n), o.w(src, n)
	switch {
	case !o.ok():
	case x.DType == y.DType:
		k.d.AddInto(y, x)
	case y.DType == F32:
		k.d.launch("add_into_f32_bf16", k.d.grid(n), 1, threads, k.d.rw(y), k.d.rd(x), i64(n))
	default:
		k.d.launch("add_into_bf16_f32", k.d.grid(n), 1, threads, k.d.rw(y), k.d.rd(x), i64(n))
	}
}

// moeRouting is a routing's buffers as the device's MoE kernels take them,
// with device scratch for the copies' ranks and the experts' counts, and for
// the padded layout's row tokens (which tensor.Routing leaves unwritten).
func (k *kernels) moeRouting(o *operands, r tensor.Routing, s tensor.MoEShape, probs, gates tensor.Buffer) MoERouting {
	n := s.BT * s.K
	mr := MoERouting{Idx: o.i(r.Idx, n), Row: o.i(r.Row, n), Offsets: o.i(r.Offsets, s.E+1)}
	if probs.Len() > 0 {
		mr.Probs = o.f(probs, s.BT*s.E)
	}
	if gates.Len() > 0 {
		mr.Gates = o.f(gates, n)
	}
	if o.bad {
		return mr
	}
	mr.Rank = as(k.d.scratch(scratchRank, n), I32, n)
	mr.Counts = as(k.d.scratch(scratchCounts, s.E), I32, s.E)
	if s.Padded {
		mr.Tok = as(k.d.scratch(scratchTok, s.Rows()), I32, s.Rows())
	} else {
		mr.Tok = o.i(r.Tok, s.Rows())
	}
	// The device kernels check every field: stand-ins of the right size for the
	// ones a call does not read.
	if mr.Probs.N == 0 || mr.Gates.N == 0 {
		unused := k.d.scratch(scratchMoEUnused, max(s.BT*s.E, n))
		if mr.Probs.N == 0 {
			mr.Probs = unused.Slice(0, s.BT*s.E)
		}
		if mr.Gates.N == 0 {
			mr.Gates = unused.Slice(0, n)
		}
	}
	return mr
}

func (k *kernels) Router(probs, gates, logits tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	o := k.ops("Router")
	z := o.f(logits, s.BT*s.E)
	if plainRouter(r, s) {
		if mr := k.moeRouting(&o, r, s, probs, gates); o.ok() {
			k.d.Router(mr, z, s)
		}
		return
	}
	spec := s.Router
	p, g, idx := o.f(probs, s.BT*s.E), o.f(gates, s.BT*s.K), o.i(r.Idx, s.BT*s.K)
	var bias Buffer
	if r.Bias.Len() > 0 {
		bias = o.f(r.Bias, s.E)
	}
	n := 0
	if spec.Groups > 0 {
		if spec.Groups > routerMaxGroups || spec.GroupK < 1 || spec.GroupK > spec.Groups || s.E%spec.Groups != 0 || s.K%spec.GroupK != 0 {
			o.failf("group-limited routing of %d experts in %d groups, %d kept, top %d: the device takes at most %d groups, a group count that divides the experts and a kept count that divides top_k",
				s.E, spec.Groups, spec.GroupK, s.K, routerMaxGroups)
		} else {
			n = s.K / spec.GroupK
		}
	}
	if o.ok() {
		k.d.launch("router_general", k.d.grid(s.BT), 1, threads, k.d.wr(p), k.d.wr(idx), k.d.wr(g), k.d.rd(z), k.d.rd(bias),
			i32(s.BT), i32(s.E), i32(s.K), flag(spec.Sigmoid), flag(spec.Raw), f32(spec.GateScale()), i32(spec.Groups), i32(spec.GroupK), i32(n))
	}
}

func (k *kernels) RouterBackward(dlogits, dgates, dprobs, gates, probs tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	o := k.ops("RouterBackward")
	dz, dg, g, p, idx := o.f(dlogits, s.BT*s.E), o.f(dgates, s.BT*s.K), o.f(gates, s.BT*s.K), o.f(probs, s.BT*s.E), o.i(r.Idx, s.BT*s.K)
	var dp Buffer
	if dprobs.Len() > 0 {
		dp = o.f(dprobs, s.BT*s.E)
	}
	if !o.ok() {
		return
	}
	if spec := s.Router; spec.Sigmoid || spec.Raw || spec.GateScale() != 1 {
		ds := k.d.scratch(scratchRouterDS, s.BT*s.E)
		k.d.launch("router_general_backward", k.d.grid(s.BT), 1, threads, k.d.rw(dz), k.d.wr(ds), k.d.rd(dg), k.d.rd(dp), k.d.rd(g), k.d.rd(p), k.d.rd(idx),
			i32(s.BT), i32(s.E), i32(s.K), flag(spec.Sigmoid), flag(spec.Raw), f32(spec.GateScale()), flag(dp.N > 0))
		return
	}
	k.d.launch("router_backward_add", k.d.grid(s.BT), 1, threads, k.d.rw(dz), k.d.rd(dg), k.d.rd(dp), k.d.rd(g), k.d.rd(p), k.d.rd(idx),
		i32(s.BT), i32(s.E), i32(s.K), flag(dp.N > 0))
}

func (k *kernels) ScaleCopies(xperm, gates tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	o := k.ops("ScaleCopies")
	n := s.BT * s.K
	xp, g, row := o.f(xperm, s.Rows()*s.C), o.f(gates, n), o.i(r.Row, n)
	if o.ok() {
		k.d.launch("scale_copies", k.d.grid(n*s.C), 1, threads, k.d.rw(xp), k.d.rd(g), k.d.rd(row), i32(n), i32(s.C))
	}
}

func (k *kernels) ScaleCopiesBackward(dgates, dxperm, x, gates tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	o := k.ops("ScaleCopiesBackward")
	n := s.BT * s.K
	dg, dxp, xs, g, row := o.f(dgates, n), o.f(dxperm, s.Rows()*s.C), o.f(x, s.BT*s.C), o.f(gates, n), o.i(r.Row, n)
	if o.ok() {
		k.d.launch("scale_copies_backward", (n*32+threads-1)/threads, 1, threads, k.d.wr(dg), k.d.rw(dxp), k.d.rd(xs), k.d.rd(g), k.d.rd(row), i32(n), i32(s.K), i32(s.C))
	}
}

func (k *kernels) ExpertBiasUpdate(bias, load tensor.Buffer, E, lo int, rate float64) {
	o := k.ops("ExpertBiasUpdate")
	n := bias.Len()
	b, l := o.f(bias, n), o.f(load, E)
	if lo < 0 || lo+n > E {
		o.failf("the biases of experts %d..%d of %d", lo, lo+n-1, E)
	}
	if o.ok() {
		k.d.launch("expert_bias_update", 1, 1, 1, k.d.rw(b), k.d.rd(l), i32(E), i32(lo), i32(n), f32(rate))
	}
}

func (k *kernels) Dispatch(xperm, x tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	o := k.ops("Dispatch")
	xp, xs := o.f(xperm, s.Rows()*s.C), o.f(x, s.BT*s.C)
	mr := k.moeRouting(&o, r, s, tensor.Buffer{}, tensor.Buffer{})
	if !o.ok() {
		return
	}
	if !s.Padded {
		k.d.Dispatch(xp, mr, xs, s)
		return
	}
	// Padded, the device places copies by the static segments (e·Capacity), and
	// the routing's offsets are then set to the kept copies' running counts, as
	// the CPU's are (RouterStats and AuxLoss read them).
	offsets := mr.Offsets
	mr.Offsets = as(k.d.scratch(scratchPadOffsets, s.E+1), I32, s.E+1)
	k.d.Dispatch(xp, mr, xs, s)
	k.d.launch("moe_offsets", 1, 1, 32, k.d.wr(offsets), k.d.rd(mr.Counts), i32(s.E), i32(s.Capacity), flag(false))
}

func (k *kernels) DispatchBackward(dx, dxperm tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	o := k.ops("DispatchBackward")
	d, dp := o.f(dx, s.BT*s.C), o.f(dxperm, s.Rows()*s.C)
	if mr := k.moeRouting(&o, r, s, tensor.Buffer{}, tensor.Buffer{}); o.ok() {
		k.d.DispatchBackward(d, dp, mr, s, true)
	}
}

func (k *kernels) Combine(out, y, gates tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	o := k.ops("Combine")
	d, ys := o.f(out, s.BT*s.C), o.f(y, s.Rows()*s.C)
	if mr := k.moeRouting(&o, r, s, tensor.Buffer{}, gates); o.ok() {
		k.d.Combine(d, ys, mr, s)
	}
}

func (k *kernels) CombineBackward(dy, dgates, dout, y, gates tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	o := k.ops("CombineBackward")
	dys, dg, do, ys := o.f(dy, s.Rows()*s.C), o.f(dgates, s.BT*s.K), o.f(dout, s.BT*s.C), o.f(y, s.Rows()*s.C)
	if mr := k.moeRouting(&o, r, s, tensor.Buffer{}, gates); o.ok() {
		if s.Padded {
			k.d.Zero(dys) // the experts' backward runs over whole segments
		}
		k.d.CombineBackward(dys, dg, do, ys, mr, s)
	}
}

// segments is where the experts' rows lie for ExpertsMatmul and its backward
// (s.Span): static segments (s.Segment) read nothing; otherwise the routing's
// offsets, an int32 buffer of experts+1, come back to the host (counted, a
// synchronisation), because cuBLASLt takes each product's rows from the host.
// ok is false after a failure, which o keeps.
func (k *kernels) segments(o *operands, offsets tensor.Buffer, s tensor.ExpertsShape, experts int) (off []int32, ok bool) {
	if s.Segment > 0 {
		return nil, o.ok()
	}
	o.i(offsets, experts+1)
	if !o.ok() {
		return nil, false
	}
	off = make([]int32, experts+1)
	o.mem.Read(off, offsets.Slice(0, experts+1))
	return off, o.mem.ok()
}

// strided is the experts' buffers bs (n values each) as one strided operand,
// when they lie in order at an even stride of at least n elements in the
// device's address space (as a layer's experts sit in their unit's buffer)
// and are of one dtype: the operand spans them all, and stride is in
// elements. ok is false otherwise, and for fewer than two buffers.
func (o *operands) strided(bs []tensor.Buffer, n int, ts ...DType) (all Buffer, stride int, ok bool) {
	if len(bs) < 2 || o.bad {
		return Buffer{}, 0, false
	}
	first := o.buf(bs[0], n, ts...)
	second := o.buf(bs[1], n, ts...)
	if o.bad || second.DType != first.DType || second.ptr <= first.ptr {
		return Buffer{}, 0, false
	}
	size := devicePtr(first.DType.Size())
	gap := second.ptr - first.ptr
	if gap%size != 0 || int(gap/size) < n {
		return Buffer{}, 0, false
	}
	for e, b := range bs[2:] {
		if x := o.buf(b, n, ts...); o.bad || x.DType != first.DType || x.ptr != first.ptr+devicePtr(e+2)*gap {
			return Buffer{}, 0, false
		}
	}
	stride = int(gap / size)
	return Buffer{ptr: first.ptr, N: (len(bs)-1)*stride + n, DType: first.DType}, stride, true
}

func (k *kernels) ExpertsMatmul(out, inp tensor.Buffer, w []tensor.Buffer, offsets tensor.Buffer, s tensor.ExpertsShape, accumulate bool) {
	o := k.ops("ExpertsMatmul")
	o.f(out, 0)
	fp8 := fp8Experts(&o, s, w, inp)
	if s.Segment > 0 && !fp8 {
		// Static segments over weights at an even stride: one batched product.
		if ws, stride, ok := o.strided(w, s.OC*s.C, F32, BF16); ok {
			rows := len(w) * s.Segment
			y, x := o.f(out, rows*s.OC), o.w(inp, rows*s.C)
			if o.ok() {
				x, ws = k.pair(x, ws)
				k.d.ExpertsMatmul(y, x, ws, ExpertsShape{E: len(w), Rows: s.Segment, C: s.C, OC: s.OC, WStride: stride}, accumulate)
			}
			return
		}
	}
	off, ok := k.segments(&o, offsets, s, len(w))
	if !ok {
		return
	}
	for e := range w {
		if lo, hi := s.Span(off, e); hi > lo {
			k.Matmul(out.Slice(lo*s.OC, hi*s.OC), inp.Slice(lo*s.C, hi*s.C), w[e], s.Expert(e, hi-lo), accumulate)
		}
	}
}

func (k *kernels) ExpertsMatmulBackward(dinp tensor.Buffer, dw []tensor.Buffer, dout, inp tensor.Buffer, w []tensor.Buffer, offsets tensor.Buffer, s tensor.ExpertsShape, accumulate bool) {
	o := k.ops("ExpertsMatmulBackward")
	fp8 := fp8Experts(&o, s, w, dout, inp)
	if fp8 {
		o.buf(dout, 0, F32, F8E4M3, F8E5M2) // each expert's product checks its operands and their scale inverses
	} else {
		o.f(dout, 0)
	}
	if len(dw) != len(w) && !o.bad {
		o.failf("%d weight gradients for %d experts", len(dw), len(w))
	}
	if s.Segment > 0 && !fp8 {
		ws, stride, wok := o.strided(w, s.OC*s.C, F32, BF16)
		gs, gstride, gok := o.strided(dw, s.OC*s.C, F32, BF16)
		if wok && gok && gstride == stride {
			rows := len(w) * s.Segment
			dy, x := o.f(dout, rows*s.OC), o.w(inp, rows*s.C)
			var dx Buffer
			if dinp.Len() > 0 {
				dx = o.f(dinp, rows*s.C)
			}
			if !o.ok() {
				return
			}
			E, R := len(w), s.Segment
			if dx.N > 0 {
				g, wt := k.pair(dy, ws)
				k.d.gemmBatched(false, false, s.C, R, s.OC, wt, s.C, stride, g, s.OC, R*s.OC, beta(accumulate), dx, s.C, R*s.C, E)
			}
			k.d.gemmBatched(false, true, s.C, s.OC, R, k.widened(x, scratchOperand), s.C, R*s.C, dy, s.OC, R*s.OC, 1, gs, s.C, stride, E)
			return
		}
	}
	off, ok := k.segments(&o, offsets, s, len(w))
	if !ok {
		return
	}
	for e := range w {
		if lo, hi := s.Span(off, e); hi > lo {
			k.MatmulBackward(dinp.Slice(lo*s.C, hi*s.C), dw[e], dout.Slice(lo*s.OC, hi*s.OC), inp.Slice(lo*s.C, hi*s.C), w[e],
				s.Expert(e, hi-lo), accumulate)
		}
	}
}

func (k *kernels) ExpertsSwiGLU(out, gate, up tensor.Buffer, offsets tensor.Buffer, width int) {
	o := k.ops("ExpertsSwiGLU")
	n := out.Len()
	y, g, u, off := o.f(out, n), o.f(gate, n), o.f(up, n), o.i(offsets, offsets.Len())
	if o.ok() && off.N > 0 {
		k.d.launch("experts_swiglu", k.d.grid(n), 1, threads, k.d.wr(y), k.d.rd(g), k.d.rd(u), k.d.rd(off), i32(off.N-1), i32(width), i64(n))
	}
}

func (k *kernels) ExpertsSwiGLUBackward(dgate, dup, dout, gate, up tensor.Buffer, offsets tensor.Buffer, width int, accumulate bool) {
	o := k.ops("ExpertsSwiGLUBackward")
	n := dout.Len()
	dg, du, dy, g, u, off := o.f(dgate, n), o.f(dup, n), o.f(dout, n), o.f(gate, n), o.f(up, n), o.i(offsets, offsets.Len())
	if o.ok() && off.N > 0 {
		k.d.launch("experts_swiglu_backward", k.d.grid(n), 1, threads, k.d.acc(dg, accumulate), k.d.acc(du, accumulate), k.d.rd(dy), k.d.rd(g), k.d.rd(u), k.d.rd(off), i32(off.N-1), i32(width), i64(n), flag(accumulate))
	}
}

func (k *kernels) RouterStats(stats, probs tensor.Buffer, r tensor.Routing, s tensor.MoEShape) {
	o := k.ops("RouterStats")
	st, p, off := o.f(stats, 2*s.E), o.f(probs, s.BT*s.E), o.i(r.Offsets, s.E+1)
	if o.ok() {
		k.d.launch("router_stats", k.d.grid(s.E), 1, threads, k.d.wr(st), k.d.rd(p), k.d.rd(off), i32(s.BT), i32(s.E))
	}
}

func (k *kernels) AuxLoss(dst, stats tensor.Buffer, r tensor.Routing, s tensor.MoEShape, tokens int, accumulate bool) {
	o := k.ops("AuxLoss")
	d, st, off := o.st(dst, 2), o.f(stats, 2*s.E), o.i(r.Offsets, s.E+1)
	if o.ok() {
		k.d.launch("aux_loss", 1, 1, 1, k.d.acc(d, accumulate), k.d.rd(st), k.d.rd(off), i32(s.BT), i32(s.E), i32(s.K), f64(float64(tokens)), flag(accumulate))
	}
}

func (k *kernels) AuxLossBackward(dprobs, stats tensor.Buffer, s tensor.MoEShape, tokens int, coeff float64) {
	o := k.ops("AuxLossBackward")
	dp, st := o.f(dprobs, s.BT*s.E), o.f(stats, 2*s.E)
	if o.ok() {
		k.d.launch("aux_loss_backward", k.d.grid(s.BT*s.E), 1, threads, k.d.wr(dp), k.d.rd(st), i32(s.BT), i32(s.E), i32(s.K), f64(float64(tokens)), f64(coeff))
	}
}

func (k *kernels) LossSum(dst, losses, targets tensor.Buffer, accumulate bool) {
	o := k.ops("LossSum")
	d, l := o.st(dst, 1), o.f(losses, losses.Len())
	t := o.i(targets, l.N)
	if o.ok() {
		k.d.launch("loss_sum", 1, 1, 1024, k.d.acc(d, accumulate), k.d.rd(l), k.d.rd(t), i32(l.N), flag(accumulate))
	}
}

// sumSqBlocks is the fixed grid of a sum of squares: the result does not
// depend on the device.
const sumSqBlocks = 512

// SumSquares sums buffers that lie end to end in memory (the gradient groups
// of one allocation) as one span: one partial launch a span into its own
// share of the partial sums, then one finish over all of them.
func (k *kernels) SumSquares(dst tensor.Buffer, accumulate bool, xs ...tensor.Buffer) {
	o := k.ops("SumSquares")
	d := o.st(dst, 1)
	var spans []Buffer
	for _, x := range xs {
		b := o.w(x, x.Len())
		if n := len(spans); n > 0 && spans[n-1].DType == b.DType && spans[n-1].ptr+devicePtr(spans[n-1].Bytes()) == b.ptr {
			spans[n-1].N += b.N
		} else if b.N > 0 {
			spans = append(spans, b)
		}
	}
	if !o.ok() {
		return
	}
	if len(spans) == 0 {
		if !accumulate {
			k.d.Zero(d)
		}
		return
	}
	// The sumSqBlocks blocks are shared among the spans by length (at least one
	// each), so the partial sums take about as much scratch whatever the list.
	var total int
	for _, x := range spans {
		total += x.N
	}
	blocks := make([]int, len(spans))
	n := 0
	for i, x := range spans {
		blocks[i] = max(int(int64(sumSqBlocks)*int64(x.N)/int64(total)), 1)
		n += blocks[i]
	}
	part := as(k.d.scratch(scratchSum64, 2*n), F64, n)
	at := 0
	for i, x := range spans {
		k.d.launch("sumsq64_partial"+suffix(x.DType), blocks[i], 1, threads, k.d.wr(part.Slice(at, at+blocks[i])), k.d.rd(x), i64(x.N))
		at += blocks[i]
	}
	k.d.launch("sum64_finish", 1, 1, 1024, k.d.acc(d, accumulate), k.d.rd(part), i32(n), flag(accumulate))
}

func (k *kernels) CloseStep(stats tensor.Buffer, maxNorm float64) {
	o := k.ops("CloseStep")
	if st := o.st(stats, tensor.NumStats); o.ok() {
		k.d.launch("close_step", 1, 1, 1, k.d.rw(st), f64(maxNorm))
	}
}

func (k *kernels) Axpy(dst, src tensor.Buffer, a float64) {
	o := k.ops("Axpy")
	d := o.st(dst, dst.Len())
	if src.Len() != dst.Len() && !o.bad {
		o.failf("%d values into %d", src.Len(), dst.Len())
	}
	if s := o.st(src, d.N); o.ok() {
		k.d.launch("axpy64", k.d.grid(d.N), 1, threads, k.d.rw(d), k.d.rd(s), f64(a), i64(d.N))
	}
}

func (k *kernels) AdamW(params, compute, grads, m, v tensor.Buffer, lr, beta1, beta2, eps, wd float64, stats tensor.Buffer) {
	o := k.ops("AdamW")
	p := o.f(params, params.Len())
	g, ms, vs, st, c := o.w(grads, p.N), o.f(m, p.N), o.f(v, p.N), o.st(stats, tensor.NumStats), o.compute(compute, p.N)
	if o.ok() {
		k.d.launch("adamw_stats"+gradSuffix(g), k.d.grid(p.N), 1, threads, k.d.rw(p), k.d.wr(c), k.d.rd(g), k.d.rw(ms), k.d.rw(vs), i64(p.N),
			f32(lr), f32(beta1), f32(beta2), f32(eps), f32(wd), k.d.rd(st))
	}
}

func (k *kernels) SGD(params, compute, grads, buf tensor.Buffer, lr, momentum, wd float64, stats tensor.Buffer) {
	o := k.ops("SGD")
	p := o.f(params, params.Len())
	g, b, st, c := o.w(grads, p.N), o.f(buf, p.N), o.st(stats, tensor.NumStats), o.compute(compute, p.N)
	if o.ok() {
		k.d.launch("sgd_stats"+gradSuffix(g), k.d.grid(p.N), 1, threads, k.d.rw(p), k.d.wr(c), k.d.rd(g), k.d.rw(b), i64(p.N), f32(lr), f32(momentum), f32(wd), k.d.rd(st))
	}
}

// gradSuffix names an optimizer kernel's variant for gradients g: none for
// fp32, _bf16 for bf16 (adamw_stats_bf16, sgd_stats_bf16).
func gradSuffix(g Buffer) string {
	if g.DType == BF16 {
		return "_bf16"
	}
	return ""
}

// f64 is a double kernel argument.
func f64(v float64) arg { return math.Float64bits(v) }
