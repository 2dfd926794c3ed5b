//go:build cuda || cudaemu

package main

import (
	"fmt"
	"math"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/cuda"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/trainer"
	"github.com/shardline/shardline/trainer/gpu"
	"github.com/shardline/shardline/trainer/model"
)

// This file is the GPU engine of the shardline-cuda build (make cuda); under
// -tags cudaemu, the same engine on the host emulator, for tests.
func init() { newDeviceEngine, rankGPUs = openGPU, gpuPerRank }

// gpuPerRank opens a rank's GPU: the one at its node index (localRank) in a
// job, else at its index among this process's ranks, modulo the GPUs visible,
// so that ranks beyond the GPUs share them (their collectives then go through
// the host: cuda.Memory.Collectives). Each rank opens its own Device: a
// goroutine and stream of its own, in the GPU's one primary context.
func gpuPerRank(localRank int) func(rank int) (tensor.Backend, func(), error) {
	return func(rank int) (tensor.Backend, func(), error) {
		n, err := cuda.Count()
		if err != nil {
			return nil, nil, err
		}
		if n == 0 {
			return nil, nil, fmt.Errorf("cuda: no GPU visible (check CUDA_VISIBLE_DEVICES)")
		}
		idx := rank
		if localRank >= 0 {
			idx = localRank
		}
		d, err := cuda.Open(idx % n)
		if err != nil {
			return nil, nil, err
		}
		return d.Kernels(), d.Close, nil
	}
}

// gpuEngine adapts trainer/gpu's model to the trainer's DeviceEngine.
type gpuEngine struct {
	d               *cuda.Device
	m               *gpu.Model
	opt             gpu.Optimizer
	tokens, targets []int32
	name            string
}

func openGPU() (trainer.DeviceEngine, error) {
	d, err := cuda.Open(0)
	if err != nil {
		return nil, err
	}
	return &gpuEngine{d: d, name: "cuda: " + d.Info().String()}, nil
}

func (e *gpuEngine) Name() string { return e.name }

func (e *gpuEngine) Start(r *config.Recipe, table []parallel.Param, weights [][]float32, B, T int, docs model.DocumentMasks) error {
	dt := cuda.F32
	if r.Precision.BF16 {
		dt = cuda.BF16
	}
	m, err := gpu.New(e.d, r.Model, table, weights, B, T, gpu.Options{Compute: dt, Documents: docs})
	if err != nil {
		return err
	}
	e.m = m
	e.opt = gpu.Optimizer{Beta1: r.Train.Beta1, Beta2: r.Train.Beta2, Eps: r.Train.Eps, WeightDecay: r.Train.WeightDecay, ClipGrad: r.Train.ClipGrad}
	e.tokens, e.targets = make([]int32, B*T), make([]int32, B*T)
	return nil
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

func (e *gpuEngine) Step(batch func(mb int, tokens, targets []int32) float64, micro int, lr, clip float64) (trainer.DeviceStep, error) {
	var res trainer.DeviceStep
	var err error
	e.d.Do(func() {
		for mb := 0; mb < micro; mb++ {
			scale := batch(mb, e.tokens, e.targets)
			n, ferr := e.m.ForwardBackward(e.tokens, e.targets, scale, mb > 0)
			if ferr != nil {
				err = ferr
				return
			}
			res.Count += n
		}
		e.m.ClipNorm(clip)
		met, merr := e.m.Metrics() // the step's one read-back
		if merr != nil {
			err = merr
			return
		}
		res.LossSum, res.GradNorm, res.AuxLoss, res.Dropped = met.LossSum, met.GradNorm, met.AuxLoss, met.Dropped
		if finite(met.LossSum) && finite(met.GradNorm) {
			e.m.Apply(lr, e.opt)
			res.Updated = true
		}
	})
	return res, err
}

func (e *gpuEngine) Eval(tokens, targets []int32) (float64, int, error) {
	var sum float64
	var n int
	var err error
	e.d.Do(func() {
		if n, err = e.m.Forward(tokens, targets, false); err != nil {
			return
		}
		var met gpu.Metrics
		met, err = e.m.Metrics()
		sum = met.LossSum
	})
	return sum, n, err
}

// Logits puts the window in the batch's first sequence (zeros elsewhere) and
// returns the logits at position k−1.
func (e *gpuEngine) Logits(window []int32, k int) ([]float32, error) {
	var out []float32
	var err error
	e.d.Do(func() {
		clear(e.tokens)
		copy(e.tokens, window)
		out, err = e.m.Logits(e.tokens, k-1)
	})
	return out, err
}

func (e *gpuEngine) Weights(dst [][]float32) error {
	var err error
	e.d.Do(func() { err = e.m.ReadWeights(dst) })
	return err
}

func (e *gpuEngine) State(main, m, v [][]float32) (int, error) {
	var n int
	var err error
	e.d.Do(func() { n, err = e.m.State(main, m, v) })
	return n, err
}

func (e *gpuEngine) Restore(m, v [][]float32, optSteps int) error {
	var err error
	e.d.Do(func() { err = e.m.SetState(m, v, optSteps) })
	return err
}

func (e *gpuEngine) Held() trainer.Memory {
	h := e.m.HeldBytes()
	m := trainer.Memory{MainWeights: h["main_weights"], Weights: h["weights"], Grads: h["grads"], OptimizerState: h["optimizer_state"],
		Activations: h["activations"] + h["scratch"] + h["inputs"], Logits: h["logits"]}
	m.Total = m.MainWeights + m.Weights + m.Grads + m.OptimizerState + m.Activations + m.Logits
	return m
}

func (e *gpuEngine) Close() {
	if e.m != nil {
		e.m.Close()
	}
	e.d.Close()
}
