package model

import (
	"fmt"
	"math"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/stretchr/testify/assert"
)

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
			refSum, refCount, refAux, refGrad := meshPass(t, cfg, B, T, 1, 1, recompute, tokens, targets)
			gmax := largest(refGrad)
			for _, cp := range []int{2, 4} {
				name := fmt.Sprintf("experts %d cp %d recompute %s", cfg.MoE.NumExperts, cp, recompute)
				sum, count, aux, grad := meshPass(t, cfg, B, T, 1, cp, recompute, tokens, targets)
				assert.Equal(t, refCount, count, name)
				assert.InDelta(t, refSum, sum, 1e-5*math.Abs(refSum), name)
				assert.InDelta(t, refAux, aux, 1e-5*math.Abs(refAux)+1e-9, name)
				worst := largestDiff(grad, refGrad)
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
