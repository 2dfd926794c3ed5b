package model

import (
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor/cpu"
)

// TestStepAllocatesNothing runs whole training steps (forward, backward, AdamW,
// clearing the gradients) on the dense Shakespeare-char model and on an MoE model
// (8 experts, top 2, one shared expert), and counts heap allocations in the whole
// process over rounds of steps after the first: the steady state of a step must
// allocate nothing. The kernels' buffers belong to the chunk of work they serve,
// not to whichever goroutine ran it, so what a step allocates does not depend on
// scheduling; the garbage collector is off so that it cannot allocate in the count.
//
// The runtime itself may allocate once in a while beside the step (a new OS
// thread, when a goroutine yields and no idle thread is left to run another);
// that is not the step's doing and it does not recur, so the test passes when one
// of a few rounds allocates nothing. Anything a step allocates on every call fails
// every round.
func TestStepAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own; this test runs in the plain suite")
	}
	moe := ShakespeareChar()
	moe.MoE = config.MoE{NumExperts: 8, TopK: 2, ExpertFFNHidden: 128, SharedExperts: 1, LayerFreq: 1, AuxLossCoeff: 0.01}
	for _, tc := range []struct {
		name string
		cfg  config.Model
	}{{"dense", ShakespeareChar()}, {"moe", moe}} {
		t.Run(tc.name, func(t *testing.T) {
			step := newStepper(t, tc.cfg, 12, 64)
			step() // the first step sizes every buffer
			defer debug.SetGCPercent(debug.SetGCPercent(-1))
			const rounds, steps = 4, 5
			var counts []uint64
			for range rounds {
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				for range steps {
					step()
				}
				runtime.ReadMemStats(&after)
				n := after.Mallocs - before.Mallocs
				if n == 0 {
					return
				}
				counts = append(counts, n)
			}
			t.Fatalf("every round of %d steps allocated: %v objects; want a round with 0", steps, counts)
		})
	}
}

// newStepper builds a model of cfg with AdamW state and returns one training step.
func newStepper(t *testing.T, cfg config.Model, B, T int) func() {
	t.Helper()
	table, err := parallel.ParamTable(cfg, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	n := len(table)
	w, g, m1, m2 := make([][]float32, n), make([][]float32, n), make([][]float32, n), make([][]float32, n)
	for i := range table {
		size := table[i].LocalNumel()
		w[i], g[i], m1[i], m2[i] = make([]float32, size), make([]float32, size), make([]float32, size), make([]float32, size)
		InitParam(w[i], &table[i], 0, 1, cfg.InitStd, cfg.Layers)
	}
	be := cpu.Backend{}
	m, err := New[float32](cfg, table, w, g, be, B, T)
	if err != nil {
		t.Fatal(err)
	}
	tokens, targets := make([]int32, B*T), make([]int32, B*T)
	for i := range tokens {
		tokens[i], targets[i] = int32(i*7%cfg.VocabSize), int32((i*7+3)%cfg.VocabSize)
	}
	it := 0
	return func() {
		it++
		for i := range g {
			clear(g[i])
		}
		m.Forward(tokens, targets)
		m.Backward(tokens, targets, 1/float64(B*T))
		for i := range w {
			be.AdamW(w[i], g[i], m1[i], m2[i], 1e-3, 0.9, 0.95, 1e-8, 0.1, it)
		}
	}
}
