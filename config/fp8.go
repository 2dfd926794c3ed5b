package config

import (
	"fmt"
	"reflect"
)

// FP8On says whether the recipe trains linear layers in FP8.
func (p Precision) FP8On() bool { return p.FP8.Format != "none" }

// FP8Layers is how many transformer layers compute in FP8: all of them but
// those first_last_layers_bf16 keeps in bf16 (0 when FP8 is off).
func (r *Recipe) FP8Layers() int {
	f := r.Precision.FP8
	if !r.Precision.FP8On() {
		return 0
	}
	if !f.FirstLastLayersBF16 {
		return r.Model.Layers
	}
	return max(0, r.Model.Layers-f.LayersAtStartInBF16-f.LayersAtEndInBF16)
}

// FP8LayerRange is the transformer layers that compute in FP8: lo..hi−1,
// every layer but those first_last_layers_bf16 keeps in bf16 (lo = hi when
// none does, FP8 off included). FP8Layers is hi − lo.
func (r *Recipe) FP8LayerRange() (lo, hi int) {
	f := r.Precision.FP8
	if !r.Precision.FP8On() {
		return 0, 0
	}
	if !f.FirstLastLayersBF16 {
		return 0, r.Model.Layers
	}
	lo, hi = f.LayersAtStartInBF16, r.Model.Layers-f.LayersAtEndInBF16
	if hi <= lo {
		return 0, 0
	}
	return lo, hi
}

// fp8 checks the FP8 keys: a scaling recipe shardline has, bf16 for the
// layers FP8 leaves out, and no FP8 setting that would change nothing
// (SL115 to SL117).
func (c *checker) fp8() {
	p := c.rc.Precision
	f := p.FP8
	dflt := Recipe{Precision: Precision{FP8: Default().Precision.FP8}}
	// changed lists the FP8 keys set explicitly to a value other than the default.
	changed := func(names ...string) []string {
		var out []string
		for _, n := range names {
			key := "precision.fp8." + n
			fld := recipeSchema.byKey[key]
			if c.r.Explicit(key) && !reflect.DeepEqual(fld.Get(c.rc), fld.Get(&dflt)) {
				out = append(out, key)
			}
		}
		return out
	}
	noEffect := func(key, why, fix string) {
		v, _ := c.r.Value(key)
		c.report(SevError, "SL117", fmt.Sprintf("%s (%s) changes nothing: %s", key, FormatValue(v), why), fix, key)
	}
	if !p.FP8On() {
		for _, k := range changed("recipe", "amax_history_len", "amax_compute_algo", "margin", "wgrad", "param_gather",
			"first_last_layers_bf16", "layers_at_start_in_bf16", "layers_at_end_in_bf16", "head_bf16", "router_bf16", "experts") {
			noEffect(k, `precision.fp8.format is "none": nothing computes in FP8`, `set format = "hybrid" (or "e4m3") under [precision.fp8], or remove the key`)
		}
		return
	}
	switch f.Recipe {
	case "blockwise", "mxfp8":
		size := map[string]string{"blockwise": "block of 128 values (1×128 for activations and gradients, 128×128 for weights)", "mxfp8": "block of 32 values with a power-of-two (E8M0) scale"}[f.Recipe]
		c.report(SevError, "SL115", fmt.Sprintf("precision.fp8.recipe (%q) scales FP8 tensors per %s, which shardline does not have: it scales per tensor", f.Recipe, size),
			`set recipe = "tensorwise" (current per-tensor scaling) or "delayed" (per-tensor scaling from an amax history)`, "precision.fp8.recipe")
	case "tensorwise":
		for _, k := range changed("amax_history_len", "amax_compute_algo", "margin") {
			noEffect(k, `it configures delayed scaling, and precision.fp8.recipe is "tensorwise" (each scale comes from the tensor's own amax)`,
				`set recipe = "delayed", or remove the key`)
		}
	}
	if !p.BF16 {
		c.report(SevError, "SL116", fmt.Sprintf("precision.fp8.format (%q) needs precision.bf16 = true: the products kept out of FP8 (head, router, first and last layers, attention) compute in bf16", f.Format),
			"set bf16 = true under [precision] (Megatron's --bf16)", "precision.fp8.format", "precision.bf16")
	}
	if !f.FirstLastLayersBF16 {
		for _, k := range changed("layers_at_start_in_bf16", "layers_at_end_in_bf16") {
			noEffect(k, "precision.fp8.first_last_layers_bf16 is false, so every layer computes in FP8", "set first_last_layers_bf16 = true, or remove the key")
		}
	} else if c.rc.FP8Layers() == 0 {
		c.report(SevError, "SL117", fmt.Sprintf("precision.fp8.first_last_layers_bf16 keeps %d layers at the start and %d at the end in bf16, every one of the model's %d: nothing computes in FP8",
			f.LayersAtStartInBF16, f.LayersAtEndInBF16, c.rc.Model.Layers),
			"lower layers_at_start_in_bf16 or layers_at_end_in_bf16, or set precision.fp8.format = \"none\"",
			"precision.fp8.first_last_layers_bf16", "precision.fp8.layers_at_start_in_bf16", "precision.fp8.layers_at_end_in_bf16")
	}
	if c.rc.Model.MoE.NumExperts == 0 {
		for _, k := range changed("router_bf16", "experts") {
			noEffect(k, "the model has no experts (model.moe.num_experts = 0)", "remove the key")
		}
	}
	if f.ParamGather && c.rc.FSDP.DataParallelShardingStrategy == "no_shard" {
		noEffect("precision.fp8.param_gather", `fsdp.data_parallel_sharding_strategy is "no_shard": every rank holds its weights whole, nothing is all-gathered`,
			`set data_parallel_sharding_strategy = "optim_grads_params", or param_gather = false`)
	}
}
