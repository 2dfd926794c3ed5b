package cpu

import (
	"cmp"
	"slices"

	"github.com/shardline/shardline/tensor"
)

// Gradient is a parameter gradient a kernel adds into: F values, or, with H
// set, bf16 ones (a run that holds its gradients in bf16,
// grad_reduce_in_bf16), which a kernel adds into in F and rounds to bf16
// once per element and call, to nearest, ties to even (tensor.Kernels).
type Gradient[F Float] struct {
	F []F
	H []tensor.BF16
}

// FloatGradient is the gradient held in x.
func FloatGradient[F Float](x []F) Gradient[F] { return Gradient[F]{F: x} }

// gradTileRows bounds the rows of a bf16 weight gradient one tile widens:
// enough that each tile's product packs its other operand rarely (once per
// 256 rows of output), few enough that the F tile stays small (4 MiB at
// 4,096 columns). The tile is the kernels' own recycled scratch, as their
// packing buffers are.
const gradTileRows = 256

// gradTileElems is the elements of one tile of a flat bf16 buffer (AddInto,
// SumSquares, the optimizers): 256 KiB of float32.
const gradTileElems = 1 << 16

// intoBF16 adds into h tile by tile: each tile of step elements (the last
// shorter), h[lo:hi], is widened to F into t, add adds the call's
// contribution to it, and it is rounded back to bf16, once per element.
func intoBF16[F Float](h []tensor.BF16, step int, add func(t []F, lo, hi int)) {
	widenTiles(h, step, func(t []F, lo, hi int) {
		add(t, lo, hi)
		ToBF16(h[lo:hi], t)
	})
}

// rowTile is the elements of a tile of whole rows of a (rows, cols)
// gradient: gradTileRows rows, or all of them.
func rowTile(rows, cols int) int { return max(1, min(rows, gradTileRows)) * max(cols, 1) }

// MatmulBackwardInto is MatmulBackward with a weight gradient of either
// dtype: a bf16 one gains doutᵀ·inp a tile of its rows at a time, each row's
// product computed in F over all of dout's rows and then rounded once.
func MatmulBackwardInto[F Float](dinp []F, dweight Gradient[F], dout []F, inp, weight tensor.Weights[F], s tensor.MatmulShape, accumulate bool) {
	BT, C, OC := s.BT, s.C, s.OC
	if dinp != nil {
		beta := F(0)
		if accumulate {
			beta = 1
		}
		gemmW(false, false, BT, C, OC, dout, OC, weight, C, beta, dinp, C)
	}
	switch {
	case dweight.H == nil && dweight.F == nil:
		// no weight gradient (the input gradient alone)
	case dweight.H == nil:
		weightGrad(dweight.F, dout, OC, inp, OC, C, BT)
	default:
		intoBF16(dweight.H[:OC*C], rowTile(OC, C), func(t []F, lo, hi int) {
			r0, r1 := lo/C, hi/C
			weightGrad(t, dout[r0:], OC, inp, r1-r0, C, BT)
		})
	}
}

// weightGrad adds doutᵀ·inp into dw (M, C): M columns of dout (BT rows of
// lda values, from its first element), inp (BT, C) F or bf16 (widened as the
// product packs it).
func weightGrad[F Float](dw, dout []F, lda int, inp tensor.Weights[F], M, C, BT int) {
	if inp.BF16 == nil {
		gemm(nil, true, false, M, C, BT, dout, lda, inp.F, C, 1, dw, C)
		return
	}
	if d, ok := any(dout).([]float32); ok {
		SgemmBF16(true, false, M, C, BT, 1, d, lda, inp.BF16, C, 1, any(dw).([]float32), C)
		return
	}
	w := widened(inp, BT*C)
	gemm(nil, true, false, M, C, BT, dout, lda, w.buf, C, 1, dw, C)
	listOf[widenBuf[F]]().put(w)
}

// EmbeddingBackwardInto is EmbeddingBackward with a table gradient of either
// dtype: a bf16 row gains the sum of its tokens' dout rows, added in F in
// token order and rounded once.
func EmbeddingBackwardInto[F Float](dwte Gradient[F], dout []F, tokens []int32, s tensor.EmbeddingShape) {
	if dwte.H == nil {
		EmbeddingBackward(dwte.F, dout, tokens, s)
		return
	}
	C := s.C
	o := listOf[orderBuf]().get()
	idx := o.idx[:0]
	for i := 0; i < s.BT; i++ {
		if t := int(tokens[i]) - s.Lo; t >= 0 && t < s.N {
			idx = append(idx, int32(i))
		}
	}
	slices.SortStableFunc(idx, func(a, b int32) int { return cmp.Compare(tokens[a], tokens[b]) })
	w := listOf[widenBuf[F]]().get()
	if cap(w.buf) < C {
		w.buf = make([]F, C)
	}
	row := w.buf[:C]
	for k := 0; k < len(idx); {
		id := tokens[idx[k]]
		dst := dwte.H[(int(id)-s.Lo)*C : (int(id)-s.Lo+1)*C]
		for c, h := range dst {
			row[c] = F(h.Float32())
		}
		for ; k < len(idx) && tokens[idx[k]] == id; k++ {
			i := int(idx[k])
			for c, g := range dout[i*C : (i+1)*C] {
				row[c] += g
			}
		}
		for c, v := range row {
			dst[c] = tensor.ToBF16(float32(v))
		}
	}
	o.idx = idx[:0]
	listOf[orderBuf]().put(o)
	listOf[widenBuf[F]]().put(w)
}

// orderBuf is recycled scratch for token positions in order.
type orderBuf struct{ idx []int32 }

// RMSNormBackwardInto is RMSNormBackward with a weight gradient of either
// dtype (a bf16 one gains the rows' partial sums, added in F, rounded once).
func RMSNormBackwardInto[F Float](dinp []F, dweight Gradient[F], dout, inp []F, weight tensor.Weights[F], rstd []F, BT, C int, accumulate bool) {
	if dweight.H == nil {
		RMSNormBackward(dinp, dweight.F, dout, inp, weight, rstd, BT, C, accumulate)
		return
	}
	intoBF16(dweight.H[:C], C, func(t []F, _, _ int) {
		RMSNormBackward(dinp, t, dout, inp, weight, rstd, BT, C, accumulate)
	})
}

// HeadLossInto is HeadLoss with a weight gradient of either dtype: a bf16 dw
// is rounded once per chunk of rows (each chunk's product is one call's).
func HeadLossInto[F Float](losses, dx []F, dw Gradient[F], work []F, x, w tensor.Weights[F], targets []int32, dloss []F, s tensor.HeadShape) {
	C, V := s.C, s.V
	for r0 := 0; r0 < s.BT; r0 += s.Rows {
		n := min(s.Rows, s.BT-r0)
		z, xr := work[:n*V], x.Slice(r0*C, (r0+n)*C)
		ms := tensor.MatmulShape{BT: n, C: C, OC: V}
		Matmul(z, xr, w, ms, false)
		CrossEntropy(losses[r0:r0+n], z, z, targets[r0:r0+n], n, V)
		if dx == nil {
			continue
		}
		CrossEntropyBackward(z, dloss[r0:r0+n], z, targets[r0:r0+n], n, V)
		MatmulBackwardInto(dx[r0*C:(r0+n)*C], dw, z, xr, w, ms, false)
	}
}

// AddIntoBF16 adds n values of src (F or bf16) into the bf16 dst: each sum
// in F, rounded once.
func AddIntoBF16[F Float](dst []tensor.BF16, src tensor.Weights[F], n int) {
	intoBF16(dst[:n], gradTileElems, func(t []F, lo, hi int) {
		AddIntoW(t, src.Slice(lo, hi), hi-lo)
	})
}

// sumSquaresBF16 is Σ x² over bf16 values in float64, a tile at a time
// (each tile's sum as sumSquares adds it, the tiles' in order).
func sumSquaresBF16(h []tensor.BF16) float64 {
	var s float64
	widenTiles(h, gradTileElems, func(t []float32, _, _ int) { s += SumSquares(t) })
	return s
}

// AdamWStepBF16 is AdamWStep reading bf16 gradients, widened a tile at a time.
func AdamWStepBF16[F Float](params []F, compute []tensor.BF16, grads []tensor.BF16, m, v []F, lr, beta1, beta2, eps, wd float64, st tensor.Buffer) {
	ok, t, clip := applied("AdamW", st)
	if !ok {
		return
	}
	widenTiles(grads[:len(params)], gradTileElems, func(g []F, lo, hi int) {
		AdamW(params[lo:hi], tileOf(compute, lo, hi), g, m[lo:hi], v[lo:hi], lr, beta1, beta2, eps, wd, clip, t)
	})
}

// SGDStepBF16 is SGDStep reading bf16 gradients, widened a tile at a time.
func SGDStepBF16[F Float](params []F, compute []tensor.BF16, grads []tensor.BF16, buf []F, lr, momentum, wd float64, st tensor.Buffer) {
	ok, _, clip := applied("SGD", st)
	if !ok {
		return
	}
	widenTiles(grads[:len(params)], gradTileElems, func(g []F, lo, hi int) {
		SGD(params[lo:hi], tileOf(compute, lo, hi), g, buf[lo:hi], lr, momentum, wd, clip)
	})
}

// tileOf is c[lo:hi], or nil for a nil c (no compute copy).
func tileOf(c []tensor.BF16, lo, hi int) []tensor.BF16 {
	if c == nil {
		return nil
	}
	return c[lo:hi]
}

// widenTiles calls use with h's values widened to F, step at a time (the
// last tile shorter): g holds h[lo:hi] widened.
func widenTiles[F Float](h []tensor.BF16, step int, use func(g []F, lo, hi int)) {
	if len(h) == 0 {
		return
	}
	step = max(1, min(step, len(h)))
	w := listOf[widenBuf[F]]().get()
	if cap(w.buf) < step {
		w.buf = make([]F, step)
	}
	for lo := 0; lo < len(h); lo += step {
		hi := min(len(h), lo+step)
		g := w.buf[:hi-lo]
		FromBF16(g, h[lo:hi])
		use(g, lo, hi)
	}
	listOf[widenBuf[F]]().put(w)
}
