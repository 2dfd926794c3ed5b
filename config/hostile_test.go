package config

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// Hostile recipes of about 96 KB: each is refused with a positioned error, and
// loading allocates at most a small multiple of the file's size (before the depth
// caps, nested inline tables of this size took 2.3 GB).
func TestHostileRecipesAreLinear(t *testing.T) {
	const n = 48000 // 96 KB of nesting
	cases := map[string]struct{ src, want string }{
		"nested inline tables": {"a = " + strings.Repeat("{a=", n) + "1" + strings.Repeat("}", n) + "\n", "parts deep"},
		"nested arrays":        {"[model]\nlayers = " + strings.Repeat("[", n) + strings.Repeat("]", n) + "\n", "nested 5 levels deep"},
		"long dotted key":      {strings.Repeat("a.", n) + "b = 1\n", "parts deep"},
		"deep table header":    {"[" + strings.Repeat("a.", n) + "b]\nx = 1\n", "parts deep"},
		"many unknown keys":    {"[model]\n" + strings.Repeat("nope = 1\n", n/5), "unknown key"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			var diags Diagnostics
			bytes := allocated(func() { _, diags = LoadBytes("hostile.toml", []byte(c.src), Options{}) })
			require.True(t, diags.HasErrors())
			require.Contains(t, diags[0].Message, c.want)
			require.True(t, diags[0].Origin.Pos.IsValid(), "%v", diags[0])
			limit := uint64(400 * len(c.src)) // per-finding records dominate "many unknown keys"
			t.Logf("%d bytes of recipe: %d bytes allocated", len(c.src), bytes)
			require.Less(t, bytes, limit, "loading %d bytes allocated %d", len(c.src), bytes)
		})
	}
}

func TestRecipeReadersRefuseDevicesAndHugeFiles(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.toml")
	f, err := os.Create(big)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(MaxRecipeBytes+1))
	require.NoError(t, f.Close())
	// A base must be named .toml (recipe_secrets_test.go); behind the name, a
	// device is still refused unread.
	zero := filepath.Join(dir, "zero.toml")
	require.NoError(t, os.Symlink("/dev/zero", zero))
	ext := filepath.Join(dir, "ext.toml")
	require.NoError(t, os.WriteFile(ext, []byte("extends = \"zero.toml\"\n"), 0o644))
	for _, c := range []struct{ path, want string }{
		{"/dev/zero", "not a regular file (a device)"},
		{dir, "not a regular file (a directory)"},
		{big, "file too large"},
		{ext, "cannot read recipe " + zero + ": not a regular file"},
	} {
		_, diags := Load(c.path, Options{})
		require.True(t, diags.HasErrors(), c.path)
		require.Contains(t, diags.Err().Error(), c.want)
	}
}

func TestByteOrderMarkIsNamed(t *testing.T) {
	_, diags := LoadBytes("bom.toml", []byte("\xEF\xBB\xBF[run]\nseed = 1\n"), Options{})
	require.Len(t, diags, 1)
	require.Contains(t, diags[0].Message, "UTF-8 byte-order mark")
	require.Equal(t, "bom.toml:1:1", diags[0].Origin.Pos.String())
}

// TestImportMegatronExpansionBomb: a launch script whose variables or arrays double
// themselves line by line would need 2^40 bytes; the import refuses it once its
// expansions pass 16 MiB, naming why.
func TestImportMegatronExpansionBomb(t *testing.T) {
	for _, script := range []string{
		"A=x\n" + strings.Repeat("A=\"$A$A\"\n", 40) + "python pretrain_gpt.py $A\n",
		"A=( x )\n" + strings.Repeat("A=( \"${A[@]}\" \"${A[@]}\" )\n", 40) + "python pretrain_gpt.py \"${A[@]}\"\n",
		"A=x\n" + strings.Repeat("A=${B:-$A$A}\n", 40) + "python pretrain_gpt.py $A\n",
	} {
		res, diags := ImportMegatron("bomb.sh", []byte(script))
		require.Nil(t, res)
		require.Len(t, diags, 1)
		require.Contains(t, diags[0].Message, "its variable expansions produce over 16 MiB")
	}
}

// TestValuesMustBeUTF8: a value that is not UTF-8 (a --set, a Megatron
// argument: a path in Latin-1) is refused naming where it came from, since the
// resolved recipe a run writes is TOML, which holds only UTF-8, and would not
// load back (FuzzImport found an imported --save path that did not). A recipe
// file's own name, which becomes run.name when the recipe sets none, is made
// UTF-8 instead.
func TestValuesMustBeUTF8(t *testing.T) {
	_, diags := LoadBytes("r.toml", []byte("[run]\nname = \"x\"\n"), Options{Sets: []string{"checkpoint.dir=ckpt\xbbs"}})
	require.True(t, diags.HasErrors())
	require.Equal(t, "SL007", diags[0].Code)
	require.Contains(t, diags[0].Message, `"ckpt\xbbs" is not UTF-8`)
	require.Equal(t, "--set checkpoint.dir", diags[0].Origin.Name)

	script := "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --save ckpt\xbbs\n"
	_, diags = ImportMegatron("job.sh", []byte(script))
	require.True(t, diags.HasErrors())
	require.Contains(t, fmt.Sprint(diags), "is not UTF-8")
	require.Contains(t, fmt.Sprint(diags), "--save")

	res, diags := LoadBytes("r\xbb.toml", []byte("[model]\nlayers = 2\n"), Options{})
	require.False(t, diags.HasErrors(), "%v", diags)
	require.Equal(t, "r_", res.Recipe.Run.Name)
	body, err := AnnotatedTOML(res)
	require.NoError(t, err)
	_, diags = LoadBytes("back.toml", body, Options{})
	require.False(t, diags.HasErrors(), "the resolved recipe loads back: %v", diags)
}
