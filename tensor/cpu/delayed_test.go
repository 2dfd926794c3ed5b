package cpu_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/shardline/shardline/tensor/kerneltest"
	"github.com/stretchr/testify/require"
)

// TestFP8DelayedScale: the kernel's scales and histories are
// tensor.DelayedScaling's (every rank's amax Recorded, then Update), bit for
// bit, over 40 steps of amaxes with zeros, NaNs, infinities and scales that
// overflow, for both formats side by side in one strided history (two calls),
// every algorithm, histories of 1, 2 and 5 steps, margins 0 and 3, one rank
// and three.
func TestFP8DelayedScale(t *testing.T) {
	k := cpu.Kernels[float32]{}
	for _, algo := range []tensor.AmaxAlgo{tensor.AmaxMax, tensor.AmaxMostRecent} {
		for _, steps := range []int{1, 2, 5} {
			for _, margin := range []int{0, 3} {
				for _, ranks := range []int{1, 3} {
					t.Run(fmt.Sprintf("%v/%d/%d/%d", algo, steps, margin, ranks), func(t *testing.T) {
						const nf, nb = 4, 3
						const stride = nf + nb
						m := k.NewMemory()
						h, s := m.Alloc(tensor.Float32, steps*stride), m.Alloc(tensor.Float32, stride)
						a := m.Alloc(tensor.Float32, ranks*stride)
						m.Zero(h)
						m.Fill(s, 1)
						ref := make([]*tensor.DelayedScaling, stride)
						for i := range ref {
							f := tensor.E4M3
							if i >= nf {
								f = tensor.E5M2
							}
							var err error
							ref[i], err = tensor.NewDelayedScaling(f, steps, algo, margin)
							require.NoError(t, err)
						}
						rng := rand.New(rand.NewPCG(uint64(steps), uint64(margin+10*ranks)))
						sh := tensor.DelayedShape{Steps: steps, Ranks: ranks, Stride: stride, Algo: algo, Margin: margin}
						hs, ss := make([]float32, steps*stride), make([]float32, stride)
						for step := range 40 {
							amax := kerneltest.DelayedAmaxes(rng, ranks*stride)
							m.Write(a, amax)
							k.FP8DelayedScale(s.Slice(0, nf), h, a, tensor.E4M3, sh)
							k.FP8DelayedScale(s.Slice(nf, stride), h.Slice(nf, h.Len()), a.Slice(nf, a.Len()), tensor.E5M2, sh)
							require.NoError(t, m.Err())
							m.Read(hs, h)
							m.Read(ss, s)
							for i, d := range ref {
								for r := range ranks {
									d.Record(float32(amax[r*stride+i]))
								}
								d.Update()
								require.Equal(t, math.Float32bits(d.Scale), math.Float32bits(ss[i]), "step %d tensor %d: scale %v, want %v", step, i, ss[i], d.Scale)
								for j, v := range d.History {
									require.Equal(t, math.Float32bits(v), math.Float32bits(hs[j*stride+i]), "step %d tensor %d: history[%d] %v, want %v", step, i, j, hs[j*stride+i], v)
								}
							}
						}
					})
				}
			}
		}
	}
}
