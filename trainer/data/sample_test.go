package data

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func seqTokens(n, base int) *Tokens {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(base + i)
	}
	return NewTokens(t, 1)
}

// A source is drawn in epochs without replacement: every sample once per
// epoch, each epoch in another order; the permutation is a bijection for
// every size.
func TestSamplerEpochs(t *testing.T) {
	for n := uint64(1); n < 300; n++ {
		seen := make([]bool, n)
		for i := uint64(0); i < n; i++ {
			p := permute(i, n, n*7)
			require.Less(t, p, n)
			require.False(t, seen[p], "n=%d: %d twice", n, p)
			seen[p] = true
		}
	}
	T := 4
	s, err := NewSampler([]*Tokens{seqTokens(10*T+1, 0)}, nil, 3, T)
	require.NoError(t, err)
	require.Equal(t, []int{10}, s.Samples())
	var orders [][]int
	for e := 0; e < 3; e++ {
		var order []int
		seen := map[int]bool{}
		for r := 0; r < 10; r++ {
			_, j := s.Locate(e*10 + r)
			assert.False(t, seen[j], "epoch %d draws sample %d twice", e, j)
			seen[j] = true
			order = append(order, j)
		}
		orders = append(orders, order)
	}
	assert.NotEqual(t, orders[0], orders[1], "each epoch is shuffled anew")
	x, y := make([]int32, 2*T), make([]int32, 2*T)
	s.Fill(x, y, 0, 2)
	for b := 0; b < 2; b++ {
		assert.Equal(t, int32(orders[0][b]*T), x[b*T], "sample j starts at token j·T")
		for i := 0; i < T; i++ {
			assert.Equal(t, x[b*T+i]+1, y[b*T+i], "targets are the next token")
		}
	}
	assert.Equal(t, []Consumed{{Samples: 25, Tokens: 100, Epochs: 2.5}}, s.Consumed(25))
}

// A blend draws from its sources within 1% of their weights over 10,000
// samples (Megatron's greedy blending keeps each count within about one
// sample of its weight at every point); any split of a run of samples into
// pieces fills the same sequences.
func TestSamplerBlend(t *testing.T) {
	T := 8
	srcs := []*Tokens{seqTokens(1000, 0), seqTokens(5000, 100000), seqTokens(333, 200000)}
	s, err := NewSampler(srcs, []float64{2, 5, 3}, 7, T)
	require.NoError(t, err)
	const n = 10000
	got := make([]int, 3)
	for g := 0; g < n; g++ {
		k, _ := s.Locate(g)
		got[k]++
	}
	for k, w := range s.Weights() {
		assert.InDelta(t, w, float64(got[k])/n, 0.01, "source %d", k)
	}
	cons := s.Consumed(n)
	for k := range got {
		assert.Equal(t, got[k], cons[k].Samples)
		assert.InDelta(t, float64(got[k])/float64(s.Samples()[k]), cons[k].Epochs, 1e-12)
	}
	// Fill is a pure function of the global index: pieces equal the whole, and
	// a fresh sampler (a resumed run) agrees.
	B := 3000
	whole, wt := make([]int32, B*T), make([]int32, B*T)
	s.Fill(whole, wt, 5000, B)
	fresh, _ := NewSampler(srcs, []float64{2, 5, 3}, 7, T)
	for lo := 0; lo < B; lo += 700 {
		k := min(700, B-lo)
		x, y := make([]int32, k*T), make([]int32, k*T)
		fresh.Fill(x, y, 5000+lo, k)
		require.Equal(t, whole[lo*T:(lo+k)*T], x)
		require.Equal(t, wt[lo*T:(lo+k)*T], y)
	}
	// Tokens come from the source Locate names.
	x, y := make([]int32, T), make([]int32, T)
	for g := 0; g < 50; g++ {
		s.Fill(x, y, g, 1)
		k, j := s.Locate(g)
		assert.Equal(t, int32(100000*k+j*T), x[0])
	}
	_, err = NewSampler(srcs, []float64{1, 0, 1}, 7, T)
	assert.ErrorContains(t, err, "source 2 has weight 0")
}

// Fill allocates nothing (a training step allocates nothing), one source or
// a blend.
func TestSamplerFillAllocatesNothing(t *testing.T) {
	T, B := 8, 4
	x, y := make([]int32, B*T), make([]int32, B*T)
	one, _ := NewSampler([]*Tokens{seqTokens(1000, 0)}, nil, 1, T)
	blend, _ := NewSampler([]*Tokens{seqTokens(1000, 0), seqTokens(500, 0)}, []float64{1, 2}, 1, T)
	for _, s := range []*Sampler{one, blend} {
		s.Fill(x, y, 5000, B) // the blend's kept counts up to there
		g := 5000
		assert.Zero(t, testing.AllocsPerRun(20, func() { s.Fill(x, y, g, B); g += B }))
	}
}
