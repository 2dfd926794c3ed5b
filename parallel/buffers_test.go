package parallel

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestArena: first fit from the lowest offset, freed ranges merge, and High is the
// size an arena needs for the same requests.
func TestArena(t *testing.T) {
	a := NewArena(-1, 0)
	x, _ := a.Alloc(10)
	y, _ := a.Alloc(20)
	z, _ := a.Alloc(10)
	assert.Equal(t, []int64{0, 10, 30}, []int64{x, y, z})
	a.Free(y, 20)
	w, _ := a.Alloc(15) // first fit: the hole y left
	assert.Equal(t, int64(10), w)
	a.Free(x, 10)
	a.Free(w, 15) // merges with x's range and the 5 left after it
	v, _ := a.Alloc(30)
	assert.Equal(t, int64(0), v)
	assert.Equal(t, int64(40), a.High())

	// Slots of 10: a request of at most 10 does not straddle a multiple of 10.
	s := NewArena(-1, 10)
	s.Alloc(4)
	o, _ := s.Alloc(8)
	assert.Equal(t, int64(10), o, "8 more from 4 would straddle 10: the next slot")
	o, _ = s.Alloc(6)
	assert.Equal(t, int64(4), o, "6 fit the rest of the first slot")
	o, _ = s.Alloc(25)
	assert.Equal(t, int64(18), o, "longer than a slot: plain first fit")

	b := NewArena(40, 0)
	_, ok := b.Alloc(41)
	assert.False(t, ok, "a bounded arena refuses what does not fit")
	p, ok := b.Alloc(40)
	assert.True(t, ok)
	b.Free(p, 40)
	_, ok = b.Alloc(40)
	assert.True(t, ok, "a freed arena is whole again")
}

// TestBufferPeaks sizes the runtime's arenas on hand-made schedules: an embedding,
// four layers and a head, untied and tied (the head block then holds the
// embedding's unit too, and the embedding's gradients live from the head's
// backward to the embedding's).
func TestBufferPeaks(t *testing.T) {
	untied := [][]int{{0}, {1}, {2}, {3}, {4}, {5}}
	tied := [][]int{{0}, {1}, {2}, {3}, {4}, {5, 0}}
	equal := []int64{100, 100, 100, 100, 100, 100}
	for _, tc := range []struct {
		name                   string
		blocks                 [][]int
		length                 []int64
		prefetch, async        bool
		capBytes               int64
		wantGather, wantReduce int64
	}{
		{"one at a time", untied, equal, false, false, 0, 100, 100},
		{"prefetch: the next unit beside the current", untied, equal, true, false, 0, 200, 100},
		{"async: one reducing beside the one filling", untied, equal, false, true, 0, 100, 200},
		{"two reductions fit the cap", untied, equal, true, true, 4 * 200, 200, 300},
		{"tied: the head holds the embedding", tied, equal, false, false, 0, 200, 200},
		{"tied, prefetch and async", tied, equal, true, true, 0, 300, 300},
		// An embedding ten times a layer: the arenas hold it and the layers beside it,
		// not three buffers of its size (3000). In backward the head's 10 elements
		// leave a hole below the embedding's gradients that no layer fits: 1210.
		{"tied, large embedding", tied, []int64{1000, 100, 100, 100, 100, 10}, true, true, 0, 1110, 1210},
		// An unsharded embedding is bound to the shards: nothing to gather or reduce.
		{"tied, embedding whole", tied, []int64{0, 100, 100, 100, 100, 100}, true, true, 0, 200, 200},
	} {
		g, r := bufferPeaks(tc.blocks, tc.length, true, tc.prefetch, tc.async, tc.capBytes, 0)
		assert.Equal(t, [2]int64{tc.wantGather, tc.wantReduce}, [2]int64{g, r}, tc.name)
	}
	// Slots of the largest unit: a small unit shares a slot instead of pushing a
	// layer above it. The embedding and head of 10 beside layers of 100, prefetch
	// and async: first fit needs 210 (the head's range below two layers), slots 200.
	small := []int64{10, 100, 100, 100, 100, 10}
	g, r := bufferPeaks(untied, small, true, true, true, 0, 0)
	assert.Equal(t, [2]int64{210, 210}, [2]int64{g, r}, "first fit")
	g, r = bufferPeaks(untied, small, true, true, true, 0, 100)
	assert.Equal(t, [2]int64{200, 200}, [2]int64{g, r}, "slots")
	g, r = bufferPeaks(untied, equal, false, false, true, 0, 0)
	assert.Equal(t, [2]int64{0, 200}, [2]int64{g, r}, "optim_grads gathers nothing")
}
