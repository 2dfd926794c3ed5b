package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestNoPELayersAndChunks: which layers are NoPE (Hugging Face's and Meta's
// Llama 4 place them last in each group of nope_interval, torchtitan's llama4
// first) and which attend in chunks (the rotary layers when NoPE layers are
// interleaved, every layer otherwise).
func TestNoPELayersAndChunks(t *testing.T) {
	m := Model{Layers: 8, AttentionChunkSize: 16}
	layers := func(m Model) (nope, chunk []int) {
		for l := 0; l < m.Layers; l++ {
			if m.IsNoPELayer(l) {
				nope = append(nope, l)
			}
			chunk = append(chunk, m.AttentionChunk(l))
		}
		return
	}
	nope, chunk := layers(m)
	assert.Empty(t, nope)
	assert.Equal(t, []int{16, 16, 16, 16, 16, 16, 16, 16}, chunk, "no NoPE layers: every layer attends in chunks")
	m.NoPEInterval = 4
	nope, chunk = layers(m)
	assert.Equal(t, []int{3, 7}, nope, "Hugging Face's no_rope_layers: (l+1) % 4 == 0")
	assert.Equal(t, []int{16, 16, 16, 0, 16, 16, 16, 0}, chunk)
	m.NoPEFirst = true
	nope, chunk = layers(m)
	assert.Equal(t, []int{0, 4}, nope, "torchtitan: layer_id % every_n_layers_nope == 0")
	assert.Equal(t, []int{0, 16, 16, 16, 0, 16, 16, 16}, chunk)
	m.AttentionChunkSize = 0
	_, chunk = layers(m)
	assert.Equal(t, make([]int, 8), chunk)
}
