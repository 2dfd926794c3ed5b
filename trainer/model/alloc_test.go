package model

import (
	"testing"
	"time"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/internal/allocs"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/parallel/collective"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
)

// TestStepAllocatesNothing runs whole training steps (forward, backward, AdamW,
// clearing the gradients) on the dense Shakespeare-char model and on an MoE model
// (8 experts, top 2, one shared expert), each also with bf16 storage of the saved
// activations: the steady state of a step must allocate nothing (allocs.AssertSteady). The kernels' buffers belong to the chunk of work
// they serve, not to whichever goroutine ran it, so what a step allocates does not
// depend on scheduling.
func TestStepAllocatesNothing(t *testing.T) {
	moe := ShakespeareChar()
	moe.MoE = config.MoE{NumExperts: 8, TopK: 2, ExpertFFNHidden: 128, SharedExperts: 1, LayerFreq: 1, AuxLossCoeff: 0.01, ScoreFunction: "softmax", NormTopK: true, TopKScale: 1}
	// The routers of DeepSeek-V3 (sigmoid, groups, an expert bias) and Llama 4
	// (the token scaled before its expert), with QK-norm and a NoPE layer.
	router := moe
	router.QKNorm, router.NoPEInterval = true, 2
	router.MoE.ScoreFunction, router.MoE.TopKScale, router.MoE.NumGroups, router.MoE.GroupTopK, router.MoE.ExpertBias = "sigmoid", 2.5, 4, 2, true
	before := router
	before.MoE.ScoreBeforeExpert, before.MoE.NormTopK, before.MoE.NumGroups, before.MoE.GroupTopK = true, false, 0, 0
	for _, tc := range []struct {
		name string
		cfg  config.Model
		opt  []Option
	}{{"dense", ShakespeareChar(), nil}, {"moe", moe, nil}, {"moe-deepseek-router", router, nil}, {"moe-llama4-router", before, nil},
		{"dense-bf16-activations", ShakespeareChar(), []Option{WithBF16Activations()}},
		{"moe-bf16-activations", moe, []Option{WithBF16Activations()}}} {
		t.Run(tc.name, func(t *testing.T) {
			step := newRankStepper(t, tc.cfg, 12, 64, 1, 0, func(tensor.HostMemory) []Option { return tc.opt })
			allocs.AssertSteady(t, step)
		})
	}
}

// TestMeshStepAllocatesNothing: the same for two in-process ranks running steps
// together under tensor, context and expert parallelism (the collectives and the
// ring reuse their channels, timers and goroutine; each rank is a goroutine that
// lives through the test).
func TestMeshStepAllocatesNothing(t *testing.T) {
	dense := ShakespeareChar()
	dense.VocabSize = 64 // split over tp 2
	moe := dense
	moe.MoE = config.MoE{NumExperts: 8, TopK: 2, ExpertFFNHidden: 128, SharedExperts: 1, LayerFreq: 1, AuxLossCoeff: 0.01}
	for _, tc := range []struct {
		name       string
		cfg        config.Model
		tp, cp, ep int
	}{{"tp2", dense, 2, 1, 1}, {"cp2", dense, 1, 2, 1}, {"ep2", moe, 1, 1, 2}, {"tp2-moe", moe, 2, 1, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			world := comm.NewWorld(2, time.Minute)
			steps := make([]func(), 2)
			for r := range steps {
				opts := func(mem tensor.HostMemory) []Option {
					var opts []Option
					if tc.tp > 1 {
						opts = append(opts, WithTensorParallel(TensorParallel{Comm: tagged(t, world, r, "tp", mem), Rank: r, Size: 2}))
					}
					if tc.cp > 1 {
						opts = append(opts, WithContextParallel(ContextParallel{Comm: tagged(t, world, r, "cp", mem), Rank: r, Size: 2}))
					}
					if tc.ep > 1 {
						opts = append(opts, WithExpertParallel(ExpertParallel{Comm: tagged(t, world, r, "ep", mem), Rank: r, Size: 2}))
					}
					return opts
				}
				steps[r] = newRankStepper(t, tc.cfg, 12, 64, tc.tp, r%tc.tp, opts)
			}
			// Each rank is a goroutine for the whole test, stepping on a signal.
			start, done := [2]chan struct{}{make(chan struct{}), make(chan struct{})}, make(chan struct{}, 2)
			for r := range steps {
				go func() {
					for range start[r] {
						steps[r]()
						done <- struct{}{}
					}
				}()
			}
			defer func() {
				for r := range start {
					close(start[r])
				}
			}()
			allocs.AssertSteady(t, func() {
				for r := range start {
					start[r] <- struct{}{}
				}
				<-done
				<-done
			})
		})
	}
}

func tagged(t *testing.T, w *comm.World, r int, tag string, mem tensor.HostMemory) collective.Group {
	t.Helper()
	c, err := w.Tagged(r, []int{0, 1}, tag)
	if err != nil {
		t.Fatal(err)
	}
	return collective.OnHost(c, mem)
}

// newRankStepper builds a model of cfg with AdamW state, for tensor-parallel
// rank tpRank of tp with the model's parallelism options, made for the model's
// memory (nil: none), and returns one training step.
func newRankStepper(t *testing.T, cfg config.Model, B, T, tp, tpRank int, opts func(tensor.HostMemory) []Option) func() {
	t.Helper()
	table, err := parallel.ParamTable(cfg, tp, 1)
	if err != nil {
		t.Fatal(err)
	}
	n := len(table)
	w, g, m1, m2 := make([][]float32, n), make([][]float32, n), make([][]float32, n), make([][]float32, n)
	for i := range table {
		size := table[i].LocalNumel()
		w[i], g[i], m1[i], m2[i] = make([]float32, size), make([]float32, size), make([]float32, size), make([]float32, size)
		InitParamTP(w[i], &table[i], 0, tpRank, 1, cfg.InitStd, cfg.Layers)
	}
	be := cpu.Backend{}
	mem, wb, gb := onMemory(w, g, false)
	opt := []Option{WithMemory(mem)}
	if opts != nil {
		opt = append(opt, opts(mem)...)
	}
	m, err := New[float32](cfg, table, wb, gb, be, B, T, opt...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	local := B * m.T // tokens this rank holds (B·T/cp under context parallelism)
	tokens, targets := make([]int32, local), make([]int32, local)
	for i := range tokens {
		tokens[i], targets[i] = int32(i*7%cfg.VocabSize), int32((i*7+3)%cfg.VocabSize)
	}
	it, loss := 0, lossBuffer()
	return func() {
		it++
		for i := range g {
			clear(g[i])
		}
		m.Forward(tokens, targets, loss, false)
		m.Backward(tokens, targets, 1/float64(B*T))
		for i := range w {
			cpu.AdamW(w[i], nil, g[i], m1[i], m2[i], 1e-3, 0.9, 0.95, 1e-8, 0.1, 1, it)
		}
	}
}
