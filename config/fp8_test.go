package config

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestImportMegatronFP8: every Megatron FP8 argument lands on its
// precision.fp8 key (they are the keys' flags), --fp8-interval (ignored by
// Megatron) is a note, and the import has no error; lint then notes that run
// refuses what the engine does not build of it (SL114: FP8 all-gathers
// under delayed scaling; delayed scaling and bf16 weight gradients are
// built) and nothing else
// about it.
func TestImportMegatronFP8(t *testing.T) {
	src := "torchrun pretrain_gpt.py " + llamaArgs + " --bf16 --use-megatron-fsdp --use-distributed-optimizer --no-gradient-accumulation-fusion --ckpt-format fsdp_dtensor" +
		" --data-parallel-sharding-strategy optim_grads_params --num-layers 4" +
		" --fp8-format e4m3 --fp8-recipe delayed --fp8-amax-history-len 1024 --fp8-amax-compute-algo max --fp8-margin 2" +
		" --fp8-param-gather --first-last-layers-bf16 --num-layers-at-start-in-bf16 1 --num-layers-at-end-in-bf16 2 --no-fp8-wgrad --fp8-interval 1\n"
	res, diags := ImportMegatron("fp8.sh", []byte(src))
	require.False(t, diags.HasErrors(), "%v", diags)
	f := res.Recipe.Precision.FP8
	require.Equal(t, FP8{Format: "e4m3", Recipe: "delayed", AmaxHistoryLen: 1024, AmaxComputeAlgo: "max", Margin: 2, Wgrad: false, ParamGather: true,
		FirstLastLayersBF16: true, LayersAtStartInBF16: 1, LayersAtEndInBF16: 2, HeadBF16: true, RouterBF16: true, Experts: true}, f)
	require.Equal(t, 1, res.Recipe.FP8Layers(), "4 layers less 1 at the start and 2 at the end")
	require.Contains(t, res.Origin("precision.fp8.amax_history_len").Describe(), "--fp8-amax-history-len")
	var notes []string
	for _, d := range append(diags, Lint(res, nil)...) {
		if d.Severity == SevError {
			t.Errorf("%s %s: %s", d.Code, d.Key, d.Message)
		}
		notes = append(notes, d.Code+" "+d.Message)
	}
	all := strings.Join(notes, "\n")
	require.Contains(t, all, "SL011 --fp8-interval has no effect in shardline")
	require.NotContains(t, all, "SL114 precision.fp8.recipe", "delayed scaling is built")
	require.NotContains(t, all, "SL114 precision.fp8.wgrad", "bf16 weight gradients are built")
	require.Contains(t, all, "SL114 precision.fp8.param_gather (true): shardline run refuses it")
	// Megatron's defaults stand where the script is silent: delayed scaling
	// over one step's amax.
	res, diags = ImportMegatron("hybrid.sh", []byte("torchrun pretrain_gpt.py "+llamaArgs+" --bf16 --fp8-format hybrid\n"))
	require.False(t, diags.HasErrors(), "%v", diags)
	f = res.Recipe.Precision.FP8
	require.Equal(t, []any{"hybrid", "delayed", 1, "most_recent", 0, true}, []any{f.Format, f.Recipe, f.AmaxHistoryLen, f.AmaxComputeAlgo, f.Margin, f.Wgrad})
}

// TestImportMegatronFP8Example: the Llama 3 8B example script's fp8 branch
// (--fp8-format hybrid, --fp8-param-gather; testdata/megatron/llama3_8b.sh
// with DTYPE="fp8"), which SL010 refused before, imports (its default data
// branch, Megatron's mock data, is refused as before).
func TestImportMegatronFP8Example(t *testing.T) {
	src, err := os.ReadFile("testdata/megatron/llama3_8b.sh")
	require.NoError(t, err)
	script := strings.Replace(string(src), `DTYPE="bf16"`, `DTYPE="fp8"`, 1)
	require.NotEqual(t, string(src), script)
	res, diags := ImportMegatron("llama3_8b.sh", []byte(script))
	for _, d := range diags {
		if d.Code == "SL010" {
			require.NotContains(t, d.Message, "fp8", "only the mock data of the script's default branch is refused")
		}
	}
	require.NotNil(t, res)
	f := res.Recipe.Precision.FP8
	require.Equal(t, "hybrid", f.Format)
	require.True(t, f.ParamGather)
	require.Contains(t, res.Origin("precision.fp8.param_gather").Describe(), "--fp8-param-gather")
}

// TestImportTorchtitanFloat8: the float8 converter is torchao's tensorwise
// recipe (hybrid formats, current scaling); enable_fsdp_float8_all_gather is
// param_gather; filter_fqns keeps the head and the router out of FP8; the
// grouped_mm converter puts the experts in FP8; the 2024 [float8] layout reads
// the same; without a converter the float8 settings are notes.
func TestImportTorchtitanFloat8(t *testing.T) {
	src, err := os.ReadFile("testdata/torchtitan/llama3_8b.toml")
	require.NoError(t, err)
	job := strings.Replace(string(src), `# converters = ["float8"]`, `converters = ["quantize.linear.float8"]`, 1)
	res, diags := importTTClean(t, "llama3_8b.toml", []byte(job), 64)
	requireNoErrors(t, diags)
	f := res.Recipe.Precision.FP8
	require.Equal(t, []any{"hybrid", "tensorwise", false, true}, []any{f.Format, f.Recipe, f.ParamGather, f.HeadBF16})
	require.Equal(t, `imported from [quantize.linear.float8] filter_fqns (an array of 1) ("output" in filter_fqns keeps the head out of FP8) at llama3_8b.toml:65:1`,
		res.Origin("precision.fp8.head_bf16").Describe())
	for _, d := range diags {
		if d.Code == "SL011" && strings.Contains(d.Message, "precompute_float8_dynamic_scale_for_fsdp") {
			t.Errorf("a false switch is noted: %s", d.Message)
		}
	}

	// Without the converter the same file's float8 settings change nothing.
	res, diags = importTT(t, "llama3_8b.toml", 64)
	requireNoErrors(t, diags)
	require.Equal(t, "none", res.Recipe.Precision.FP8.Format)
	found := false
	for _, d := range diags {
		found = found || (d.Code == "SL011" && strings.Contains(d.Message, "FP8 is off unless model.converters names float8"))
	}
	require.True(t, found, "the [quantize.linear.float8] settings are noted")

	// Llama 4 Scout: the router named in filter_fqns; experts in FP8 only with
	// the grouped_mm converter.
	src, err = os.ReadFile("testdata/torchtitan/llama4_17bx16e.toml")
	require.NoError(t, err)
	for _, c := range []struct {
		conv    string
		experts bool
	}{{`["float8"]`, false}, {`["quantize.linear.float8", "quantize.grouped_mm.float8"]`, true}} {
		job := strings.Replace(string(src), "[model]\n", "[model]\nconverters = "+c.conv+"\n", 1)
		res, diags := importTTClean(t, "llama4.toml", []byte(job), 64)
		for _, d := range diags {
			require.NotEqual(t, "SL010", d.Code, d.Message)
		}
		f := res.Recipe.Precision.FP8
		require.Equal(t, []bool{true, true, c.experts}, []bool{f.HeadBF16, f.RouterBF16, f.Experts}, c.conv)
	}

	// 2024: the old switch and [float8] section; no filter_fqns puts the head in FP8.
	res, diags = importTTClean(t, "old.toml", []byte("[float8]\nenable_float8_linear = true\nenable_fsdp_float8_all_gather = true\n"), 0)
	requireNoErrors(t, diags)
	f = res.Recipe.Precision.FP8
	require.Equal(t, []any{"hybrid", "tensorwise", true, false}, []any{f.Format, f.Recipe, f.ParamGather, f.HeadBF16})
	require.Contains(t, res.Origin("precision.fp8.param_gather").Describe(), "[float8] enable_fsdp_float8_all_gather = true")
}

// TestFP8RunRefuses: shardline run (config.NotExecuted, which trainer.Run
// checks first) accepts what the engine computes in FP8 (the hybrid and e4m3
// formats under tensorwise and delayed scaling, FP8 or bf16 weight gradients,
// FP8 compute weights under tensorwise, the MoE router in FP8 or bf16, dense
// layers, MoE layers' attention and experts (routed and shared, or the
// experts in bf16), first and last layers in bf16, tensor and context
// parallelism) and refuses each part it does not build,
// naming the key and the fix.
func TestFP8RunRefuses(t *testing.T) {
	r := Default()
	require.Empty(t, NotExecuted(&r))
	r.Precision.BF16 = true
	r.Precision.FP8.Format = "hybrid"
	r.Precision.FP8.Recipe = "tensorwise"
	require.Empty(t, NotExecuted(&r), "hybrid, tensorwise: built")
	r.Precision.FP8.Format = "e4m3"
	require.Empty(t, NotExecuted(&r), "e4m3, tensorwise: built")
	delayed := r
	delayed.Precision.FP8.Recipe, delayed.Precision.FP8.AmaxHistoryLen, delayed.Precision.FP8.AmaxComputeAlgo = "delayed", 1024, "max"
	require.Empty(t, NotExecuted(&delayed), "e4m3, delayed: built")
	delayed.Precision.FP8.Wgrad = false
	require.Empty(t, NotExecuted(&delayed), "bf16 weight gradients: built")
	for _, c := range []struct {
		key, why, fix string
		set           func(r *Recipe)
	}{
		{"precision.fp8.head_bf16", "output head", "head_bf16 = true", func(r *Recipe) { r.Precision.FP8.HeadBF16 = false }},
		{"precision.fp8.experts", "delayed scales", `recipe = "tensorwise", or experts = false`, func(r *Recipe) {
			r.Model.MoE.NumExperts, r.Model.MoE.TopK, r.Precision.FP8.Recipe = 4, 2, "delayed"
		}},
	} {
		x := r
		c.set(&x)
		un := NotExecuted(&x)
		require.Len(t, un, 1, c.key)
		require.Equal(t, c.key, un[0].Key)
		require.Contains(t, un[0].Why, c.why, c.key)
		require.Contains(t, un[0].Fix, c.fix, c.key)
	}
	// FP8 compute weights gathered as FP8: built under tensorwise scaling,
	// refused (beside delayed scaling itself) under delayed.
	pg := r
	pg.Precision.FP8.ParamGather = true
	require.Empty(t, NotExecuted(&pg), "param_gather, tensorwise: built")
	pg.Precision.FP8.Recipe = "delayed"
	un := NotExecuted(&pg)
	require.Len(t, un, 1)
	require.Equal(t, "precision.fp8.param_gather", un[0].Key)
	require.Contains(t, un[0].Why, "amax histories")
	require.Contains(t, un[0].Fix, `set recipe = "tensorwise", or param_gather = false`)
	moe := r
	moe.Model.MoE.NumExperts, moe.Model.MoE.TopK, moe.Precision.FP8.Experts = 4, 2, false
	require.Empty(t, NotExecuted(&moe), "MoE layers with the experts in bf16: built")
	moe.Precision.FP8.RouterBF16 = false
	require.Empty(t, NotExecuted(&moe), "the router in FP8: built")
	moe.Precision.FP8.Experts = true
	require.Empty(t, NotExecuted(&moe), "MoE layers with the experts in FP8: built")
	moe.Precision.FP8.Recipe = "delayed"
	require.Len(t, NotExecuted(&moe), 1, "the experts in FP8 under delayed scaling: refused")
	tp := r
	tp.Parallel.TensorParallel, tp.Parallel.ContextParallel = 2, 2
	require.Empty(t, NotExecuted(&tp), "tensor and context parallelism: built")
	tp.Precision.FP8.Recipe, tp.Precision.FP8.AmaxHistoryLen, tp.Precision.FP8.AmaxComputeAlgo = "delayed", 16, "max"
	require.Empty(t, NotExecuted(&tp), "tensor and context parallelism under delayed scaling: built")
	wg := r
	wg.Precision.FP8.ParamGather, wg.Precision.FP8.Wgrad = true, false
	require.Empty(t, NotExecuted(&wg), "FP8 compute weights with bf16 weight gradients: built")
	d := Default()
	require.Equal(t, 0, d.FP8Layers())
	require.Equal(t, 4, r.FP8Layers())
	lo, hi := r.FP8LayerRange()
	require.Equal(t, [2]int{0, 4}, [2]int{lo, hi})
	r.Precision.FP8.FirstLastLayersBF16 = true
	lo, hi = r.FP8LayerRange()
	require.Equal(t, [2]int{1, 3}, [2]int{lo, hi}, "one layer at each end in bf16")
	r.Precision.FP8.LayersAtStartInBF16 = 4
	lo, hi = r.FP8LayerRange()
	require.Equal(t, lo, hi, "every layer in bf16: none in FP8")
	lo, hi = d.FP8LayerRange()
	require.Equal(t, lo, hi, "FP8 off")
}

// TestExportMegatronFP8: an FP8 recipe exports as Megatron's --fp8-*
// arguments (--no-fp8-wgrad for wgrad = false; head_bf16 and the other keys no
// argument carries listed) and imports back to the same fingerprint; without
// FP8 no --fp8-* argument is written (Megatron's --fp8-format has no "none").
func TestExportMegatronFP8(t *testing.T) {
	res, diags := Load("../recipes/tiny.toml", Options{Sets: []string{"precision.bf16=true", "precision.fp8.format=e4m3", "precision.fp8.recipe=tensorwise",
		"precision.fp8.wgrad=false", "precision.fp8.param_gather=true", "precision.fp8.head_bf16=false"}})
	require.False(t, diags.HasErrors(), "%v", diags)
	want, err := Fingerprint(&res.Recipe)
	require.NoError(t, err)
	e := ExportMegatron(&res.Recipe)
	args := strings.Join(e.Args, " ")
	require.Contains(t, args, "--fp8-format e4m3 --fp8-recipe tensorwise")
	require.Contains(t, args, "--no-fp8-wgrad --fp8-param-gather")
	require.Contains(t, e.Unexpressed, "precision.fp8.head_bf16 = false")
	script := strings.Replace(e.Script("tiny.toml", want), "\n# torchrun ", "\ntorchrun ", 1)
	back, diags := ImportMegatron("launch.sh", []byte(script))
	require.False(t, diags.HasErrors(), "%v\n%s", diags, script)
	got, err := Fingerprint(&back.Recipe)
	require.NoError(t, err)
	require.Equal(t, want, got, script)

	res, diags = Load("../recipes/tiny.toml", Options{})
	require.False(t, diags.HasErrors(), "%v", diags)
	require.NotContains(t, strings.Join(ExportMegatron(&res.Recipe).Args, " "), "fp8")
}
