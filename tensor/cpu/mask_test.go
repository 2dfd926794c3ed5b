package cpu

import (
	"fmt"
	"math"
	"math/rand"
	"testing"

	"github.com/shardline/shardline/tensor"
)

// The block masks (tensor.AttentionShape's Chunk and Starts): query p sees key
// j iff Lo(p) ≤ j ≤ p. Checked against the float64 formula with the mask
// written out, forward and backward, and by finite differences.

// visibleRef is the mask as the issue states it, from block ids rather than
// from Lo: key position j is visible to query position p iff j ≤ p and both
// lie in the same chunk (p/chunk) and the same document (the same count of
// document starts at or before them, starts being the query's document start).
func visibleRef(s tensor.AttentionShape, start, p, j int) bool {
	if j > p {
		return false
	}
	if s.Chunk > 0 && j/s.Chunk != p/s.Chunk {
		return false
	}
	return j >= start
}

// naiveMasked is naiveAttention's formula under visibleRef, with its float64
// backward (dq, dk, dv of L = Σ out·dout).
func naiveMasked(s tensor.AttentionShape, starts []int32, q, k, v, dout []float64) (out, lse, dq, dk, dv []float64) {
	scale := 1 / math.Sqrt(float64(s.HD))
	HD := s.HD
	out, lse = make([]float64, len(q)), make([]float64, s.B*s.NH*s.Tq)
	dq, dk, dv = make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
	for b := 0; b < s.B; b++ {
		for i := 0; i < s.Tq; i++ {
			start := 0
			if starts != nil {
				start = int(starts[b*s.Tq+i])
			}
			for h := 0; h < s.NH; h++ {
				kh := h / (s.NH / s.NKV)
				qi := ((b*s.Tq+i)*s.NH + h) * HD
				p := make([]float64, s.Tk)
				m := math.Inf(-1)
				for j := range p {
					p[j] = math.Inf(-1)
					if !visibleRef(s, start, s.QOff+i, s.KOff+j) {
						continue
					}
					kj := ((b*s.Tk+j)*s.NKV + kh) * HD
					p[j] = scale * dot(q[qi:qi+HD], k[kj:kj+HD])
					m = math.Max(m, p[j])
				}
				li := (b*s.NH+h)*s.Tq + i
				lse[li] = math.Inf(-1)
				var z float64
				for j := range p {
					if !math.IsInf(p[j], -1) {
						z += math.Exp(p[j] - m)
					}
				}
				if z == 0 {
					continue
				}
				lse[li] = m + math.Log(z)
				for j := range p {
					if math.IsInf(p[j], -1) {
						p[j] = 0
						continue
					}
					p[j] = math.Exp(p[j]-m) / z
					kj := ((b*s.Tk+j)*s.NKV + kh) * HD
					for d := 0; d < HD; d++ {
						out[qi+d] += p[j] * v[kj+d]
					}
				}
				// backward: dP = dO·V, dS = P∘(dP − dO·O)·scale
				D := dot(dout[qi:qi+HD], out[qi:qi+HD])
				for j := range p {
					if p[j] == 0 {
						continue
					}
					kj := ((b*s.Tk+j)*s.NKV + kh) * HD
					dp := dot(dout[qi:qi+HD], v[kj:kj+HD])
					ds := p[j] * (dp - D) * scale
					for d := 0; d < HD; d++ {
						dv[kj+d] += p[j] * dout[qi+d]
						dq[qi+d] += ds * k[kj+d]
						dk[kj+d] += ds * q[qi+d]
					}
				}
			}
		}
	}
	return out, lse, dq, dk, dv
}

// docStarts gives every query of b sequences of Tq (positions QOff..) the
// start of its document: documents begin at positions 0 and those in cuts.
func docStarts(B, Tq, qoff int, cuts [][]int) []int32 {
	st := make([]int32, B*Tq)
	for b := 0; b < B; b++ {
		for i := 0; i < Tq; i++ {
			p, start := qoff+i, 0
			for _, c := range cuts[b] {
				if c <= p {
					start = max(start, c)
				}
			}
			st[b*Tq+i] = int32(start)
		}
	}
	return st
}

type maskCase struct {
	name string
	s    tensor.AttentionShape
	cuts [][]int // document starts per sequence (nil: no document mask)
}

// maskCases cover chunks and documents alone and together, across the
// kernels' 64-key blocks (whole blocks skipped), with GQA and with query and
// key offsets (a context-parallel block pair).
var maskCases = []maskCase{
	{"chunk 48", tensor.AttentionShape{B: 2, Tq: 200, Tk: 200, NH: 4, NKV: 2, HD: 8, Causal: true, Chunk: 48}, nil},
	{"chunk 64", tensor.AttentionShape{B: 1, Tq: 192, Tk: 192, NH: 2, NKV: 2, HD: 4, Causal: true, Chunk: 64}, nil},
	{"documents", tensor.AttentionShape{B: 2, Tq: 190, Tk: 190, NH: 4, NKV: 1, HD: 8, Causal: true}, [][]int{{5, 70, 71, 150}, {130}}},
	{"chunks and documents", tensor.AttentionShape{B: 2, Tq: 160, Tk: 160, NH: 2, NKV: 2, HD: 4, Causal: true, Chunk: 40}, [][]int{{30, 100}, {}}},
	{"offsets, chunk", tensor.AttentionShape{B: 1, Tq: 80, Tk: 100, NH: 2, NKV: 1, HD: 4, QOff: 120, KOff: 60, Causal: true, Chunk: 90}, nil},
	{"offsets, documents", tensor.AttentionShape{B: 2, Tq: 80, Tk: 100, NH: 2, NKV: 1, HD: 4, QOff: 120, KOff: 60, Causal: true}, [][]int{{70, 130, 181}, {170}}},
	{"offsets, no key visible", tensor.AttentionShape{B: 1, Tq: 30, Tk: 30, NH: 1, NKV: 1, HD: 4, QOff: 100, KOff: 0, Causal: true}, [][]int{{95}}},
}

// TestFlashAttentionMasks: forward and backward of the masked flash kernels
// equal the float64 formula with the mask written out from block ids (float64
// kernels 1e-12: the same sums in another order; float32 1e-5 relative, the
// float32 kernels' rounding over a few hundred keys).
func TestFlashAttentionMasks(t *testing.T) {
	eachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewSource(31))
		for _, c := range maskCases {
			s := c.s
			var starts []int32
			if c.cuts != nil {
				starts = docStarts(s.B, s.Tq, s.QOff, c.cuts)
			}
			q, k, v := randF64(r, s.B*s.Tq*s.NH*s.HD), randF64(r, s.B*s.Tk*s.NKV*s.HD), randF64(r, s.B*s.Tk*s.NKV*s.HD)
			dout := randF64(r, len(q))
			wo, wl, wdq, wdk, wdv := naiveMasked(s, starts, q, k, v, dout)
			out, lse := make([]float64, len(q)), make([]float64, len(wl))
			FlashAttentionMasked(out, lse, q, k, v, starts, s)
			dq, dk, dv := make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
			FlashAttentionBackwardMasked(dq, dk, dv, dout, out, lse, q, k, v, starts, s)
			for name, p := range map[string][2][]float64{"out": {out, wo}, "lse": {lse, wl}, "dq": {dq, wdq}, "dk": {dk, wdk}, "dv": {dv, wdv}} {
				if e := maxRel(p[0], p[1]); e > 1e-12 {
					t.Fatalf("%s: float64 %s differs from the formula by %.3g", c.name, name, e)
				}
			}
			q32, k32, v32, d32 := toF32(q), toF32(k), toF32(v), toF32(dout)
			o32, l32 := make([]float32, len(q)), make([]float32, len(wl))
			FlashAttentionMasked(o32, l32, q32, k32, v32, starts, s)
			dq32, dk32, dv32 := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
			FlashAttentionBackwardMasked(dq32, dk32, dv32, d32, o32, l32, q32, k32, v32, starts, s)
			for name, p := range map[string][2][]float64{"out": {toF64(o32), wo}, "lse": {toF64(l32), wl}, "dq": {toF64(dq32), wdq}, "dk": {toF64(dk32), wdk}, "dv": {toF64(dv32), wdv}} {
				if e := maxRel(p[0], p[1]); e > 1e-5 {
					t.Fatalf("%s: float32 %s differs from the formula by %.3g", c.name, name, e)
				}
			}
		}
	})
}

// TestFlashAttentionMaskGrad checks the masked backward against central finite
// differences (float64, tolerance as checkGrads says) on small shapes where
// chunk and document boundaries cut the rows.
func TestFlashAttentionMaskGrad(t *testing.T) {
	r := rand.New(rand.NewSource(32))
	for _, c := range []maskCase{
		{"chunk 3", tensor.AttentionShape{B: 1, Tq: 7, Tk: 7, NH: 2, NKV: 1, HD: 3, Causal: true, Chunk: 3}, nil},
		{"documents", tensor.AttentionShape{B: 2, Tq: 6, Tk: 6, NH: 2, NKV: 2, HD: 2, Causal: true}, [][]int{{2, 3}, {4}}},
		{"offsets, chunk and documents", tensor.AttentionShape{B: 1, Tq: 5, Tk: 6, NH: 1, NKV: 1, HD: 3, QOff: 5, KOff: 1, Causal: true, Chunk: 4}, [][]int{{6}}},
	} {
		s := c.s
		var starts []int32
		if c.cuts != nil {
			starts = docStarts(s.B, s.Tq, s.QOff, c.cuts)
		}
		q, k, v := randF64(r, s.B*s.Tq*s.NH*s.HD), randF64(r, s.B*s.Tk*s.NKV*s.HD), randF64(r, s.B*s.Tk*s.NKV*s.HD)
		R := randF64(r, len(q))
		out, lse := make([]float64, len(q)), make([]float64, s.B*s.NH*s.Tq)
		loss := func() float64 { FlashAttentionMasked(out, lse, q, k, v, starts, s); return dot(out, R) }
		loss()
		dq, dk, dv := make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
		FlashAttentionBackwardMasked(dq, dk, dv, R, out, lse, q, k, v, starts, s)
		checkGrads(t, fmt.Sprintf("masked flash attention, %s", c.name), map[string][]float64{"q": q, "k": k, "v": v},
			map[string][]float64{"q": dq, "k": dk, "v": dv}, loss)
	}
}

// TestFlashAttentionDocumentsApart: two documents packed in one sequence with
// their document starts give, row for row, what each document gives run alone
// (float64, 1e-12): the mask is training the documents apart.
func TestFlashAttentionDocumentsApart(t *testing.T) {
	r := rand.New(rand.NewSource(33))
	const T, cut, NH, HD = 150, 70, 2, 4
	s := tensor.AttentionShape{B: 1, Tq: T, Tk: T, NH: NH, NKV: NH, HD: HD, Causal: true}
	q, k, v, dout := randF64(r, T*NH*HD), randF64(r, T*NH*HD), randF64(r, T*NH*HD), randF64(r, T*NH*HD)
	starts := docStarts(1, T, 0, [][]int{{cut}})
	out, lse := make([]float64, len(q)), make([]float64, NH*T)
	FlashAttentionMasked(out, lse, q, k, v, starts, s)
	dq, dk, dv := make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
	FlashAttentionBackwardMasked(dq, dk, dv, dout, out, lse, q, k, v, starts, s)
	for _, doc := range [][2]int{{0, cut}, {cut, T}} {
		n := doc[1] - doc[0]
		w := func(x []float64) []float64 { return x[doc[0]*NH*HD : doc[1]*NH*HD] }
		ds := tensor.AttentionShape{B: 1, Tq: n, Tk: n, NH: NH, NKV: NH, HD: HD, Causal: true}
		o1, l1 := make([]float64, n*NH*HD), make([]float64, NH*n)
		FlashAttention(o1, l1, w(q), w(k), w(v), ds)
		q1, k1, v1 := make([]float64, len(o1)), make([]float64, len(o1)), make([]float64, len(o1))
		FlashAttentionBackward(q1, k1, v1, w(dout), o1, l1, w(q), w(k), w(v), ds)
		for name, p := range map[string][2][]float64{"out": {w(out), o1}, "dq": {w(dq), q1}, "dk": {w(dk), k1}, "dv": {w(dv), v1}} {
			if e := maxRel(p[0], p[1]); e > 1e-12 {
				t.Fatalf("document %v: %s differs from the document alone by %.3g", doc, name, e)
			}
		}
	}
}
