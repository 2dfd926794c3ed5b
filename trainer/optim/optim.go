package optim

import "math"

// Schedule is the learning rate at a step: linear warmup from 0 over Warmup steps,
// then Decay ("cosine", "linear" or "constant") from Peak to Peak·MinFactor over
// DecaySteps steps after warmup (0: ending at the last step, Steps-Warmup-1 steps
// after warmup), then Peak·MinFactor.
type Schedule struct {
	Peak       float64
	Warmup     int
	Steps      int
	MinFactor  float64
	Decay      string
	DecaySteps int
}

// LR returns the learning rate of step (0-based).
func (s Schedule) LR(step int) float64 {
	if step < s.Warmup {
		return s.Peak * float64(step+1) / float64(s.Warmup)
	}
	if s.Decay == "constant" || s.Steps <= s.Warmup {
		return s.Peak
	}
	span := s.DecaySteps
	if span <= 0 {
		span = max(1, s.Steps-s.Warmup-1)
	}
	p := math.Min(1, float64(step-s.Warmup)/float64(span))
	minLR := s.Peak * s.MinFactor
	switch s.Decay {
	case "linear":
		return s.Peak - (s.Peak-minLR)*p
	default: // cosine
		return minLR + 0.5*(s.Peak-minLR)*(1+math.Cos(math.Pi*p))
	}
}
