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

// torchtitanLR is torchtitan's linear_warmup_stable_decay factor (its
// components/lr_scheduler.py) with no stable phase beyond the one step its
// formula always has: the schedule recipe import torchtitan maps onto
// lr_decay_steps = steps - warmup_steps.
func torchtitanLR(step, warmup, total int, decay string, minF float64) float64 {
	decaySteps := total - warmup
	stable := total + 1 - warmup - decaySteps
	switch {
	case step < warmup:
		return float64(step+1) / float64(warmup)
	case step < warmup+stable:
		return 1
	}
	p := float64(step+1-warmup-stable) / float64(decaySteps)
	c := 1 - p
	if decay == "cosine" {
		c = 0.5 * (1 + math.Cos(math.Pi*p))
	}
	return minF + (1-minF)*c
}

// TestScheduleDecaySteps: with DecaySteps = steps - warmup the schedule is
// torchtitan's at every step (tolerance 1e-12: the same arithmetic in another
// order), and past DecaySteps it holds the minimum.
func TestScheduleDecaySteps(t *testing.T) {
	for _, c := range []struct{ warmup, total int }{{2, 10}, {200, 1000}, {0, 7}, {5, 6}} {
		for _, decay := range []string{"linear", "cosine"} {
			s := Schedule{Peak: 1, Warmup: c.warmup, Steps: c.total, MinFactor: 0.1, Decay: decay, DecaySteps: c.total - c.warmup}
			for step := 0; step < c.total; step++ {
				assert.InDelta(t, torchtitanLR(step, c.warmup, c.total, decay, 0.1), s.LR(step), 1e-12, "%+v %s step %d", c, decay, step)
			}
		}
	}
	s := Schedule{Peak: 2, Warmup: 10, Steps: 100, MinFactor: 0.25, Decay: "linear", DecaySteps: 40}
	assert.InDelta(t, 1.25, s.LR(30), 1e-12) // halfway down 2 → 0.5
	assert.Equal(t, 0.5, s.LR(50))
	assert.Equal(t, 0.5, s.LR(99))
}
