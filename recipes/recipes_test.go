package recipes

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestShippedRecipesLintClean: every recipe shipped loads and lints with no error
// and no warning, in an environment with no SHARDLINE_ variables.
func TestShippedRecipesLintClean(t *testing.T) {
	var files []string
	require.NoError(t, filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Ext(p) == ".toml" {
			files = append(files, p)
		}
		return err
	}))
	require.GreaterOrEqual(t, len(files), 6)
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			res, diags := config.Load(f, config.Options{})
			require.NotNil(t, res, "%v", diags)
			diags = append(diags, config.Lint(res, nil)...)
			for _, d := range diags {
				assert.NotEqual(t, config.SevError, d.Severity, "%v", d)
				assert.NotEqual(t, config.SevWarning, d.Severity, "%v", d)
			}
		})
	}
}

// TestLlama4Shape pins the public report's model so an edit cannot drift from it.
func TestLlama4Shape(t *testing.T) {
	res, diags := config.Load("llama4-3bx128e.toml", config.Options{})
	require.False(t, diags.HasErrors(), "%v", diags)
	m, p := res.Recipe.Model, res.Recipe.Parallel
	assert.Equal(t, []int{2048, 48, 32, 4, 202048, 8192}, []int{m.Hidden, m.Layers, m.Heads, m.KVHeads, m.VocabSize, m.SeqLen})
	assert.Equal(t, []int{128, 8, 768, 1, 1}, []int{m.MoE.NumExperts, m.MoE.TopK, m.MoE.ExpertFFNHidden, m.MoE.SharedExperts, m.MoE.LayerFreq})
	assert.Equal(t, []int{8, 4, 1}, []int{p.WorldSize, p.ExpertParallel, res.Recipe.Train.MicroBatchSize})
	assert.Equal(t, "full", res.Recipe.ActivationCheckpoint.Mode)
	assert.True(t, res.Recipe.Precision.BF16)
	assert.Equal(t, "fp32", res.Recipe.Precision.MainParamsDtype)
	mo := m.MoE
	assert.Equal(t, config.MoE{NumExperts: 128, TopK: 8, ExpertFFNHidden: 768, SharedExperts: 1, LayerFreq: 1, ScoreFunction: "sigmoid",
		TopKScale: 1, ScoreBeforeExpert: true, ExpertBias: true, BiasUpdateRate: 1e-3}, mo, "torchtitan llama4's router")
}

// TestEmbeddedEqualsFiles: FS holds every .toml file of this directory tree,
// byte for byte, and nothing else (a recipe added in a new subdirectory
// fails here until the embed pattern takes it in).
func TestEmbeddedEqualsFiles(t *testing.T) {
	var onDisk []string
	require.NoError(t, filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Ext(p) == ".toml" {
			onDisk = append(onDisk, filepath.ToSlash(p))
		}
		return err
	}))
	sort.Strings(onDisk)
	assert.Equal(t, onDisk, Names())
	for _, p := range onDisk {
		want, err := os.ReadFile(filepath.FromSlash(p))
		require.NoError(t, err)
		got, err := fs.ReadFile(FS, p)
		require.NoError(t, err)
		assert.Equal(t, string(want), string(got), p)
	}
	assert.Contains(t, onDisk, Default)
}

// TestShippedRecipesLoadEmbedded: every shipped recipe loads from the
// embedded copies, by its shipped: name, with its bases resolved among them,
// to the same recipe as its file.
func TestShippedRecipesLoadEmbedded(t *testing.T) {
	for _, p := range Names() {
		if strings.HasPrefix(p, "base/") {
			continue
		}
		res, diags := config.Load(config.ShippedPrefix+p, config.Options{Shipped: FS})
		require.False(t, diags.HasErrors(), "%s: %v", p, diags)
		file, diags := config.Load(filepath.FromSlash(p), config.Options{})
		require.False(t, diags.HasErrors(), "%s: %v", p, diags)
		a, _, err := config.ResolvedTOML(&res.Recipe)
		require.NoError(t, err)
		b, _, err := config.ResolvedTOML(&file.Recipe)
		require.NoError(t, err)
		assert.Equal(t, string(b), string(a), p)
		assert.Equal(t, config.ShippedPrefix+p, res.Files[len(res.Files)-1], "the recipe itself is named shipped:")
		for _, f := range res.Files {
			assert.True(t, config.IsShipped(f), "%s: its bases are shipped ones too: %s", p, f)
		}
	}
}
