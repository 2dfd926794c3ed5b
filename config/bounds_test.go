package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestExtendsChainIsBounded: a base that extends itself through a symbolic
// link to its own directory (loop -> .) is no cycle by path, so the chain went on,
// holding every copy of the file, until the path was too long (about 800 deep).
// A chain is at most maxExtendsDepth recipes.
func TestExtendsChainIsBounded(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Symlink(".", filepath.Join(dir, "loop")))
	pad := "# " + strings.Repeat("x", 512<<10) + "\n" // half a megabyte a copy
	require.NoError(t, os.WriteFile(filepath.Join(dir, "base.toml"), []byte(pad+"extends = \"loop/base.toml\"\n[model]\nlayers = 2\n"), 0o644))
	var diags Diagnostics
	bytes := allocated(func() { _, diags = Load(filepath.Join(dir, "base.toml"), Options{}) })
	require.True(t, diags.HasErrors())
	d := diags[0]
	require.Equal(t, "SL005", d.Code)
	require.Contains(t, d.Message, "goes 17 recipes deep")
	require.Contains(t, d.Help, "at most 16 bases")
	require.Less(t, bytes, uint64(64<<20), "loading allocated %d bytes", bytes)
}

// TestImportSizesAreCheckedBeforeUse: values an import multiplies are bounded
// first. torchtitan degrees of 2^32 wrapped their product to 0, and the import
// divided by it (a panic); torchrun --nproc_per_node 2^62+1 --nnodes 4 wrapped
// to a world size of 4.
func TestImportSizesAreCheckedBeforeUse(t *testing.T) {
	job := "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n[parallelism]\ntensor_parallel_degree = 4294967296\ndata_parallel_replicate_degree = 4294967296\n"
	for _, ws := range []int{0, 8} {
		_, diags := ImportTorchtitan("job.toml", []byte(job), ws)
		d := firstError(t, diags)
		require.Equal(t, "SL008", d.Code)
		require.Equal(t, "job.toml:5:1", d.Location())
		require.Contains(t, d.Message, "a parallel degree is at most 1048576")
	}
	job = "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n[parallelism]\ntensor_parallel_degree = 1024\npipeline_parallel_degree = 1024\ncontext_parallel_degree = 1024\n"
	_, diags := ImportTorchtitan("job.toml", []byte(job), 0)
	require.Contains(t, fmt.Sprint(diags), "replicate × tp × pp × cp reaches 1073741824")
	job = "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n[training]\nlocal_batch_size = 4611686018427387905\n"
	_, diags = ImportTorchtitan("job.toml", []byte(job), 4)
	require.Contains(t, fmt.Sprint(diags), "a micro-batch is 1 to 1073741824 sequences")

	for _, launch := range []string{"torchrun --nproc_per_node 4611686018427387905 --nnodes 4", "torchrun --nproc_per_node 1048576 --nnodes 2"} {
		res, diags := ImportMegatron("job.sh", []byte(launch+" pretrain_gpt.py "+llamaArgs+"\n"))
		require.Nil(t, res, launch)
		require.Contains(t, diags[0].Message, "over the 1048576 ranks a recipe has", launch)
	}
}

// TestAllocationSizesAreRefusedByRules: values that size the plan's
// allocations (vocab_size 1e12, hidden, seq_len, layers) are refused by a rule
// where they enter, before lint or plan builds anything from them.
func TestAllocationSizesAreRefusedByRules(t *testing.T) {
	for _, set := range []string{"model.vocab_size=1000000000000", "model.hidden=1000000000000", "model.seq_len=1000000000000",
		"model.layers=1000000000", "model.moe.num_experts=1000000000", "train.micro_batch_size=1000000000000", "parallel.world_size=1000000000000"} {
		var diags Diagnostics
		bytes := allocated(func() { _, diags = LoadBytes("r.toml", nil, Options{Sets: []string{set}}) })
		require.Len(t, diags, 1, set)
		require.Equal(t, "SL008", diags[0].Code, set)
		require.Contains(t, diags[0].Message, "must be ≤", set)
		require.Less(t, bytes, uint64(4<<20), set)
	}
}

func firstError(t *testing.T, diags Diagnostics) Diagnostic {
	t.Helper()
	for _, d := range diags {
		if d.Severity == SevError {
			return d
		}
	}
	t.Fatalf("no error among %v", diags)
	return Diagnostic{}
}
