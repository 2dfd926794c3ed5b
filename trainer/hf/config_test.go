package hf

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func moeModel(shared, freq int) config.Model {
	return config.Model{Family: "llama", Layers: 2, Hidden: 32, Heads: 4, KVHeads: 2, FFNHidden: 64, VocabSize: 32, SeqLen: 16,
		RopeTheta: 10000, RopeScaling: "none", RopeScalingFactor: 1, NormEps: 1e-5, InitStd: 0.02,
		MoE: config.MoE{NumExperts: 4, TopK: 2, ExpertFFNHidden: 16, SharedExperts: shared, LayerFreq: freq, ScoreFunction: "softmax", NormTopK: true, TopKScale: 1}}
}

// writeConfig writes Config(m), changed, as dir/config.json.
func writeConfig(t *testing.T, dir string, m config.Model, change map[string]any) {
	c := Config(m)
	for k, v := range change {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	b, err := json.Marshal(c)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ConfigFile), b, 0o644))
}

// The MoE keys of Mixtral's and Qwen2-MoE's config.json are compared too: the
// experts, their width, top-k, the shared experts, the layer interleave, and
// what shardline's router always does (normalised top-k probabilities), each
// with its fix; an export's own config.json passes.
func TestCheckConfigMoE(t *testing.T) {
	dir := t.TempDir()
	mixtral, qwen := moeModel(0, 1), moeModel(2, 2)
	require.Equal(t, "MixtralForCausalLM", Architecture(mixtral))
	require.Equal(t, "Qwen2MoeForCausalLM", Architecture(qwen))
	for _, c := range []struct {
		m      config.Model
		change map[string]any
		want   []string
	}{
		{mixtral, nil, nil},
		{qwen, nil, nil},
		{mixtral, map[string]any{"num_local_experts": 8, "num_experts_per_tok": 1},
			[]string{"num_local_experts is 8, the recipe's model.moe.num_experts is 4: set model.moe.num_experts = 8",
				"num_experts_per_tok is 1, the recipe's model.moe.top_k is 2: set model.moe.top_k = 1"}},
		{mixtral, map[string]any{"num_local_experts": nil}, []string{"num_local_experts is absent (transformers' default 8)"}},
		{mixtral, map[string]any{"sliding_window": 8}, []string{"sliding_window is 8, the recipe's model.seq_len is 16: shardline's attention has no sliding window"}},
		{mixtral, map[string]any{"sliding_window": 4096}, nil},
		{qwen, map[string]any{"norm_topk_prob": nil}, []string{`norm_topk_prob is absent (transformers' default false), the recipe's model.moe.norm_top_k is true: set model.moe.norm_top_k = false`}},
		{qwen, map[string]any{"shared_expert_intermediate_size": 48}, []string{"shared_expert_intermediate_size is 48, the recipe's model.moe.shared_experts is 2: set model.moe.shared_experts = 3 (× model.moe.expert_ffn_hidden 16)"}},
		{qwen, map[string]any{"decoder_sparse_step": 1, "moe_intermediate_size": 32},
			[]string{"decoder_sparse_step is 1, the recipe's model.moe.layer_freq is 2: set model.moe.layer_freq = 1",
				"moe_intermediate_size is 32, the recipe's model.moe.expert_ffn_hidden is 16: set model.moe.expert_ffn_hidden = 32"}},
		{qwen, map[string]any{"mlp_only_layers": []int{0}}, []string{"mlp_only_layers is [0]: no recipe key changes it: shardline's model has []"}},
		{qwen, map[string]any{"architectures": []string{"LlamaForCausalLM"}}, []string{`architectures is ["LlamaForCausalLM"], the recipe's model.moe.num_experts is 4: the recipe's model makes it Qwen2MoeForCausalLM`}},
		{qwen, map[string]any{"model_type": "qwen3_moe"}, []string{`model_type is "qwen3_moe"`}},
		{moeModel(0, 1), map[string]any{"rope_scaling": map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
			[]string{`set model.rope_scaling = "llama3", model.rope_scaling_factor = 8, model.rope_scaling_low_freq_factor = 1, model.rope_scaling_high_freq_factor = 4 and model.rope_scaling_original_max_position_embeddings = 8192`}},
	} {
		writeConfig(t, dir, c.m, c.change)
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
	require.NoError(t, os.WriteFile(filepath.Join(dir, ConfigFile), []byte(`{"architectures": "LlamaForCausalLM"`), 0o644))
	assert.ErrorContains(t, CheckConfig(dir, mixtral), ConfigFile)
}

// FuzzCheckConfig: any config.json is accepted or refused, never a panic; one
// accepted names the recipe's architecture and, where it gives them, its sizes.
func FuzzCheckConfig(f *testing.F) {
	for _, m := range []config.Model{moeModel(0, 1), moeModel(2, 2), glmModel()} {
		b, _ := json.Marshal(Config(m))
		f.Add(b)
	}
	f.Add([]byte(`{"architectures":["LlamaForCausalLM"],"model_type":"llama","head_dim":null,"num_attention_heads":0,"rope_scaling":{"type":"llama3"}}`))
	f.Add([]byte(`{"architectures":["LlamaForCausalLM"],"model_type":"llama","num_attention_heads":0.5}`))
	f.Add([]byte(`{"architectures":["LlamaForCausalLM"],"model_type":"llama","num_attention_heads":1e300,"hidden_size":-1e300}`))
	f.Add([]byte(`{"architectures":["MixtralForCausalLM"],"model_type":"mixtral","num_attention_heads":-0.25,"hidden_size":0.5}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, ConfigFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, m := range []config.Model{moeModel(0, 1), moeModel(2, 2), glmModel()} {
			if CheckConfig(dir, m) != nil {
				continue
			}
			var c map[string]any
			if err := json.Unmarshal(b, &c); err != nil {
				t.Fatalf("accepted a config.json that is not JSON: %v", err)
			}
			want := Config(m)
			for _, k := range []string{"architectures", "hidden_size", "num_hidden_layers", "vocab_size", "rope_theta", "rms_norm_eps"} {
				if v, ok := c[k]; ok && !equalJSON(v, want[k]) {
					t.Fatalf("accepted %s = %v for a model with %v", k, v, want[k])
				}
			}
		}
	})
}

// CheckConfig divided hidden_size by num_attention_heads as integers when
// config.json gives no head_dim: 0.5 heads (0 as an integer) panicked with an
// integer divide by zero. A count that is not a whole positive number is now
// the key's mismatch, named with the recipe's value.
func TestCheckConfigFractionalHeads(t *testing.T) {
	m := moeModel(0, 1)
	for _, heads := range []any{0.5, -3.0, 1e300, "two"} {
		c := Config(m)
		delete(c, "head_dim")
		c["num_attention_heads"] = heads
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, ConfigFile), must(json.Marshal(c)), 0o644))
		var err error
		require.NotPanics(t, func() { err = CheckConfig(dir, m) }, "num_attention_heads = %v", heads)
		require.Error(t, err, "num_attention_heads = %v", heads)
		assert.Contains(t, err.Error(), "num_attention_heads")
		assert.Contains(t, err.Error(), filepath.Join(dir, ConfigFile))
	}
}

// TestChunkedAttentionIsNotLlama: Llama, Mixtral and Qwen2-MoE attend over the
// whole sequence, so a recipe with chunked attention does not import their
// weights as its own: its model is Llama 4's, which config.json's architecture
// is not (its export writes Llama4ForCausalLM, TestExportMatchesPyTorch).
func TestChunkedAttentionIsNotLlama(t *testing.T) {
	m := moeModel(0, 1)
	m.MoE = config.MoE{}
	dir := t.TempDir()
	writeConfig(t, dir, m, nil)
	m.AttentionChunkSize = 8
	err := CheckConfig(dir, m)
	require.ErrorContains(t, err, `architectures is ["LlamaForCausalLM"], the recipe's model.moe.score_before_expert, model.nope_interval and model.attention_chunk_size is false, 0 and 8: the recipe's model makes it Llama4ForCausalLM`)
	require.Equal(t, "Llama4ForCausalLM", Architecture(m))
}

// TestCheckConfigRopeScaling: config.json's llama3 rope_scaling is compared
// number by number with the recipe's (Llama 4's factor 16 with equal low and
// high frequency factors against Llama 3.1's defaults, say), the fix naming
// all four keys; an export's own config.json writes the recipe's numbers and
// passes; one shardline cannot take (high below low) says why.
func TestCheckConfigRopeScaling(t *testing.T) {
	dir := t.TempDir()
	llama31 := config.Model{Family: "llama", Layers: 2, Hidden: 32, Heads: 4, KVHeads: 2, FFNHidden: 64, VocabSize: 32, SeqLen: 16,
		RopeTheta: 500000, RopeScaling: "llama3", RopeScalingFactor: 8, RopeScalingLowFreqFactor: 1, RopeScalingHighFreqFactor: 4,
		RopeScalingOriginalMaxPositionEmbeddings: 8192, NormEps: 1e-5, InitStd: 0.02}
	llama4 := llama31
	llama4.RopeScalingFactor, llama4.RopeScalingHighFreqFactor = 16, 1
	llama4JSON := map[string]any{"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}
	require.Equal(t, llama4JSON, Config(llama4)["rope_scaling"])
	for _, c := range []struct {
		m      config.Model
		change map[string]any
		want   string
	}{
		{llama4, nil, ""},
		{llama31, nil, ""},
		{llama31, map[string]any{"rope_scaling": llama4JSON}, `set model.rope_scaling = "llama3", model.rope_scaling_factor = 16, model.rope_scaling_low_freq_factor = 1, model.rope_scaling_high_freq_factor = 1 and model.rope_scaling_original_max_position_embeddings = 8192`},
		{llama4, map[string]any{"rope_scaling": map[string]any{"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 4096}},
			"model.rope_scaling_original_max_position_embeddings = 4096"},
		{llama4, map[string]any{"rope_scaling": map[string]any{"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}},
			"high_freq_factor at least low_freq_factor"},
	} {
		writeConfig(t, dir, c.m, c.change)
		err := CheckConfig(dir, c.m)
		if c.want == "" {
			assert.NoError(t, err, "%v", c.change)
			continue
		}
		assert.ErrorContains(t, err, c.want, "%v", c.change)
	}
}
