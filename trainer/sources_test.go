package trainer

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardline/shardline/trainer/ckpt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sourcesOf reads each metrics line's per-source consumption.
func sourcesOf(t *testing.T, dir string) [][]SourceConsumed {
	var out [][]SourceConsumed
	for _, line := range bytes.Split(bytes.TrimSpace(must(os.ReadFile(filepath.Join(dir, "metrics.jsonl")))), []byte("\n")) {
		var m Metrics
		require.NoError(t, json.Unmarshal(line, &m))
		out = append(out, m.Data)
	}
	return out
}

// A run blending two sources (one small enough to be drawn for several
// epochs) stopped at step 5 and resumed equals the run never stopped, bit for
// bit, and so do the samples, tokens and epochs it records per source; resumed
// on 4 ranks from 2 it trains along the same curve (1e-5 relative: the
// reduction order differs) on the same samples.
func TestResumeWithSourcesAndEpochs(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.txt"), filepath.Join(dir, "b.txt")
	require.NoError(t, os.WriteFile(a, []byte(strings.Repeat("the cat sat on the mat. ", 20)), 0o644)) // 480 bytes: 14 samples of 32
	require.NoError(t, os.WriteFile(b, []byte(corpus()), 0o644))
	sets := []string{"data.path=", `data.sources=["0.4 ` + a + `", "0.6 ` + b + `"]`, "data.tokenizer=byte", "model.vocab_size=256",
		"data.val_fraction=0.1", "train.steps=8", "train.eval_interval=4", "checkpoint.interval=5", "parallel.world_size=2",
		"train.global_batch_size=16"}
	whole, _ := tinyRun(t, sets...)
	ref, err := Run(context.Background(), whole, opts())
	require.NoError(t, err)
	refSources := sourcesOf(t, ref.Dir)
	last := refSources[len(refSources)-1]
	require.Len(t, last, 2)
	assert.Equal(t, a, last[0].Source)
	assert.Equal(t, 8*16, last[0].Samples+last[1].Samples)
	assert.InDelta(t, 0.4, float64(last[0].Samples)/128, 0.01)
	assert.Greater(t, last[0].Epochs, 3.0, "the small source is drawn for several epochs")

	stopped, _ := tinyRun(t, sets...)
	o := opts()
	o.StopAfter = 5
	first, err := Run(context.Background(), stopped, o)
	require.NoError(t, err)
	entries, err := ckpt.List(filepath.Join(first.Dir, "checkpoints"))
	require.NoError(t, err)
	o = opts()
	o.Resume = entries[len(entries)-1].Dir
	again, err := Run(context.Background(), stopped, o)
	require.NoError(t, err)
	assert.Equal(t, curveOf(t, ref.Dir), curveOf(t, again.Dir))
	assert.Equal(t, refSources, sourcesOf(t, again.Dir))

	moved, _ := tinyRun(t, append(sets, "parallel.world_size=4")...)
	o = opts()
	o.Resume = entries[len(entries)-1].Dir
	four, err := Run(context.Background(), moved, o)
	require.NoError(t, err)
	want, got := lossesOf(t, ref.Dir), lossesOf(t, four.Dir)
	require.Len(t, got, len(want))
	assert.Less(t, maxRelDiff(want, got), 1e-5)
	assert.Equal(t, refSources[5:], sourcesOf(t, four.Dir)[5:])
}
