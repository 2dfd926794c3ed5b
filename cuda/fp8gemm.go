//go:build cuda || cudaemu

package cuda

import (
	"fmt"

	"github.com/shardline/shardline/tensor"
)

// FP8 products on cuBLASLt's FP8 kernels (compute capability 8.9 and later):
// the operands' codes are read in place, one byte a value, at twice bf16's
// tensor-core rate, and their scale inverses are passed to cuBLASLt as device
// pointers (CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, B_SCALE_POINTER), so the
// product is (sa·sb)·op(A)·op(B) summed in fp32, as the widening path
// (fp8.go) computes it from fp32 copies.
//
// cuBLASLt's FP8 kernels take one layout of operands only, "TN": A
// transposed, B not (column-major terms), and 16-byte alignment of every
// operand's start, of its leading dimension and of its contiguous extent.
// In the model's row-major terms a forward product out = x·wᵀ is TN as it
// stands (A = w, B = x); the backward's products are not: dx = dout·w reads
// w transposed and dw = doutᵀ·x reads x and dout transposed, so those
// operands' codes are first transposed into scratch (transpose_u8, a byte a
// value: a quarter of the widening path's fp32 copies) as Transformer Engine
// keeps their "column-wise" copies. E5M2 × E5M2 has no FP8 kernel (nor is it
// a product the model makes). A product that does not meet these rules, or
// a device before 8.9, takes the widening path.

// Scratch slots of the transposed FP8 operands (a byte a value, in fp32
// scratch words).
const (
	scratchFP8TA = iota + scratchFP8B + 1 // the first operand of a backward product, transposed
	scratchFP8TB                          // dout transposed, for the weight gradient
)

// fp8Native reports whether the device runs FP8 products on cuBLASLt's FP8
// kernels: compute capability 8.9 or later (the host emulator reports 9.0
// and runs them as loops under the same rules), unless widenFP8 is set.
func (d *Device) fp8Native() bool {
	return !d.widenFP8 && (d.info.Major > 8 || d.info.Major == 8 && d.info.Minor >= 9)
}

// fp8Pair reports whether a and b have a cuBLASLt FP8 kernel: both FP8, not
// both E5M2.
func fp8Pair(a, b DType) bool {
	return isFP8(a) && isFP8(b) && !(a == F8E5M2 && b == F8E5M2)
}

// aligned16 reports whether every value is a multiple of 16.
func aligned16(vs ...int64) bool {
	for _, v := range vs {
		if v%16 != 0 {
			return false
		}
	}
	return true
}

// fp8GemmFits reports whether the column-major product C (m×n) = Aᵀ·B with A
// (k×m, lda) and B (k×n, ldb) FP8 codes and C (ldc) of its dtype meets
// cuBLASLt's FP8 rules: a kernel for the operand pair, and 16 bytes dividing
// each operand's start, leading dimension and contiguous extent (k for A and
// B, m for C).
func fp8GemmFits(m, n, k int, A Buffer, lda int, B Buffer, ldb int, Cb Buffer, ldc int) bool {
	if !fp8Pair(A.DType, B.DType) || (Cb.DType != F32 && Cb.DType != BF16) || m <= 0 || n <= 0 || k <= 0 {
		return false
	}
	cs := int64(Cb.DType.Size())
	return aligned16(int64(A.ptr), int64(B.ptr), int64(Cb.ptr), int64(k), int64(lda), int64(ldb), int64(m)*cs, int64(ldc)*cs)
}

// gemmFP8 is the column-major product C (m×n) = (sa[0]·sb[0])·Aᵀ·B + β·C on
// cuBLASLt's FP8 kernels: A (k×m, lda) and B (k×n, ldb) FP8 codes, sa and sb
// their scale inverses (f32 device scalars), C fp32 or bf16 (ldc), summed in
// fp32 and rounded once into a bf16 C. The caller checked fp8GemmFits; a
// product that does not fit fails the device.
func (d *Device) gemmFP8(m, n, k int, A Buffer, lda int, sa Buffer, B Buffer, ldb int, sb Buffer, beta float32, Cb Buffer, ldc int) {
	if d.err != nil {
		return
	}
	if !fp8GemmFits(m, n, k, A, lda, B, ldb, Cb, ldc) {
		d.fail("gemm", fmt.Errorf("FP8 product %s·%s→%s of %d×%d×%d (lda %d, ldb %d, ldc %d) outside cuBLASLt's FP8 rules (TN operands, 16-byte alignment)",
			A.DType, B.DType, Cb.DType, m, n, k, lda, ldb, ldc))
		return
	}
	if d.drv.onComm {
		d.fail("gemm", fmt.Errorf("a matrix product inside Background: cuBLASLt's handle is bound to the compute stream"))
		return
	}
	c := int64(m) * int64(n) * int64(Cb.DType.Size())
	read := int64(m)*int64(k) + int64(k)*int64(n) + 8 // the codes and the two scale inverses
	if beta != 0 {
		read += c
	}
	if d.counted("gemm "+A.DType.String()+"·"+B.DType.String()+"→"+Cb.DType.String(), read, c); d.tr.dry {
		return
	}
	d.fp8Product(m, n, k, A, lda, sa, B, ldb, sb, beta, Cb, ldc)
}

// transposed is x (rows × cols row-major FP8 codes) transposed into scratch
// slot i: cols × rows codes (transpose_u8).
func (d *Device) transposed(x Buffer, rows, cols, i int) Buffer {
	t := as(d.scratch(i, (rows*cols+3)/4), x.DType, rows*cols)
	d.launch("transpose_u8", (cols+31)/32, (rows+31)/32, 256, d.wr(t), d.rd(x), i32(rows), i32(cols))
	return t
}

// maxTransposeRows bounds the rows transpose_u8 takes (its grid's y extent,
// 65,535 blocks of 32 rows).
const maxTransposeRows = 65535 * 32

// matmulNativeFP8 runs Matmul's FP8 product out = (x·α)·wᵀ on cuBLASLt's FP8
// kernels, reporting false (having done nothing) where the operands do not
// fit them: column-major outᵀ (OC×BT) = w (C×OC)ᵀ · xᵀ (C×BT), TN as it
// stands.
func (k *kernels) matmulNativeFP8(y Buffer, x, w fp8Operand, s tensor.MatmulShape, accumulate bool) bool {
	if !k.d.fp8Native() || !fp8GemmFits(s.OC, s.BT, s.C, w.x, s.C, x.x, s.C, y, s.OC) {
		return false
	}
	k.d.gemmFP8(s.OC, s.BT, s.C, w.x, s.C, w.inv, x.x, s.C, x.inv, beta(accumulate), y, s.OC)
	return true
}

// matmulBackwardNativeFP8 runs MatmulBackward's FP8 products on cuBLASLt's
// FP8 kernels, reporting false (having done nothing) where the operands do
// not fit them: dxᵀ (C×BT) = (wᵀ)ᵀ·doutᵀ, A being w's codes transposed
// (C×OC row-major); dwᵀ (C×OC) = (xᵀ)ᵀ·dout with x's and dout's codes
// transposed (C×BT and OC×BT row-major), added into dweight. Either
// gradient may be absent (the empty Buffer): its product is left out.
func (k *kernels) matmulBackwardNativeFP8(dx, dw Buffer, dy, x, w fp8Operand, s tensor.MatmulShape, accumulate bool) bool {
	d := k.d
	if !d.fp8Native() || s.BT > maxTransposeRows || s.OC > maxTransposeRows {
		return false
	}
	// The transposes' alignment is the scratch's (an allocation's start);
	// their leading dimensions are OC (wᵀ) and BT (xᵀ, doutᵀ).
	wt, xt, dyt := w.x, x.x, dy.x
	wt.ptr, xt.ptr, dyt.ptr = 0, 0, 0
	if dx.N == 0 && dw.N == 0 {
		return false
	}
	if dx.N > 0 && !fp8GemmFits(s.C, s.BT, s.OC, wt, s.OC, dy.x, s.OC, dx, s.C) {
		return false
	}
	if dw.N > 0 && !fp8GemmFits(s.C, s.OC, s.BT, xt, s.BT, dyt, s.BT, dw, s.C) {
		return false
	}
	if dx.N > 0 {
		wT := d.transposed(w.x, s.OC, s.C, scratchFP8TA)
		d.gemmFP8(s.C, s.BT, s.OC, wT, s.OC, w.inv, dy.x, s.OC, dy.inv, beta(accumulate), dx, s.C)
	}
	if dw.N > 0 {
		xT := d.transposed(x.x, s.BT, s.C, scratchFP8TA)
		dyT := d.transposed(dy.x, s.BT, s.OC, scratchFP8TB)
		d.gemmFP8(s.C, s.OC, s.BT, xT, s.BT, x.inv, dyT, s.BT, dy.inv, 1, dw, s.C)
	}
	return true
}
