package cpu

import (
	"math"
	"slices"

	"github.com/shardline/shardline/tensor"
)

// MoE routing and token permutation. Shapes: BT tokens, E experts, K = top_k, C
// channels; gates (BT,K) weigh each token's chosen experts; the index arrays are
// Routing's.

// Routing is tensor.Routing's index arrays as host slices (the backend's
// adapter views tensor.Routing's int32 buffers in place).
type Routing struct {
	Idx, Row, Tok, Offsets, Cursor []int32
}

// Router sets probs (BT,E) to the scores s.Router names (softmax(logits), or
// each logit's sigmoid), picks each token's top K experts (ties to the lower
// index) into r.Idx and sets gates to the chosen scores, renormalised to sum 1
// unless s.Router.Raw, times s.Router.Scale. The default router (softmax,
// renormalised, no bias, no groups) chooses by logit and takes the softmax of
// the chosen logits, which is the same; any other chooses by score plus bias
// (nil: none) within the token's best groups (tensor.RouterSpec).
func Router[F Float](probs, gates, logits, bias []F, r Routing, s tensor.MoEShape) {
	idx := r.Idx
	BT, E, K, spec := s.BT, s.E, s.K, s.Router
	if len(bias) == 0 {
		bias = nil
	}
	plain := !spec.Sigmoid && !spec.Raw && bias == nil && spec.Groups == 0
	scale := F(spec.GateScale())
	var v []F
	var allowed []bool
	if !plain {
		// Scratch from a pool: a step allocates nothing once warm.
		sc := listOf[routerScratch[F]]().get()
		defer listOf[routerScratch[F]]().put(sc)
		sc.v, sc.allowed = slices.Grow(sc.v[:0], E)[:E], slices.Grow(sc.allowed[:0], E)[:E]
		v, allowed = sc.v, sc.allowed
	}
	for t := 0; t < BT; t++ {
		l, p := logits[t*E:(t+1)*E], probs[t*E:(t+1)*E]
		if spec.Sigmoid {
			for e, z := range l {
				p[e] = sigmoidOf(z)
			}
		} else {
			softmaxRow(p, l)
		}
		sel, g := idx[t*K:(t+1)*K], gates[t*K:(t+1)*K]
		if plain {
			pickTop(sel, l, nil)
			for j, e := range sel {
				g[j] = l[e]
			}
			softmaxRow(g, g)
		} else {
			for e := range v {
				v[e] = p[e]
				if bias != nil {
					v[e] += bias[e]
				}
				allowed[e] = true
			}
			if spec.Groups > 0 {
				chooseGroups(allowed, v, spec.Groups, spec.GroupK, K/spec.GroupK)
			}
			pickTop(sel, v, allowed)
			var sum F
			for j, e := range sel {
				g[j] = p[e]
				sum += p[e]
			}
			if !spec.Raw {
				if spec.Sigmoid {
					sum += 1e-20 // Megatron's and DeepSeek-V3's guard against a zero sum
				}
				for j := range g {
					g[j] /= sum
				}
			}
		}
		if scale != 1 {
			for j := range g {
				g[j] *= scale
			}
		}
	}
}

// routerScratch is Router's per-call scratch (the choosing scores and the
// allowed experts), kept in a pool.
type routerScratch[F Float] struct {
	v       []F
	allowed []bool
}

// sigmoidOf is 1/(1+e^−z).
func sigmoidOf[F Float](z F) F { return F(1 / (1 + math.Exp(-float64(z)))) }

// pickTop fills sel with the indices of the len(sel) largest values of v among
// the allowed ones (allowed nil: all), by repeated maximum: K is small and the
// order is deterministic, ties to the lower index.
func pickTop[F Float](sel []int32, v []F, allowed []bool) {
	for j := range sel {
		best := -1
		for e, x := range v {
			if allowed != nil && !allowed[e] {
				continue
			}
			taken := false
			for _, s := range sel[:j] {
				taken = taken || int(s) == e
			}
			if !taken && (best < 0 || x > v[best]) {
				best = e
			}
		}
		sel[j] = int32(best)
	}
}

// chooseGroups keeps allowed only the experts of the keep best of G groups of
// len(v)/G experts, each group scored by the sum of its n largest values of v
// (Megatron's group-limited routing; ties to the lower group).
func chooseGroups[F Float](allowed []bool, v []F, G, keep, n int) {
	per := len(v) / G
	var score [maxGroups]F
	var top [maxGroups]int32
	for q := 0; q < G; q++ {
		pickTop(top[:n], v[q*per:(q+1)*per], nil)
		var sum F
		for _, e := range top[:n] {
			sum += v[q*per+int(e)]
		}
		score[q] = sum
	}
	pickTop(top[:keep], score[:G], nil)
	for e := range allowed {
		allowed[e] = false
	}
	for _, q := range top[:keep] {
		for e := int(q) * per; e < (int(q)+1)*per; e++ {
			allowed[e] = true
		}
	}
}

// maxGroups bounds a router's groups (and the experts a group scores by), as
// model.moe.num_groups' bound does.
const maxGroups = 4096

// RouterBackward accumulates into dlogits (BT,E) the gradient through the gates
// (dgates, the gradient of the selected gates) and through the probabilities
// (dprobs (BT,E), may be nil), for the scores and gates s.Router names.
func RouterBackward[F Float](dlogits, dgates, dprobs, gates, probs []F, r Routing, s tensor.MoEShape) {
	idx := r.Idx
	BT, E, K, spec := s.BT, s.E, s.K, s.Router
	c := F(spec.GateScale())
	if !spec.Sigmoid && !spec.Raw {
		// The gates are c·softmax of the chosen logits.
		for t := 0; t < BT; t++ {
			g, dg := gates[t*K:(t+1)*K], dgates[t*K:(t+1)*K]
			var dot F
			for j := range g {
				dot += g[j] * dg[j]
			}
			for j := range g {
				if c == 1 {
					dlogits[t*E+int(idx[t*K+j])] += g[j] * (dg[j] - dot)
				} else {
					dlogits[t*E+int(idx[t*K+j])] += g[j] / c * (c*dg[j] - dot)
				}
			}
			if dprobs == nil {
				continue
			}
			p, dp := probs[t*E:(t+1)*E], dprobs[t*E:(t+1)*E]
			dot = 0
			for e := range p {
				dot += p[e] * dp[e]
			}
			for e := range p {
				dlogits[t*E+e] += p[e] * (dp[e] - dot)
			}
		}
		return
	}
	sc := listOf[routerScratch[F]]().get()
	defer listOf[routerScratch[F]]().put(sc)
	sc.v = slices.Grow(sc.v[:0], E)[:E]
	ds := sc.v // the gradient of each score
	for t := 0; t < BT; t++ {
		g, dg, sel := gates[t*K:(t+1)*K], dgates[t*K:(t+1)*K], idx[t*K:(t+1)*K]
		p := probs[t*E : (t+1)*E]
		for e := range ds {
			ds[e] = 0
			if dprobs != nil {
				ds[e] = dprobs[t*E+e]
			}
		}
		if spec.Raw {
			for j, e := range sel {
				ds[e] += c * dg[j]
			}
		} else {
			// g_j = c·s_j/S, S the chosen scores' sum: ∂/∂s_j = (c·dg_j − Σ dg·g)/S.
			var sum, dot F
			for j, e := range sel {
				sum += p[e]
				dot += dg[j] * g[j]
			}
			if spec.Sigmoid {
				sum += 1e-20
			}
			for j, e := range sel {
				ds[e] += (c*dg[j] - dot) / sum
			}
		}
		if spec.Sigmoid {
			for e, pe := range p {
				dlogits[t*E+e] += ds[e] * pe * (1 - pe)
			}
			continue
		}
		var dot F
		for e := range p {
			dot += p[e] * ds[e]
		}
		for e := range p {
			dlogits[t*E+e] += p[e] * (ds[e] - dot)
		}
	}
}

// ScaleCopies multiplies each kept copy's row of xperm by its gate: the token
// scaled before its expert.
func ScaleCopies[F Float](xperm, gates []F, r Routing, s tensor.MoEShape) {
	C := s.C
	for i, row := range r.Row[:s.BT*s.K] {
		if row < 0 {
			continue
		}
		g, x := gates[i], xperm[int(row)*C:(int(row)+1)*C]
		for c := range x {
			x[c] *= g
		}
	}
}

// ScaleCopiesBackward sets dgates to each kept copy's dxperm row · its
// token's row of x (0 when dropped), then scales the row by the gate in place.
func ScaleCopiesBackward[F Float](dgates, dxperm, x, gates []F, r Routing, s tensor.MoEShape) {
	C, K := s.C, s.K
	for i, row := range r.Row[:s.BT*K] {
		if row < 0 {
			dgates[i] = 0
			continue
		}
		d, xt := dxperm[int(row)*C:(int(row)+1)*C], x[i/K*C:(i/K+1)*C]
		var dot F
		for c := range d {
			dot += d[c] * xt[c]
		}
		dgates[i] = dot
		g := gates[i]
		for c := range d {
			d[c] *= g
		}
	}
}

// ExpertBiasUpdate adds rate·sign(mean(load) − load[lo+i]) to bias[i], the
// bias of expert lo+i (the mean of the E loads in float64).
func ExpertBiasUpdate[F Float](bias, load []F, E, lo int, rate float64) {
	var mean float64
	for _, n := range load[:E] {
		mean += float64(n)
	}
	mean /= float64(E)
	for i := range bias {
		switch d := mean - float64(load[lo+i]); {
		case d > 0:
			bias[i] += F(rate)
		case d < 0:
			bias[i] -= F(rate)
		}
	}
}

// Dispatch assigns each copy (t, j) a row in expert-major order (tokens in order
// within an expert), keeping at most s.Capacity copies per expert, and gathers the
// tokens' rows of x (BT,C) into xperm. It reads r.Idx and fills r.Row and
// r.Offsets, the cumulative counts of kept copies (Offsets[E] of them); r.Cursor
// is scratch. Packed, the kept copies are rows 0..Offsets[E] and r.Tok names
// each row's token; with s.Padded, expert e's copies start at row e·Capacity,
// the segments' unused rows are zeroed, and r.Tok is not written.
func Dispatch[F Float](xperm, x []F, r Routing, s tensor.MoEShape) {
	row, tok, offsets, cursor, idx := r.Row, r.Tok, r.Offsets, r.Cursor, r.Idx
	C, E, K, capacity := s.C, s.E, s.K, s.Capacity
	for e := range offsets {
		offsets[e] = 0
	}
	for i, e := range idx {
		if int(offsets[e+1]) < capacity {
			offsets[e+1]++
			row[i] = 0
		} else {
			row[i] = -1
		}
	}
	if s.Padded {
		for e := 0; e < E; e++ {
			cursor[e] = int32(e * capacity)
			clear(xperm[(e*capacity+int(offsets[e+1]))*C : (e+1)*capacity*C]) // the segment's unused rows
		}
	}
	for e := 0; e < E; e++ {
		offsets[e+1] += offsets[e]
	}
	if !s.Padded {
		copy(cursor, offsets[:E])
	}
	for i, e := range idx {
		if row[i] < 0 {
			continue
		}
		r := cursor[e]
		cursor[e]++
		row[i] = r
		if !s.Padded {
			tok[r] = int32(i / K)
		}
		copy(xperm[int(r)*C:int(r+1)*C], x[(i/K)*C:(i/K+1)*C])
	}
}

// DispatchBackward accumulates the permuted rows' gradients dxperm back onto their
// tokens: dx[t] += dxperm[row] for each kept copy. Packed it runs over the rows
// 0..r.Offsets[E] in order; Padded over each token's copies in order.
func DispatchBackward[F Float](dx, dxperm []F, rt Routing, s tensor.MoEShape) {
	C := s.C
	if s.Padded {
		for i, r := range rt.Row {
			if r < 0 {
				continue
			}
			t := i / s.K
			d, src := dx[t*C:(t+1)*C], dxperm[int(r)*C:int(r+1)*C]
			for c := range d {
				d[c] += src[c]
			}
		}
		return
	}
	tok := rt.Tok
	for r := 0; r < int(rt.Offsets[s.E]); r++ {
		d, s := dx[int(tok[r])*C:int(tok[r]+1)*C], dxperm[r*C:(r+1)*C]
		for c := range d {
			d[c] += s[c]
		}
	}
}

// Combine adds each token's expert outputs with their gates: out[t] += Σ_j
// gates[t,j] · y[row[t,j]] (dropped copies contribute nothing).
func Combine[F Float](out, y, gates []F, r Routing, s tensor.MoEShape) {
	row := r.Row
	j := getJob[combineJob[F]]()
	*j = combineJob[F]{out: out, y: y, gates: gates, row: row, C: s.C, K: s.K}
	parallel(j, s.BT, s.K*s.C)
	putJob(j)
}

// combineJob is Combine or, with back set, CombineBackward.
type combineJob[F Float] struct {
	out, y, gates, dy, dgates []F
	row                       []int32
	C, K                      int
	back                      bool
}

func (j *combineJob[F]) rows(_, lo, hi int) {
	if j.back {
		j.backward(lo, hi)
		return
	}
	out, y, gates, row, C, K := j.out, j.y, j.gates, j.row, j.C, j.K
	for t := lo; t < hi; t++ {
		o := out[t*C : (t+1)*C]
		for j := 0; j < K; j++ {
			r := row[t*K+j]
			if r < 0 {
				continue
			}
			g, yr := gates[t*K+j], y[int(r)*C:int(r+1)*C]
			for c := range o {
				o[c] += g * yr[c]
			}
		}
	}
}

// CombineBackward sets dy[row[t,j]] = gates[t,j] · dout[t] and dgates[t,j] =
// dout[t] · y[row[t,j]] (0 if dropped). Packed, the rows no kept copy has are
// left alone; Padded, they are zeroed (the experts' backward runs over whole
// segments).
func CombineBackward[F Float](dy, dgates, dout, y, gates []F, r Routing, s tensor.MoEShape) {
	row := r.Row
	if s.Padded {
		clear(dy[:s.Rows()*s.C])
	}
	j := getJob[combineJob[F]]()
	*j = combineJob[F]{out: dout, y: y, gates: gates, dy: dy, dgates: dgates, row: row, C: s.C, K: s.K, back: true}
	parallel(j, s.BT, 2*s.K*s.C)
	putJob(j)
}

// backward is CombineBackward over tokens [lo, hi) (out holds dout).
func (j *combineJob[F]) backward(lo, hi int) {
	dy, dgates, dout, y, gates, row, C, K := j.dy, j.dgates, j.out, j.y, j.gates, j.row, j.C, j.K
	for t := lo; t < hi; t++ {
		do := dout[t*C : (t+1)*C]
		for j := 0; j < K; j++ {
			r := row[t*K+j]
			dgates[t*K+j] = 0
			if r < 0 {
				continue
			}
			g, yr, d := gates[t*K+j], y[int(r)*C:int(r+1)*C], dy[int(r)*C:int(r+1)*C]
			var s F
			for c, v := range do {
				s += v * yr[c]
				d[c] = g * v
			}
			dgates[t*K+j] = s
		}
	}
}

// softmaxRow writes softmax(src) into dst (which may alias src): in float32
// rows, the exponentials sixteen at a time (vexp32, about 1 ulp) and their sum
// in float64; in float64 rows (the reference), all in float64.
func softmaxRow[F Float](dst, src []F) {
	if d, ok := any(dst).([]float32); ok {
		softmaxRow32(d, any(src).([]float32))
		return
	}
	mx := math.Inf(-1)
	for _, v := range src {
		mx = math.Max(mx, float64(v))
	}
	var sum float64
	for i, v := range src {
		e := math.Exp(float64(v) - mx)
		dst[i] = F(e)
		sum += e
	}
	for i := range dst {
		dst[i] = F(float64(dst[i]) / sum)
	}
}

// softmaxRow32 is softmaxRow of a float32 row: e^(x − max) by vexp32, summed
// and divided in float64. A NaN or infinite logit makes the row NaN, as in
// float64.
func softmaxRow32(dst, src []float32) {
	if len(src) == 0 {
		return
	}
	mx := maxOf(src)
	for i, v := range src {
		dst[i] = v - mx
	}
	vexp32(dst, dst)
	var sum float64
	for _, e := range dst {
		sum += float64(e)
	}
	for i, e := range dst {
		dst[i] = float32(float64(e) / sum)
	}
}

// AdamW applies one step of AdamW with decoupled weight decay wd to params (see
// trainer/optim for the schedule), from the gradients clipped by clip (each g
// read as F(g·clip), the value scaling them in place with Scale leaves):
// m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²; p −= lr·(m̂/(√v̂ + ε) + wd·p),
// with bias correction at step t (1-based). compute, unless nil, receives the
// updated params rounded to bf16 (as ToBF16), block by block while they are in
// cache.
func AdamW[F Float](params []F, compute []tensor.BF16, grads, m, v []F, lr, beta1, beta2, eps, wd, clip float64, t int) {
	j := getJob[optimJob[F]]()
	*j = optimJob[F]{params: params, compute: compute, grads: grads, m: m, v: v, adam: true, b1: F(beta1), b2: F(beta2),
		c1: F(1 / (1 - math.Pow(beta1, float64(t)))), c2: F(1 / (1 - math.Pow(beta2, float64(t)))), eps: F(eps), lr: F(lr), wd: F(wd), clip: F(clip)}
	parallel(j, len(grads), 16)
	putJob(j)
}

// SGD applies one step of SGD with momentum and decoupled weight decay, from
// the gradients clipped by clip, as AdamW: buf = μ·buf + g; p −= lr·(buf + wd·p).
// compute as AdamW's.
func SGD[F Float](params []F, compute []tensor.BF16, grads, buf []F, lr, momentum, wd, clip float64) {
	j := getJob[optimJob[F]]()
	*j = optimJob[F]{params: params, compute: compute, grads: grads, m: buf, b1: F(momentum), lr: F(lr), wd: F(wd), clip: F(clip)}
	parallel(j, len(grads), 6)
	putJob(j)
}

// optimJob is an AdamW step (adam) or an SGD step (m is the momentum buffer, b1
// the momentum) over elements [lo, hi), with the gradients scaled by clip and,
// when compute is set, the bf16 copy of the updated params written.
type optimJob[F Float] struct {
	params, grads, m, v               []F
	compute                           []tensor.BF16
	adam                              bool
	b1, b2, c1, c2, eps, lr, wd, clip F
}

func (j *optimJob[F]) rows(_, lo, hi int) {
	if j.compute == nil {
		j.update(lo, hi)
		return
	}
	for a := lo; a < hi; a += bf16Block {
		b := min(a+bf16Block, hi)
		j.update(a, b)
		if p32, ok := any(j.params[a:b]).([]float32); ok {
			toBF16Rows(j.compute[a:b], p32)
			continue
		}
		for i, p := range j.params[a:b] {
			j.compute[a+i] = tensor.ToBF16(float32(p))
		}
	}
}

// update is the optimizer's step over elements [lo, hi). Each gradient is
// scaled by clip in a product of its own (F(…) rounds it there, so that no
// compiler fuses it into the next operation): the update then rounds as it did
// on gradients scaled in place beforehand.
func (j *optimJob[F]) update(lo, hi int) {
	params, grads, m := j.params[lo:hi], j.grads[lo:hi], j.m[lo:hi]
	grads, m = grads[:len(params)], m[:len(params)]
	b1, flr, fwd, fc := j.b1, j.lr, j.wd, j.clip
	if !j.adam {
		for i, g := range grads {
			g = F(g * fc)
			m[i] = b1*m[i] + g
			params[i] -= flr * (m[i] + fwd*params[i])
		}
		return
	}
	v := j.v[lo:hi]
	v = v[:len(params)]
	b2, c1, c2, fe := j.b2, j.c1, j.c2, j.eps
	if p32, ok := any(params).([]float32); ok {
		k := [10]float32{float32(b1), float32(1 - b1), float32(b2), float32(1 - b2), float32(c1), float32(c2), float32(fe), float32(flr), float32(fwd), float32(fc)}
		done := adamw32(p32, any(grads).([]float32), any(m).([]float32), any(v).([]float32), &k)
		params, grads, m, v = params[done:], grads[done:], m[done:], v[done:]
	}
	for i, g := range grads {
		g = F(g * fc)
		mi := b1*m[i] + (1-b1)*g
		vi := b2*v[i] + (1-b2)*g*g
		m[i], v[i] = mi, vi
		p := params[i]
		params[i] = p - flr*(mi*c1/(F(math.Sqrt(float64(vi*c2)))+fe)+fwd*p)
	}
}

// ToBF16 rounds src to the nearest bf16 values (ties to even, as tensor.ToBF16)
// into dst: float32 sixteen values an instruction where the CPU has AVX-512,
// blocks shared among the cores.
func ToBF16[F Float](dst []tensor.BF16, src []F) {
	dst = dst[:len(src)]
	if x, ok := any(src).([]float32); ok {
		j := getJob[toBF16Job]()
		j.dst, j.src = dst, x
		parallel(j, (len(x)+bf16Block-1)/bf16Block, 2*bf16Block)
		putJob(j)
		return
	}
	for i, v := range src {
		dst[i] = tensor.ToBF16(float32(v))
	}
}

// bf16Block is the values of one block of ToBF16.
const bf16Block = 4096

type toBF16Job struct {
	dst []tensor.BF16
	src []float32
}

func (j *toBF16Job) rows(_, lo, hi int) {
	a, b := lo*bf16Block, min(hi*bf16Block, len(j.src))
	toBF16Rows(j.dst[a:b], j.src[a:b])
}

// FromBF16 widens src into dst (same length), exactly: float32 a 32-value panel
// at a time where the CPU has AVX-512, blocks shared among the cores.
func FromBF16[F Float](dst []F, src []tensor.BF16) {
	dst = dst[:len(src)]
	if x, ok := any(dst).([]float32); ok {
		j := getJob[fromBF16Job]()
		j.dst, j.src = x, src
		parallel(j, (len(x)+bf16Block-1)/bf16Block, 2*bf16Block)
		putJob(j)
		return
	}
	for i, v := range src {
		dst[i] = F(v.Float32())
	}
}

type fromBF16Job struct {
	dst []float32
	src []tensor.BF16
}

func (j *fromBF16Job) rows(_, lo, hi int) {
	a, b := lo*bf16Block, min(hi*bf16Block, len(j.src))
	dst, src := j.dst[a:b], j.src[a:b]
	bulk := len(src) / nr * nr // bf16Block is a multiple of nr: only the last block has a tail
	widenPanel(dst, src, nr, bulk/nr)
	tensor.CastToFloat32(dst[bulk:], src[bulk:])
}

// SumSquares is Σ x² in float64: fixed blocks of the slice (their size depends on
// its length alone) are summed on the cores, and the block sums added in order,
// so the result is the same on any number of cores.
func SumSquares[F Float](x []F) float64 {
	if len(x) == 0 {
		return 0
	}
	j := getJob[sumSquaresJob[F]]()
	j.x = x
	chunks := run(j, len(x), sumBlock)
	var s float64
	for c := range chunks {
		s += j.part[c]
	}
	putJob(j)
	return s
}

// sumBlock is the fewest values a block of SumSquares sums.
const sumBlock = 1 << 14

type sumSquaresJob[F Float] struct {
	x    []F
	part [maxChunks]float64
}

func (j *sumSquaresJob[F]) rows(c, lo, hi int) { j.part[c] = sumSquares(j.x[lo:hi]) }

// Scale multiplies x by f in place.
func Scale[F Float](x []F, f float64) {
	j := getJob[scaleJob[F]]()
	*j = scaleJob[F]{x, F(f)}
	parallel(j, len(x), 1)
	putJob(j)
}

type scaleJob[F Float] struct {
	x []F
	f F
}

func (j *scaleJob[F]) rows(_, lo, hi int) {
	for i := range j.x[lo:hi] {
		j.x[lo+i] *= j.f
	}
}

// The experts' products run over the segments a routing leaves: expert e's rows
// are offsets[e]..offsets[e+1] of the permuted buffers, read here, by the
// backend, so that no count goes back to the caller (a GPU runs them as grouped
// products the same way).

// ExpertsMatmul is out_e (n_e,OC) = inp_e (n_e,C) · w[e] (OC,C)ᵀ for each expert e
// of w over its segment (s.Span: offsets, or the static segments; += with
// accumulate); rows outside the segments are left alone.
func ExpertsMatmul[F Float](out []F, inp tensor.Weights[F], w []tensor.Weights[F], offsets []int32, s tensor.ExpertsShape, accumulate bool) {
	j := getExpertsJob[F]()
	j.out, j.inp, j.w, j.offsets, j.s, j.accumulate = out, inp, append(j.w, w...), offsets, s, accumulate
	j.run()
	j.put()
}

// ExpertsMatmulBackward is MatmulBackward per expert over its segment: dw[e]
// accumulates; dinp's segments are overwritten unless accumulate.
func ExpertsMatmulBackward[F Float](dinp []F, dw [][]F, dout []F, inp tensor.Weights[F], w []tensor.Weights[F], offsets []int32, s tensor.ExpertsShape, accumulate bool) {
	j := getExpertsJob[F]()
	for _, d := range dw {
		j.dw = append(j.dw, FloatGradient(d))
	}
	j.dinp, j.out, j.inp, j.w, j.offsets, j.s, j.accumulate, j.back = dinp, dout, inp, append(j.w, w...), offsets, s, accumulate, true
	j.run()
	j.put()
}

// expertsJob is ExpertsMatmul or, with back set, ExpertsMatmulBackward (out
// then holds dout). Its slices of experts are kept, emptied, when it is
// recycled, so the steady state allocates nothing.
type expertsJob[F Float] struct {
	out, dinp  []F
	dw         []Gradient[F]
	inp        tensor.Weights[F]
	w          []tensor.Weights[F]
	offsets    []int32
	s          tensor.ExpertsShape
	accumulate bool
	back       bool
}

// getExpertsJob returns a recycled job with empty expert slices.
func getExpertsJob[F Float]() *expertsJob[F] { return getJob[expertsJob[F]]() }

// put clears the job, keeping its expert slices' room, and recycles it.
func (j *expertsJob[F]) put() {
	clear(j.w)
	clear(j.dw)
	w, dw := j.w[:0], j.dw[:0]
	*j = expertsJob[F]{w: w, dw: dw}
	listOf[expertsJob[F]]().put(j)
}

// run shares the experts among the cores, each expert's products on one core,
// when there are enough experts to keep every core busy and none holds more
// than its share of the rows: one parallel region instead of one per expert,
// and each expert's rows in one core's cache. Otherwise each expert's product
// is shared among the cores in turn. Every expert's result is computed alike
// either way (Sgemm splits no sum), so the two give the same values.
func (j *expertsJob[F]) run() {
	E, w := len(j.w), threads()
	if w > 1 && E >= 2*w {
		total, most := 0, 0
		for e := range E {
			lo, hi := j.s.Span(j.offsets, e)
			total += hi - lo
			most = max(most, hi-lo)
		}
		if most*w <= total {
			run(j, E, 1)
			return
		}
	}
	j.rows(0, 0, E)
}

// rows runs experts [lo, hi). Inside the region run opens, a product finds no
// idle core while the others work on their experts, and runs its parts one
// after another on the caller's.
func (j *expertsJob[F]) rows(_, lo, hi int) {
	C, OC := j.s.C, j.s.OC
	for e := lo; e < hi; e++ {
		r0, r1 := j.s.Span(j.offsets, e)
		if r1 == r0 {
			continue
		}
		shape := tensor.MatmulShape{BT: r1 - r0, C: C, OC: OC}
		if j.back {
			MatmulBackwardInto(j.dinp[r0*C:r1*C], j.dw[e], j.out[r0*OC:r1*OC], j.inp.Slice(r0*C, r1*C), j.w[e], shape, j.accumulate)
		} else {
			Matmul(j.out[r0*OC:r1*OC], j.inp.Slice(r0*C, r1*C), j.w[e], shape, j.accumulate)
		}
	}
}

// ExpertsSwiGLU is SwiGLU over the rows of width values in the segments, rows
// offsets[0]..offsets[len(offsets)−1].
func ExpertsSwiGLU[F Float](out, gate, up []F, offsets []int32, width int) {
	lo, hi := int(offsets[0])*width, int(offsets[len(offsets)-1])*width
	SwiGLU(out[lo:hi], gate[lo:hi], up[lo:hi], hi-lo)
}

// ExpertsSwiGLUBackward is SwiGLUBackward over the same rows.
func ExpertsSwiGLUBackward[F Float](dgate, dup, dout, gate, up []F, offsets []int32, width int, accumulate bool) {
	lo, hi := int(offsets[0])*width, int(offsets[len(offsets)-1])*width
	SwiGLUBackward(dgate[lo:hi], dup[lo:hi], dout[lo:hi], gate[lo:hi], up[lo:hi], hi-lo, accumulate)
}

// RouterStats sets stats (2E) to each expert's kept copies (from r.Offsets), then
// each expert's router probability summed over the BT tokens (in float64, token
// order): what the load-balancing loss needs, and what the ranks that split a
// sequence's tokens add up.
func RouterStats[F Float](stats, probs []F, r Routing, s tensor.MoEShape) {
	E := s.E
	for e := 0; e < E; e++ {
		var pe float64
		for t := 0; t < s.BT; t++ {
			pe += float64(probs[t*E+e])
		}
		stats[e], stats[E+e] = F(r.Offsets[e+1]-r.Offsets[e]), F(pe)
	}
}

// AuxLoss sets dst[0] to Switch Transformer's load-balancing loss E·Σ_e f_e·P_e
// from stats (RouterStats', over tokens tokens: f_e = stats[e]/(tokens·K), P_e =
// stats[E+e]/tokens) and dst[1] to the copies this routing dropped past capacity
// (BT·K − r.Offsets[E]); both are added with accumulate.
func AuxLoss[F Float](dst tensor.Buffer, stats []F, r Routing, s tensor.MoEShape, tokens int, accumulate bool) {
	d := statsView("AuxLoss", dst, 2)
	if d == nil {
		return
	}
	E, K, n := s.E, s.K, float64(tokens)
	var aux float64
	for e := 0; e < E; e++ {
		aux += float64(E) * float64(stats[e]) / (n * float64(K)) * float64(stats[E+e]) / n
	}
	dropped := float64(s.BT*K) - float64(r.Offsets[E])
	if accumulate {
		aux, dropped = d[0]+aux, d[1]+dropped
	}
	d[0], d[1] = aux, dropped
}

// AuxLossBackward sets dprobs (BT,E) to the gradient of coeff·aux through the
// router probabilities: coeff·E·f_e/tokens for every token (f is a count).
func AuxLossBackward[F Float](dprobs, stats []F, s tensor.MoEShape, tokens int, coeff float64) {
	E, K, n := s.E, s.K, float64(tokens)
	for e := 0; e < E; e++ {
		d := F(coeff * float64(E) * float64(stats[e]) / (n * float64(K)) / n)
		for t := 0; t < s.BT; t++ {
			dprobs[t*E+e] = d
		}
	}
}
