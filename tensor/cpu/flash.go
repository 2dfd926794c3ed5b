package cpu

import (
	"math"

	"github.com/shardline/shardline/tensor"
)

// Flash attention on the CPU: blocks of flashBlock queries against blocks of
// flashBlock keys with an online softmax, so no (Tq, Tk) buffer exists; the
// forward keeps only the output and each row's log-sum-exp, and the backward
// remakes each block's probabilities from them. The same contract as the GPU's
// (cuda.Device.FlashAttention): natural-log lse of the scaled scores, −Inf for a
// row that sees no key (its output is 0).

// flashBlock is the query and key block size.
const flashBlock = 64

// FlashAttention: out (B,Tq,NH,HD) = softmax(q·kᵀ/√HD, masked)·v and lse (B,NH,Tq),
// per s (its Chunk; not its Starts: FlashAttentionMasked takes them). Work is
// split by (batch, head, query block).
func FlashAttention[F Float](out, lse, q, k, v []F, s tensor.AttentionShape) {
	FlashAttentionMasked(out, lse, q, k, v, nil, s)
}

// FlashAttentionMasked is FlashAttention with starts (B,Tq), each query's
// document start (tensor.AttentionShape.Starts; nil: none). Key blocks no row
// of a query block sees are skipped.
func FlashAttentionMasked[F Float](out, lse, q, k, v []F, starts []int32, s tensor.AttentionShape) {
	j := getJob[flashJob[F]]()
	j.flashArgs = flashArgs[F]{out: out, lse: lse, q: q, k: k, v: v, starts: starts, s: s}
	nq := (s.Tq + flashBlock - 1) / flashBlock
	parallel(j, s.B*s.NH*nq, 4*flashBlock*s.Tk*s.HD)
	j.flashArgs = flashArgs[F]{}
	listOf[flashJob[F]]().put(j) // with its buffers
}

// FlashAttentionBackward accumulates dq, dk, dv (+=, as every CPU backward) from
// dout, the forward's out and lse, remaking each block's probabilities:
// dV += Pᵀ·dO, dS = P∘(dO·Vᵀ − rowsum(dO∘O))/√HD, dQ += dS·K, dK += dSᵀ·Q. Work is
// split by (batch, key/value head), so no two goroutines write the same row.
func FlashAttentionBackward[F Float](dq, dk, dv, dout, out, lse, q, k, v []F, s tensor.AttentionShape) {
	FlashAttentionBackwardMasked(dq, dk, dv, dout, out, lse, q, k, v, nil, s)
}

// FlashAttentionBackwardMasked is FlashAttentionBackward with starts, as
// FlashAttentionMasked; it skips the key blocks the forward skipped.
func FlashAttentionBackwardMasked[F Float](dq, dk, dv, dout, out, lse, q, k, v []F, starts []int32, s tensor.AttentionShape) {
	j := getJob[flashJob[F]]()
	j.flashArgs = flashArgs[F]{out: out, lse: lse, q: q, k: k, v: v, dq: dq, dk: dk, dv: dv, dout: dout, starts: starts, s: s, back: true}
	parallel(j, s.B*s.NKV, s.NH/s.NKV*5*s.Tq*s.Tk*s.HD)
	j.flashArgs = flashArgs[F]{}
	listOf[flashJob[F]]().put(j)
}

type flashArgs[F Float] struct {
	out, lse, q, k, v, dq, dk, dv, dout []F
	starts                              []int32 // (B,Tq) document starts, or nil
	s                                   tensor.AttentionShape
	back                                bool
}

type flashJob[F Float] struct {
	flashArgs[F]
	bufs chunkBufs[F]
}

// keysFor is the keys first..live−1 of the block starting at j0 (at most n
// keys) that query i of batch b sees: all of them without a causal mask, else
// those at positions Lo..QOff+i (tensor.AttentionShape); first ≥ live when none.
func (a *flashArgs[F]) keysFor(b, i, j0, n int) (first, live int) {
	s := a.s
	if !s.Causal {
		return 0, n
	}
	p := s.QOff + i
	live = min(max(p-s.KOff-j0+1, 0), n)
	if lo := a.lo(b, i); lo > 0 {
		first = min(max(lo-s.KOff-j0, 0), n)
	}
	return first, live
}

// lo is the first position query i of batch b sees (0 when only causal).
func (a *flashArgs[F]) lo(b, i int) int {
	var start int
	if a.starts != nil {
		start = int(a.starts[b*a.s.Tq+i])
	}
	return a.s.VisibleFrom(a.s.QOff+i, start)
}

// keyRange is the keys [beg, end) any of rows [i0, i0+nr) of batch b sees,
// beg rounded down to a multiple of flashBlock (the causal diagonal's grid).
func (a *flashArgs[F]) keyRange(b, i0, nr int) (beg, end int) {
	s := a.s
	if !s.Causal {
		return 0, s.Tk
	}
	end = min(max(s.QOff+i0+nr-1-s.KOff+1, 0), s.Tk)
	if s.Masked() || a.starts != nil {
		lo := a.lo(b, i0)
		for r := 1; r < nr; r++ {
			lo = min(lo, a.lo(b, i0+r))
		}
		beg = min(max(lo-s.KOff, 0), end) / flashBlock * flashBlock
	}
	return beg, end
}

func (j *flashJob[F]) rows(c, lo, hi int) {
	if j.back {
		j.backward(c, lo, hi)
		return
	}
	s := j.s
	HD, qs, ks := s.HD, s.NH*s.HD, s.NKV*s.HD // row strides of q (and out) and of k, v
	nq := (s.Tq + flashBlock - 1) / flashBlock
	group, scale := s.NH/s.NKV, 1/math.Sqrt(float64(s.HD))
	gb := &j.bufs.gemm[c]
	buf := j.bufs.scratchFor(c, flashBlock*flashBlock+flashBlock*HD+2*flashBlock)
	S, acc := buf[:flashBlock*flashBlock], buf[flashBlock*flashBlock:flashBlock*(flashBlock+HD)]
	m, l := buf[flashBlock*(flashBlock+HD):flashBlock*(flashBlock+HD+1)], buf[flashBlock*(flashBlock+HD+1):]
	for item := lo; item < hi; item++ {
		bh, qb := item/nq, item%nq
		b, h := bh/s.NH, bh%s.NH
		kh := h / group
		i0 := qb * flashBlock
		nr := min(flashBlock, s.Tq-i0)
		qh := j.q[(b*s.Tq+i0)*qs+h*HD:]
		kk, vv := j.k[b*s.Tk*ks+kh*HD:], j.v[b*s.Tk*ks+kh*HD:]
		for r := 0; r < nr; r++ {
			m[r], l[r] = F(math.Inf(-1)), 0
		}
		clear(acc[:nr*HD])
		kbeg, kend := j.keyRange(b, i0, nr)
		for j0 := kbeg; j0 < kend; j0 += flashBlock {
			nc := min(flashBlock, kend-j0)
			gemm(gb, false, true, nr, nc, HD, qh, qs, kk[j0*ks:], ks, 0, S, nc)
			for r := 0; r < nr; r++ {
				row := S[r*nc : (r+1)*nc]
				first, live := j.keysFor(b, i0+r, j0, nc)
				if first >= live {
					clear(row)
					continue
				}
				mx := maxOf(row[first:live])
				mnew := max(m[r], F(scale)*mx)
				affine(row[first:live], F(scale), -mnew)
				expInPlace(row[first:live])
				clear(row[:first])
				clear(row[live:])
				corr := expF(m[r] - mnew) // 0 while m is −Inf
				l[r] = l[r]*corr + sum4(row[first:live])
				m[r] = mnew
				if corr != 1 {
					for d := range acc[r*HD : (r+1)*HD] {
						acc[r*HD+d] *= corr
					}
				}
			}
			gemmTri(gb, diagonal(s, i0, j0), false, false, nr, HD, nc, S, nc, vv[j0*ks:], ks, 1, acc, HD)
		}
		for r := 0; r < nr; r++ {
			o := j.out[(b*s.Tq+i0+r)*qs+h*HD : (b*s.Tq+i0+r)*qs+h*HD+HD]
			li := (b*s.NH+h)*s.Tq + i0 + r
			if l[r] == 0 {
				clear(o)
				j.lse[li] = F(math.Inf(-1))
				continue
			}
			inv := 1 / l[r]
			for d := range o {
				o[d] = acc[r*HD+d] * inv
			}
			j.lse[li] = m[r] + F(math.Log(float64(l[r])))
		}
	}
}

func (j *flashJob[F]) backward(c, lo, hi int) {
	s := j.s
	HD, qs, ks := s.HD, s.NH*s.HD, s.NKV*s.HD
	group, scale := s.NH/s.NKV, F(1/math.Sqrt(float64(s.HD)))
	gb := &j.bufs.gemm[c]
	buf := j.bufs.scratchFor(c, 2*flashBlock*flashBlock+flashBlock)
	P, dP, D := buf[:flashBlock*flashBlock], buf[flashBlock*flashBlock:2*flashBlock*flashBlock], buf[2*flashBlock*flashBlock:]
	for item := lo; item < hi; item++ {
		b, kh := item/s.NKV, item%s.NKV
		kk, vv := j.k[b*s.Tk*ks+kh*HD:], j.v[b*s.Tk*ks+kh*HD:]
		dkk, dvv := j.dk[b*s.Tk*ks+kh*HD:], j.dv[b*s.Tk*ks+kh*HD:]
		for h := kh * group; h < (kh+1)*group; h++ {
			for i0 := 0; i0 < s.Tq; i0 += flashBlock {
				nr := min(flashBlock, s.Tq-i0)
				at := (b*s.Tq+i0)*qs + h*HD
				qh, doh, dqh := j.q[at:], j.dout[at:], j.dq[at:]
				for r := 0; r < nr; r++ {
					o, do := j.out[at+r*qs:at+r*qs+HD], j.dout[at+r*qs:at+r*qs+HD]
					D[r] = dot2(o, do)
				}
				lrow := j.lse[(b*s.NH+h)*s.Tq+i0:]
				kbeg, kend := j.keyRange(b, i0, nr)
				for j0 := kbeg; j0 < kend; j0 += flashBlock {
					nc := min(flashBlock, kend-j0)
					gemm(gb, false, true, nr, nc, HD, qh, qs, kk[j0*ks:], ks, 0, P, nc)
					for r := 0; r < nr; r++ {
						row := P[r*nc : (r+1)*nc]
						first, live := j.keysFor(b, i0+r, j0, nc)
						if first >= live {
							clear(row)
							continue
						}
						affine(row[first:live], scale, -lrow[r])
						expInPlace(row[first:live])
						clear(row[:first])
						clear(row[live:])
					}
					tri := diagonal(s, i0, j0)                                                                // P and dS: lower triangular on the diagonal
					gemmTri(gb, transposed(tri), true, false, nc, HD, nr, P, nc, doh, qs, 1, dvv[j0*ks:], ks) // dV += Pᵀ·dO
					gemm(gb, false, true, nr, nc, HD, doh, qs, vv[j0*ks:], ks, 0, dP, nc)                     // dP = dO·Vᵀ
					for r := 0; r < nr; r++ {
						dsoftmax(dP[r*nc:(r+1)*nc], P[r*nc:(r+1)*nc], D[r], scale) // dS (0 where P is)
					}
					gemmTri(gb, tri, false, false, nr, HD, nc, dP, nc, kk[j0*ks:], ks, 1, dqh, qs)            // dQ += dS·K
					gemmTri(gb, transposed(tri), true, false, nc, HD, nr, dP, nc, qh, qs, 1, dkk[j0*ks:], ks) // dK += dSᵀ·Q
				}
			}
		}
	}
}

// diagonal is lower for a causal block whose first query and first key sit at
// the same position (the diagonal block: row r sees keys 0..r, so P, and dS,
// are zero above the diagonal and the products that read them skip those zeros,
// as the materialised kernel does), full otherwise.
func diagonal(s tensor.AttentionShape, i0, j0 int) triangle {
	if s.Causal && s.QOff+i0 == s.KOff+j0 {
		return lower
	}
	return full
}

// transposed is what tri says of a matrix once transposed.
func transposed(tri triangle) triangle {
	switch tri {
	case lower:
		return upper
	case upper:
		return lower
	}
	return full
}

// maxScan is the largest value of x (not empty) by one scan; not the builtin
// max, whose NaN and ±0 rules cost a branchy sequence per value.
func maxScan[F Float](x []F) F {
	mx := x[0]
	for _, v := range x {
		if v > mx {
			mx = v
		}
	}
	return mx
}

// expF is e^x: exp32 for float32 (the kernels' exponential), math.Exp for
// float64 (the gradient checks).
func expF[F Float](x F) F {
	if v, ok := any(x).(float32); ok {
		return F(exp32(v))
	}
	return F(math.Exp(float64(x)))
}
