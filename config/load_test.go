package config

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	}
	return dir
}

// TestPrecedence: defaults < base < file < env < --set < Megatron flags, and every
// layer is remembered in order.
func TestPrecedence(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"base/b.toml": "[model]\nlayers = 2\nhidden = 64\nheads = 2\n[train]\nlr = 0.5\n",
		"x.toml":      "extends = \"base/b.toml\"\n[model]\nlayers = 3\n",
	})
	res, diags := Load(filepath.Join(dir, "x.toml"), Options{
		Env:   []string{"SHARDLINE_MODEL_LAYERS=5", "SHARDLINE_TRAIN_LR=0.25", "OTHER=1"},
		Sets:  []string{"model.layers=6", "model.hidden=96"},
		Flags: []FlagValue{{Name: "num-layers", Value: "7"}},
	})
	require.Empty(t, diags)
	r := res.Recipe
	assert.Equal(t, 7, r.Model.Layers)
	assert.Equal(t, 96, r.Model.Hidden)
	assert.Equal(t, 2, r.Model.Heads)
	assert.Equal(t, 0.25, r.Train.LR)
	assert.Equal(t, 384, r.Model.FFNHidden, "untouched keys keep their default")

	var kinds []OriginKind
	for _, o := range res.History("model.layers") {
		kinds = append(kinds, o.Kind)
	}
	assert.Equal(t, []OriginKind{FromFile, FromFile, FromEnv, FromSet, FromFlag}, kinds)
	h := res.History("model.layers")
	assert.Equal(t, filepath.Join(dir, "base/b.toml")+":2:1", h[0].Pos.String())
	assert.Equal(t, filepath.Join(dir, "x.toml")+":3:1", h[1].Pos.String())
	assert.Equal(t, "flag --num-layers", res.Origin("model.layers").Location())
	assert.Equal(t, FromDefault, res.Origin("model.ffn_hidden").Kind)
	assert.False(t, res.Explicit("model.ffn_hidden"))
	assert.Equal(t, []string{filepath.Join(dir, "base/b.toml"), filepath.Join(dir, "x.toml")}, res.Files)
}

func TestOverrideForms(t *testing.T) {
	dir := writeFiles(t, map[string]string{"x.toml": "[data]\npath = \"/\"\n"})
	res, diags := Load(filepath.Join(dir, "x.toml"), Options{
		Sets: []string{
			`fsdp.fsdp_unit_modules=embedding, transformer_layer`,
			`run.name="quoted name"`,
			`model.moe.capacity_factor=1_000.5`,
			`run.seed=0x10`,
		},
		Flags: []FlagValue{{Name: "no-gradient-accumulation-fusion", Value: "true"}, {Name: "bf16", Value: "true"}, {Name: "use-megatron-fsdp", Value: "false"},
			{Name: "data-parallel-sharding-strategy", Value: "optim"}, {Name: "ckpt-format", Value: "torch_dist"}},
	})
	require.Empty(t, diags)
	r := res.Recipe
	assert.Equal(t, []string{"embedding", "transformer_layer"}, r.FSDP.FSDPUnitModules)
	assert.Equal(t, "quoted name", r.Run.Name)
	assert.Equal(t, 1000.5, r.Model.MoE.CapacityFactor)
	assert.Equal(t, int64(16), r.Run.Seed)
	assert.False(t, r.FSDP.GradientAccumulationFusion)
	assert.True(t, r.Precision.BF16)
	assert.False(t, r.FSDP.UseMegatronFSDP)
	assert.Equal(t, "optim", r.FSDP.DataParallelShardingStrategy)

	res, diags = Load(filepath.Join(dir, "x.toml"), Options{Sets: []string{`fsdp.fsdp_unit_modules=["embedding"]`}})
	require.Empty(t, diags)
	assert.Equal(t, []string{"embedding"}, res.Recipe.FSDP.FSDPUnitModules)
}

func TestInlineTablesAndDottedKeys(t *testing.T) {
	dir := writeFiles(t, map[string]string{"x.toml": "[model]\nmoe = { num_experts = 4, top_k = 1 }\nmoe.layer_freq = 2\n"})
	res, diags := Load(filepath.Join(dir, "x.toml"), Options{})
	require.Empty(t, diags)
	assert.Equal(t, MoE{NumExperts: 4, TopK: 1, ExpertFFNHidden: 256, AuxLossCoeff: 0.01, LayerFreq: 2,
		ScoreFunction: "softmax", NormTopK: true, TopKScale: 1, BiasUpdateRate: 1e-3}, res.Recipe.Model.MoE)
}

func TestImpliedValues(t *testing.T) {
	dir := writeFiles(t, map[string]string{"my-run.toml": "[fsdp]\nuse_nccl_ub = true\n"})
	res, diags := Load(filepath.Join(dir, "my-run.toml"), Options{})
	require.Empty(t, diags)
	assert.True(t, res.Recipe.FSDP.FSDPDoubleBuffer)
	assert.Equal(t, FromImplied, res.Origin("fsdp.fsdp_double_buffer").Kind)
	assert.Equal(t, "my-run", res.Recipe.Run.Name)
}

func TestMissingFile(t *testing.T) {
	res, diags := Load(filepath.Join(t.TempDir(), "none.toml"), Options{})
	assert.Nil(t, res)
	require.Len(t, diags, 1)
	assert.Equal(t, "SL005", diags[0].Code)
	assert.Contains(t, diags[0].Message, "does not exist")
}

// TestRoundTrip: resolve -> load -> resolve gives identical bytes and fingerprint,
// for every shipped recipe and with overrides.
func TestRoundTrip(t *testing.T) {
	files, err := filepath.Glob("../recipes/*.toml")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			res, diags := Load(f, Options{Flags: []FlagValue{{Name: "num-layers", Value: "3"}}, Sets: []string{"train.lr=0.000123"}})
			require.False(t, diags.HasErrors(), "%v", diags)
			out1, fp1, err := ResolvedTOML(&res.Recipe)
			require.NoError(t, err)
			res2, diags := LoadBytes(filepath.Join(t.TempDir(), "resolved.toml"), out1, Options{})
			require.False(t, diags.HasErrors(), "%v", diags)
			assert.Equal(t, res.Recipe, res2.Recipe)
			out2, fp2, err := ResolvedTOML(&res2.Recipe)
			require.NoError(t, err)
			assert.Equal(t, string(out1), string(out2))
			assert.Equal(t, fp1, fp2)
			fp3, err := Fingerprint(&res.Recipe)
			require.NoError(t, err)
			assert.Equal(t, fp1, fp3)
			for _, fld := range RecipeSchema().Fields {
				assert.True(t, res2.Explicit(fld.Key), "resolved output states %s explicitly", fld.Key)
			}
		})
	}
}

func TestFingerprintChangesWithRecipe(t *testing.T) {
	a, b := Default(), Default()
	b.Train.LR *= 2
	fa, err := Fingerprint(&a)
	require.NoError(t, err)
	fb, err := Fingerprint(&b)
	require.NoError(t, err)
	assert.NotEqual(t, fa, fb)
	assert.Regexp(t, `^sha256:[0-9a-f]{64}$`, fa)
}

// TestReferenceCurrent keeps docs/recipes.md equal to `shardline recipe docs
// --format markdown`, and makes sure every key is documented.
func TestReferenceCurrent(t *testing.T) {
	secs, err := Reference()
	require.NoError(t, err)
	n := 0
	for _, s := range secs {
		assert.NotEmpty(t, s.Doc, "section %s has a doc comment", s.Name)
		n += len(s.Fields)
	}
	assert.Equal(t, len(RecipeSchema().Fields), n)
	var b bytes.Buffer
	require.NoError(t, WriteReference(&b, "markdown"))
	golden(t, "../docs/recipes.md", b.Bytes())
}

func TestExpandPath(t *testing.T) {
	p, err := ExpandPath("${HOME}/x/$USER", map[string]string{"HOME": "/h", "USER": "u"})
	require.NoError(t, err)
	assert.Equal(t, "/h/x/u", p)
	p, err = ExpandPath("${GOROOT}/src", map[string]string{"GOROOT": "/go"})
	require.NoError(t, err)
	assert.Equal(t, "/go/src", p)
	p, err = ExpandPath("${GOROOT}/src/testdata/Isaac.Newton-Opticks.txt", nil)
	require.NoError(t, err, "GOROOT falls back to the Go installation")
	_, err = os.Stat(p)
	assert.NoError(t, err)
	_, err = ExpandPath("${NOPE_NOT_SET}/x", nil)
	assert.ErrorContains(t, err, "NOPE_NOT_SET is not set")
}

func TestSuggest(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"layres", "layers"}, {"hiden", "hidden"}, {"cosinus", "cosine"}, {"zzzzzz", ""}, {"optim_grad", "optim_grads"},
	} {
		assert.Equal(t, tc.want, Suggest(tc.in, []string{"layers", "hidden", "cosine", "optim_grads", "optim_grads_params"}), tc.in)
	}
}

// TestMegatronArguments: a Llama argument list as Megatron's examples write it
// loads clean: the describing arguments are accepted, --untie-embeddings-and-
// output-weights and --min-lr set their keys (min_lr_factor = min-lr / lr, with
// lr given after it), and the no-effect ones are notes.
func TestMegatronArguments(t *testing.T) {
	var flags []FlagValue
	for _, a := range [][2]string{{"swiglu", "true"}, {"normalization", "RMSNorm"}, {"position-embedding-type", "rope"},
		{"disable-bias-linear", "true"}, {"group-query-attention", "true"}, {"num-query-groups", "2"}, {"untie-embeddings-and-output-weights", "true"},
		{"max-position-embeddings", "4096"}, {"attention-dropout", "0"}, {"hidden-dropout", "0.0"}, {"min-lr", "3e-5"}, {"lr", "3e-4"},
		{"use-mcore-models", "true"}, {"use-flash-attn", "true"}} {
		flags = append(flags, FlagValue{Name: a[0], Value: a[1]})
	}
	res, diags := LoadBytes("r.toml", []byte("[model]\ntie_embeddings = true\n"), Options{Flags: flags})
	require.False(t, diags.HasErrors(), "%v", diags)
	r := res.Recipe
	require.False(t, r.Model.TieEmbeddings)
	require.Equal(t, 2, r.Model.KVHeads)
	require.InDelta(t, 0.1, r.Train.MinLRFactor, 1e-12)
	notes := 0
	for _, d := range diags {
		if d.Code == "SL011" {
			notes++
		}
	}
	require.Equal(t, 2, notes, "%v", diags)
	require.Equal(t, "flag --min-lr=3e-5", res.Origin("train.min_lr_factor").Describe())
}

// TestLoadShipped: a shipped:PATH recipe is read from Options.Shipped, its
// extends resolve among the shipped recipes (never a file beside the
// working directory), diagnostics name it shipped:PATH:line:col, and the
// run name implied by its file name carries no prefix. Without Shipped, or
// for a name not shipped, the recipe does not exist.
func TestLoadShipped(t *testing.T) {
	shipped := fstest.MapFS{
		"r.toml":      {Data: []byte("extends = \"base/b.toml\"\n[model]\nlayers = 3\n")},
		"base/b.toml": {Data: []byte("[model]\nhidden = 64\nlayers = 2\n")},
		"bad.toml":    {Data: []byte("[model]\nlayers = -1\n")},
	}
	res, diags := Load("shipped:r.toml", Options{Shipped: shipped})
	require.False(t, diags.HasErrors(), "%v", diags)
	assert.Equal(t, 3, res.Recipe.Model.Layers)
	assert.Equal(t, 64, res.Recipe.Model.Hidden)
	assert.Equal(t, "r", res.Recipe.Run.Name)
	assert.Equal(t, []string{"shipped:base/b.toml", "shipped:r.toml"}, res.Files)
	assert.Equal(t, "shipped:r.toml:3:1", res.Origin("model.layers").Location())

	_, diags = Load("shipped:bad.toml", Options{Shipped: shipped})
	require.True(t, diags.HasErrors())
	assert.Contains(t, diags.Err().Error(), "shipped:bad.toml:2:")

	for _, c := range []struct {
		path string
		opts Options
	}{{"shipped:r.toml", Options{}}, {"shipped:none.toml", Options{Shipped: shipped}}, {"shipped:../r.toml", Options{Shipped: shipped}}} {
		res, diags := Load(c.path, c.opts)
		assert.Nil(t, res, c.path)
		require.True(t, diags.HasErrors(), c.path)
		assert.Contains(t, diags.Err().Error(), "recipe "+c.path+" does not exist", c.path)
	}
	assert.Equal(t, "shipped:base/x.toml", extendsPath("shipped:a.toml", "base/x.toml"))
	assert.Equal(t, "shipped:x.toml", extendsPath("shipped:base/a.toml", "../x.toml"))
	assert.Equal(t, "/etc/x.toml", extendsPath("shipped:a.toml", "/etc/x.toml"))
	assert.Equal(t, filepath.Join("dir", "x.toml"), extendsPath(filepath.Join("dir", "a.toml"), "x.toml"))
}

// TestMegatronDocumentMasks: --eod-mask-loss and --reset-attention-mask set
// their data keys; --reset-position-ids is accepted beside
// --reset-attention-mask (rotary positions are relative) and refused without it.
func TestMegatronDocumentMasks(t *testing.T) {
	gpt2 := []byte("[data]\npath = \"/\"\ntokenizer = \"gpt2\"\n[model]\nvocab_size = 50304\n")
	flags := []FlagValue{{Name: "eod-mask-loss", Value: "true"}, {Name: "reset-attention-mask", Value: "true"}, {Name: "reset-position-ids", Value: "true"}}
	res, diags := LoadBytes("r.toml", gpt2, Options{Flags: flags})
	require.False(t, diags.HasErrors(), "%v", diags)
	require.True(t, res.Recipe.Data.EODMaskLoss)
	require.True(t, res.Recipe.Data.ResetAttentionMask)
	require.Equal(t, "flag --reset-attention-mask=true", res.Origin("data.reset_attention_mask").Describe())
	require.False(t, Lint(res, nil).HasErrors())

	_, diags = LoadBytes("r.toml", gpt2, Options{Flags: flags[2:]})
	require.True(t, diags.HasErrors())
	require.ErrorContains(t, diags.Err(), "--reset-position-ids")
	require.ErrorContains(t, diags.Err(), "add --reset-attention-mask")
}
