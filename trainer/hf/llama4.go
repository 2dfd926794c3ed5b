package hf

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/shardline/shardline/config"
)

// Llama 4's text model in transformers (modeling_llama4.py, configuration_llama4.py:
// Llama4ForCausalLM, model_type llama4_text) as shardline writes and reads it:
//
//   - Attention: q, k, v and o projections without biases; RoPE on the layers
//     whose no_rope_layers entry is 1, rotating adjacent pairs (2i, 2i+1) as
//     complex numbers (shardline rotates i with i + head_dim/2: the q and k
//     rows of each head are permuted on the way, llama4Perm); the
//     chunked_attention layers (layer_types) attend within chunks of
//     attention_chunk_size positions. use_qk_norm (a weightless L2 norm of q
//     and k after RoPE, on the RoPE layers) has no shardline counterpart and
//     is written false; attn_temperature_tuning (NoPE layers' queries scaled by
//     1 + attn_scale·log(1 + ⌊(p+1)/floor_scale⌋)) likewise.
//   - MoE layers (moe_layers: every interleave_moe_layer_step-th): a router
//     (num_local_experts × hidden, no bias) whose top num_experts_per_tok
//     logits are passed through a sigmoid and scale the token before its
//     expert; the experts fused as experts.gate_up_proj (E, hidden,
//     2·intermediate_size: gate columns, then up) and experts.down_proj (E,
//     intermediate_size, hidden), both multiplied from the right; one
//     shared_expert MLP of intermediate_size added unweighted. Dense layers
//     are an MLP of intermediate_size_mlp.
//
// shardline's model is that when its router is Llama 4's (sigmoid scores,
// raw, unscaled, the token scaled before its expert, no groups) with at most
// one shared expert (none is written as a zero shared expert), no QK-norm,
// and expert biases all zero (transformers' router has none: a model trained
// with biases chooses other experts than its export would).

// llama4Multimodal says how to read Llama4ForConditionalGeneration's text
// model (its language_model is a Llama4ForCausalLM of its text_config), whose
// directory also holds the vision model's weights.
const llama4Multimodal = "Llama 4's text and vision model: shardline reads its text model as Llama4ForCausalLM; make a directory of it: its text_config as config.json with architectures [\"Llama4ForCausalLM\"], and its language_model.* tensors named without the \"language_model.\" prefix (the vision_model.* and multi_modal_projector.* tensors left out)"

// isLlama4 reports whether the model's architecture is Llama 4's: MoE with the
// token scaled before its expert, or NoPE layers or chunked attention, which
// no other architecture shardline writes has.
func isLlama4(m config.Model) bool {
	return (m.MoE.NumExperts > 0 && m.MoE.ScoreBeforeExpert) || m.NoPEInterval > 0 || m.AttentionChunkSize > 0
}

// llama4Supported refuses what Llama4ForCausalLM does not compute, naming
// each recipe key.
func llama4Supported(m config.Model) error {
	var what []string
	add := func(bad bool, why string) {
		if bad {
			what = append(what, why)
		}
	}
	add(m.QKNorm, "model.qk_norm (shardline's QK-norm is an RMSNorm with gains before RoPE on every layer; Llama 4's use_qk_norm is a weightless L2 norm after RoPE on its RoPE layers only)")
	if moe := m.MoE; moe.NumExperts > 0 {
		add(moe.ScoreFunction != "sigmoid", fmt.Sprintf("model.moe.score_function = %q (Llama 4's router is sigmoid)", moe.ScoreFunction))
		add(moe.NormTopK, "model.moe.norm_top_k = true (Llama 4 keeps the sigmoid scores as they are)")
		add(moe.TopKScale != 0 && moe.TopKScale != 1, fmt.Sprintf("model.moe.top_k_scale = %v (Llama 4 scales the gates by 1)", moe.TopKScale))
		add(!moe.ScoreBeforeExpert, "model.moe.score_before_expert = false (Llama 4 scales the token before its expert)")
		add(moe.NumGroups > 0, "model.moe.num_groups (Llama 4 routes over all experts)")
		add(moe.SharedExperts > 1, fmt.Sprintf("model.moe.shared_experts = %d (Llama 4 has one shared expert of the experts' width)", moe.SharedExperts))
	}
	if len(what) == 0 {
		return nil
	}
	return fmt.Errorf("the model is Llama 4's kind (its router scales the token before its expert, or it has NoPE layers or chunked attention), and Llama4ForCausalLM does not compute what it sets: %s; export and import need a model Llama 4 computes", strings.Join(what, "; "))
}

// llama4Layers are Llama4TextConfig's per-layer lists of the model:
// no_rope_layers (1: RoPE), layer_types and moe_layers.
func llama4Layers(m config.Model) (rope []int, types []string, moe []int) {
	rope, types, moe = make([]int, m.Layers), make([]string, m.Layers), []int{}
	for l := 0; l < m.Layers; l++ {
		rope[l], types[l] = 1, "full_attention"
		if m.IsNoPELayer(l) {
			rope[l] = 0
		}
		if m.AttentionChunk(l) > 0 {
			types[l] = "chunked_attention"
		}
		if m.IsMoELayer(l) {
			moe = append(moe, l)
		}
	}
	return rope, types, moe
}

// llama4Config fills config.json's Llama4TextConfig keys into c (which holds
// the keys every architecture shares).
func llama4Config(m config.Model, c map[string]any) {
	rope, types, moe := llama4Layers(m)
	c["model_type"], c["intermediate_size_mlp"] = "llama4_text", m.FFNHidden
	c["no_rope_layers"], c["layer_types"], c["moe_layers"] = rope, types, moe
	if m.NoPEInterval > 0 {
		c["no_rope_layer_interval"] = m.NoPEInterval
	}
	// Every layer_types entry says whether its layer attends in chunks;
	// transformers makes the chunked mask whatever they say, and refuses a
	// null size, so a model without chunks gives its whole context.
	c["attention_chunk_size"] = m.AttentionChunkSize
	if m.AttentionChunkSize == 0 {
		c["attention_chunk_size"] = m.SeqLen
	}
	c["use_qk_norm"], c["attn_temperature_tuning"], c["floor_scale"], c["attn_scale"] = false, false, 8192, 0.1
	c["router_jitter_noise"], c["output_router_logits"] = 0.0, false
	if m.MoE.NumExperts > 0 {
		c["intermediate_size"], c["num_local_experts"], c["num_experts_per_tok"] = m.MoE.ExpertFFNHidden, m.MoE.NumExperts, m.MoE.TopK
		c["interleave_moe_layer_step"], c["router_aux_loss_coef"] = m.MoE.LayerFreq, m.MoE.AuxLossCoeff
	} else { // dense: no layer reads the experts' keys
		c["intermediate_size"], c["num_local_experts"], c["num_experts_per_tok"] = m.FFNHidden, 0, 0
		c["interleave_moe_layer_step"], c["router_aux_loss_coef"] = 1, 0.0
	}
}

// llama4Perm maps row r of a (heads·head_dim, ·) q or k projection in
// shardline's order (head h, element i pairing with i + head_dim/2) to its row
// in Llama 4's (element 2i pairing with 2i+1).
func llama4Perm(r, hd int) int {
	h, i := r/hd, r%hd
	if i < hd/2 {
		return h*hd + 2*i
	}
	return h*hd + 2*(i-hd/2) + 1
}

// permuteRows returns x (rows × cols) with row r moved to row to(r).
func permuteRows(x []float32, rows, cols int, to func(int) int) []float32 {
	out := make([]float32, len(x))
	for r := 0; r < rows; r++ {
		copy(out[to(r)*cols:(to(r)+1)*cols], x[r*cols:(r+1)*cols])
	}
	return out
}

// llama4Name is a shardline parameter's Llama4ForCausalLM name, "" for the
// experts, the shared expert and the expert bias (handled apart).
func llama4Name(name string) string {
	top, pre, parts := splitName(name)
	if pre == "" {
		return top
	}
	switch rest := strings.Join(parts[2:], "."); rest {
	case "attn_norm.weight":
		return pre + "input_layernorm.weight"
	case "mlp_norm.weight":
		return pre + "post_attention_layernorm.weight"
	case "attn.wq", "attn.wk", "attn.wv", "attn.wo":
		return pre + "self_attn." + rest[len("attn.w"):] + "_proj.weight"
	case "mlp.w1":
		return pre + "feed_forward.gate_proj.weight"
	case "mlp.w3":
		return pre + "feed_forward.up_proj.weight"
	case "mlp.w2":
		return pre + "feed_forward.down_proj.weight"
	case "moe.router":
		return pre + "feed_forward.router.weight"
	}
	return ""
}

// layerOf is the layer a parameter name "layers.N.…" belongs to (0 for the
// others).
func layerOf(name string) int {
	parts := strings.Split(name, ".")
	if len(parts) > 2 && parts[0] == "layers" {
		l, _ := strconv.Atoi(parts[1])
		return l
	}
	return 0
}

// llama4MoEName is one tensor of a Llama 4 layer's MoE block, in
// Llama4ForCausalLM's names.
func llama4MoEName(l int, what string) string {
	return "model.layers." + strconv.Itoa(l) + ".feed_forward." + what
}

// llama4ToHF writes the model's parameters as Llama4ForCausalLM's tensors:
// q and k rows permuted to Llama 4's RoPE pairs, each MoE layer's experts
// fused (gate_up_proj, down_proj, both transposed), its shared expert (zeros
// without one), and no expert bias, which must be zero.
func llama4ToHF(m config.Model, params []Param) ([]Tensor, error) {
	hd, h, ef, E := m.HeadSize(), m.Hidden, m.MoE.ExpertFFNHidden, m.MoE.NumExperts
	var out []Tensor
	experts := map[int][]Param{} // layer -> its experts' w1, w3, w2 in order
	shared := map[int][]Param{}
	for _, p := range params {
		l := layerOf(p.Name)
		switch {
		case strings.HasSuffix(p.Name, ".moe.expert_bias"):
			for e, b := range p.Data {
				if b != 0 {
					return nil, fmt.Errorf("%s[%d] is %g: Llama4ForCausalLM's router has no expert bias and chooses each token's experts by its logits alone, so the export would route otherwise than the trained model (model.moe.expert_bias); export a model trained without expert biases (model.moe.expert_bias = false, balanced by model.moe.aux_loss_coeff)", p.Name, e, b)
				}
			}
			continue
		case strings.Contains(p.Name, ".moe.experts."):
			experts[l] = append(experts[l], p)
			continue
		case strings.Contains(p.Name, ".moe.shared."):
			shared[l] = append(shared[l], p)
			continue
		}
		n := llama4Name(p.Name)
		if n == "" {
			return nil, fmt.Errorf("parameter %s has no Llama4ForCausalLM name", p.Name)
		}
		data := p.Data
		if strings.HasSuffix(p.Name, ".attn.wq") || strings.HasSuffix(p.Name, ".attn.wk") {
			data = permuteRows(data, p.Shape[0], p.Shape[1], func(r int) int { return llama4Perm(r, hd) })
		}
		out = append(out, Tensor{Name: n, Shape: p.Shape, Data: data})
	}
	for l := 0; l < m.Layers; l++ {
		if !m.IsMoELayer(l) {
			continue
		}
		ps := experts[l]
		if len(ps) != 3*E {
			return nil, fmt.Errorf("layer %d has %d expert matrices, the model's %d experts need %d", l, len(ps), E, 3*E)
		}
		gateUp, down := make([]float32, E*h*2*ef), make([]float32, E*ef*h)
		for e := 0; e < E; e++ {
			w1, w3, w2 := ps[3*e].Data, ps[3*e+1].Data, ps[3*e+2].Data // (ef, h), (ef, h), (h, ef)
			gu, d := gateUp[e*h*2*ef:], down[e*ef*h:]
			for r := 0; r < ef; r++ {
				for c := 0; c < h; c++ {
					gu[c*2*ef+r], gu[c*2*ef+ef+r] = w1[r*h+c], w3[r*h+c]
					d[r*h+c] = w2[c*ef+r]
				}
			}
		}
		out = append(out, Tensor{Name: llama4MoEName(l, "experts.gate_up_proj"), Shape: []int{E, h, 2 * ef}, Data: gateUp},
			Tensor{Name: llama4MoEName(l, "experts.down_proj"), Shape: []int{E, ef, h}, Data: down})
		gate, up, dn := make([]float32, ef*h), make([]float32, ef*h), make([]float32, h*ef)
		if s := shared[l]; len(s) == 3 {
			gate, up, dn = s[0].Data, s[1].Data, s[2].Data
		}
		out = append(out, Tensor{Name: llama4MoEName(l, "shared_expert.gate_proj.weight"), Shape: []int{ef, h}, Data: gate},
			Tensor{Name: llama4MoEName(l, "shared_expert.up_proj.weight"), Shape: []int{ef, h}, Data: up},
			Tensor{Name: llama4MoEName(l, "shared_expert.down_proj.weight"), Shape: []int{h, ef}, Data: dn})
	}
	return out, nil
}

// llama4FromHF fills params from Llama4ForCausalLM's tensors, the inverse of
// llama4ToHF: expert biases become zero (transformers' router has none) and a
// model without a shared expert needs the shared expert's tensors zero.
func llama4FromHF(m config.Model, ts map[string]Tensor, params []Param) error {
	hd, h, ef, E := m.HeadSize(), m.Hidden, m.MoE.ExpertFFNHidden, m.MoE.NumExperts
	used := map[string]bool{}
	take := taker(ts, used)
	experts, shared := map[int][]int{}, map[int][]int{} // layer -> indices into params
	for i := range params {
		p := &params[i]
		l := layerOf(p.Name)
		switch {
		case strings.HasSuffix(p.Name, ".moe.expert_bias"):
			clear(p.Data)
			continue
		case strings.Contains(p.Name, ".moe.experts."):
			experts[l] = append(experts[l], i)
			continue
		case strings.Contains(p.Name, ".moe.shared."):
			shared[l] = append(shared[l], i)
			continue
		}
		t, err := take(llama4Name(p.Name), p.Shape)
		if err != nil {
			return fmt.Errorf("%w (shardline's %s)", err, p.Name)
		}
		if strings.HasSuffix(p.Name, ".attn.wq") || strings.HasSuffix(p.Name, ".attn.wk") {
			for r := 0; r < p.Shape[0]; r++ { // shardline's row r is Llama 4's row llama4Perm(r)
				from := llama4Perm(r, hd)
				copy(p.Data[r*p.Shape[1]:(r+1)*p.Shape[1]], t.Data[from*p.Shape[1]:(from+1)*p.Shape[1]])
			}
			continue
		}
		copy(p.Data, t.Data)
	}
	for l := 0; l < m.Layers; l++ {
		if !m.IsMoELayer(l) {
			continue
		}
		gu, err1 := take(llama4MoEName(l, "experts.gate_up_proj"), []int{E, h, 2 * ef})
		dn, err2 := take(llama4MoEName(l, "experts.down_proj"), []int{E, ef, h})
		sg, err3 := take(llama4MoEName(l, "shared_expert.gate_proj.weight"), []int{ef, h})
		su, err4 := take(llama4MoEName(l, "shared_expert.up_proj.weight"), []int{ef, h})
		sd, err5 := take(llama4MoEName(l, "shared_expert.down_proj.weight"), []int{h, ef})
		for _, err := range []error{err1, err2, err3, err4, err5} {
			if err != nil {
				return fmt.Errorf("%w (%d experts of %d)", err, E, ef)
			}
		}
		idx := experts[l]
		for e := 0; e < E; e++ {
			w1, w3, w2 := params[idx[3*e]].Data, params[idx[3*e+1]].Data, params[idx[3*e+2]].Data
			g, d := gu.Data[e*h*2*ef:], dn.Data[e*ef*h:]
			for r := 0; r < ef; r++ {
				for c := 0; c < h; c++ {
					w1[r*h+c], w3[r*h+c] = g[c*2*ef+r], g[c*2*ef+ef+r]
					w2[c*ef+r] = d[r*h+c]
				}
			}
		}
		if s := shared[l]; len(s) == 3 {
			copy(params[s[0]].Data, sg.Data)
			copy(params[s[1]].Data, su.Data)
			copy(params[s[2]].Data, sd.Data)
			continue
		}
		for _, t := range []Tensor{sg, su, sd} {
			if nonzero(t.Data) {
				return fmt.Errorf("tensor %s is not zero, and the recipe's model has no shared expert (model.moe.shared_experts = 0): set model.moe.shared_experts = 1", t.Name)
			}
		}
	}
	return unused(ts, used)
}

// llama4Check compares config.json's Llama4TextConfig keys with the recipe's
// model (value gives a key's value or transformers' default, same compares a
// key with Config's): the MLP and expert sizes, which layers are MoE, NoPE and
// chunked, and what shardline does not compute (QK-norm, the NoPE layers'
// temperature tuning past floor_scale, biases).
func llama4Check(m config.Model, c map[string]any, value func(string) any, same func(key, recipeKey string, recipeValue any)) []ConfigMismatch {
	var bad []ConfigMismatch
	absent := func(key string) bool { _, ok := c[key]; return !ok }
	L := m.Layers
	moe := m.MoE
	if moe.NumExperts > 0 {
		same("intermediate_size", "model.moe.expert_ffn_hidden", moe.ExpertFFNHidden)
		same("num_local_experts", "model.moe.num_experts", moe.NumExperts)
		same("num_experts_per_tok", "model.moe.top_k", moe.TopK)
	}
	// Which layers are MoE: moe_layers, or every interleave_moe_layer_step-th.
	var hfMoE []int
	if list, ok := value("moe_layers").([]any); ok {
		for _, v := range list {
			if f, ok := v.(float64); ok && whole(f, 0) && f < float64(L) {
				hfMoE = append(hfMoE, int(f))
			}
		}
	} else if step, ok := value("interleave_moe_layer_step").(float64); ok && whole(step, 1) {
		for l := int(step) - 1; l < L; l += int(step) {
			hfMoE = append(hfMoE, l)
		}
	}
	_, _, want := llama4Layers(m)
	if fmt.Sprint(hfMoE) != fmt.Sprint(want) {
		fix := "set model.moe.layer_freq so that its MoE layers (0-based, every layer_freq-th: layer_freq−1, 2·layer_freq−1…) are these"
		switch {
		case len(hfMoE) == 0:
			fix = "the model has no MoE layer: set model.moe.num_experts = 0"
		case len(want) == 0:
			fix = "the model has MoE layers: set model.moe.num_experts (num_local_experts), model.moe.top_k (num_experts_per_tok), model.moe.expert_ffn_hidden (intermediate_size), model.moe.layer_freq and Llama 4's router (model.moe.score_function = \"sigmoid\", norm_top_k = false, score_before_expert = true, shared_experts = 1)"
		}
		bad = append(bad, ConfigMismatch{"moe_layers", hfMoE, false, "model.moe.layer_freq", fmt.Sprint(want), fix})
	}
	if len(want) < L {
		same("intermediate_size_mlp", "model.ffn_hidden", m.FFNHidden)
	}
	// RoPE and NoPE layers: no_rope_layers (1: RoPE), or every
	// no_rope_layer_interval-th NoPE.
	hfRope := make([]int, L)
	if list, ok := value("no_rope_layers").([]any); ok && len(list) > 0 {
		for l := range hfRope {
			if l < len(list) {
				if f, ok := list[l].(float64); ok && f != 0 {
					hfRope[l] = 1
				}
			}
		}
	} else if n, ok := value("no_rope_layer_interval").(float64); ok && whole(n, 1) {
		for l := range hfRope {
			if (l+1)%int(n) != 0 {
				hfRope[l] = 1
			}
		}
	}
	wantRope, _, _ := llama4Layers(m)
	nope := 0
	for l := range wantRope {
		nope += 1 - wantRope[l]
	}
	if fmt.Sprint(hfRope) != fmt.Sprint(wantRope) {
		bad = append(bad, ConfigMismatch{"no_rope_layers", hfRope, false, "model.nope_interval", m.NoPEInterval,
			"set model.nope_interval (and model.nope_first) so that the NoPE layers (the zeros) are these: every nope_interval-th layer, the last of each group (0-based n−1, 2n−1…) or with nope_first the first (0, n, 2n…)"})
	}
	// Chunked layers: layer_types, or the RoPE layers; each within
	// attention_chunk_size positions.
	chunk, _ := value("attention_chunk_size").(float64)
	for l := 0; l < L; l++ {
		chunked := hfRope[l] == 1
		if list, ok := value("layer_types").([]any); ok && l < len(list) {
			chunked = list[l] == "chunked_attention"
		}
		got, hv := 0.0, any("full_attention")
		if chunked {
			got, hv = chunk, fmt.Sprintf("chunked_attention within %v positions", chunk)
		}
		if got == float64(m.AttentionChunk(l)) {
			continue
		}
		fix := "set model.attention_chunk_size = 0: the layer attends over the whole sequence"
		switch {
		case chunked && whole(chunk, 1) && (nope == 0 || hfRope[l] == 1):
			fix = fmt.Sprintf("set model.attention_chunk_size = %v", chunk)
		case chunked:
			fix = "shardline chunks the RoPE layers only (every layer when none is NoPE), and this NoPE layer is chunked: such a model cannot be imported"
		}
		bad = append(bad, ConfigMismatch{fmt.Sprintf("layer_types[%d] (with attention_chunk_size)", l), hv, false, "model.attention_chunk_size", m.AttentionChunk(l), fix})
		break // one layer says it
	}
	if q, _ := value("use_qk_norm").(bool); q && nope < L {
		bad = append(bad, ConfigMismatch{"use_qk_norm", true, absent("use_qk_norm"), "", nil,
			"shardline has no Llama 4 QK-norm (a weightless L2 norm of the RoPE layers' queries and keys after RoPE); its model.qk_norm is an RMSNorm with gains before RoPE: such a model cannot be imported"})
	}
	if tune, _ := value("attn_temperature_tuning").(bool); tune && nope > 0 {
		// 1 + attn_scale·log(1 + ⌊(p+1)/floor_scale⌋) is 1 below position floor_scale − 1.
		if fs, _ := value("floor_scale").(float64); !(fs > 0) || float64(m.SeqLen) >= fs {
			bad = append(bad, ConfigMismatch{"attn_temperature_tuning", true, absent("attn_temperature_tuning"), "model.seq_len", m.SeqLen,
				fmt.Sprintf("shardline does not scale the NoPE layers' queries by position (Llama 4's temperature tuning, which changes positions from floor_scale − 1 = %v on): set model.seq_len below floor_scale", fs-1)})
		}
	}
	same("attention_bias", "", nil)
	return bad
}

// unused refuses a tensor of ts that used does not name.
func unused(ts map[string]Tensor, used map[string]bool) error {
	var extra []string
	for name := range ts {
		if !used[name] {
			extra = append(extra, name)
		}
	}
	if len(extra) == 0 {
		return nil
	}
	first := extra[0]
	for _, n := range extra {
		first = min(first, n)
	}
	return fmt.Errorf("tensor %s is not part of the recipe's model (%d such tensors)", first, len(extra))
}
