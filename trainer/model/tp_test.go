package model

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/parallel/collective"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// meshPass runs one forward and backward of cfg over B sequences of T tokens on
// tp × cp in-process ranks (tp fastest, as the mesh orders them) and returns the
// loss sum and count of the whole micro-batch, the aux loss (every rank must have
// the whole micro-batch's), and every parameter's gradient assembled whole:
// tensor-parallel slices put back at their places (parallel.Param.GlobalIndex)
// and summed over the cp ranks (as FSDP's reduction over dp×cp sums them).
func meshPass(t *testing.T, cfg config.Model, B, T, tp, cp int, recompute string, tokens, targets []int32, extra ...Option) (float64, int, float64, [][]float32) {
	t.Helper()
	full, err := parallel.ParamTable(cfg, 1, 1)
	require.NoError(t, err)
	table, err := parallel.ParamTable(cfg, tp, 1)
	require.NoError(t, err)
	n := tp * cp
	world := comm.NewWorld(n, 10*time.Second)
	sums, counts, aux := make([]float64, n), make([]int, n), make([]float64, n)
	grads := make([][][]float32, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr, cr := r%tp, r/tp
			w, g := make([][]float32, len(table)), make([][]float32, len(table))
			for i := range table {
				w[i], g[i] = make([]float32, table[i].LocalNumel()), make([]float32, table[i].LocalNumel())
				InitParamTP(w[i], &table[i], 0, tr, 42, 0.3, cfg.Layers)
			}
			mem, wb, gb := onMemory(w, g, false)
			var opts []Option
			opts = append(opts, WithRecompute(recompute))
			opts = append(opts, extra...)
			if tp > 1 {
				tpRanks := make([]int, tp)
				for i := range tpRanks {
					tpRanks[i] = cr*tp + i
				}
				c, err := world.Tagged(r, tpRanks, "tp")
				if err != nil {
					errs[r] = err
					return
				}
				opts = append(opts, WithTensorParallel(TensorParallel{Comm: collective.OnHost(c, mem), Rank: tr, Size: tp}))
			}
			if cp > 1 {
				cpRanks := make([]int, cp)
				for i := range cpRanks {
					cpRanks[i] = i*tp + tr
				}
				c, err := world.Tagged(r, cpRanks, "cp")
				if err != nil {
					errs[r] = err
					return
				}
				opts = append(opts, WithContextParallel(ContextParallel{Comm: collective.OnHost(c, mem), Rank: cr, Size: cp}))
			}
			m, err := New[float32](cfg, table, wb, gb, cpu.Kernels[float32]{}, B, T, append(opts, WithMemory(mem))...)
			if err != nil {
				errs[r] = err
				return
			}
			defer m.Close()
			tok, tgt := make([]int32, B*T/cp), make([]int32, B*T/cp)
			LocalTokens(tok, tokens, B, T, cr, cp)
			LocalTokens(tgt, targets, B, T, cr, cp)
			sums[r], counts[r] = m.Loss(tok, tgt)
			aux[r] = m.AuxLoss()
			m.Backward(tok, tgt, 1.0/float64(B*T))
			errs[r], grads[r] = m.Err(), g
		}()
	}
	wg.Wait()
	out := make([][]float32, len(full))
	for i := range full {
		out[i] = make([]float32, full[i].Numel())
	}
	var sum float64
	var count int
	for r := 0; r < n; r++ {
		require.NoError(t, errs[r])
		assert.InDelta(t, aux[0], aux[r], 1e-6, "every rank has the whole micro-batch's aux loss")
		tr := r % tp
		if tr == 0 { // every tp rank returns its group's whole sums
			sum, count = sum+sums[r], count+counts[r]
		}
		for i := range table {
			for j, v := range grads[r][i] {
				gi := table[i].GlobalIndex(int64(j), tr)
				if table[i].TPSplit < 0 && tr > 0 {
					continue // replicated over tp: every tp rank holds the same sum
				}
				out[i][gi] += v
			}
		}
	}
	return sum, count, aux[0], out
}

// TestTensorParallelEqualsOneRank: the model split over tp 2 and 4 ranks
// (column/row-parallel projections, sequence-parallel norms, vocabulary-parallel
// embedding and cross-entropy; tied and untied embeddings, grouped-query
// attention) and over tp 2 × cp 2 gives one rank's loss and every gradient, under
// every recompute mode; and an MoE model (routed experts on each rank's rows, a
// shared expert split like the MLP, router statistics summed over tp). fp32; sums run in another order (partial sums
// reduce-scattered, the log-sum-exp combined over ranks): measured about 1e-7.
// Tolerance 1e-5 of the largest gradient.
func TestTensorParallelEqualsOneRank(t *testing.T) {
	moe := tinyMoE(1, 0, 2) // a shared expert, MoE every other layer, aux loss
	moe.MoE.ExpertFFNHidden = 8
	for _, c := range []struct {
		name string
		cfg  config.Model
	}{{"untied", tinyConfig(false)}, {"tied", tinyConfig(true)}, {"moe", moe}} {
		cfg, tied := c.cfg, c.name
		cfg.Hidden, cfg.Heads, cfg.KVHeads, cfg.FFNHidden, cfg.VocabSize, cfg.SeqLen = 16, 4, 4, 24, 12, 16
		B, T := 2, 16
		tokens, targets := make([]int32, B*T), make([]int32, B*T)
		for i := range tokens {
			tokens[i], targets[i] = int32(i*7%cfg.VocabSize), int32((i*5+3)%cfg.VocabSize)
		}
		targets[9] = -1
		for _, recompute := range []string{"none", "selective", "full"} {
			refSum, refCount, refAux, refGrad := meshPass(t, cfg, B, T, 1, 1, recompute, tokens, targets)
			gmax := largest(refGrad)
			for _, mesh := range [][2]int{{2, 1}, {4, 1}, {2, 2}} {
				name := fmt.Sprintf("%s tp %d cp %d recompute %s", tied, mesh[0], mesh[1], recompute)
				sum, count, aux, grad := meshPass(t, cfg, B, T, mesh[0], mesh[1], recompute, tokens, targets)
				assert.Equal(t, refCount, count, name)
				assert.InDelta(t, refSum, sum, 1e-5*math.Abs(refSum), name)
				assert.InDelta(t, refAux, aux, 1e-5*math.Abs(refAux)+1e-9, name)
				worst := largestDiff(grad, refGrad)
				t.Logf("%s: loss %.9g vs %.9g, worst gradient difference %.3g of %.3g", name, sum, refSum, worst, gmax)
				assert.Less(t, worst, 1e-5*gmax, name)
			}
		}
	}
}

// largest is the largest magnitude among the gradients.
func largest(g [][]float32) float64 {
	var m float64
	for _, x := range g {
		for _, v := range x {
			m = math.Max(m, math.Abs(float64(v)))
		}
	}
	return m
}

// largestDiff is the largest element-wise difference between two gradient sets.
func largestDiff(a, b [][]float32) float64 {
	var m float64
	for i := range a {
		for j := range a[i] {
			m = math.Max(m, math.Abs(float64(a[i][j]-b[i][j])))
		}
	}
	return m
}

// TestGlobalIndex: a column-parallel slice holds consecutive rows, a row-parallel
// one a block of every row's columns.
func TestGlobalIndex(t *testing.T) {
	col := parallel.Param{Shape: []int{4, 3}, LocalShape: []int{2, 3}, TPSplit: 0}
	assert.Equal(t, int64(6+4), col.GlobalIndex(4, 1))
	row := parallel.Param{Shape: []int{2, 6}, LocalShape: []int{2, 3}, TPSplit: 1}
	assert.Equal(t, int64(6+3+1), row.GlobalIndex(4, 1)) // local (1, 1) → (1, 4)
	rep := parallel.Param{Shape: []int{5}, LocalShape: []int{5}, TPSplit: -1}
	assert.Equal(t, int64(3), rep.GlobalIndex(3, 1))
}
