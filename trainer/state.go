package trainer

import (
	"runtime"
	"sync"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/trainer/model"
	"github.com/shardline/shardline/trainer/optim"
)

// state is one rank's training state, laid out by the plan: per parameter group a
// flat buffer of compute weights, gradients, fp32 main weights (only when the
// compute dtype is bf16) and optimizer moments; per parameter, views into them.
type state struct {
	plan    *parallel.Plan
	weights [][]float32 // per group: compute weights (bf16-rounded when bf16)
	grads   [][]float32
	main    [][]float32 // per group: fp32 main weights, or the weights themselves
	m, v    [][]float32
	wviews  [][]float32 // per parameter (table order)
	gviews  [][]float32
	decay   []bool // per group entry, in group order: is weight decay applied
	bf16    bool
	be      tensor.Backend
}

func newState(p *parallel.Plan, r *config.Recipe, be tensor.Backend) *state {
	s := &state{plan: p, wviews: make([][]float32, len(p.Params)), gviews: make([][]float32, len(p.Params)), bf16: r.Precision.BF16, be: be}
	for gi := range p.Groups {
		g := &p.Groups[gi]
		w, gr := make([]float32, g.Padded), make([]float32, g.Padded)
		s.weights, s.grads = append(s.weights, w), append(s.grads, gr)
		s.m, s.v = append(s.m, make([]float32, g.Padded)), append(s.v, make([]float32, g.Padded))
		main := w
		if s.bf16 {
			main = make([]float32, g.Padded)
		}
		s.main = append(s.main, main)
		for _, e := range g.Entries {
			s.wviews[e.Param] = w[e.Offset : e.Offset+e.Numel]
			s.gviews[e.Param] = gr[e.Offset : e.Offset+e.Numel]
			s.decay = append(s.decay, !p.Params[e.Param].NoDecay || r.Train.DecayNormsAndEmbeddings)
		}
	}
	return s
}

// init fills every parameter from (seed, name, index) into the main weights, and
// the compute weights from them.
func (s *state) init(r *config.Recipe) {
	for gi := range s.plan.Groups {
		g := &s.plan.Groups[gi]
		for _, e := range g.Entries {
			model.InitParam(s.main[gi][e.Offset:e.Offset+e.Numel], &s.plan.Params[e.Param], 0, r.Run.Seed, r.Model.InitStd, r.Model.Layers)
		}
		s.syncCompute(gi)
	}
}

// syncCompute refreshes group gi's compute weights from its main weights.
func (s *state) syncCompute(gi int) {
	if !s.bf16 {
		return
	}
	copy(s.weights[gi], s.main[gi])
	s.be.RoundBF16(s.weights[gi])
}

func (s *state) zeroGrads() {
	for _, g := range s.grads {
		clear(g)
	}
}

// gradNorm is the global L2 norm of the gradients.
func (s *state) gradNorm() float64 {
	var ss float64
	for _, g := range s.grads {
		ss += optim.SquaredNorm(g)
	}
	return sqrt(ss)
}

// step applies the optimizer to every parameter (decay per parameter) and refreshes
// the compute weights: train.optimizer adamw or adam (Megatron's adam is AdamW with
// decoupled weight decay) runs AdamW, sgd runs SGD with momentum train.beta1 (its
// buffer is the first-moment buffer).
//
// Parameters are updated on every core: each element's update depends only on its
// own values, so the split does not change any bit of the result.
func (s *state) step(tr config.Train, lr float64, t int) {
	type job struct {
		gi     int
		lo, hi int64
		decay  bool
	}
	var jobs []job
	k := 0
	for gi := range s.plan.Groups {
		for _, e := range s.plan.Groups[gi].Entries {
			jobs = append(jobs, job{gi, e.Offset, e.Offset + e.Numel, s.decay[k]})
			k++
		}
	}
	workers := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(jobs); i += workers {
				j := jobs[i]
				wd := tr.WeightDecay
				if !j.decay {
					wd = 0
				}
				p, g, m, v := s.main[j.gi][j.lo:j.hi], s.grads[j.gi][j.lo:j.hi], s.m[j.gi][j.lo:j.hi], s.v[j.gi][j.lo:j.hi]
				if tr.Optimizer == "sgd" {
					s.be.SGD(p, g, m, lr, tr.Beta1, wd)
				} else {
					s.be.AdamW(p, g, m, v, lr, tr.Beta1, tr.Beta2, tr.Eps, wd, t)
				}
			}
		}()
	}
	wg.Wait()
	for gi := range s.plan.Groups {
		s.syncCompute(gi)
	}
}

// bytes reports what the state holds, by plan memory component.
func (s *state) bytes() (weights, main, grads, optState int64) {
	for gi := range s.weights {
		n := int64(len(s.weights[gi])) * 4
		weights += n
		grads += n
		optState += 2 * n
		if s.bf16 {
			main += n
		}
	}
	return
}
