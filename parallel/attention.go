package parallel

import "github.com/shardline/shardline/config"

// attentionPairs is the (query, key) pairs causal attention over t positions
// computes, in chunks of chunk positions (0, or chunk ≥ t: none), as the FLOP
// formulas count them: a causal block of L positions counts L²/2 pairs (the
// mask halves the L² products; the diagonal counted half, the convention of
// the whole-sequence formula 2·seq·w per token). With n = ⌊t/chunk⌋ whole
// chunks and r = t − n·chunk positions in the last, shorter one:
//
//	pairs = (n·chunk² + r²) / 2
//
// against t²/2 without chunks. The exact count of visible pairs is pairs +
// t/2 (each chunk's diagonal in full).
func attentionPairs(t, chunk int) float64 {
	T := float64(t)
	if chunk <= 0 || chunk >= t {
		return T * T / 2
	}
	n, r, c := float64(t/chunk), float64(t%chunk), float64(chunk)
	return (n*c*c + r*r) / 2
}

// attentionLength is the sum over the layers of the keys a token attends to
// on average, as the FLOP formulas count them (attentionPairs over the
// sequence, per token, doubled back to the whole-sequence convention): seq_len
// for a layer over the whole sequence, less for a chunked one
// (config.Model.AttentionChunk: the rotary layers with NoPE layers between, or
// every layer). Document masks (data.reset_attention_mask) depend on the data
// and are counted as whole-sequence causal attention.
func attentionLength(mo config.Model) float64 {
	var sum float64
	for l := 0; l < mo.Layers; l++ {
		if chunk := mo.AttentionChunk(l); chunk > 0 && chunk < mo.SeqLen {
			sum += 2 * attentionPairs(mo.SeqLen, chunk) / float64(mo.SeqLen)
		} else {
			sum += float64(mo.SeqLen)
		}
	}
	return sum
}

// visiblePairs counts, exactly, the (query, key) pairs of a block of h query
// positions from q0 and h key positions from k0 that causal attention in
// chunks of chunk positions (0: none) lets a query see: key ≤ query, and the
// key in the query's chunk.
func visiblePairs(q0, k0, h, chunk int) float64 {
	var n float64
	for i := q0; i < q0+h; i++ {
		lo, hi := k0, min(k0+h-1, i)
		if chunk > 0 {
			lo = max(lo, i/chunk*chunk)
		}
		if hi >= lo {
			n += float64(hi - lo + 1)
		}
	}
	return n
}

// chunkedAttention is one layer's attention kernels, forward and backward, on
// one rank for a micro-batch of shape sh in chunks of chunk positions (0 < chunk
// < seq_len), and the kernels launched; ring attention's merges and gradient
// additions under context parallelism included, as microCompute counts them
// without chunks.
//
// Without context parallelism the kernel's work is the ⌊T/chunk⌋ whole chunks'
// causal attention, one causal block of chunk positions each (timed as that
// many (batch, head) pairs more), and the last chunk's T mod chunk positions
// (timed apart: one launch more than the kernel makes, microseconds).
//
// With it, each rank holds the query halves r and 2P−1−r of the sequence
// (trainer/model/cp.go); a pair of halves is computed unless every key lies
// before the query half's first chunk (blockPairs), its kernel's time that of
// the whole block (causal on the diagonal, full otherwise) scaled by the share
// of its pairs the chunks leave visible (the kernels skip the tiles nothing
// sees). The ranks' work differs; the slowest rank's is the step's.
func chunkedAttention(c opCosts, sh microShape, NH, HD, Q, KV, chunk int) (fwd, bwd, calls float64) {
	B, T := sh.B, sh.T
	P := sh.CP
	if P <= 1 {
		n, r := T/chunk, T%chunk
		fwd, bwd = c.attentionTime(B*NH*n, chunk, HD, false), c.attentionTime(B*NH*n, chunk, HD, true)
		if r > 0 {
			fwd += c.attentionTime(B*NH, r, HD, false)
			bwd += c.attentionTime(B*NH, r, HD, true)
		}
		return fwd, bwd, 2
	}
	h := T / 2
	diag, full := float64(h)*float64(h+1)/2, float64(h)*float64(h)
	var slowest float64
	for r := 0; r < P; r++ {
		var f, b, pairs float64
		ringBlocks(r, P, h, chunk, func(gq, gk int) {
			vis := visiblePairs(gq*h, gk*h, h, chunk)
			if gk == gq {
				f += c.attentionTime(B*NH, h, HD, false) * vis / diag
				b += c.attentionTime(B*NH, h, HD, true) * vis / diag
			} else {
				f += c.attentionFullTime(B*NH, h, HD, false) * vis / full
				b += c.attentionFullTime(B*NH, h, HD, true) * vis / full
			}
			pairs++
		})
		f += pairs * c.stream(StreamAttnMerge, float64(B*h*Q))
		b += float64(P)*c.stream(StreamAdd, float64(2*B*T*KV)) + 2*c.stream(StreamAdd, float64(B*T*KV))
		if f+b > slowest {
			slowest, fwd, bwd, calls = f+b, f, b, 2*pairs+pairs+float64(P)+2
		}
	}
	return fwd, bwd, calls
}

// ringBlocks calls f for each pair of halves (query half gq, key half gk, of
// h positions each) that rank r of P computes in ring attention with chunks
// of chunk positions (0: none), as trainer/model/cp.go's blockPairs: the
// rank's query halves r and 2P−1−r, each against the key halves at or before
// it, less those whose keys all lie before the query half's first chunk.
func ringBlocks(r, P, h, chunk int, f func(gq, gk int)) {
	for _, gq := range []int{r, 2*P - 1 - r} {
		for gk := 0; gk <= gq; gk++ {
			if chunk > 0 && (gk+1)*h <= gq*h/chunk*chunk {
				continue // every key before every query's chunk: not computed
			}
			f(gq, gk)
		}
	}
}
