package hf

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// glmModel is DeepSeek-V3's router on a small model: sigmoid scores
// renormalised and scaled by 2.5, 2 groups of 2 experts of which a token keeps
// 1, expert biases, a shared expert, QK-norm, the first of 2 layers dense.
func glmModel() config.Model {
	m := moeModel(1, 2)
	m.QKNorm = true
	m.MoE.ScoreFunction, m.MoE.TopKScale, m.MoE.NumGroups, m.MoE.GroupTopK = "sigmoid", 2.5, 2, 1
	m.MoE.ExpertBias, m.MoE.BiasUpdateRate = true, 1e-3
	return m
}

// Glm4Moe's config.json is compared key by key: the routed and shared experts,
// the router (scale, groups, renormalisation), the dense first layers, QK-norm,
// and what shardline's attention cannot be (a partial rotation, biases,
// multi-token prediction layers), each with its fix; the export's own passes,
// and transformers 5's rope_parameters are read where 4's top-level keys and
// rope_scaling are absent.
func TestCheckConfigGlm4Moe(t *testing.T) {
	dir := t.TempDir()
	m := glmModel()
	require.Equal(t, "Glm4MoeForCausalLM", Architecture(m))
	c := Config(m)
	require.Equal(t, "glm4_moe", c["model_type"])
	require.Equal(t, 1, c["first_k_dense_replace"])
	softmax := m
	softmax.QKNorm = false
	softmax.MoE.ScoreFunction, softmax.MoE.TopKScale, softmax.MoE.NumGroups, softmax.MoE.GroupTopK, softmax.MoE.ExpertBias = "softmax", 1, 0, 0, false
	for _, c := range []struct {
		m      config.Model
		change map[string]any
		want   []string
	}{
		{m, nil, nil},
		{m, map[string]any{"rope_theta": nil, "partial_rotary_factor": nil, "rope_parameters": map[string]any{"rope_type": "default", "rope_theta": 10000, "partial_rotary_factor": 1.0}}, nil},
		{m, map[string]any{"rope_theta": nil, "partial_rotary_factor": nil, "rope_parameters": map[string]any{"rope_type": "llama3", "rope_theta": 10000, "partial_rotary_factor": 1.0,
			"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
			[]string{`set model.rope_scaling = "llama3", model.rope_scaling_factor = 8, model.rope_scaling_low_freq_factor = 1, model.rope_scaling_high_freq_factor = 4 and model.rope_scaling_original_max_position_embeddings = 8192`}},
		{m, map[string]any{"n_routed_experts": 8, "num_experts_per_tok": 4, "n_shared_experts": 2},
			[]string{"n_routed_experts is 8, the recipe's model.moe.num_experts is 4: set model.moe.num_experts = 8",
				"num_experts_per_tok is 4, the recipe's model.moe.top_k is 2: set model.moe.top_k = 4",
				"n_shared_experts is 2, the recipe's model.moe.shared_experts is 1: set model.moe.shared_experts = 2"}},
		{m, map[string]any{"n_group": 8, "topk_group": 4, "norm_topk_prob": false},
			[]string{"n_group is 8, the recipe's model.moe.num_groups is 2: set model.moe.num_groups = 8",
				"topk_group is 4, the recipe's model.moe.group_top_k is 1: set model.moe.group_top_k = 4",
				"norm_topk_prob is false, the recipe's model.moe.norm_top_k is true: set model.moe.norm_top_k = false"}},
		{m, map[string]any{"routed_scaling_factor": nil}, []string{"routed_scaling_factor is absent (transformers' default 1), the recipe's model.moe.top_k_scale is 2.5: set model.moe.top_k_scale = 1"}},
		{m, map[string]any{"moe_intermediate_size": 32, "intermediate_size": 128},
			[]string{"moe_intermediate_size is 32, the recipe's model.moe.expert_ffn_hidden is 16: set model.moe.expert_ffn_hidden = 32",
				"intermediate_size is 128, the recipe's model.ffn_hidden is 64: set model.ffn_hidden = 128"}},
		{m, map[string]any{"first_k_dense_replace": 0}, []string{"first_k_dense_replace is 0, the recipe's model.moe.layer_freq is 2: set model.moe.layer_freq = 1 (every layer MoE)"}},
		{m, map[string]any{"first_k_dense_replace": 3}, []string{"first_k_dense_replace is 3, the recipe's model.moe.layer_freq is 2: shardline's dense layers are those between every model.moe.layer_freq-th"}},
		{m, map[string]any{"partial_rotary_factor": nil}, []string{"partial_rotary_factor is absent (transformers' default 0.5): shardline applies RoPE to every dimension of each head"}},
		{m, map[string]any{"use_qk_norm": false, "attention_bias": true},
			[]string{"use_qk_norm is false, the recipe's model.qk_norm is true: set model.qk_norm = false",
				"attention_bias is true: no recipe key changes it: shardline's model has false"}},
		{m, map[string]any{"num_nextn_predict_layers": 1}, []string{"num_nextn_predict_layers is 1: shardline has no multi-token prediction layers"}},
		{softmax, map[string]any{"architectures": []string{"Glm4MoeForCausalLM"}, "model_type": "glm4_moe"},
			[]string{`architectures is ["Glm4MoeForCausalLM"], the recipe's model.moe.score_function is softmax: set model.moe.score_function = "sigmoid"`}},
	} {
		writeConfig(t, dir, m, c.change)
		err := CheckConfig(dir, c.m)
		if c.want == nil {
			assert.NoError(t, err, "%v", c.change)
			continue
		}
		require.Error(t, err, "%v", c.change)
		for _, w := range c.want {
			assert.ErrorContains(t, err, w)
		}
	}
}

// What Glm4Moe's config.json cannot say is refused at export and import,
// naming the recipe key, its value and a fix: dense layers other than the
// first, a group score of other than the two best experts, and groups too
// small for it. (NoPE layers make a model Llama 4's kind, whose refusal names
// DeepSeek-V3's router: TestExportRefusesWhatNoArchitectureComputes.)
func TestGlm4MoeRefusesWhatItCannotExpress(t *testing.T) {
	for _, c := range []struct {
		change func(m *config.Model)
		want   string
	}{
		{func(m *config.Model) { m.Layers = 4 }, "model.moe.layer_freq = 2 with 4 layers: the MoE layers are every 2-th and the layers between them dense"},
		{func(m *config.Model) { m.MoE.NumExperts, m.MoE.TopK, m.MoE.NumGroups, m.MoE.GroupTopK = 8, 4, 4, 1 },
			"model.moe.group_top_k = 1 with model.moe.top_k = 4: shardline scores a group by its top_k / group_top_k = 4 best experts, transformers' Glm4Moe by its 2 best"},
		{func(m *config.Model) { m.MoE.NumGroups, m.MoE.GroupTopK = 4, 2 }, "model.moe.num_experts = 4 in 4 groups: transformers scores each group by its 2 best experts (topk(2)), which a group of 1 cannot give"},
	} {
		m := glmModel()
		c.change(&m)
		require.NoError(t, Supported(glmModel()))
		err := Supported(m)
		require.ErrorContains(t, err, "the model's sigmoid router exports as Glm4MoeForCausalLM, which cannot express")
		assert.ErrorContains(t, err, c.want)
		_, err = ToHF(m, nil)
		assert.ErrorContains(t, err, c.want)
		dir := t.TempDir()
		writeConfig(t, dir, glmModel(), nil)
		assert.ErrorContains(t, CheckConfig(dir, m), c.want)
	}
	// Every group kept: the group score chooses nothing.
	m := glmModel()
	m.MoE.NumExperts, m.MoE.TopK, m.MoE.NumGroups, m.MoE.GroupTopK = 8, 3, 2, 2
	assert.NoError(t, Supported(m))
}

// ExportedBias shifts a layer's biases to a minimum of 0 under group-limited
// routing only, and copies.
func TestExportedBias(t *testing.T) {
	m := glmModel()
	in := []float32{0.25, -1.5, 0.5, -1.25}
	assert.Equal(t, []float32{1.75, 0, 2, 0.25}, ExportedBias(m, in))
	assert.Equal(t, []float32{0.25, -1.5, 0.5, -1.25}, in)
	assert.Equal(t, []float32{0.5, 0, 1}, ExportedBias(m, []float32{0.5, 0, 1}))
	m.MoE.NumGroups, m.MoE.GroupTopK = 0, 0
	assert.Equal(t, in, ExportedBias(m, in))
}

// A real DeepSeek-V3 config.json (its published values) is refused, naming
// multi-head latent attention and its sizes, with the recipe keys its router
// maps onto and the architecture that takes that router.
func TestDeepSeekV3ConfigNamesMLA(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, ConfigFile)
	ds := `{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168,
		"intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_nextn_predict_layers": 1,
		"num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
		"ep_size": 1, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
		"v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
		"num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": true,
		"scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-06,
		"rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096}}`
	require.NoError(t, os.WriteFile(path, []byte(ds), 0o644))
	for _, m := range []config.Model{glmModel(), moeModel(0, 1)} {
		err := CheckConfig(dir, m)
		require.Error(t, err)
		for _, w := range []string{path + ": DeepseekV3ForCausalLM attends with multi-head latent attention (MLA",
			"(q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128)",
			"which shardline's attention does not compute: its weights cannot be imported",
			`model.moe.score_function = "sigmoid" (scoring_func), model.moe.num_experts = 256 (n_routed_experts), model.moe.top_k = 8 (num_experts_per_tok)`,
			"model.moe.num_groups = 8 (n_group), model.moe.group_top_k = 4 (topk_group), model.moe.expert_bias = true",
			"its first 3 layers are dense (first_k_dense_replace)",
			"exported and imported as Glm4MoeForCausalLM"} {
			assert.ErrorContains(t, err, w)
		}
	}
	// DeepSeek-V2 by its model type alone; DeepSeek-VL's is not it.
	require.NoError(t, os.WriteFile(path, []byte(`{"model_type": "deepseek_v2", "kv_lora_rank": 512}`), 0o644))
	assert.ErrorContains(t, CheckConfig(dir, glmModel()), path+": deepseek_v2 attends with multi-head latent attention (MLA")
	require.NoError(t, os.WriteFile(path, []byte(`{"architectures": ["DeepseekVLForCausalLM"], "model_type": "deepseek_vl"}`), 0o644))
	err := CheckConfig(dir, glmModel())
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "latent attention")
}
