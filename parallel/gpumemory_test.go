package parallel

import (
	"path/filepath"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/stretchr/testify/require"
)

// TestEngineMemoryMatchesTheGPU: a one-GPU plan's memory is what the engine held
// on an H100 (run.json's held bytes, 2026-11-23): moe-tiny exactly; tiny and the
// 134M model were measured before the statistics buffer grew by two values per
// layer (the MoE layers' aux loss and kept copies), so their figures here add
// 2·layers·4 bytes. trainer/gpu's TestHeldEqualsPlan checks every component on
// the device.
func TestEngineMemoryMatchesTheGPU(t *testing.T) {
	for _, c := range []struct {
		recipe string
		sets   []string
		held   int64
	}{
		{"tiny", []string{"parallel.device=cuda", "train.micro_batch_size=8", "train.global_batch_size=16"}, 61_523_988 + 2*4*4},
		{"moe-tiny", []string{"parallel.device=cuda", "train.micro_batch_size=8", "train.global_batch_size=16"}, 264_137_068},
		{"dense-125m", []string{"parallel.world_size=1", "checkpoint.interval=0", "checkpoint.keep_last=0"}, 8_466_023_956 + 2*12*4},
	} {
		res, diags := config.Load(filepath.Join("..", "recipes", c.recipe+".toml"), config.Options{Sets: c.sets})
		require.False(t, diags.HasErrors(), "%v", diags)
		topo, err := TopologyOf(res.Recipe.Parallel, nil)
		require.NoError(t, err)
		p, err := Compile(&res.Recipe, topo)
		require.NoError(t, err)
		require.Equal(t, c.held, p.Memory.Total, c.recipe)
	}
}
