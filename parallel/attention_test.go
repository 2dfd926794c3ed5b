package parallel

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bruteVisible counts by brute force the (query, key) pairs causal attention
// over t positions in chunks of chunk positions (0: none) lets a query see:
// key ≤ query, in the query's chunk.
func bruteVisible(t, chunk int) float64 {
	var n float64
	for q := 0; q < t; q++ {
		for k := 0; k <= q; k++ {
			if chunk == 0 || k/chunk == q/chunk {
				n++
			}
		}
	}
	return n
}

// TestAttentionPairsCountsVisiblePairs: the plan's pairs of chunked causal
// attention, (n·chunk² + r²)/2 with the last chunk of r positions, are the
// visible pairs counted one by one less half of each chunk's diagonal (the
// convention of the whole-sequence count t²/2, half the diagonal's t pairs),
// for every length to 40 and every chunk size, a last shorter chunk or none,
// a chunk of the whole sequence or more; and visiblePairs counts them all.
// Exact: every count is a whole or half number far below 2⁵³.
func TestAttentionPairsCountsVisiblePairs(t *testing.T) {
	for T := 1; T <= 40; T++ {
		for chunk := 0; chunk <= T+2; chunk++ {
			want := bruteVisible(T, chunk)
			require.Equal(t, want, attentionPairs(T, chunk)+float64(T)/2, "T %d, chunk %d", T, chunk)
			require.Equal(t, want, visiblePairs(0, 0, T, chunk), "T %d, chunk %d", T, chunk)
		}
	}
}

// TestRingBlocksCoverChunkedAttention: the halves ring attention computes over
// every rank (2P halves of h positions, rank r holding r and 2P−1−r) hold every
// visible pair exactly once, and each pair of halves skipped for lying before
// the query's chunk holds none: so the time model's ring under chunks counts
// the kernels the engine runs and no work is lost.
func TestRingBlocksCoverChunkedAttention(t *testing.T) {
	for P := 1; P <= 4; P++ {
		for h := 1; h <= 9; h++ {
			T := 2 * P * h
			for chunk := 0; chunk <= T+1; chunk++ {
				var sum float64
				for r := 0; r < P; r++ {
					computed := map[[2]int]bool{}
					ringBlocks(r, P, h, chunk, func(gq, gk int) {
						computed[[2]int{gq, gk}] = true
						sum += visiblePairs(gq*h, gk*h, h, chunk)
					})
					for _, gq := range []int{r, 2*P - 1 - r} {
						for gk := 0; gk <= gq; gk++ {
							if !computed[[2]int{gq, gk}] {
								require.Zero(t, visiblePairs(gq*h, gk*h, h, chunk), "P %d, h %d, chunk %d: skipped halves %d, %d", P, h, chunk, gq, gk)
							}
						}
					}
				}
				require.Equal(t, bruteVisible(T, chunk), sum, "P %d, h %d, chunk %d", P, h, chunk)
			}
		}
	}
}

// TestPlanFLOPsFollowAttentionChunks: a recipe whose rotary layers attend in
// chunks (48 of its 128 positions: two whole chunks and one of 32) between
// NoPE layers over the whole sequence plans its model FLOPs as the same model
// without chunks less, per chunked layer, the attention its chunks skip: 4·w
// FLOPs per visible (query, key) pair forward (QKᵀ and PV), 3× for the step,
// the pairs counted one by one (less half the diagonal, the whole-sequence
// convention). A chunk of the whole sequence or more plans as none. The MFU
// stays the model FLOPs over the step time and the peak.
func TestPlanFLOPsFollowAttentionChunks(t *testing.T) {
	sets := []string{"model.nope_interval=2", "train.global_batch_size=32"}
	full := compile(t, &load(t, "../recipes/tiny.toml", sets...).Recipe)
	res := load(t, "../recipes/tiny.toml", append(sets, "model.attention_chunk_size=48")...)
	chunked := compile(t, &res.Recipe)
	mo := res.Recipe.Model
	T, w := mo.SeqLen, float64(mo.Heads*mo.HeadSize())
	var skipped float64 // per sequence, forward
	rotary := 0
	for l := 0; l < mo.Layers; l++ {
		if c := mo.AttentionChunk(l); c > 0 {
			rotary++
			skipped += 4 * w * (bruteVisible(T, 0) - bruteVisible(T, c))
		}
	}
	require.Equal(t, 2, rotary, "two of the four layers attend in chunks")
	seqs := float64(res.Recipe.Train.GlobalBatchSize)
	assert.InEpsilon(t, full.ModelFLOPs-3*seqs*skipped, chunked.ModelFLOPs, 1e-12)
	assert.InEpsilon(t, full.ExecFLOPs-3*seqs*skipped, chunked.ExecFLOPs, 1e-12, "no recompute: executed as counted")
	assert.InEpsilon(t, chunked.ModelFLOPs/float64(chunked.Mesh.World)/(chunked.StepTimeS*chunked.Topology.Device.PeakFLOPS), chunked.MFU, 1e-12)
	require.Contains(t, chunked.TimeModel, "calibrated", "the CPU's shipped calibration times the step")
	assert.Less(t, chunked.StepTimeS, full.StepTimeS)

	whole := compile(t, &load(t, "../recipes/tiny.toml", append(sets, "model.attention_chunk_size=128")...).Recipe)
	assert.Equal(t, full.ModelFLOPs, whole.ModelFLOPs)
	assert.Equal(t, full.StepTimeS, whole.StepTimeS)
}

// TestTimeModelFollowsAttentionChunks: on a GPU (the H100's roofline) a
// chunked layer's attention is its whole chunks' causal attention and the
// last shorter chunk's, a NoPE layer's the whole sequence's, forward and
// backward; under context parallelism the chunked plan is faster too, and
// never slower than a chunk of the whole sequence.
func TestTimeModelFollowsAttentionChunks(t *testing.T) {
	sets := []string{"model.seq_len=8192", "model.nope_interval=4", "train.micro_batch_size=1", "train.global_batch_size=8", "parallel.world_size=8"}
	res := load(t, "../recipes/dense-125m.toml", append(sets, "model.attention_chunk_size=3000")...)
	p := compile(t, &res.Recipe)
	require.Equal(t, "h100-80gb", p.Topology.Device.Name)
	mo := res.Recipe.Model
	g := gpuCosts{dev: p.Topology.Device, bf16: res.Recipe.Precision.BF16}
	sh := microShape{B: 1, T: mo.SeqLen, CP: 1, TP: 1, EP: 1, ETP: 1, Mode: "none", BF16: res.Recipe.Precision.BF16}
	bh, HD := mo.Heads, mo.HeadSize()
	var want float64
	for l := 0; l < mo.Layers; l++ {
		for _, bwd := range []bool{false, true} {
			if mo.AttentionChunk(l) == 0 {
				want += g.attentionTime(bh, 8192, HD, bwd)
			} else {
				want += g.attentionTime(bh*2, 3000, HD, bwd) + g.attentionTime(bh, 2192, HD, bwd)
			}
		}
	}
	sh.Mode = "none"
	assert.InEpsilon(t, want, microCompute(mo, sh, g).Attention, 1e-12)
	noChunks := mo
	noChunks.AttentionChunkSize = 0
	assert.Less(t, microCompute(mo, sh, g).Attention, microCompute(noChunks, sh, g).Attention)

	for _, cp := range []int{2, 4} {
		t.Run(fmt.Sprintf("cp%d", cp), func(t *testing.T) {
			cpSets := append(append([]string{}, sets...), fmt.Sprintf("parallel.context_parallel=%d", cp))
			a := compile(t, &load(t, "../recipes/dense-125m.toml", append(cpSets, "model.attention_chunk_size=1024")...).Recipe)
			b := compile(t, &load(t, "../recipes/dense-125m.toml", append(cpSets, "model.attention_chunk_size=8192")...).Recipe)
			assert.Less(t, a.StepTimeS, b.StepTimeS)
			assert.Less(t, a.ModelFLOPs, b.ModelFLOPs)
		})
	}
}
