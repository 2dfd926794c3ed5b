package cpu

import (
	"runtime"
	"sync"
)

// Sgemm computes C = alpha·op(A)·op(B) + beta·C for row-major matrices: op(A) is
// M×K (A is M×K with row stride lda, or K×M when transA), op(B) is K×N (B is K×N with
// row stride ldb, or N×K when transB), C is M×N with row stride ldc.
//
// It is a BLIS-style blocked GEMM: B is packed into K×NR column panels and A into
// MR×K row panels, and an MR×NR micro-kernel (AVX-512 FMA in assembly where the CPU
// has it, portable Go otherwise) accumulates a tile in registers. Row blocks of C are
// shared among goroutines, one per core, when the product is large enough to pay
// for them. Packing buffers come from a pool: no allocation in the steady state.
func Sgemm(transA, transB bool, M, N, K int, alpha float32, A []float32, lda int, B []float32, ldb int, beta float32, C []float32, ldc int) {
	if M == 0 || N == 0 {
		return
	}
	if beta != 1 {
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
		return
	}
	g := gemmArgs{transA: transA, transB: transB, M: M, N: N, K: K, alpha: alpha, A: A, lda: lda, B: B, ldb: ldb, C: C, ldc: ldc}
	g.run()
}

// Blocking: a KC×NR panel of B (32 KiB) stays in L1, an MC×KC block of A (72 KiB)
// in L2.
const (
	mr = 6
	nr = 32
	kc = 256
	mc = 72
	nc = 3072
)

type gemmArgs struct {
	transA, transB bool
	M, N, K        int
	alpha          float32
	A              []float32
	lda            int
	B              []float32
	ldb            int
	C              []float32
	ldc            int
}

var packPool = sync.Pool{New: func() any { b := make([]float32, kc*nc); return &b }}
var packAPool = sync.Pool{New: func() any { b := make([]float32, mc*kc+mr*nr); return &b }}

// parallelFLOPs is the product size below which one goroutine is faster than
// waking others (measured on two cores: about 2·64³).
const parallelFLOPs = 1 << 19

func (g *gemmArgs) run() {
	workers := runtime.GOMAXPROCS(0)
	if 2*g.M*g.N*g.K < parallelFLOPs || g.M <= mr {
		workers = 1
	}
	bpp := packPool.Get().(*[]float32)
	bp := *bpp
	defer packPool.Put(bpp)
	for jc := 0; jc < g.N; jc += nc {
		ncur := min(nc, g.N-jc)
		for pc := 0; pc < g.K; pc += kc {
			kcur := min(kc, g.K-pc)
			g.packB(bp, pc, kcur, jc, ncur)
			blocks := (g.M + mc - 1) / mc
			if workers == 1 || blocks == 1 && g.M <= mc {
				g.rowBlocks(bp, 0, g.M, pc, kcur, jc, ncur)
				continue
			}
			// Split the rows evenly (in MR multiples) among the workers.
			var wg sync.WaitGroup
			per := (g.M + workers - 1) / workers
			per = (per + mr - 1) / mr * mr
			for w := 0; w < workers; w++ {
				lo, hi := w*per, min((w+1)*per, g.M)
				if lo >= hi {
					break
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					g.rowBlocks(bp, lo, hi, pc, kcur, jc, ncur)
				}()
			}
			wg.Wait()
		}
	}
}

// rowBlocks multiplies rows [lo, hi) of op(A)'s current K block by the packed B block.
func (g *gemmArgs) rowBlocks(bp []float32, lo, hi, pc, kcur, jc, ncur int) {
	app := packAPool.Get().(*[]float32)
	ap := (*app)[:mc*kc]
	edge := (*app)[mc*kc:] // MR×NR scratch tile for edges
	defer packAPool.Put(app)
	for ic := lo; ic < hi; ic += mc {
		mcur := min(mc, hi-ic)
		g.packA(ap, ic, mcur, pc, kcur)
		for jr := 0; jr < ncur; jr += nr {
			bpanel := bp[jr*kcur : jr*kcur+nr*kcur]
			nrCur := min(nr, ncur-jr)
			for ir := 0; ir < mcur; ir += mr {
				apanel := ap[ir*kcur : ir*kcur+mr*kcur]
				mrCur := min(mr, mcur-ir)
				ci := (ic+ir)*g.ldc + jc + jr
				if mrCur == mr && nrCur == nr {
					kernel(kcur, apanel, bpanel, g.C[ci:], g.ldc)
					continue
				}
				clear(edge)
				kernel(kcur, apanel, bpanel, edge, nr)
				for i := 0; i < mrCur; i++ {
					crow := g.C[ci+i*g.ldc : ci+i*g.ldc+nrCur]
					for j := range crow {
						crow[j] += edge[i*nr+j]
					}
				}
			}
		}
	}
}

// packB copies op(B)[pc:pc+kcur, jc:jc+ncur] into NR-wide panels, each kcur×NR row
// major, zero-padding the last panel.
func (g *gemmArgs) packB(bp []float32, pc, kcur, jc, ncur int) {
	for jr := 0; jr < ncur; jr += nr {
		panel := bp[jr*kcur : jr*kcur+nr*kcur]
		w := min(nr, ncur-jr)
		for p := 0; p < kcur; p++ {
			dst := panel[p*nr : p*nr+nr]
			k := pc + p
			if g.transB {
				for j := 0; j < w; j++ {
					dst[j] = g.B[(jc+jr+j)*g.ldb+k]
				}
			} else {
				copy(dst[:w], g.B[k*g.ldb+jc+jr:k*g.ldb+jc+jr+w])
			}
			clear(dst[w:])
		}
	}
}

// packA copies alpha·op(A)[ic:ic+mcur, pc:pc+kcur] into MR-tall panels, each kcur×MR
// (the MR values of one k adjacent), zero-padding the last panel.
func (g *gemmArgs) packA(ap []float32, ic, mcur, pc, kcur int) {
	for ir := 0; ir < mcur; ir += mr {
		panel := ap[ir*kcur : ir*kcur+mr*kcur]
		h := min(mr, mcur-ir)
		m0 := ic + ir
		if g.transA {
			// op(A) row m is column m of A: the MR values of one k are adjacent in A.
			for p := 0; p < kcur; p++ {
				src := g.A[(pc+p)*g.lda+m0 : (pc+p)*g.lda+m0+h]
				dst := panel[p*mr : p*mr+mr]
				for i, v := range src {
					dst[i] = g.alpha * v
				}
				clear(dst[h:])
			}
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
			if g.alpha == 1 {
				for p, v := range row {
					panel[p*mr+i] = v
				}
				continue
			}
			for p, v := range row {
				panel[p*mr+i] = g.alpha * v
			}
		}
	}
}

// kernelGo is the portable micro-kernel: c[i*ldc+j] += Σ_p a[p*MR+i]·b[p*NR+j].
func kernelGo(k int, a, b, c []float32, ldc int) {
	var acc [mr][nr]float32
	for p := 0; p < k; p++ {
		bp := b[p*nr : p*nr+nr]
		ap := a[p*mr : p*mr+mr]
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
		for j := range crow {
			crow[j] += acc[i][j]
		}
	}
}
