package optim

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSchedule(t *testing.T) {
	s := Schedule{Peak: 1, Warmup: 10, Steps: 110, MinFactor: 0.1, Decay: "cosine"}
	assert.InDelta(t, 0.1, s.LR(0), 1e-12)
	assert.InDelta(t, 1, s.LR(9), 1e-12)
	assert.InDelta(t, 1, s.LR(10), 1e-12)
	assert.InDelta(t, 0.55, s.LR(10+99/2), 0.01) // halfway down the cosine
	assert.InDelta(t, 0.1, s.LR(109), 1e-12)
	s.Decay = "linear"
	assert.InDelta(t, 0.1, s.LR(109), 1e-12)
	assert.InDelta(t, 1-0.9*50.0/99, s.LR(60), 1e-12)
	s.Decay = "constant"
	assert.Equal(t, 1.0, s.LR(100))
}

// TestAdamWByHand: two steps on one parameter, computed by hand in float64.
// Tolerance 1e-6: float32 arithmetic on values of order 1.
func TestAdamWByHand(t *testing.T) {
	o := AdamW{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}
	p, m, v := []float32{1}, []float32{0}, []float32{0}
	o.Update(p, []float32{0.5}, m, v, 0.01, 1, true)
	// m̂ = 0.5, v̂ = 0.25: update = 0.5/0.5 = 1; p = 1 − 0.01·(1 + 0.1·1) = 0.989
	assert.InDelta(t, 0.989, p[0], 1e-6)
	o.Update(p, []float32{-0.5}, m, v, 0.01, 2, false)
	m2, v2 := 0.9*0.05+0.1*-0.5, 0.95*0.0125+0.05*0.25
	mh, vh := m2/(1-0.81), v2/(1-0.9025)
	assert.InDelta(t, 0.989-0.01*mh/(math.Sqrt(vh)+1e-8), p[0], 1e-6)
}

func TestClip(t *testing.T) {
	g := []float32{3, 4}
	n := math.Sqrt(SquaredNorm(g))
	assert.Equal(t, 5.0, n)
	f := ClipFactor(n, 1)
	Scale(g, f)
	assert.InDelta(t, 1, math.Sqrt(SquaredNorm(g)), 1e-6)
	assert.Equal(t, 1.0, ClipFactor(0.5, 1))
	assert.Equal(t, 1.0, ClipFactor(10, 0))
}
