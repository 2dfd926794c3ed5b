package hf

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/shardline/shardline/config"
)

// DeepSeek-V3's router over standard attention: Glm4MoeForCausalLM.
//
// transformers' DeepseekV3ForCausalLM always attends with multi-head latent
// attention (MLA), which shardline's attention does not compute. Two
// architectures route exactly as DeepSeek-V3 does (sigmoid scores, the
// e_score_correction_bias added for the choice only, n_group/topk_group
// group-limited choice, norm_topk_prob, routed_scaling_factor, shared experts
// as one wider MLP with no gate, first_k_dense_replace dense layers) over
// grouped-query attention: Dots1ForCausalLM (rednote's dots.llm1) and
// Glm4MoeForCausalLM (GLM-4.5). Dots1's attention is Qwen3's, always with the
// per-head QK RMSNorm; Glm4Moe's has it as use_qk_norm, and its other
// differences from shardline's attention are switches config.json sets:
// attention_bias false and partial_rotary_factor 1 (GLM-4.5 rotates half of
// each head; transformers rotates the first partial_rotary_factor·head_dim
// dimensions, rotate-half style, as shardline does all of them). So one
// architecture, Glm4MoeForCausalLM, takes every sigmoid router, with and
// without QK-norm.
//
// What no config.json key expresses is refused (glm4MoeSupported): NoPE
// layers; dense layers other than the first ones (first_k_dense_replace); and
// group-limited routing whose group score differs: transformers scores a group
// by the sum of its two best biased scores (topk(2)), shardline (as Megatron)
// by its top_k / group_top_k best, equal when that is 2 or when every group
// is kept. One difference is bridged instead: transformers 4.5x fills the
// experts of the groups not chosen with 0.0 before the top-k (later versions
// with -inf, as DeepSeek's own code and shardline), so an allowed expert whose
// biased score is below 0 would lose to an excluded one. An export under
// group-limited routing therefore writes each layer's biases less their
// minimum when it is negative: every biased score is then above 0, and adding
// one constant to every expert's bias changes no choice (each group's score
// and each expert's rank move alike), nor the gates, which read the unbiased
// scores.

// glm4Moe is the architecture a sigmoid router exports as.
const glm4Moe = "Glm4MoeForCausalLM"

// isGlm4Moe says whether m exports as Glm4MoeForCausalLM: an MoE model whose
// router scores by sigmoid and weighs the experts' outputs (Llama 4 scales
// the token before its expert instead).
func isGlm4Moe(m config.Model) bool {
	return m.MoE.NumExperts > 0 && m.MoE.ScoreFunction == "sigmoid" && !m.MoE.ScoreBeforeExpert
}

// firstDense is first_k_dense_replace for m: the layers before its first MoE
// layer; ok says whether every layer after them is MoE, as Glm4Moe's are.
func firstDense(m config.Model) (k int, ok bool) {
	k = m.Layers
	for l := 0; l < m.Layers; l++ {
		if m.IsMoELayer(l) {
			k = l
			break
		}
	}
	for l := k; l < m.Layers; l++ {
		if !m.IsMoELayer(l) {
			return k, false
		}
	}
	return k, true
}

// groupLimited says whether m's group-limited routing excludes experts (some
// groups are not kept).
func groupLimited(m config.Model) bool {
	return m.MoE.NumGroups > 0 && m.MoE.GroupTopK < m.MoE.NumGroups
}

// glm4MoeSupported refuses what Glm4MoeForCausalLM cannot express, each with
// the recipe key, its value, the rule and a fix.
func glm4MoeSupported(m config.Model) error {
	moe := m.MoE
	var bad []string
	if m.NoPEInterval > 0 {
		bad = append(bad, fmt.Sprintf("model.nope_interval = %d: Glm4MoeForCausalLM applies RoPE in every layer (set it to 0)", m.NoPEInterval))
	}
	if k, ok := firstDense(m); !ok {
		bad = append(bad, fmt.Sprintf("model.moe.layer_freq = %d with %d layers: the MoE layers are every %d-th and the layers between them dense, Glm4MoeForCausalLM's dense layers are the first first_k_dense_replace (%d) only (set layer_freq to 1, every layer MoE, or to model.layers, only the last)",
			moe.LayerFreq, m.Layers, moe.LayerFreq, k))
	}
	groups := max(1, moe.NumGroups)
	if per := moe.NumExperts / groups; per < 2 {
		fix := "set model.moe.num_groups to at most num_experts / 2"
		if moe.NumGroups == 0 {
			fix = "use at least 2 experts"
		}
		bad = append(bad, fmt.Sprintf("model.moe.num_experts = %d in %d groups: transformers scores each group by its 2 best experts (topk(2)), which a group of %d cannot give (%s)", moe.NumExperts, groups, per, fix))
	}
	if groupLimited(m) && moe.TopK/moe.GroupTopK != 2 {
		bad = append(bad, fmt.Sprintf("model.moe.group_top_k = %d with model.moe.top_k = %d: shardline scores a group by its top_k / group_top_k = %d best experts, transformers' Glm4Moe by its 2 best (set group_top_k = top_k / 2, as DeepSeek-V3's 4 of 8 groups for top 8, or route over all experts: num_groups = 0)",
			moe.GroupTopK, moe.TopK, moe.TopK/moe.GroupTopK))
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("the model's sigmoid router exports as %s, which cannot express %s", glm4Moe, strings.Join(bad, "; "))
}

// glm4MoeConfig adds Glm4MoeForCausalLM's keys to c.
func glm4MoeConfig(c map[string]any, m config.Model) {
	moe := m.MoE
	k, _ := firstDense(m)
	scale := moe.TopKScale
	if scale == 0 {
		scale = 1
	}
	c["model_type"], c["intermediate_size"] = "glm4_moe", m.FFNHidden
	c["moe_intermediate_size"], c["n_routed_experts"], c["num_experts_per_tok"] = moe.ExpertFFNHidden, moe.NumExperts, moe.TopK
	c["n_shared_experts"], c["routed_scaling_factor"], c["norm_topk_prob"] = moe.SharedExperts, scale, moe.NormTopK
	c["n_group"], c["topk_group"], c["first_k_dense_replace"] = max(1, moe.NumGroups), max(1, moe.GroupTopK), k
	c["use_qk_norm"], c["partial_rotary_factor"], c["num_nextn_predict_layers"] = m.QKNorm, 1.0, 0
	c["attention_dropout"] = 0.0
}

// ExportedBias is what an export writes for one MoE layer's expert biases:
// under group-limited routing, the biases less their minimum when it is
// negative (the package comment above says why; no choice changes), otherwise
// the biases themselves. The result is a new slice.
func ExportedBias(m config.Model, bias []float32) []float32 {
	out := append([]float32(nil), bias...)
	if !isGlm4Moe(m) || !groupLimited(m) || len(out) == 0 {
		return out
	}
	lo := out[0]
	for _, v := range out {
		lo = min(lo, v)
	}
	if lo < 0 {
		for i := range out {
			out[i] -= lo
		}
	}
	return out
}

// stackShared stacks a layer's shared experts (w1, w3, w2 each, in order) into
// one SwiGLU MLP S·ef wide, its down projection times scale: the sum of
// SwiGLU MLPs is one wider SwiGLU MLP.
func stackShared(h, ef, S int, ps []Param, scale float32) (gate, up, down []float32) {
	gate, up, down = make([]float32, 0, S*ef*h), make([]float32, 0, S*ef*h), make([]float32, h*S*ef)
	for s := 0; s < S; s++ {
		w1, w3, w2 := ps[3*s], ps[3*s+1], ps[3*s+2]
		gate, up = append(gate, w1.Data...), append(up, w3.Data...)
		for r := 0; r < h; r++ { // down (h, S·ef): expert s fills columns s·ef..
			for c := 0; c < ef; c++ {
				down[r*S*ef+s*ef+c] = scale * w2.Data[r*ef+c]
			}
		}
	}
	return gate, up, down
}

// unstackShared is stackShared's inverse: it fills the layer's shared experts
// (params at idx, w1, w3, w2 each) from the stacked MLP, the down projection
// times scale.
func unstackShared(h, ef, S int, params []Param, idx []int, gate, up, down []float32, scale float32) {
	for s := 0; s < S; s++ {
		copy(params[idx[3*s]].Data, gate[s*ef*h:(s+1)*ef*h])
		copy(params[idx[3*s+1]].Data, up[s*ef*h:(s+1)*ef*h])
		w2 := params[idx[3*s+2]].Data
		for r := 0; r < h; r++ {
			for c := 0; c < ef; c++ {
				w2[r*ef+c] = scale * down[r*S*ef+s*ef+c]
			}
		}
	}
}

// glm4MoeExtra appends to out what Glm4MoeForCausalLM holds beside the renamed
// parameters: each MoE layer's shared experts stacked into mlp.shared_experts
// (zero-width without shared experts: Glm4Moe always has the module), and its
// e_score_correction_bias as zeros when the model has no expert bias.
func glm4MoeExtra(m config.Model, out []Tensor, shared map[string][]Param) []Tensor {
	h, ef, S := m.Hidden, m.MoE.ExpertFFNHidden, m.MoE.SharedExperts
	for l := 0; l < m.Layers; l++ {
		if !m.IsMoELayer(l) {
			continue
		}
		pre := "model.layers." + strconv.Itoa(l) + ".mlp."
		gate, up, down := stackShared(h, ef, S, shared[strconv.Itoa(l)], 1)
		out = append(out, Tensor{Name: pre + "shared_experts.gate_proj.weight", Shape: []int{S * ef, h}, Data: gate},
			Tensor{Name: pre + "shared_experts.up_proj.weight", Shape: []int{S * ef, h}, Data: up},
			Tensor{Name: pre + "shared_experts.down_proj.weight", Shape: []int{h, S * ef}, Data: down})
		if !m.MoE.ExpertBias {
			out = append(out, Tensor{Name: pre + "gate.e_score_correction_bias", Shape: []int{m.MoE.NumExperts}, Data: make([]float32, m.MoE.NumExperts)})
		}
	}
	return out
}

// glm4MoeFromHF fills the shared experts (params at shared[layer]) from
// Glm4Moe's stacked ones, with take marking what it reads, and checks that a
// model without expert bias reads zero biases.
func glm4MoeFromHF(m config.Model, take func(string, []int) (Tensor, error), params []Param, shared map[string][]int) error {
	h, ef, S, E := m.Hidden, m.MoE.ExpertFFNHidden, m.MoE.SharedExperts, m.MoE.NumExperts
	for l := 0; l < m.Layers; l++ {
		if !m.IsMoELayer(l) {
			continue
		}
		pre := "model.layers." + strconv.Itoa(l) + ".mlp."
		if !m.MoE.ExpertBias {
			b, err := take(pre+"gate.e_score_correction_bias", []int{E})
			if err != nil {
				return err
			}
			if nonzero(b.Data) {
				return fmt.Errorf("tensor %s is not zero and the recipe's model has no expert bias: set model.moe.expert_bias = true", b.Name)
			}
		}
		gate, err1 := take(pre+"shared_experts.gate_proj.weight", []int{S * ef, h})
		up, err2 := take(pre+"shared_experts.up_proj.weight", []int{S * ef, h})
		down, err3 := take(pre+"shared_experts.down_proj.weight", []int{h, S * ef})
		for _, err := range []error{err1, err2, err3} {
			if err != nil {
				return fmt.Errorf("%w (%d shared experts of %d: n_shared_experts × moe_intermediate_size)", err, S, ef)
			}
		}
		unstackShared(h, ef, S, params, shared[strconv.Itoa(l)], gate.Data, up.Data, down.Data, 1)
	}
	return nil
}

// glm4MoeReadExtra is what ReadLimit adds for Glm4Moe beyond shardline's
// table: the zero biases without expert bias, and three (empty) tensors per
// MoE layer without shared experts.
func glm4MoeReadExtra(m config.Model) (elements int64, tensors int) {
	for l := 0; l < m.Layers; l++ {
		if !m.IsMoELayer(l) {
			continue
		}
		if !m.MoE.ExpertBias {
			elements, tensors = elements+int64(m.MoE.NumExperts), tensors+1
		}
		if m.MoE.SharedExperts == 0 {
			tensors += 3
		}
	}
	return elements, tensors
}

// checkGlm4MoeConfig compares Glm4Moe's keys of config.json c (value: with
// transformers' defaults) with m, through same (a key and the recipe key that
// sets it), and reports through add what same cannot say.
func checkGlm4MoeConfig(m config.Model, c map[string]any, value func(string) any, same func(key, recipeKey string, recipeValue any), add func(ConfigMismatch)) {
	absent := func(key string) bool {
		_, given := c[key]
		return !given && ropeParameter(c, key) == nil
	}
	moe := m.MoE
	if k, _ := firstDense(m); k > 0 { // the dense layers' MLP width
		same("intermediate_size", "model.ffn_hidden", m.FFNHidden)
	}
	same("moe_intermediate_size", "model.moe.expert_ffn_hidden", moe.ExpertFFNHidden)
	same("n_routed_experts", "model.moe.num_experts", moe.NumExperts)
	same("num_experts_per_tok", "model.moe.top_k", moe.TopK)
	same("n_shared_experts", "model.moe.shared_experts", moe.SharedExperts)
	same("routed_scaling_factor", "model.moe.top_k_scale", moe.TopKScale)
	same("norm_topk_prob", "model.moe.norm_top_k", moe.NormTopK)
	same("n_group", "model.moe.num_groups", moe.NumGroups)
	same("topk_group", "model.moe.group_top_k", moe.GroupTopK)
	same("use_qk_norm", "model.qk_norm", m.QKNorm)
	same("attention_bias", "", nil)
	k, _ := firstDense(m)
	if got := value("first_k_dense_replace"); !equalJSON(got, k) {
		fix := "shardline's dense layers are those between every model.moe.layer_freq-th: no layer_freq makes only the first layers dense"
		if g, ok := got.(float64); ok {
			switch {
			case g == 0:
				fix = "set model.moe.layer_freq = 1 (every layer MoE)"
			case g == float64(m.Layers-1):
				fix = fmt.Sprintf("set model.moe.layer_freq = %d (only the last layer MoE)", m.Layers)
			}
		}
		add(ConfigMismatch{"first_k_dense_replace", got, absent("first_k_dense_replace"), "model.moe.layer_freq", moe.LayerFreq, fix})
	}
	if got := value("partial_rotary_factor"); !equalJSON(got, 1.0) {
		add(ConfigMismatch{"partial_rotary_factor", got, absent("partial_rotary_factor"), "", nil,
			"shardline applies RoPE to every dimension of each head (partial_rotary_factor 1; GLM-4.5 rotates half): no recipe key changes it"})
	}
	if got := value("num_nextn_predict_layers"); !equalJSON(got, 0) {
		add(ConfigMismatch{"num_nextn_predict_layers", got, false, "", nil,
			"shardline has no multi-token prediction layers: remove them (the tensors of layers num_hidden_layers and up) and set it to 0"})
	}
}

// ropeParameter is key's value in transformers 5's rope_parameters, which
// holds rope_theta, partial_rotary_factor and the scaling (rope_type and its
// numbers) where older config.json files have them at the top level and in
// rope_scaling: for "rope_scaling", rope_parameters itself unless its type is
// "default"; nil when absent.
func ropeParameter(c map[string]any, key string) any {
	rp, ok := c["rope_parameters"].(map[string]any)
	switch {
	case !ok:
		return nil
	case key == "rope_scaling":
		if t := ropeType(rp); t == "" || t == "default" {
			return nil
		}
		return rp
	}
	return rp[key]
}

// deepseekMLA refuses DeepSeek-V2's and V3's config.json (Kimi K2's too), whose
// attention is multi-head latent attention, naming it, and says what its
// router maps to: the recipe's model.moe keys, exported and imported as
// Glm4MoeForCausalLM over standard attention. ok is false for other models.
func deepseekMLA(path string, c map[string]any, arch, mt string) (err error, ok bool) {
	switch {
	case arch == "DeepseekV2ForCausalLM" || arch == "DeepseekV3ForCausalLM":
	case mt == "deepseek_v2" || mt == "deepseek_v3":
	default:
		return nil, false
	}
	var mla []string
	for _, k := range []string{"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"} {
		if v, ok := c[k]; ok {
			mla = append(mla, fmt.Sprintf("%s %s", k, must(json.Marshal(v))))
		}
	}
	var keys []string
	for _, k := range []struct{ hf, recipe string }{
		{"scoring_func", "model.moe.score_function"}, {"n_routed_experts", "model.moe.num_experts"},
		{"num_experts_per_tok", "model.moe.top_k"}, {"moe_intermediate_size", "model.moe.expert_ffn_hidden"},
		{"n_shared_experts", "model.moe.shared_experts"}, {"routed_scaling_factor", "model.moe.top_k_scale"},
		{"norm_topk_prob", "model.moe.norm_top_k"}, {"n_group", "model.moe.num_groups"}, {"topk_group", "model.moe.group_top_k"},
	} {
		if v, ok := c[k.hf]; ok && v != nil {
			keys = append(keys, fmt.Sprintf("%s = %s (%s)", k.recipe, must(json.Marshal(v)), k.hf))
		}
	}
	if t, _ := c["topk_method"].(string); t == "noaux_tc" {
		keys = append(keys, "model.moe.expert_bias = true (topk_method noaux_tc: e_score_correction_bias)")
	}
	router := ""
	if len(keys) > 0 {
		router = "; its router maps onto the recipe's " + strings.Join(keys, ", ")
		if k, ok := c["first_k_dense_replace"].(float64); ok && k > 0 {
			router += fmt.Sprintf("; its first %v layers are dense (first_k_dense_replace), which model.moe.layer_freq (every layer_freq-th layer MoE) expresses only as layer_freq = 1 for none, or layer_freq = model.layers for all but the last", k)
		}
	}
	name := arch
	if name == "" {
		name = mt
	}
	detail := ""
	if len(mla) > 0 {
		detail = " (" + strings.Join(mla, ", ") + ")"
	}
	return fmt.Errorf("%s: %s attends with multi-head latent attention (MLA: queries, keys and values through low-rank projections, with a separate RoPE part)%s, which shardline's attention does not compute: its weights cannot be imported%s. A model with DeepSeek-V3's router over standard attention is exported and imported as %s (model.moe.score_function = \"sigmoid\"); start from such a model instead",
		path, name, detail, router, glm4Moe), true
}
