package hf

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/shardline/shardline/config"
)

// Architecture names the Hugging Face model class an export uses: Llama 4's
// (Llama4ForCausalLM) for MoE models whose router scales the token before its
// expert and for models with NoPE layers or chunked attention; for an MoE
// model with DeepSeek-V3's sigmoid router (its outputs weighed by the gates)
// Glm4MoeForCausalLM (with or without QK-norm; glm4moe.go says why); with QK-norm
// Qwen3ForCausalLM (dense) or Qwen3MoeForCausalLM; otherwise LlamaForCausalLM
// for dense models, MixtralForCausalLM for MoE models whose every layer is MoE
// with no shared experts and renormalised gates, Qwen2MoeForCausalLM otherwise.
// Supported says which models have none.
func Architecture(m config.Model) string {
	switch {
	case isLlama4(m): // llama4.go
		return "Llama4ForCausalLM"
	case isGlm4Moe(m): // glm4moe.go
		return glm4Moe
	case m.QKNorm && m.MoE.NumExperts == 0:
		return "Qwen3ForCausalLM"
	case m.QKNorm:
		return "Qwen3MoeForCausalLM"
	case m.MoE.NumExperts == 0:
		return "LlamaForCausalLM"
	case m.MoE.SharedExperts == 0 && m.MoE.LayerFreq == 1 && m.MoE.NormTopK:
		return "MixtralForCausalLM"
	}
	return "Qwen2MoeForCausalLM"
}

// Supported refuses a model no architecture Architecture names computes: a
// Llama 4 model (llama4Supported) with what Llama4ForCausalLM does not
// compute; for Glm4MoeForCausalLM what its config.json cannot express
// (glm4MoeSupported); otherwise the routers' settings only DeepSeek-V3's and
// Llama 4's have (a scale, expert biases, groups), and QK-norm with shared
// experts (Qwen3-MoE has none).
func Supported(m config.Model) error {
	if isLlama4(m) {
		return llama4Supported(m)
	}
	if isGlm4Moe(m) {
		return glm4MoeSupported(m)
	}
	moe := m.MoE
	var what []string
	add := func(set bool, key string) {
		if set {
			what = append(what, key)
		}
	}
	add(m.NoPEInterval > 0, "model.nope_interval")
	if moe.NumExperts > 0 {
		add(moe.ScoreFunction == "sigmoid", "model.moe.score_function")
		add(moe.TopKScale != 0 && moe.TopKScale != 1, "model.moe.top_k_scale")
		add(moe.ScoreBeforeExpert, "model.moe.score_before_expert")
		add(moe.ExpertBias, "model.moe.expert_bias")
		add(moe.NumGroups > 0, "model.moe.num_groups")
		add(m.QKNorm && moe.SharedExperts > 0, "model.moe.shared_experts with model.qk_norm")
	}
	if len(what) == 0 {
		return nil
	}
	return fmt.Errorf("the model sets %s, which none of the Hugging Face architectures shardline writes and reads computes (Llama, Mixtral, Qwen2-MoE, Qwen3, Qwen3-MoE, Llama 4, and Glm4Moe for DeepSeek-V3's sigmoid router)", strings.Join(what, ", "))
}

// Config is config.json for the model.
func Config(m config.Model) map[string]any {
	c := map[string]any{
		"architectures": []string{Architecture(m)}, "hidden_size": m.Hidden, "num_hidden_layers": m.Layers,
		"num_attention_heads": m.Heads, "num_key_value_heads": m.EffectiveKVHeads(), "head_dim": m.HeadSize(),
		"vocab_size": m.VocabSize, "max_position_embeddings": m.SeqLen, "rms_norm_eps": m.NormEps, "rope_theta": m.RopeTheta,
		"tie_word_embeddings": m.TieEmbeddings, "hidden_act": "silu", "torch_dtype": "float32", "initializer_range": m.InitStd,
		"attention_bias": false, "mlp_bias": false, "bos_token_id": nil, "eos_token_id": nil,
	}
	if m.RopeScaling == "llama3" { // transformers' llama3 rope type (tensor.RopeInvFreq)
		c["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": m.RopeScalingFactor, "low_freq_factor": m.RopeScalingLowFreqFactor,
			"high_freq_factor": m.RopeScalingHighFreqFactor, "original_max_position_embeddings": m.RopeScalingOriginalMaxPositionEmbeddings}
	}
	switch Architecture(m) {
	case "Llama4ForCausalLM":
		llama4Config(m, c)
	case "LlamaForCausalLM":
		c["model_type"], c["intermediate_size"] = "llama", m.FFNHidden
	case "Qwen3ForCausalLM":
		c["model_type"], c["intermediate_size"] = "qwen3", m.FFNHidden
		c["use_sliding_window"], c["sliding_window"], c["max_window_layers"] = false, nil, m.Layers
	case "Qwen3MoeForCausalLM":
		c["model_type"], c["intermediate_size"] = "qwen3_moe", m.FFNHidden
		c["moe_intermediate_size"], c["num_experts"], c["num_experts_per_tok"] = m.MoE.ExpertFFNHidden, m.MoE.NumExperts, m.MoE.TopK
		c["decoder_sparse_step"], c["norm_topk_prob"], c["mlp_only_layers"] = m.MoE.LayerFreq, m.MoE.NormTopK, []int{}
		c["router_aux_loss_coef"], c["output_router_logits"] = m.MoE.AuxLossCoeff, false
		c["use_sliding_window"], c["sliding_window"], c["max_window_layers"] = false, nil, m.Layers
	case glm4Moe:
		glm4MoeConfig(c, m)
	case "MixtralForCausalLM":
		c["model_type"], c["intermediate_size"] = "mixtral", m.MoE.ExpertFFNHidden
		c["num_local_experts"], c["num_experts_per_tok"] = m.MoE.NumExperts, m.MoE.TopK
		c["router_aux_loss_coef"], c["sliding_window"] = m.MoE.AuxLossCoeff, nil
	default:
		c["model_type"], c["intermediate_size"] = "qwen2_moe", m.FFNHidden
		c["moe_intermediate_size"], c["shared_expert_intermediate_size"] = m.MoE.ExpertFFNHidden, m.MoE.SharedExperts*m.MoE.ExpertFFNHidden
		c["num_experts"], c["num_experts_per_tok"], c["decoder_sparse_step"] = m.MoE.NumExperts, m.MoE.TopK, m.MoE.LayerFreq
		c["norm_topk_prob"], c["mlp_only_layers"], c["use_sliding_window"] = m.MoE.NormTopK, []int{}, false
		c["router_aux_loss_coef"], c["output_router_logits"] = m.MoE.AuxLossCoeff, false
	}
	return c
}

// hfName maps a shardline parameter name to its Hugging Face name; shared experts
// (Qwen2-MoE's one wider shared expert) are handled apart and return "".
func hfName(m config.Model, name string) string {
	top, pre, parts := splitName(name)
	if pre == "" {
		return top
	}
	proj := map[string]string{"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
	switch rest := strings.Join(parts[2:], "."); {
	case rest == "attn_norm.weight":
		return pre + "input_layernorm.weight"
	case rest == "mlp_norm.weight":
		return pre + "post_attention_layernorm.weight"
	case rest == "attn.q_norm.weight" || rest == "attn.k_norm.weight":
		return pre + "self_attn." + parts[3] + ".weight"
	case strings.HasPrefix(rest, "attn.w"):
		return pre + "self_attn." + rest[len("attn.w"):] + "_proj.weight"
	case strings.HasPrefix(rest, "mlp.w"):
		return pre + "mlp." + proj[rest[len("mlp."):]] + ".weight"
	case rest == "moe.router" && Architecture(m) == "MixtralForCausalLM":
		return pre + "block_sparse_moe.gate.weight"
	case rest == "moe.router":
		return pre + "mlp.gate.weight"
	case rest == "moe.expert_bias" && Architecture(m) == glm4Moe:
		return pre + "mlp.gate.e_score_correction_bias"
	case strings.HasPrefix(rest, "moe.experts.") && Architecture(m) == "MixtralForCausalLM":
		return pre + "block_sparse_moe.experts." + parts[4] + "." + parts[5] + ".weight"
	case strings.HasPrefix(rest, "moe.experts."):
		return pre + "mlp.experts." + parts[4] + "." + proj[parts[5]] + ".weight"
	}
	return ""
}

// splitName parses a shardline parameter name as every architecture here
// names it: a parameter outside the layers gets its Hugging Face name (top;
// "" for an unknown one), a layer's its name prefix "model.layers.N." (pre)
// and the name's dot-separated parts.
func splitName(name string) (top, pre string, parts []string) {
	switch name {
	case "embed.weight":
		return "model.embed_tokens.weight", "", nil
	case "norm.weight":
		return "model.norm.weight", "", nil
	case "output.weight":
		return "lm_head.weight", "", nil
	}
	parts = strings.Split(name, ".")
	if len(parts) < 3 || parts[0] != "layers" {
		return "", "", nil
	}
	return "", "model.layers." + parts[1] + ".", parts
}

// taker is a function that takes tensor name from ts, refusing a missing one
// or one of another shape than the recipe's model needs, and records it in
// used (so that what is left over can be refused).
func taker(ts map[string]Tensor, used map[string]bool) func(name string, shape []int) (Tensor, error) {
	return func(name string, shape []int) (Tensor, error) {
		t, ok := ts[name]
		if !ok {
			return Tensor{}, fmt.Errorf("tensor %s is missing", name)
		}
		if fmt.Sprint(t.Shape) != fmt.Sprint(shape) {
			return Tensor{}, fmt.Errorf("tensor %s has shape %v, the recipe's model needs %v", name, t.Shape, shape)
		}
		used[name] = true
		return t, nil
	}
}

// Param is one shardline parameter: its name, shape and values.
type Param struct {
	Name  string
	Shape []int
	Data  []float32
}

// ToHF renames a model's parameters (in table order) for Hugging Face. Qwen2-MoE
// has one shared expert with a sigmoid gate: shardline's shared experts become
// that one expert, their matrices stacked (the sum of SwiGLU MLPs is one wider
// SwiGLU MLP), its gate weights zero and its down projection doubled, since
// sigmoid(0) = 1/2 (both exact in floating point). Qwen2's q, k and v projections
// have biases: they are written as zeros. Glm4Moe's shared experts are one MLP
// without a gate, stacked the same way (down projection as it is); its expert
// biases are written as ExportedBias says, zeros without expert bias.
func ToHF(m config.Model, params []Param) ([]Tensor, error) {
	if err := Supported(m); err != nil {
		return nil, err
	}
	arch := Architecture(m)
	if arch == "Llama4ForCausalLM" {
		return llama4ToHF(m, params)
	}
	if m.AttentionChunkSize > 0 {
		return nil, fmt.Errorf("model.attention_chunk_size = %d: %s attends over the whole sequence and its config.json has no attention_chunk_size (Llama 4's), so the exported model would compute other logits than the one trained; export a model without chunked attention", m.AttentionChunkSize, arch)
	}
	var out []Tensor
	shared := map[string][]Param{} // layer -> its shared experts' matrices, in order
	for _, p := range params {
		if strings.Contains(p.Name, ".moe.shared.") {
			layer := strings.Split(p.Name, ".")[1]
			shared[layer] = append(shared[layer], p)
			continue
		}
		n := hfName(m, p.Name)
		if n == "" {
			return nil, fmt.Errorf("parameter %s has no %s name", p.Name, arch)
		}
		data := p.Data
		if strings.HasSuffix(p.Name, ".moe.expert_bias") {
			data = ExportedBias(m, data)
		}
		out = append(out, Tensor{Name: n, Shape: p.Shape, Data: data})
		if arch == "Qwen2MoeForCausalLM" && strings.HasSuffix(p.Name, ".attn.wv") {
			pre := strings.TrimSuffix(n, "v_proj.weight")
			for _, b := range []string{"q", "k", "v"} {
				rows := m.Hidden
				if b != "q" {
					rows = m.EffectiveKVHeads() * m.HeadSize()
				}
				out = append(out, Tensor{Name: pre + b + "_proj.bias", Shape: []int{rows}, Data: make([]float32, rows)})
			}
		}
	}
	if arch == "Qwen2MoeForCausalLM" {
		for l := 0; l < m.Layers; l++ {
			if !m.IsMoELayer(l) {
				continue
			}
			pre := "model.layers." + strconv.Itoa(l) + ".mlp."
			h, ef, S := m.Hidden, m.MoE.ExpertFFNHidden, m.MoE.SharedExperts
			gate, up, down := stackShared(h, ef, S, shared[strconv.Itoa(l)], 2)
			out = append(out, Tensor{Name: pre + "shared_expert.gate_proj.weight", Shape: []int{S * ef, h}, Data: gate},
				Tensor{Name: pre + "shared_expert.up_proj.weight", Shape: []int{S * ef, h}, Data: up},
				Tensor{Name: pre + "shared_expert.down_proj.weight", Shape: []int{h, S * ef}, Data: down},
				Tensor{Name: pre + "shared_expert_gate.weight", Shape: []int{1, h}, Data: make([]float32, h)})
		}
	}
	if arch == glm4Moe {
		out = glm4MoeExtra(m, out, shared)
	}
	return out, nil
}

// FromHF fills params (shardline's table: names and shapes) from a Hugging Face
// model's tensors, refusing a missing tensor, a shape that differs, a tensor the
// model does not have, and what shardline cannot represent (nonzero Qwen2 biases
// or shared-expert gate, Glm4Moe's expert biases when the recipe has none),
// each named.
func FromHF(m config.Model, ts map[string]Tensor, params []Param) error {
	if err := Supported(m); err != nil {
		return err
	}
	if Architecture(m) == "Llama4ForCausalLM" {
		return llama4FromHF(m, ts, params)
	}
	used := map[string]bool{}
	take := taker(ts, used)
	shared := map[string][]int{} // layer -> indices into params
	for i := range params {
		p := &params[i]
		if strings.Contains(p.Name, ".moe.shared.") {
			l := strings.Split(p.Name, ".")[1]
			shared[l] = append(shared[l], i)
			continue
		}
		t, err := take(hfName(m, p.Name), p.Shape)
		if err != nil {
			return fmt.Errorf("%w (shardline's %s)", err, p.Name)
		}
		copy(p.Data, t.Data)
	}
	if Architecture(m) == "Qwen2MoeForCausalLM" {
		h, ef, S := m.Hidden, m.MoE.ExpertFFNHidden, m.MoE.SharedExperts
		for l := 0; l < m.Layers; l++ {
			pre := "model.layers." + strconv.Itoa(l) + "."
			for _, b := range []string{"q", "k", "v"} {
				if t, ok := ts[pre+"self_attn."+b+"_proj.bias"]; ok {
					used[t.Name] = true
					if nonzero(t.Data) {
						return fmt.Errorf("tensor %s is not zero: shardline's attention has no biases", t.Name)
					}
				}
			}
			if !m.IsMoELayer(l) {
				continue
			}
			g, err := take(pre+"mlp.shared_expert_gate.weight", []int{1, h})
			if err != nil {
				return err
			}
			if nonzero(g.Data) {
				return fmt.Errorf("tensor %s is not zero: shardline's shared experts have no gate (it must be a constant 1/2)", g.Name)
			}
			gate, err1 := take(pre+"mlp.shared_expert.gate_proj.weight", []int{S * ef, h})
			up, err2 := take(pre+"mlp.shared_expert.up_proj.weight", []int{S * ef, h})
			down, err3 := take(pre+"mlp.shared_expert.down_proj.weight", []int{h, S * ef})
			for _, err := range []error{err1, err2, err3} {
				if err != nil {
					return fmt.Errorf("%w (%d shared experts of %d)", err, S, ef)
				}
			}
			unstackShared(h, ef, S, params, shared[strconv.Itoa(l)], gate.Data, up.Data, down.Data, 0.5)
		}
	}
	if Architecture(m) == glm4Moe {
		if err := glm4MoeFromHF(m, take, params, shared); err != nil {
			return err
		}
	}
	var extra []string
	for name := range ts {
		if !used[name] {
			extra = append(extra, name)
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		return fmt.Errorf("tensor %s is not part of the recipe's model (%d such tensors)", extra[0], len(extra))
	}
	return nil
}

func nonzero(x []float32) bool {
	for _, v := range x {
		if v != 0 {
			return true
		}
	}
	return false
}
