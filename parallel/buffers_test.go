package parallel

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestBufferPeaks counts the unit buffers a pass needs on hand-made schedules:
// four layer units between an embedding and a head, untied and tied (the head
// block then holds the embedding's unit too, and the embedding's gradients live
// from the head's backward to the embedding's).
func TestBufferPeaks(t *testing.T) {
	untied := [][]int{{0}, {1}, {2}, {3}, {4}, {5}}
	tied := [][]int{{0}, {1}, {2}, {3}, {4}, {5, 0}}
	all := []bool{true, true, true, true, true, true}
	length := []int64{10, 100, 100, 100, 100, 10}
	for _, tc := range []struct {
		blocks                 [][]int
		sharded                []bool
		prefetch, async        bool
		capBytes               int64
		wantGather, wantReduce int
		name                   string
	}{
		{untied, all, false, false, 0, 1, 1, "untied"},
		{untied, all, true, false, 0, 2, 1, "untied prefetch"},
		{untied, all, false, true, 0, 1, 2, "untied async"},
		{untied, all, true, true, 4 * 200, 2, 3, "untied, two reductions fit the cap"},
		{tied, all, false, false, 0, 2, 2, "tied"},
		{tied, all, true, true, 0, 3, 3, "tied prefetch async"},
		// An unsharded embedding is bound to the shards: nothing to gather or reduce.
		{tied, []bool{false, true, true, true, true, true}, true, true, 0, 2, 2, "tied, embedding whole"},
	} {
		g, r := bufferPeaks(tc.blocks, tc.sharded, length, true, tc.prefetch, tc.async, tc.capBytes)
		assert.Equal(t, [2]int{tc.wantGather, tc.wantReduce}, [2]int{g, r}, tc.name)
	}
	g, r := bufferPeaks(untied, all, length, false, false, true, 0)
	assert.Equal(t, [2]int{0, 2}, [2]int{g, r}, "optim_grads gathers nothing")
}
