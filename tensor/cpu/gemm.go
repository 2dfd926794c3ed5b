package cpu

import (
	"math"

	"github.com/shardline/shardline/tensor"
)

// Sgemm computes C = alpha·op(A)·op(B) + beta·C for row-major matrices: op(A) is
// M×K (A is M×K with row stride lda, or K×M when transA), op(B) is K×N (B is K×N with
// row stride ldb, or N×K when transB), C is M×N with row stride ldc.
//
// It is a BLIS-style blocked GEMM: B is packed into K×NR column panels and A into
// MR×K row panels, and an MR×NR micro-kernel (AVX-512 FMA in assembly where the CPU
// has it, portable Go otherwise) accumulates a tile in registers. Row blocks of C are
// shared among the cores when the product is large enough to pay for them. Packing
// buffers are recycled: no allocation in the steady state.
func Sgemm(transA, transB bool, M, N, K int, alpha float32, A []float32, lda int, B []float32, ldb int, beta float32, C []float32, ldc int) {
	c, ok := newGemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
	if !ok {
		return
	}
	g := gemmPool.get()
	g.gemmCall = c
	g.run()
	g.gemmCall = gemmCall{} // hold no matrix alive
	gemmPool.put(g)
}

// SgemmBF16 is Sgemm with B stored in bf16: each value is widened to float32
// (exactly) as B is packed into panels, so the micro-kernel and the
// accumulation run in float32 as for a float32 B, and the product equals Sgemm's
// on B's widened values bit for bit. B is always packed (a float32 B is read in
// place where it can be), which costs K·N widening moves per part of the product.
func SgemmBF16(transA, transB bool, M, N, K int, alpha float32, A []float32, lda int, B []tensor.BF16, ldb int, beta float32, C []float32, ldc int) {
	c, ok := newGemm(transA, transB, M, N, K, alpha, A, lda, nil, ldb, beta, C, ldc)
	if !ok {
		return
	}
	c.Bh = B
	g := gemmPool.get()
	g.gemmCall = c
	g.run()
	g.gemmCall = gemmCall{}
	gemmPool.put(g)
}

// SgemmFP8 is Sgemm with B stored as FP8 codes of format f: each code is
// widened to its value (exactly, through the format's table) as B is packed
// into panels, as SgemmBF16 widens bf16, so the product equals Sgemm's on B's
// values bit for bit. Scales are the caller's: alpha carries them (the FP8
// products of tensor.Kernels pass the operands' scale inverses' product).
func SgemmFP8(transA, transB bool, M, N, K int, alpha float32, A []float32, lda int, B []uint8, f tensor.FP8Format, ldb int, beta float32, C []float32, ldc int) {
	c, ok := newGemm(transA, transB, M, N, K, alpha, A, lda, nil, ldb, beta, C, ldc)
	if !ok {
		return
	}
	vals := f.Values()
	c.Bq, c.qv = B, &vals
	g := gemmPool.get()
	g.gemmCall = c
	g.run()
	g.gemmCall = gemmCall{}
	gemmPool.put(g)
}

// sgemmSerial is Sgemm on the calling goroutine alone, packing into b: for
// products inside a parallel region, where each chunk of the region owns its b.
// tri says op(A) is triangular (causal attention's probabilities), so a tile
// skips the part of K where its rows of op(A) are zero.
func sgemmSerial(b *gemmBufs, tri triangle, transA, transB bool, M, N, K int, alpha float32, A []float32, lda int, B []float32, ldb int, beta float32, C []float32, ldc int) {
	c, ok := newGemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
	if ok {
		c.tri = tri
		c.part(b, 0, M, 0, N)
	}
}

// triangle is what a GEMM knows of op(A)'s zeros.
type triangle uint8

const (
	full  triangle = iota
	lower          // op(A)[m][k] = 0 for k > m
	upper          // op(A)[m][k] = 0 for k < m
)

// newGemm applies beta to C where the product will not (it returns false when
// nothing is left to compute) and describes the product.
func newGemm(transA, transB bool, M, N, K int, alpha float32, A []float32, lda int, B []float32, ldb int, beta float32, C []float32, ldc int) (gemmCall, bool) {
	if M == 0 || N == 0 {
		return gemmCall{}, false
	}
	// With beta 0 the first K block stores its tiles over C (never reading it)
	// instead of C being cleared first.
	set := beta == 0 && K > 0 && alpha != 0
	if beta != 1 && !set {
		for i := 0; i < M; i++ {
			row := C[i*ldc : i*ldc+N]
			if beta == 0 {
				clear(row)
			} else {
				for j := range row {
					row[j] *= beta
				}
			}
		}
	}
	if K == 0 || alpha == 0 {
		return gemmCall{}, false
	}
	return gemmCall{transA: transA, transB: transB, M: M, N: N, K: K, alpha: alpha, A: A, lda: lda, B: B, ldb: ldb, C: C, ldc: ldc, set: set}, true
}

// Blocking: a KC×NR panel of B (64 KiB) stays in L2 next to an MC×KC block of A
// (192 KiB); KC = 512 covers the model's K (C, 3C, the FFN width) in one block,
// measured best on the model's shapes (256 and 768 were slower).
const (
	mr = 12
	nr = 32
	kc = 512
	mc = 96
	nc = 3072
)

// gemmCall is one product's operands.
type gemmCall struct {
	transA, transB bool
	M, N, K        int
	alpha          float32
	A              []float32
	lda            int
	B              []float32
	Bh             []tensor.BF16 // B in bf16 (SgemmBF16), B nil
	Bq             []uint8       // B in FP8 codes (SgemmFP8), B nil
	qv             *[256]float32 // the values of Bq's codes
	ldb            int
	C              []float32
	ldc            int
	set            bool          // the first K block overwrites C (beta 0)
	tri            triangle      // op(A)'s known zeros
	dot            bool          // the bf16 dot-product path (SgemmDotBF16)
	ah             []tensor.BF16 // its op(A) in bf16 rows (gemmArgs.roundA)
	ldah           int
}

// gemmBufs are the packing buffers of one part of a product. A part always
// packs into the buffers of its own index, whichever goroutine computes it, so
// what is allocated (only on a part's first use of a larger shape) never depends
// on scheduling.
type gemmBufs struct {
	b   []float32 // B panels: at most KC×(NC+NR), sized to the product
	a   []float32 // A panels (MC×KC) and an MR×NR edge tile
	dot dotBufs   // the bf16 dot-product path's
}

func (b *gemmBufs) panelsB(need int) []float32 {
	if cap(b.b) < need {
		b.b = make([]float32, need)
	}
	return b.b[:need]
}

func (b *gemmBufs) panelsA() []float32 {
	if b.a == nil {
		b.a = make([]float32, mc*kc+mr*nr)
	}
	return b.a
}

// gemmArgs is a product shared among the cores.
type gemmArgs struct {
	gemmCall
	// The split: part p computes columns [p·per, (p+1)·per) of C (splitN) or
	// rows [p·per, (p+1)·per), packing its own panels of B into bufs[p].
	splitN bool
	per    int
	bufs   [maxChunks]gemmBufs
	dotA   []tensor.BF16 // op(A) rounded to bf16 (SgemmDotBF16)
}

// gemmPool recycles gemmArgs with their buffers: one per goroutine calling
// Sgemm at the same time.
var gemmPool freeList[gemmArgs]

// parallelFLOPs is the product size below which one core is faster than sharing
// the product (measured on two cores: about 2·64³).
const parallelFLOPs = 1 << 19

// run splits C among the cores in one parallel region, by rows (tiles of MR) or
// by columns (panels of NR), whichever gives the busiest core fewer micro-kernel
// calls (rows on a tie). Each part packs what it needs itself, so no part waits
// for another: split by rows, every part packs B if B needs packing.
func (g *gemmArgs) run() {
	workers := min(threads(), maxChunks)
	if 2*g.M*g.N*g.K < parallelFLOPs {
		workers = 1
	}
	panels, tiles := (g.N+nr-1)/nr, (g.M+mr-1)/mr
	byRows := ceilDiv(tiles, min(workers, tiles)) * panels
	byCols := ceilDiv(panels, min(workers, panels)) * tiles
	// Only where A is read in place: packing a transposed A costs about as much
	// as the products it feeds here, and by columns every part would pack all of it.
	direct, _ := g.aInPlace()
	direct = direct || g.dot // the dot-product path reads its bf16 rows of A in place
	g.splitN = direct && byCols < byRows
	unit, span := mr, tiles
	if g.splitN {
		unit, span = nr, panels
	}
	perParts := ceilDiv(span, min(workers, span)) // units in each part
	parts := ceilDiv(span, perParts)              // no part left empty
	if parts <= 1 {
		g.part(&g.bufs[0], 0, g.M, 0, g.N)
		return
	}
	g.per = perParts * unit
	run(g, parts, 1)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// rows computes parts [lo, hi) of C (one part per chunk).
func (g *gemmArgs) rows(_, lo, hi int) {
	for p := lo; p < hi; p++ {
		if g.splitN {
			g.part(&g.bufs[p], 0, g.M, p*g.per, min((p+1)*g.per, g.N))
		} else {
			g.part(&g.bufs[p], p*g.per, min((p+1)*g.per, g.M), 0, g.N)
		}
	}
}

// part computes C[r0:r1, c0:c1], packing into b.
func (g *gemmCall) part(b *gemmBufs, r0, r1, c0, c1 int) {
	if g.dot {
		g.partDot(&b.dot, r0, r1, c0, c1)
		return
	}
	bp := b.panelsB(min(kc, g.K) * (min(nc, c1-c0) + nr))
	ap := b.panelsA()
	for jc := c0; jc < c1; jc += nc {
		ncur := min(nc, c1-jc)
		for pc := 0; pc < g.K; pc += kc {
			kcur := min(kc, g.K-pc)
			g.packB(bp, pc, kcur, jc, ncur)
			g.rowBlocks(bp, ap, r0, r1, pc, kcur, jc, ncur, pc > 0 || !g.set)
		}
	}
}

// aInPlace says how the kernels read A without packing it, which they do when
// alpha is 1: untransposed (direct) by the strided kernel, rows at stride lda;
// transposed (directT) by the panel kernel, whose k-th MR values are adjacent in
// A, at stride lda.
func (g *gemmCall) aInPlace() (direct, directT bool) {
	ok := hasStrided && g.alpha == 1 && !g.dot // the dot-product path packs A into bf16 pairs
	return ok && !g.transA, ok && g.transA
}

// maxInPlaceLDB is the widest row stride (in floats) at which the kernels read
// an untransposed B's full panels in place instead of packing them. A panel's
// KC rows lie ldb apart: from 4 KiB apart on, each k step lands on another
// page and the panel's rows alias in the L1's sets, and the kernel stalls on
// its reads. Measured on an AMD EPYC without AVX-512 (2048×N×512, in place ÷
// packed, interleaved, three rounds): about 0.8 at N = 1024, 1536 and 2048
// (square 1024³: 121 against 165 GFLOP/s); at 256×N×512, where each of two
// parts packs all of B for few rows, 0.9–1.1; at N ≤ 768 the two are level.
const maxInPlaceLDB = 1024 - 1

// bInPlace says whether a panel of B of w columns is read where it lies: a
// full panel of an fp32 B in rows (untransposed) at most maxInPlaceLDB apart.
func (g *gemmCall) bInPlace(w int) bool {
	return !g.transB && w == nr && g.Bh == nil && g.Bq == nil && g.ldb <= maxInPlaceLDB
}

// rowBlocks multiplies rows [lo, hi) of op(A)'s current K block by the packed B block
// bp, packing A into apBuf. add says whether tiles add to C or overwrite it.
func (g *gemmCall) rowBlocks(bp, apBuf []float32, lo, hi, pc, kcur, jc, ncur int, add bool) {
	ap := apBuf[:mc*kc]
	edge := apBuf[mc*kc:] // MR×NR scratch tile for edges
	// Only a last partial panel of rows of an A read in place is packed (into
	// the first panel of ap).
	direct, directT := g.aInPlace()
	for ic := lo; ic < hi; ic += mc {
		mcur := min(mc, hi-ic)
		if !direct && !directT {
			g.packA(ap, ic, mcur, pc, kcur)
		} else if rem := mcur % mr; rem != 0 {
			g.packA(ap, ic+mcur-rem, rem, pc, kcur)
		}
		for jr := 0; jr < ncur; jr += nr {
			bpanel, ldb := bp[jr*kcur:jr*kcur+nr*kcur], nr
			nrCur := min(nr, ncur-jr)
			if g.bInPlace(nrCur) { // read in place (see packB)
				bpanel, ldb = g.B[pc*g.ldb+jc+jr:], g.ldb
			}
			for ir := 0; ir < mcur; ir += mr {
				mrCur := min(mr, mcur-ir)
				ci := (ic+ir)*g.ldc + jc + jr
				c, ldc, tile := g.C[ci:], g.ldc, add
				if nrCur < nr || mrCur < mr {
					c, ldc, tile = edge, nr, false
				}
				// [k0, k1) of this K block meets the tile's nonzero part of op(A).
				k0, k1 := 0, kcur
				switch g.tri {
				case lower:
					k1 = min(kcur, ic+ir+mr-pc)
				case upper:
					k0 = max(0, ic+ir-pc)
				}
				if k1 <= k0 {
					if add {
						continue // adds nothing
					}
					k0, k1 = 0, kcur // overwriting: the product of zeros is written
				}
				kn, bk := k1-k0, bpanel[k0*ldb:]
				switch {
				case direct && mrCur == mr:
					kernelStrided(kn, g.A[(ic+ir)*g.lda+pc+k0:], g.lda, bk, ldb, c, ldc, tile)
				case directT && mrCur == mr:
					kernel(kn, g.A[(pc+k0)*g.lda+ic+ir:], g.lda, bk, ldb, c, ldc, tile)
				case direct || directT:
					kernel(kn, ap[k0*mr:mr*kcur], mr, bk, ldb, c, ldc, tile) // the packed partial panel
				default:
					kernel(kn, ap[ir*kcur+k0*mr:ir*kcur+mr*kcur], mr, bk, ldb, c, ldc, tile)
				}
				if nrCur < nr || mrCur < mr {
					g.storeEdge(edge, ci, mrCur, nrCur, add)
				}
			}
		}
	}
}

// storeEdge moves the rows × cols corner of an edge tile (rows of NR) into C at
// element ci: added to C when add is set, over it otherwise.
func (g *gemmCall) storeEdge(edge []float32, ci, rows, cols int, add bool) {
	for i := 0; i < rows; i++ {
		crow := g.C[ci+i*g.ldc : ci+i*g.ldc+cols]
		if !add {
			copy(crow, edge[i*nr:i*nr+cols])
			continue
		}
		for j := range crow {
			crow[j] += edge[i*nr+j]
		}
	}
}

// packB copies op(B)[pc:pc+kcur, jc:jc+ncur] into NR-wide panels, each kcur×NR row
// major, zero-padding the last panel. A full panel of an untransposed B with
// rows less than 4 KiB apart needs no copy: the kernels read it in place (its
// rows at stride ldb; see maxInPlaceLDB).
func (g *gemmCall) packB(bp []float32, pc, kcur, jc, ncur int) {
	for jr := 0; jr < ncur; jr += nr {
		panel := bp[jr*kcur : jr*kcur+nr*kcur]
		w := min(nr, ncur-jr)
		switch {
		case g.Bh != nil:
			g.packBH(panel, pc, kcur, jc+jr, w)
		case g.Bq != nil:
			g.packBQ(panel, pc, kcur, jc+jr, w)
		case g.bInPlace(w):
			// read in place
		case !g.transB:
			for p := 0; p < kcur; p++ {
				dst := panel[p*nr : p*nr+nr]
				k := pc + p
				copy(dst[:w], g.B[k*g.ldb+jc+jr:k*g.ldb+jc+jr+w])
				clear(dst[w:])
			}
		case w == nr:
			// Column j of the panel is row jc+jr+j of B: gather 16 rows at a time.
			b := g.B[(jc+jr)*g.ldb+pc:]
			packCols16(panel, b, g.ldb, kcur)
			packCols16(panel[16:], b[16*g.ldb:], g.ldb, kcur)
		default:
			for j := 0; j < nr; j++ {
				if j >= w {
					for p := 0; p < kcur; p++ {
						panel[p*nr+j] = 0
					}
					continue
				}
				row := g.B[(jc+jr+j)*g.ldb+pc : (jc+jr+j)*g.ldb+pc+kcur]
				for p, v := range row {
					panel[p*nr+j] = v
				}
			}
		}
	}
}

// packBH is packB's panel of a bf16 B: columns [j0, j0+w) of op(B)'s rows
// [pc, pc+kcur), widened to float32, zero-padded to NR columns.
func (g *gemmCall) packBH(panel []float32, pc, kcur, j0, w int) {
	if !g.transB {
		if w == nr {
			widenPanel(panel, g.Bh[pc*g.ldb+j0:], g.ldb, kcur)
			return
		}
		for p := 0; p < kcur; p++ {
			dst := panel[p*nr : p*nr+nr]
			k := pc + p
			src := g.Bh[k*g.ldb+j0 : k*g.ldb+j0+w]
			for j, v := range src {
				dst[j] = math.Float32frombits(uint32(v) << 16)
			}
			clear(dst[w:])
		}
		return
	}
	if w == nr {
		b := g.Bh[j0*g.ldb+pc:]
		packCols16BF16(panel, b, g.ldb, kcur)
		packCols16BF16(panel[16:], b[16*g.ldb:], g.ldb, kcur)
		return
	}
	for j := 0; j < nr; j++ {
		if j >= w {
			for p := 0; p < kcur; p++ {
				panel[p*nr+j] = 0
			}
			continue
		}
		row := g.Bh[(j0+j)*g.ldb+pc : (j0+j)*g.ldb+pc+kcur]
		for p, v := range row {
			panel[p*nr+j] = math.Float32frombits(uint32(v) << 16)
		}
	}
}

// packBQ is packB's panel of an FP8 B: columns [j0, j0+w) of op(B)'s rows
// [pc, pc+kcur), each code widened to its value, zero-padded to NR columns.
func (g *gemmCall) packBQ(panel []float32, pc, kcur, j0, w int) {
	v := g.qv
	for p := 0; p < kcur; p++ {
		dst := panel[p*nr : p*nr+nr]
		k := pc + p
		if g.transB {
			for j := range w {
				dst[j] = v[g.Bq[(j0+j)*g.ldb+k]]
			}
		} else {
			for j, c := range g.Bq[k*g.ldb+j0 : k*g.ldb+j0+w] {
				dst[j] = v[c]
			}
		}
		clear(dst[w:])
	}
}

// widenPanelGo is widenPanel in Go.
func widenPanelGo(dst []float32, src []tensor.BF16, ldb, k int) {
	for p := 0; p < k; p++ {
		d, s := (*[nr]float32)(dst[p*nr:p*nr+nr]), (*[nr]tensor.BF16)(src[p*ldb:p*ldb+nr])
		for j, v := range s {
			d[j] = math.Float32frombits(uint32(v) << 16)
		}
	}
}

// packCols16BF16 is packCols16 reading bf16 rows, widening each value.
func packCols16BF16(panel []float32, b []tensor.BF16, ldb, kcur int) {
	var rows [16][]tensor.BF16
	for i := range rows {
		rows[i] = b[i*ldb : i*ldb+kcur : i*ldb+kcur]
	}
	f := func(v tensor.BF16) float32 { return math.Float32frombits(uint32(v) << 16) }
	for p := 0; p < kcur; p++ {
		d := (*[16]float32)(panel[p*nr : p*nr+16])
		d[0], d[1], d[2], d[3] = f(rows[0][p]), f(rows[1][p]), f(rows[2][p]), f(rows[3][p])
		d[4], d[5], d[6], d[7] = f(rows[4][p]), f(rows[5][p]), f(rows[6][p]), f(rows[7][p])
		d[8], d[9], d[10], d[11] = f(rows[8][p]), f(rows[9][p]), f(rows[10][p]), f(rows[11][p])
		d[12], d[13], d[14], d[15] = f(rows[12][p]), f(rows[13][p]), f(rows[14][p]), f(rows[15][p])
	}
}

// packCols16 writes panel[p*NR+i] = b[i*ldb+p] for i < 16, p < kcur: sixteen rows
// of B, read side by side, become sixteen adjacent values of each panel row.
func packCols16(panel, b []float32, ldb, kcur int) {
	var rows [16][]float32
	for i := range rows {
		rows[i] = b[i*ldb : i*ldb+kcur : i*ldb+kcur]
	}
	for p := 0; p < kcur; p++ {
		d := (*[16]float32)(panel[p*nr : p*nr+16])
		d[0], d[1], d[2], d[3] = rows[0][p], rows[1][p], rows[2][p], rows[3][p]
		d[4], d[5], d[6], d[7] = rows[4][p], rows[5][p], rows[6][p], rows[7][p]
		d[8], d[9], d[10], d[11] = rows[8][p], rows[9][p], rows[10][p], rows[11][p]
		d[12], d[13], d[14], d[15] = rows[12][p], rows[13][p], rows[14][p], rows[15][p]
	}
}

// packA copies alpha·op(A)[ic:ic+mcur, pc:pc+kcur] into MR-tall panels, each kcur×MR
// (the MR values of one k adjacent), zero-padding the last panel.
func (g *gemmCall) packA(ap []float32, ic, mcur, pc, kcur int) {
	for ir := 0; ir < mcur; ir += mr {
		panel := ap[ir*kcur : ir*kcur+mr*kcur]
		h := min(mr, mcur-ir)
		m0 := ic + ir
		if g.transA {
			// op(A) row m is column m of A: the MR values of one k are adjacent in A.
			for p := 0; p < kcur; p++ {
				src := g.A[(pc+p)*g.lda+m0 : (pc+p)*g.lda+m0+h]
				dst := panel[p*mr : p*mr+mr]
				if g.alpha == 1 && h == mr {
					d, v := (*[mr]float32)(dst), (*[mr]float32)(src) // moves, no memmove call
					d[0], d[1], d[2], d[3], d[4], d[5] = v[0], v[1], v[2], v[3], v[4], v[5]
					d[6], d[7], d[8], d[9], d[10], d[11] = v[6], v[7], v[8], v[9], v[10], v[11]
					continue
				} else if g.alpha == 1 {
					copy(dst, src)
				} else {
					for i, v := range src {
						dst[i] = g.alpha * v
					}
				}
				clear(dst[h:])
			}
			continue
		}
		if h == mr && g.alpha == 1 {
			packRows(panel, g.A[m0*g.lda+pc:], g.lda, kcur)
			continue
		}
		for i := 0; i < mr; i++ {
			if i >= h {
				for p := 0; p < kcur; p++ {
					panel[p*mr+i] = 0
				}
				continue
			}
			row := g.A[(m0+i)*g.lda+pc : (m0+i)*g.lda+pc+kcur]
			for p, v := range row {
				panel[p*mr+i] = g.alpha * v
			}
		}
	}
}

// packRows transposes a full MR×kcur block of A (rows at stride lda) into
// panel[p*MR+i], gathering one value from each row and writing the MR values of a
// column contiguously.
func packRows(panel, a []float32, lda, kcur int) {
	var rows [mr][]float32
	for i := range rows {
		rows[i] = a[i*lda : i*lda+kcur : i*lda+kcur]
	}
	for p := 0; p < kcur; p++ {
		d := panel[p*mr : p*mr+mr : p*mr+mr]
		d[0], d[1], d[2], d[3] = rows[0][p], rows[1][p], rows[2][p], rows[3][p]
		d[4], d[5], d[6], d[7] = rows[4][p], rows[5][p], rows[6][p], rows[7][p]
		d[8], d[9], d[10], d[11] = rows[8][p], rows[9][p], rows[10][p], rows[11][p]
	}
}

// kernelGo is the portable micro-kernel: c[i*ldc+j] (+)= Σ_p a[p*ars+i]·b[p*ldb+j],
// added when add is set, stored otherwise.
func kernelGo(k int, a []float32, ars int, b []float32, ldb int, c []float32, ldc int, add bool) {
	var acc [mr][nr]float32
	for p := 0; p < k; p++ {
		bp := b[p*ldb : p*ldb+nr]
		ap := a[p*ars : p*ars+mr]
		for i := 0; i < mr; i++ {
			ai := ap[i]
			row := &acc[i]
			for j := range row {
				row[j] += ai * bp[j]
			}
		}
	}
	for i := 0; i < mr; i++ {
		crow := c[i*ldc : i*ldc+nr]
		if !add {
			copy(crow, acc[i][:])
			continue
		}
		for j := range crow {
			crow[j] += acc[i][j]
		}
	}
}
