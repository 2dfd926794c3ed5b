package cpu

import (
	"math"

	"github.com/shardline/shardline/tensor"
)

// The materialised attention: the reference the flash kernels are checked
// against (tests only; the engine runs flash attention alone, so no (T,T)
// buffer exists outside tests). It is also what gemm's triangle modes serve.

// Attention is causal scaled-dot-product attention with grouped key/value heads:
// q (B,T,NH,HD), k and v (B,T,NKV,HD), out (B,T,NH,HD); att (B,NH,T,T) keeps the
// probabilities for backward (zero above the diagonal). Query head h reads key/value
// head h / (NH/NKV). Per (batch, head) it is two GEMMs, S = Q·Kᵀ and O = P·V, with
// the masked softmax between them. It takes the square causal case of s (T = s.Tq
// = s.Tk, no offsets); FlashAttention takes any.
func Attention[F Float](out, att, q, k, v []F, s tensor.AttentionShape) {
	B, T, NH, NKV, HD := s.B, s.Tq, s.NH, s.NKV, s.HD
	j := getJob[attentionJob[F]]()
	j.attentionArgs = attentionArgs[F]{out, att, q, k, v, B, T, NH, NKV, HD}
	parallel(j, B*NH, 2*T*T*HD)
	j.attentionArgs = attentionArgs[F]{}
	listOf[attentionJob[F]]().put(j) // with its buffers
}

type attentionArgs[F Float] struct {
	out, att, q, k, v []F
	B, T, NH, NKV, HD int
}

type attentionJob[F Float] struct {
	attentionArgs[F]
	bufs chunkBufs[F]
}

func (j *attentionJob[F]) rows(c, lo, hi int) {
	out, att, q, k, v, T, NH, NKV, HD := j.out, j.att, j.q, j.k, j.v, j.T, j.NH, j.NKV, j.HD
	group, scale := NH/NKV, 1/math.Sqrt(float64(HD))
	gb := &j.bufs.gemm[c]
	for bh := lo; bh < hi; bh++ {
		b, h := bh/NH, bh%NH
		kh := h / group
		qh, kk, vv := q[(b*T*NH+h)*HD:], k[(b*T*NKV+kh)*HD:], v[(b*T*NKV+kh)*HD:]
		P := att[bh*T*T : (bh+1)*T*T]
		gemm(gb, false, true, T, T, HD, qh, NH*HD, kk, NKV*HD, 0, P, T)
		for t := 0; t < T; t++ {
			row := P[t*T : (t+1)*T]
			live := row[:t+1]
			// softmax(scale·s) over the causal prefix; scale > 0, so the largest
			// score is found before scaling, and scaling and shifting are one pass.
			maxv := maxOf(live)
			for t2, x := range live {
				live[t2] = (x - maxv) * F(scale)
			}
			expInPlace(live)
			inv := 1 / sum4(live)
			for t2 := range live {
				live[t2] *= inv
			}
			clear(row[t+1:])
		}
		gemmTri(gb, lower, false, false, T, HD, T, P, T, vv, NKV*HD, 0, out[(b*T*NH+h)*HD:], NH*HD)
	}
}

// AttentionBackward accumulates dq, dk, dv from dout through the saved
// probabilities P: dP = dO·Vᵀ, dV += Pᵀ·dO, dS = P∘(dP − rowsum(P∘dP))·scale,
// dQ += dS·K, dK += dSᵀ·Q. Work is split by (batch, key/value head), so no two
// goroutines write the same dk or dv row.
func AttentionBackward[F Float](dq, dk, dv, dout, att, q, k, v []F, s tensor.AttentionShape) {
	B, T, NH, NKV, HD := s.B, s.Tq, s.NH, s.NKV, s.HD
	j := getJob[attentionBackJob[F]]()
	j.attentionBackArgs = attentionBackArgs[F]{dq, dk, dv, dout, att, q, k, v, B, T, NH, NKV, HD}
	parallel(j, B*NKV, NH/NKV*5*T*T*HD)
	j.attentionBackArgs = attentionBackArgs[F]{}
	listOf[attentionBackJob[F]]().put(j) // with its buffers
}

type attentionBackArgs[F Float] struct {
	dq, dk, dv, dout, att, q, k, v []F
	B, T, NH, NKV, HD              int
}

type attentionBackJob[F Float] struct {
	attentionBackArgs[F]
	bufs chunkBufs[F]
}

func (j *attentionBackJob[F]) rows(c, lo, hi int) {
	dq, dk, dv, dout, att, q, k, v, T, NH, NKV, HD := j.dq, j.dk, j.dv, j.dout, j.att, j.q, j.k, j.v, j.T, j.NH, j.NKV, j.HD
	group, scale := NH/NKV, F(1/math.Sqrt(float64(HD)))
	gb := &j.bufs.gemm[c]
	dP := j.bufs.scratchFor(c, T*T)
	for bk := lo; bk < hi; bk++ {
		b, kh := bk/NKV, bk%NKV
		kk, vv := k[(b*T*NKV+kh)*HD:], v[(b*T*NKV+kh)*HD:]
		dkk, dvv := dk[(b*T*NKV+kh)*HD:], dv[(b*T*NKV+kh)*HD:]
		for h := kh * group; h < (kh+1)*group; h++ {
			bh := b*NH + h
			P := att[bh*T*T : (bh+1)*T*T]
			qh, dqh, doh := q[(b*T*NH+h)*HD:], dq[(b*T*NH+h)*HD:], dout[(b*T*NH+h)*HD:]
			gemm(gb, false, true, T, T, HD, doh, NH*HD, vv, NKV*HD, 0, dP, T)
			gemmTri(gb, upper, true, false, T, HD, T, P, T, doh, NH*HD, 1, dvv, NKV*HD)
			for t := 0; t < T; t++ {
				d := dP[t*T : (t+1)*T]
				p, live := P[t*T:t*T+t+1], d[:t+1]
				dot := dot2(p, live)
				for t2, pv := range p {
					live[t2] = pv * (live[t2] - dot) * scale
				}
				clear(d[t+1:])
			}
			gemmTri(gb, lower, false, false, T, HD, T, dP, T, kk, NKV*HD, 1, dqh, NH*HD)
			gemmTri(gb, upper, true, false, T, HD, T, dP, T, qh, NH*HD, 1, dkk, NKV*HD)
		}
	}
}
