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
