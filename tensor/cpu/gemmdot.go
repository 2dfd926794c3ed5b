package cpu

import (
	"math"

	"github.com/shardline/shardline/tensor"
)

// The bf16 dot-product GEMM: where the CPU has AVX-512 BF16, a product with a
// bf16 B (a bf16 weight) rounds op(A) to bf16 and multiplies pairs of bf16 values
// with VDPBF16PS into float32 accumulators, as a GPU's bf16 GEMM does: the
// products of two bf16 values are exact in float32, and every sum is float32.
// Against the widening product (SgemmBF16) the only difference is A's rounding to
// bf16 (a relative 2⁻⁹ per value), for twice the multiplies per instruction.
// op(A) is rounded once per product into bf16 rows (K padded to even with a zero,
// rows to a multiple of MR with zero rows), which the micro-kernel reads in
// place, a pair of adjacent values at a time; B is packed into NR-wide panels of
// pairs (column j's values 2p and 2p+1 in one 32-bit word).

// bf16Dot says whether products with bf16 weights run on the dot-product path
// (the kernels' Matmul and MatmulBackward); SetBF16Dot changes it.
var bf16Dot = hasBF16Dot

// SetBF16Dot turns the bf16 dot-product path on or off for products with bf16
// weights and returns a function that restores the previous setting: for tests
// and benchmarks that compare it with the widening path. Off a CPU with AVX-512
// BF16 the path runs a portable kernel (much slower; for tests). Not safe to
// call while kernels run.
func SetBF16Dot(on bool) (restore func()) {
	old := bf16Dot
	bf16Dot = on
	return func() { bf16Dot = old }
}

// BF16Dot says whether products with bf16 weights round the other operand to
// bf16 and multiply bf16 pairs (AVX-512 BF16), rather than widening the weights
// to float32.
func BF16Dot() bool { return bf16Dot }

// SgemmDotBF16 is SgemmBF16 on the dot-product path: alpha·op(A), untransposed
// or transposed, is rounded to bf16 once, and the products of bf16 pairs are
// summed in float32. It equals, up to the order and rounding of float32
// additions, the product of A's and B's bf16 values. Products too small to
// share run on the calling goroutine; the rounded A is kept with the product's
// recycled buffers, so the steady state allocates nothing.
func SgemmDotBF16(transA, transB bool, M, N, K int, alpha float32, A []float32, lda int, B []tensor.BF16, ldb int, beta float32, C []float32, ldc int) {
	c, ok := newGemm(transA, transB, M, N, K, alpha, A, lda, nil, ldb, beta, C, ldc)
	if !ok {
		return
	}
	c.Bh, c.dot = B, true
	g := gemmPool.get()
	c.ah, c.ldah = g.roundA(&c)
	g.gemmCall = c
	g.run()
	g.gemmCall = gemmCall{}
	gemmPool.put(g)
}

// sgemmDotBF16A is SgemmDotBF16 with A (M,K) already bf16, untransposed, and
// alpha 1: its rows are the product's operand as they are where they have the
// dot kernel's layout (an even row length and whole tiles of rows), else they
// are copied into that layout; nothing is rounded.
func sgemmDotBF16A(M, N, K int, A []tensor.BF16, lda int, transB bool, B []tensor.BF16, ldb int, beta float32, C []float32, ldc int) {
	c, ok := newGemm(false, transB, M, N, K, 1, nil, lda, nil, ldb, beta, C, ldc)
	if !ok {
		return
	}
	c.Bh, c.dot = B, true
	g := gemmPool.get()
	ld := (K + 1) &^ 1
	if lda == ld && M%mr == 0 {
		c.ah, c.ldah = A[:M*ld], ld
	} else {
		rows := ceilDiv(M, mr) * mr
		if cap(g.dotA) < rows*ld {
			g.dotA = make([]tensor.BF16, rows*ld)
		}
		ah := g.dotA[:rows*ld]
		for i := 0; i < M; i++ {
			row := ah[i*ld : i*ld+ld]
			copy(row, A[i*lda:i*lda+K])
			if ld > K {
				row[K] = 0
			}
		}
		clear(ah[M*ld:])
		c.ah, c.ldah = ah, ld
	}
	g.gemmCall = c
	g.run()
	g.gemmCall = gemmCall{}
	gemmPool.put(g)
}

// roundA rounds alpha·op(A) to bf16 rows in g's buffer: M rows, padded with zero
// rows to a multiple of MR, of K values padded with a zero to an even count,
// which it returns with that row length.
func (g *gemmArgs) roundA(c *gemmCall) ([]tensor.BF16, int) {
	ld := (c.K + 1) &^ 1
	rows := ceilDiv(c.M, mr) * mr
	if cap(g.dotA) < rows*ld {
		g.dotA = make([]tensor.BF16, rows*ld)
	}
	ah := g.dotA[:rows*ld]
	if !c.transA && c.alpha == 1 && c.lda == ld { // contiguous rows, even K: one rounding shared among the cores
		ToBF16(ah[:c.M*ld], c.A[:c.M*ld])
		clear(ah[c.M*ld:])
		return ah, ld
	}
	for i := 0; i < c.M; i++ {
		row := ah[i*ld : i*ld+ld]
		switch {
		case !c.transA && c.alpha == 1:
			toBF16Rows(row[:c.K], c.A[i*c.lda:i*c.lda+c.K])
		case !c.transA:
			for k, v := range c.A[i*c.lda : i*c.lda+c.K] {
				row[k] = tensor.ToBF16(c.alpha * v)
			}
		default:
			for k := 0; k < c.K; k++ {
				row[k] = tensor.ToBF16(c.alpha * c.A[k*c.lda+i])
			}
		}
		if ld > c.K {
			row[c.K] = 0
		}
	}
	clear(ah[c.M*ld:])
	return ah, ld
}

// dotBufs are a part's packing buffers on the dot-product path.
type dotBufs struct {
	b    []uint32  // B panels: at most KC/2 pair steps × (NC+NR) columns
	edge []float32 // an MR×NR tile for the edges of C
}

// partDot is part on the dot-product path: C[r0:r1, c0:c1], packing B into b and
// reading op(A)'s bf16 rows (ah) in place.
func (g *gemmCall) partDot(b *dotBufs, r0, r1, c0, c1 int) {
	need := (min(kc, g.K) + 1) / 2 * (min(nc, c1-c0) + nr)
	if cap(b.b) < need {
		b.b = make([]uint32, need)
	}
	if b.edge == nil {
		b.edge = make([]float32, mr*nr)
	}
	bp, edge := b.b[:need], b.edge
	for jc := c0; jc < c1; jc += nc {
		ncur := min(nc, c1-jc)
		for pc := 0; pc < g.K; pc += kc {
			kcur := min(kc, g.K-pc)
			kp := (kcur + 1) / 2
			add := pc > 0 || !g.set
			for jr := 0; jr < ncur; jr += nr {
				g.packBDot(bp[jr*kp:jr*kp+nr*kp], pc, kcur, jc+jr, min(nr, ncur-jr))
			}
			for ic := r0; ic < r1; ic += mc { // an MC-row block of A stays in cache across B's panels
				for jr := 0; jr < ncur; jr += nr {
					bpanel, nrCur := bp[jr*kp:jr*kp+nr*kp], min(nr, ncur-jr)
					for ir := ic; ir < min(ic+mc, r1); ir += mr {
						mrCur := min(mr, r1-ir)
						ci := ir*g.ldc + jc + jr
						a := g.ah[ir*g.ldah+pc:]
						if nrCur == nr && mrCur == mr {
							kernelDot(kp, a, g.ldah, bpanel, g.C[ci:], g.ldc, add)
							continue
						}
						kernelDot(kp, a, g.ldah, bpanel, edge, nr, false)
						g.storeEdge(edge, ci, mrCur, nrCur, add)
					}
				}
			}
		}
	}
}

// packBDot writes columns [j0, j0+w) of op(B)'s rows [pc, pc+kcur) into an
// NR-wide panel of pairs: panel[p*NR+j] holds op(B)[pc+2p][j0+j] (low half) and
// op(B)[pc+2p+1][j0+j] (high half); columns past w and a last odd row are zero.
func (g *gemmCall) packBDot(panel []uint32, pc, kcur, j0, w int) {
	kp := (kcur + 1) / 2
	if g.transB { // column j of op(B) is row j0+j of B: its pairs are adjacent
		for j := 0; j < nr; j++ {
			if j >= w {
				for p := 0; p < kp; p++ {
					panel[p*nr+j] = 0
				}
				continue
			}
			row := g.Bh[(j0+j)*g.ldb+pc : (j0+j)*g.ldb+pc+kcur]
			p := 0
			for ; 2*p+1 < len(row); p++ {
				panel[p*nr+j] = uint32(row[2*p]) | uint32(row[2*p+1])<<16
			}
			if p < kp {
				panel[p*nr+j] = uint32(row[2*p])
			}
		}
		return
	}
	for p := 0; p < kp; p++ {
		d := (*[nr]uint32)(panel[p*nr : (p+1)*nr])
		r0 := g.Bh[(pc+2*p)*g.ldb+j0 : (pc+2*p)*g.ldb+j0+w]
		if 2*p+1 < kcur {
			r1 := g.Bh[(pc+2*p+1)*g.ldb+j0 : (pc+2*p+1)*g.ldb+j0+w]
			for j, v := range r0 {
				d[j] = uint32(v) | uint32(r1[j])<<16
			}
		} else {
			for j, v := range r0 {
				d[j] = uint32(v)
			}
		}
		clear(d[w:])
	}
}

// kernelDotGo is the dot-product micro-kernel in Go, as VDPBF16PS computes it:
// each accumulator adds the product of a pair's high values, then of its low
// values, each product exact in float32 (8-bit by 8-bit significands) and each
// sum rounded to float32. a holds MR rows of bf16 at stride lda (2·kp values
// read from each), b kp pair steps of NR words.
func kernelDotGo(kp int, a []tensor.BF16, lda int, b []uint32, c []float32, ldc int, add bool) {
	var acc [mr][nr]float32
	for p := 0; p < kp; p++ {
		bs := (*[nr]uint32)(b[p*nr : (p+1)*nr])
		for i := 0; i < mr; i++ {
			a0, a1 := a[i*lda+2*p].Float32(), a[i*lda+2*p+1].Float32()
			row := &acc[i]
			for j, w := range bs {
				b0, b1 := math.Float32frombits(w<<16), math.Float32frombits(w&0xFFFF0000)
				s := row[j] + a1*b1
				row[j] = s + a0*b0
			}
		}
	}
	for i := 0; i < mr; i++ {
		crow := c[i*ldc : i*ldc+nr]
		for j := range crow {
			if add {
				crow[j] += acc[i][j]
			} else {
				crow[j] = acc[i][j]
			}
		}
	}
}
