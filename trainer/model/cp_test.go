package model

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cpPass runs one forward and backward of cfg over B sequences of T tokens split
// over cp in-process ranks, and returns the summed loss, the token count, the
// aux loss of rank 0 and every parameter's gradient summed over the ranks (each
// rank's gradient covers its own tokens; FSDP's reduction over dp×cp sums them).
func cpPass(t *testing.T, cfg config.Model, B, T, cp int, recompute string, tokens, targets []int32) (float64, int, float64, [][]float32) {
	t.Helper()
	world := comm.NewWorld(cp, 10*time.Second)
	sums, counts, aux := make([]float64, cp), make([]int, cp), make([]float64, cp)
	grads := make([][][]float32, cp)
	errs := make([]error, cp)
	var wg sync.WaitGroup
	for r := 0; r < cp; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			opts := []Option{WithRecompute(recompute)}
			if cp > 1 {
				opts = append(opts, WithContextParallel(ContextParallel{Comm: world.Rank(r), Rank: r, Size: cp}))
			}
			m, _, g, _ := build[float32](t, cfg, B, T, opts...)
			tok, tgt := make([]int32, B*T/cp), make([]int32, B*T/cp)
			LocalTokens(tok, tokens, B, T, r, cp)
			LocalTokens(tgt, targets, B, T, r, cp)
			sums[r], counts[r] = m.Forward(tok, tgt)
			aux[r] = m.AuxLoss()
			m.Backward(tok, tgt, 1.0/float64(B*T))
			errs[r], grads[r] = m.Err(), g
		}()
	}
	wg.Wait()
	var sum float64
	var count int
	for r := 0; r < cp; r++ {
		require.NoError(t, errs[r])
		sum, count = sum+sums[r], count+counts[r]
		assert.InDelta(t, aux[0], aux[r], 1e-6, "every rank has the whole sequences' aux loss")
		if r > 0 {
			for i := range grads[0] {
				for j, v := range grads[r][i] {
					grads[0][i][j] += v
				}
			}
		}
	}
	return sum, count, aux[0], grads[0]
}

// TestContextParallelEqualsOneRank: sequences split over 2 and 4 context-parallel
// ranks (ring attention, RoPE at the chunks' positions, router statistics summed
// over the group) give one rank's loss, aux loss and gradients, dense and MoE,
// with every recompute mode. fp32 throughout; what differs is the order of sums
// (the online softmax over key blocks, dK/dV summed along the ring, gradients
// summed over ranks): measured about 1e-7 relative. Tolerance 1e-5 of the largest
// gradient; a wrong position, chunk or mask is off by 1e-2 or more.
func TestContextParallelEqualsOneRank(t *testing.T) {
	dense := tinyConfig(false)
	moe := tinyMoE(1, 0, 2)
	for _, cfg := range []config.Model{dense, moe} {
		cfg.SeqLen = 16
		B, T := 2, 16
		tokens, targets := make([]int32, B*T), make([]int32, B*T)
		for i := range tokens {
			tokens[i], targets[i] = int32(i*7%cfg.VocabSize), int32((i*5+3)%cfg.VocabSize)
		}
		targets[5] = -1 // ignored targets count on whichever rank holds them
		for _, recompute := range []string{"none", "selective", "full"} {
			refSum, refCount, refAux, refGrad := cpPass(t, cfg, B, T, 1, recompute, tokens, targets)
			var gmax float64
			for _, g := range refGrad {
				for _, v := range g {
					gmax = math.Max(gmax, math.Abs(float64(v)))
				}
			}
			for _, cp := range []int{2, 4} {
				name := fmt.Sprintf("experts %d cp %d recompute %s", cfg.MoE.NumExperts, cp, recompute)
				sum, count, aux, grad := cpPass(t, cfg, B, T, cp, recompute, tokens, targets)
				assert.Equal(t, refCount, count, name)
				assert.InDelta(t, refSum, sum, 1e-5*math.Abs(refSum), name)
				assert.InDelta(t, refAux, aux, 1e-5*math.Abs(refAux)+1e-9, name)
				var worst float64
				for i := range grad {
					for j := range grad[i] {
						worst = math.Max(worst, math.Abs(float64(grad[i][j]-refGrad[i][j])))
					}
				}
				t.Logf("%s: loss %.9g vs %.9g, aux %.6g vs %.6g, worst gradient difference %.3g of %.3g", name, sum, refSum, aux, refAux, worst, gmax)
				assert.Less(t, worst, 1e-5*gmax, "%s: gradient difference %.3g of largest %.3g", name, worst, gmax)
			}
		}
	}
}

// TestLocalTokens: rank r of cp holds chunks r and 2·cp−1−r of each sequence,
// chunk-major (chunk r of both sequences, then the other chunk of both).
func TestLocalTokens(t *testing.T) {
	src := make([]int32, 2*8)
	for i := range src {
		src[i] = int32(i)
	}
	dst := make([]int32, 2*4)
	LocalTokens(dst, src, 2, 8, 1, 2) // chunks of 2: rank 1 holds chunks 1 and 2
	assert.Equal(t, []int32{2, 3, 10, 11, 4, 5, 12, 13}, dst)
	LocalTokens(dst, src, 2, 8, 0, 2) // chunks 0 and 3
	assert.Equal(t, []int32{0, 1, 8, 9, 6, 7, 14, 15}, dst)
}
