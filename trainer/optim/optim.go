package optim

import "math"

// Schedule is the learning rate at a step: linear warmup from 0 over Warmup steps,
// then Decay ("cosine", "linear" or "constant") from Peak to Peak·MinFactor at Steps.
type Schedule struct {
	Peak      float64
	Warmup    int
	Steps     int
	MinFactor float64
	Decay     string
}

// LR returns the learning rate of step (0-based).
func (s Schedule) LR(step int) float64 {
	if step < s.Warmup {
		return s.Peak * float64(step+1) / float64(s.Warmup)
	}
	if s.Decay == "constant" || s.Steps <= s.Warmup {
		return s.Peak
	}
	p := math.Min(1, float64(step-s.Warmup)/float64(max(1, s.Steps-s.Warmup-1)))
	minLR := s.Peak * s.MinFactor
	switch s.Decay {
	case "linear":
		return s.Peak - (s.Peak-minLR)*p
	default: // cosine
		return minLR + 0.5*(s.Peak-minLR)*(1+math.Cos(math.Pi*p))
	}
}

// AdamW holds the hyper-parameters of Loshchilov & Hutter's AdamW.
type AdamW struct {
	Beta1, Beta2, Eps, WeightDecay float64
}

// Update applies one AdamW step to params with grads and moments m, v (same length):
// m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²; p −= lr·(m̂/(√v̂ + ε) + wd·p), with
// bias-corrected m̂, v̂ at step t (1-based). decay false skips the weight decay.
func (o AdamW) Update(params, grads, m, v []float32, lr float64, t int, decay bool) {
	b1, b2 := float32(o.Beta1), float32(o.Beta2)
	c1 := float32(1 / (1 - math.Pow(o.Beta1, float64(t))))
	c2 := float32(1 / (1 - math.Pow(o.Beta2, float64(t))))
	eps, flr := float32(o.Eps), float32(lr)
	wd := float32(0)
	if decay {
		wd = float32(o.WeightDecay)
	}
	for i, g := range grads {
		mi := b1*m[i] + (1-b1)*g
		vi := b2*v[i] + (1-b2)*g*g
		m[i], v[i] = mi, vi
		p := params[i]
		params[i] = p - flr*(mi*c1/(float32(math.Sqrt(float64(vi*c2)))+eps)+wd*p)
	}
}

// SGD is stochastic gradient descent with momentum and decoupled weight decay.
type SGD struct {
	Momentum, WeightDecay float64
}

// Update applies buf = μ·buf + g; p −= lr·(buf + wd·p).
func (o SGD) Update(params, grads, buf []float32, lr float64, decay bool) {
	mu, flr := float32(o.Momentum), float32(lr)
	wd := float32(0)
	if decay {
		wd = float32(o.WeightDecay)
	}
	for i, g := range grads {
		buf[i] = mu*buf[i] + g
		params[i] -= flr * (buf[i] + wd*params[i])
	}
}

// SquaredNorm is Σ g², accumulated in float64.
func SquaredNorm(g []float32) float64 {
	var s float64
	for _, x := range g {
		s += float64(x) * float64(x)
	}
	return s
}

// ClipFactor is the factor that scales gradients of global L2 norm `norm` to at most
// maxNorm (1 when clipping is off or not needed).
func ClipFactor(norm, maxNorm float64) float64 {
	if maxNorm <= 0 || norm <= maxNorm || norm == 0 {
		return 1
	}
	return maxNorm / (norm + 1e-6)
}

// Scale multiplies g by f.
func Scale(g []float32, f float64) {
	if f == 1 {
		return
	}
	ff := float32(f)
	for i := range g {
		g[i] *= ff
	}
}
