package hf

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// llama4Model is a small Llama 4: layer 1 and 3 MoE (sigmoid top 1, the token
// scaled before its expert, one shared expert), NoPE layers 1 and 3, the
// others within chunks of 8.
func llama4Model() config.Model {
	m := moeModel(1, 2)
	m.Layers, m.NoPEInterval, m.AttentionChunkSize = 4, 2, 8
	m.MoE.TopK, m.MoE.ScoreFunction, m.MoE.NormTopK, m.MoE.ScoreBeforeExpert = 1, "sigmoid", false, true
	return m
}

// TestLlama4Config: config.json's Llama 4 keys say which layers are MoE,
// NoPE and chunked, the sizes, and false for what shardline does not compute
// (QK-norm, temperature tuning).
func TestLlama4Config(t *testing.T) {
	m := llama4Model()
	require.NoError(t, Supported(m))
	c := Config(m)
	assert.Equal(t, "Llama4ForCausalLM", Architecture(m))
	assert.Equal(t, "llama4_text", c["model_type"])
	assert.Equal(t, []int{1, 0, 1, 0}, c["no_rope_layers"])
	assert.Equal(t, []string{"chunked_attention", "full_attention", "chunked_attention", "full_attention"}, c["layer_types"])
	assert.Equal(t, []int{1, 3}, c["moe_layers"])
	assert.Equal(t, []any{8, 16, 64, 4, 1, 2, false, false}, []any{c["attention_chunk_size"], c["intermediate_size"], c["intermediate_size_mlp"],
		c["num_local_experts"], c["num_experts_per_tok"], c["interleave_moe_layer_step"], c["use_qk_norm"], c["attn_temperature_tuning"]})
	m.NoPEFirst = true
	assert.Equal(t, []int{0, 1, 0, 1}, Config(m)["no_rope_layers"], "torchtitan's placement: layers 0 and 2 NoPE")
	// Without NoPE layers every layer is chunked; without chunks none is, and
	// transformers (which refuses a null size) gets the whole context.
	m.NoPEFirst, m.NoPEInterval = false, 0
	assert.Equal(t, []string{"chunked_attention", "chunked_attention", "chunked_attention", "chunked_attention"}, Config(m)["layer_types"])
	m.AttentionChunkSize = 0
	c = Config(m)
	assert.Equal(t, []string{"full_attention", "full_attention", "full_attention", "full_attention"}, c["layer_types"])
	assert.Equal(t, 16, c["attention_chunk_size"])
}

// TestLlama4Refusals: what Llama4ForCausalLM does not compute is refused by
// its recipe key.
func TestLlama4Refusals(t *testing.T) {
	for _, c := range []struct {
		change func(*config.Model)
		want   string
	}{
		{func(m *config.Model) { m.QKNorm = true }, "model.qk_norm (shardline's QK-norm is an RMSNorm with gains before RoPE"},
		{func(m *config.Model) { m.MoE.ScoreFunction = "softmax" }, `model.moe.score_function = "softmax"`},
		{func(m *config.Model) { m.MoE.NormTopK = true }, "model.moe.norm_top_k = true"},
		{func(m *config.Model) { m.MoE.TopKScale = 2.5 }, "model.moe.top_k_scale = 2.5"},
		{func(m *config.Model) { m.MoE.NumGroups, m.MoE.GroupTopK = 2, 1 }, "model.moe.num_groups"},
		{func(m *config.Model) { m.MoE.SharedExperts = 2 }, "model.moe.shared_experts = 2 (Llama 4 has one shared expert"},
		{func(m *config.Model) { m.MoE.ScoreBeforeExpert = false }, "model.moe.score_before_expert = false"}, // still Llama 4's: NoPE layers
	} {
		m := llama4Model()
		c.change(&m)
		err := Supported(m)
		require.ErrorContains(t, err, c.want)
		_, err = ToHF(m, nil)
		require.ErrorContains(t, err, c.want)
	}
}

// llama4Params is a table of m's parameters (shardline's names and shapes,
// as parallel.ParamTable lays them out) filled with distinct values.
func llama4Params(m config.Model) []Param {
	h, hd, ef := m.Hidden, m.HeadSize(), m.MoE.ExpertFFNHidden
	var ps []Param
	n := 0
	add := func(name string, shape ...int) {
		size := 1
		for _, d := range shape {
			size *= d
		}
		data := make([]float32, size)
		for i := range data {
			n++
			data[i] = float32(n)
		}
		ps = append(ps, Param{Name: name, Shape: shape, Data: data})
	}
	add("embed.weight", m.VocabSize, h)
	for l := 0; l < m.Layers; l++ {
		pre := "layers." + strconv.Itoa(l)
		add(pre+".attn_norm.weight", h)
		add(pre+".attn.wq", m.Heads*hd, h)
		add(pre+".attn.wk", m.EffectiveKVHeads()*hd, h)
		add(pre+".attn.wv", m.EffectiveKVHeads()*hd, h)
		add(pre+".attn.wo", h, m.Heads*hd)
		add(pre+".mlp_norm.weight", h)
		if !m.IsMoELayer(l) {
			add(pre+".mlp.w1", m.FFNHidden, h)
			add(pre+".mlp.w3", m.FFNHidden, h)
			add(pre+".mlp.w2", h, m.FFNHidden)
			continue
		}
		add(pre+".moe.router", m.MoE.NumExperts, h)
		if m.MoE.ExpertBias {
			add(pre+".moe.expert_bias", m.MoE.NumExperts)
			clear(ps[len(ps)-1].Data)
		}
		for s := 0; s < m.MoE.SharedExperts; s++ {
			sp := fmt.Sprintf("%s.moe.shared.%d", pre, s)
			add(sp+".w1", ef, h)
			add(sp+".w3", ef, h)
			add(sp+".w2", h, ef)
		}
		for e := 0; e < m.MoE.NumExperts; e++ {
			ep := fmt.Sprintf("%s.moe.experts.%d", pre, e)
			add(ep+".w1", ef, h)
			add(ep+".w3", ef, h)
			add(ep+".w2", h, ef)
		}
	}
	add("norm.weight", h)
	add("output.weight", m.VocabSize, h)
	return ps
}

// TestLlama4Tensors: the layouts of Llama4ForCausalLM's tensors, element by
// element (q and k rows in adjacent RoPE pairs; gate_up_proj (E, hidden,
// 2·intermediate) with gate columns then up, down_proj (E, intermediate,
// hidden): both the transposes of shardline's), and an import of the export
// gives the parameters back; a nonzero expert bias is refused on export (and
// an import zeroes the biases), a nonzero shared expert on import into a
// model without one.
func TestLlama4Tensors(t *testing.T) {
	m := llama4Model()
	m.MoE.ExpertBias = true
	ps := llama4Params(m)
	byName := map[string]Param{}
	for _, p := range ps {
		byName[p.Name] = p
	}
	ts, err := ToHF(m, ps)
	require.NoError(t, err)
	hfT := map[string]Tensor{}
	for _, tn := range ts {
		hfT[tn.Name] = tn
	}
	h, hd, ef := m.Hidden, m.HeadSize(), m.MoE.ExpertFFNHidden
	// q: head 1's element 3 (pairs with 3 + hd/2) is row 2·3 of head 1; element hd/2+3 is row 2·3+1.
	wq, q := byName["layers.0.attn.wq"], hfT["model.layers.0.self_attn.q_proj.weight"]
	assert.Equal(t, wq.Data[(hd+3)*h:(hd+4)*h], q.Data[(hd+6)*h:(hd+7)*h])
	assert.Equal(t, wq.Data[(hd+hd/2+3)*h:(hd+hd/2+4)*h], q.Data[(hd+7)*h:(hd+8)*h])
	assert.Equal(t, byName["layers.0.attn.wv"].Data, hfT["model.layers.0.self_attn.v_proj.weight"].Data, "v is not rotated")
	gu, dn := hfT["model.layers.1.feed_forward.experts.gate_up_proj"], hfT["model.layers.1.feed_forward.experts.down_proj"]
	require.Equal(t, []int{4, h, 2 * ef}, gu.Shape)
	require.Equal(t, []int{4, ef, h}, dn.Shape)
	e, r, c := 2, 5, 7 // expert 2, its hidden unit r, input c
	assert.Equal(t, byName["layers.1.moe.experts.2.w1"].Data[r*h+c], gu.Data[e*h*2*ef+c*2*ef+r], "gate")
	assert.Equal(t, byName["layers.1.moe.experts.2.w3"].Data[r*h+c], gu.Data[e*h*2*ef+c*2*ef+ef+r], "up")
	assert.Equal(t, byName["layers.1.moe.experts.2.w2"].Data[c*ef+r], dn.Data[e*ef*h+r*h+c], "down")
	assert.Equal(t, byName["layers.1.moe.shared.0.w2"].Data, hfT["model.layers.1.feed_forward.shared_expert.down_proj.weight"].Data)
	assert.Equal(t, byName["layers.1.moe.router"].Data, hfT["model.layers.1.feed_forward.router.weight"].Data)
	assert.Equal(t, byName["layers.0.mlp.w1"].Data, hfT["model.layers.0.feed_forward.gate_proj.weight"].Data)
	_, has := hfT["model.layers.1.feed_forward.expert_bias"]
	assert.False(t, has)

	back := llama4Params(m)
	for i := range back {
		clear(back[i].Data)
		if back[i].Name == "layers.1.moe.expert_bias" {
			back[i].Data[0] = 9
		}
	}
	require.NoError(t, FromHF(m, hfT, back))
	for i := range ps {
		require.Equal(t, ps[i].Data, back[i].Data, ps[i].Name)
	}
	extra := map[string]Tensor{"model.layers.0.feed_forward.experts.gate_up_proj": {Name: "x", Shape: []int{1}, Data: []float32{0}}}
	for k, v := range hfT {
		extra[k] = v
	}
	require.ErrorContains(t, FromHF(m, extra, back), "tensor model.layers.0.feed_forward.experts.gate_up_proj is not part of the recipe's model (1 such tensors)")

	for i := range ps {
		if ps[i].Name == "layers.3.moe.expert_bias" {
			ps[i].Data[2] = 0.25
		}
	}
	_, err = ToHF(m, ps)
	require.ErrorContains(t, err, "layers.3.moe.expert_bias[2] is 0.25: Llama4ForCausalLM's router has no expert bias")

	// No shared expert: written as zeros, read back only if zero.
	m.MoE.SharedExperts = 0
	ps = llama4Params(m)
	ts, err = ToHF(m, ps)
	require.NoError(t, err)
	hfT = map[string]Tensor{}
	for _, tn := range ts {
		hfT[tn.Name] = tn
	}
	sg := hfT["model.layers.1.feed_forward.shared_expert.gate_proj.weight"]
	require.Equal(t, []int{ef, h}, sg.Shape)
	assert.False(t, nonzero(sg.Data))
	require.NoError(t, FromHF(m, hfT, llama4Params(m)))
	sg.Data[0] = 1
	require.ErrorContains(t, FromHF(m, hfT, llama4Params(m)), "shared_expert.gate_proj.weight is not zero, and the recipe's model has no shared expert (model.moe.shared_experts = 0): set model.moe.shared_experts = 1")
}

// TestCheckConfigLlama4: config.json's Llama 4 keys are compared with the
// recipe's model, each mismatch with its fix: which layers are MoE (moe_layers
// or interleave_moe_layer_step), NoPE (no_rope_layers or its interval) and
// chunked (layer_types or the RoPE layers, attention_chunk_size), the sizes,
// and what shardline does not compute (use_qk_norm, transformers' default;
// temperature tuning within the recipe's sequence). An export's own
// config.json passes.
func TestCheckConfigLlama4(t *testing.T) {
	m := llama4Model()
	for _, c := range []struct {
		name   string
		change map[string]any
		want   []string
	}{
		{"own", nil, nil},
		{"lists left out", map[string]any{"moe_layers": nil, "layer_types": nil, "no_rope_layers": nil, "no_rope_layer_interval": 2}, nil},
		{"qk norm", map[string]any{"use_qk_norm": nil}, []string{"use_qk_norm is absent (transformers' default true): shardline has no Llama 4 QK-norm"}},
		{"moe layers", map[string]any{"moe_layers": []int{0, 1, 2, 3}}, []string{"moe_layers is [0,1,2,3], the recipe's model.moe.layer_freq is [1 3]"}},
		{"interleave", map[string]any{"moe_layers": nil, "interleave_moe_layer_step": 1}, []string{"moe_layers is [0,1,2,3]"}},
		{"no moe", map[string]any{"moe_layers": []int{}}, []string{"set model.moe.num_experts = 0"}},
		{"nope layers", map[string]any{"no_rope_layers": []int{0, 1, 0, 1}}, []string{"no_rope_layers is [0,1,0,1], the recipe's model.nope_interval is 2"}},
		{"nope default", map[string]any{"no_rope_layers": nil, "no_rope_layer_interval": nil}, []string{"no_rope_layers is [1,1,1,0]"}},
		{"chunk size", map[string]any{"attention_chunk_size": 4}, []string{"layer_types[0] (with attention_chunk_size) is \"chunked_attention within 4 positions\", the recipe's model.attention_chunk_size is 8: set model.attention_chunk_size = 4"}},
		{"nope chunked", map[string]any{"layer_types": []string{"chunked_attention", "chunked_attention", "chunked_attention", "chunked_attention"}},
			[]string{"layer_types[1] (with attention_chunk_size)", "this NoPE layer is chunked: such a model cannot be imported"}},
		{"temperature", map[string]any{"attn_temperature_tuning": true, "floor_scale": 16}, []string{"attn_temperature_tuning is true, the recipe's model.seq_len is 16: shardline does not scale the NoPE layers' queries by position", "set model.seq_len below floor_scale"}},
		{"temperature past the sequence", map[string]any{"attn_temperature_tuning": nil, "floor_scale": nil}, nil},
		{"mlp", map[string]any{"intermediate_size_mlp": 128}, []string{"intermediate_size_mlp is 128, the recipe's model.ffn_hidden is 64: set model.ffn_hidden = 128"}},
		{"experts", map[string]any{"intermediate_size": 32, "num_local_experts": nil}, []string{"intermediate_size is 32, the recipe's model.moe.expert_ffn_hidden is 16: set model.moe.expert_ffn_hidden = 32",
			"num_local_experts is absent (transformers' default 16), the recipe's model.moe.num_experts is 4: set model.moe.num_experts = 16"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeConfig(t, dir, m, c.change)
			err := CheckConfig(dir, m)
			if c.want == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range c.want {
				assert.ErrorContains(t, err, w)
			}
		})
	}
	// A dense recipe against a config.json with MoE layers says what to set.
	dense := m
	dense.MoE = config.MoE{}
	dir := t.TempDir()
	writeConfig(t, dir, m, nil)
	require.ErrorContains(t, CheckConfig(dir, dense), "moe_layers is [1,3], the recipe's model.moe.layer_freq is []: the model has MoE layers: set model.moe.num_experts")
	// Llama4ForConditionalGeneration's directory is refused with how to take
	// its text model out.
	dir = t.TempDir()
	writeConfig(t, dir, m, map[string]any{"architectures": []string{"Llama4ForConditionalGeneration"}, "model_type": "llama4"})
	require.ErrorContains(t, CheckConfig(dir, m), `architectures is ["Llama4ForConditionalGeneration"]: Llama 4's text and vision model: shardline reads its text model as Llama4ForCausalLM`)
	// A Llama config.json is not the recipe's Llama 4.
	dir = t.TempDir()
	plain := moeModel(0, 1)
	plain.MoE = config.MoE{}
	writeConfig(t, dir, plain, nil)
	require.ErrorContains(t, CheckConfig(dir, m), `architectures is ["LlamaForCausalLM"], the recipe's model.moe.score_before_expert, model.nope_interval and model.attention_chunk_size is true, 2 and 8: the recipe's model makes it Llama4ForCausalLM`)
}
