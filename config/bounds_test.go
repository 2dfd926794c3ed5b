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
		_, diags := importTTClean(t, "job.toml", []byte(job), ws)
		d := firstError(t, diags)
		require.Equal(t, "SL008", d.Code)
		require.Equal(t, "job.toml:5:1", d.Location())
		require.Contains(t, d.Message, "a parallel degree is at most 1048576")
	}
	job = "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n[parallelism]\ntensor_parallel_degree = 1024\npipeline_parallel_degree = 1024\ncontext_parallel_degree = 1024\n"
	_, diags := importTTClean(t, "job.toml", []byte(job), 0)
	require.Contains(t, fmt.Sprint(diags), "replicate × tp × pp × cp reaches 1073741824")
	job = "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n[training]\nlocal_batch_size = 4611686018427387905\n"
	_, diags = importTTClean(t, "job.toml", []byte(job), 4)
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

// TestImportRepetitionIsLinear: a launch script of 20,000 lines of A+=( x )
// copied the whole array on every line (4 GB allocated, minutes for 100,000
// lines); A+=x repeated copied the whole string. Arrays grow in place, and a
// string's copies count against the script's 16 MiB expansion budget.
func TestImportRepetitionIsLinear(t *testing.T) {
	script := "A=( x )\n" + strings.Repeat("A+=( x )\n", 20000) + "python pretrain_gpt.py " + llamaArgs + " \"${A[@]}\"\n"
	var diags Diagnostics
	bytes := allocated(func() { _, diags = ImportMegatron("job.sh", []byte(script)) })
	require.Contains(t, fmt.Sprint(diags), "words that are no --argument")
	require.Less(t, bytes, uint64(64<<20), "importing %d bytes allocated %d", len(script), bytes)

	script = "A=x\n" + strings.Repeat("A+=xxxxxxxx\n", 20000) + "python pretrain_gpt.py " + llamaArgs + " --save $A\n"
	bytes = allocated(func() { _, diags = ImportMegatron("job.sh", []byte(script)) })
	require.Len(t, diags, 1)
	require.Contains(t, diags[0].Message, "its variable expansions produce over 16 MiB")
	require.Less(t, bytes, uint64(64<<20), "importing %d bytes allocated %d", len(script), bytes)
}

// TestFindingsOnALongLineAreLinear: a torchtitan job with 20,000 converters on
// one line made 20,000 findings, each naming the whole array and quoting the
// whole line (60,000 of them took 23 GB and were killed). A finding quotes at
// most 160 bytes of a line, around its column, and each converter is refused
// once.
func TestFindingsOnALongLineAreLinear(t *testing.T) {
	var b strings.Builder
	b.WriteString("[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\nconverters = [")
	for i := 0; i < 20000; i++ {
		fmt.Fprintf(&b, "\"c%d\", \"mx\", ", i)
	}
	b.WriteString("]\n")
	src := []byte(b.String())
	var out strings.Builder
	bytes := allocated(func() {
		_, diags := importTTClean(t, "job.toml", src, 0)
		require.NoError(t, RenderText(&out, diags, map[string][]byte{"job.toml": src}))
	})
	require.Less(t, bytes, uint64(256<<20), "%d bytes of job file: %d bytes allocated", len(src), bytes)
	require.Less(t, out.Len(), 400*20002, "the report is linear in its findings")
	require.Equal(t, 1, strings.Count(out.String(), `converter "mx"`), "one finding per converter")
	require.Contains(t, out.String(), `[model] converters (an array of 40000): converter "c19999"`)
	require.Contains(t, out.String(), " 4 | converters = [\"c0\", ")
}
