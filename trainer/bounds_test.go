package trainer

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/fileio"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A run directory whose resolved.toml (with run.json's fingerprint made to
// match) claims a model of 400 MB beside a weights.bin of a few kilobytes is
// refused from weights.bin's size before the values are allocated (sample,
// export and RunLogits read run directories; before, the recipe's model was
// allocated whole first).
func TestRunDirRecipeDoesNotSetTheAllocation(t *testing.T) {
	res, _ := tinyRun(t, "train.steps=1", "train.eval_interval=0", "logging.sample_tokens=0")
	r, err := Run(context.Background(), res, opts())
	require.NoError(t, err)
	big := res.Recipe
	big.Model.Hidden, big.Model.FFNHidden, big.Model.Layers, big.Model.Heads, big.Model.KVHeads = 1024, 4096, 6, 8, 8
	body, _, err := config.ResolvedTOML(&big)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(r.Dir, "resolved.toml"), body, 0o644))
	fp, err := config.Fingerprint(&big)
	require.NoError(t, err)
	var info map[string]any
	require.NoError(t, json.Unmarshal(must(os.ReadFile(filepath.Join(r.Dir, "run.json"))), &info))
	info["recipe_fingerprint"] = fp
	require.NoError(t, os.WriteFile(filepath.Join(r.Dir, "run.json"), must(json.Marshal(info)), 0o644))

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = loadRun(r.Dir)
	runtime.ReadMemStats(&after)
	assert.ErrorIs(t, err, fileio.ErrCorrupt)
	assert.ErrorContains(t, err, "weights.bin: corrupt file: ")
	assert.ErrorContains(t, err, "the file and the recipe are not of one run")
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(32<<20), "bytes allocated")
}
