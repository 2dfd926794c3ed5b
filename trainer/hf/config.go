package hf

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"
	"strings"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/fileio"
)

// maxConfig caps config.json as read (a few kilobytes when written).
const maxConfig = 1 << 20

// hfDefaults are transformers' defaults for the keys CheckConfig compares, per
// model_type: what the library takes when config.json leaves a key out.
var hfDefaults = map[string]map[string]any{
	"llama": {"vocab_size": 32000.0, "hidden_size": 4096.0, "intermediate_size": 11008.0, "num_hidden_layers": 32.0, "num_attention_heads": 32.0,
		"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": false,
		"attention_bias": false, "mlp_bias": false, "rope_scaling": nil},
	"mixtral": {"vocab_size": 32000.0, "hidden_size": 4096.0, "intermediate_size": 14336.0, "num_hidden_layers": 32.0, "num_attention_heads": 32.0,
		"num_key_value_heads": 8.0, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "hidden_act": "silu", "tie_word_embeddings": false,
		"num_local_experts": 8.0, "num_experts_per_tok": 2.0, "sliding_window": nil, "rope_scaling": nil},
	"qwen2_moe": {"vocab_size": 151936.0, "hidden_size": 2048.0, "num_hidden_layers": 24.0, "num_attention_heads": 16.0,
		"num_key_value_heads": 16.0, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": false,
		"num_experts": 60.0, "num_experts_per_tok": 4.0, "moe_intermediate_size": 1408.0, "shared_expert_intermediate_size": 5632.0,
		"decoder_sparse_step": 1.0, "norm_topk_prob": false, "mlp_only_layers": []any{}, "use_sliding_window": false,
		"intermediate_size": 5632.0, "rope_scaling": nil},
	// Qwen3Config's and Qwen3MoeConfig's defaults for the keys whose default
	// shardline relies on; a key left out whose default is not listed is
	// reported absent.
	// Llama4TextConfig's (configuration_llama4.py).
	"llama4_text": {"vocab_size": 202048.0, "hidden_size": 5120.0, "intermediate_size": 8192.0, "intermediate_size_mlp": 16384.0,
		"num_hidden_layers": 48.0, "num_attention_heads": 40.0, "num_key_value_heads": 8.0, "head_dim": 128.0, "hidden_act": "silu",
		"rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": nil, "tie_word_embeddings": false, "num_experts_per_tok": 1.0,
		"num_local_experts": 16.0, "moe_layers": nil, "interleave_moe_layer_step": 1.0, "use_qk_norm": true, "no_rope_layers": nil,
		"no_rope_layer_interval": 4.0, "attention_chunk_size": 8192.0, "layer_types": nil, "attn_temperature_tuning": true,
		"floor_scale": 8192.0, "attn_scale": 0.1, "attention_bias": false},
	"qwen3": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": false, "attention_bias": false,
		"use_sliding_window": false, "rope_scaling": nil},
	"qwen3_moe": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": false, "attention_bias": false,
		"use_sliding_window": false, "rope_scaling": nil, "decoder_sparse_step": 1.0, "norm_topk_prob": false, "mlp_only_layers": []any{}},
	// Glm4MoeConfig's (GLM-4.5's class): partial_rotary_factor 0.5 and one
	// dense first layer unless config.json says otherwise. It has no
	// num_nextn_predict_layers argument: absent, there are none.
	"glm4_moe": {"vocab_size": 151552.0, "hidden_size": 4096.0, "intermediate_size": 10944.0, "num_hidden_layers": 46.0,
		"num_attention_heads": 96.0, "num_key_value_heads": 8.0, "partial_rotary_factor": 0.5, "hidden_act": "silu", "rms_norm_eps": 1e-5,
		"tie_word_embeddings": false, "rope_theta": 10000.0, "rope_scaling": nil, "attention_bias": false, "moe_intermediate_size": 1408.0,
		"num_experts_per_tok": 8.0, "n_shared_experts": 1.0, "n_routed_experts": 128.0, "routed_scaling_factor": 1.0, "n_group": 1.0,
		"topk_group": 1.0, "first_k_dense_replace": 1.0, "norm_topk_prob": true, "use_qk_norm": false, "num_nextn_predict_layers": 0.0},
}

// modelTypes maps each architecture shardline reads to its model_type.
var modelTypes = map[string]string{"Llama4ForCausalLM": "llama4_text", "LlamaForCausalLM": "llama", "MixtralForCausalLM": "mixtral", "Qwen2MoeForCausalLM": "qwen2_moe",
	"Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe", glm4Moe: "glm4_moe"}

// whole says whether v is a whole number from least to 2^53 (a count a JSON
// number can hold exactly).
func whole(v, least float64) bool {
	return v >= least && v <= 1<<53 && v == math.Trunc(v)
}

// ConfigMismatch is one key of config.json that disagrees with the recipe's
// model: the Hugging Face key and value, the recipe key and value (Recipe is
// empty for what no recipe key sets), and the fix.
type ConfigMismatch struct {
	HFKey       string
	HFValue     any  // nil: the key is absent and transformers has no default for it
	Default     bool // HFValue is transformers' default: config.json leaves the key out
	Recipe      string
	RecipeValue any
	Fix         string
}

func (c ConfigMismatch) String() string {
	hv := "absent"
	if c.HFValue != nil {
		b, _ := json.Marshal(c.HFValue)
		hv = string(b)
		if c.Default {
			hv = "absent (transformers' default " + hv + ")"
		}
	}
	if c.Recipe == "" {
		return fmt.Sprintf("%s is %s: %s", c.HFKey, hv, c.Fix)
	}
	return fmt.Sprintf("%s is %s, the recipe's %s is %v: %s", c.HFKey, hv, c.Recipe, c.RecipeValue, c.Fix)
}

// ConfigError lists every key of a model directory's config.json that does
// not describe the recipe's model.
type ConfigError struct {
	Path       string
	Mismatches []ConfigMismatch
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s describes another model than the recipe's (%d keys differ):", e.Path, len(e.Mismatches))
	for _, m := range e.Mismatches {
		b.WriteString("\n  " + m.String())
	}
	b.WriteString("\nset the recipe's keys to the model's (--set KEY=VALUE), or start from a model of the recipe's shape")
	return b.String()
}

// CheckConfig reads dir's config.json and compares it, key by key, with the
// recipe's model m: the architecture, every size, the activation, RoPE (base
// and scaling), the norm epsilon, tied embeddings, the MoE routing and what
// shardline's model cannot be (biases, sliding windows, dense-only layers). A
// key config.json leaves out takes transformers' default for its model type.
// max_position_embeddings is not compared: a model may be trained at another
// context than it was made for. A missing config.json is refused: without it
// the weights' meaning is unknown.
func CheckConfig(dir string, m config.Model) error {
	path := filepath.Join(dir, ConfigFile)
	b, err := fileio.ReadRegular(path, maxConfig)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s is missing: without it nothing says which model the weights are (architecture, activation, RoPE base, norm epsilon); copy the model's config.json beside its weights (shardline ckpt export writes one)", path)
	}
	if err != nil {
		return err
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var bad []ConfigMismatch
	arch := Architecture(m)
	got, _ := c["architectures"].([]any)
	mt, _ := c["model_type"].(string)
	var gotArch string
	if len(got) == 1 {
		gotArch, _ = got[0].(string)
	}
	if err, ok := deepseekMLA(path, c, gotArch, mt); ok {
		return err
	}
	if err := Supported(m); err != nil {
		return err
	}
	archFix := "the recipe's model makes it " + arch + " (a router that scales the token before its expert, NoPE layers or chunked attention: Llama 4; model.moe.score_function = \"sigmoid\" otherwise: Glm4Moe; model.qk_norm: Qwen3, or Qwen3-MoE with experts; otherwise num_experts 0: Llama; every layer MoE without shared experts, renormalised: Mixtral; otherwise Qwen2-MoE)"
	switch {
	case gotArch == "Llama4ForConditionalGeneration": // llama4.go
		bad = append(bad, ConfigMismatch{"architectures", c["architectures"], false, "", nil, llama4Multimodal})
	case gotArch != arch && (arch == "Llama4ForCausalLM" || gotArch == "Llama4ForCausalLM"):
		bad = append(bad, ConfigMismatch{"architectures", c["architectures"], false, "model.moe.score_before_expert, model.nope_interval and model.attention_chunk_size",
			fmt.Sprintf("%v, %d and %d", m.MoE.ScoreBeforeExpert, m.NoPEInterval, m.AttentionChunkSize), archFix})
	case gotArch != arch && gotArch == glm4Moe && m.MoE.NumExperts > 0:
		bad = append(bad, ConfigMismatch{"architectures", c["architectures"], false, "model.moe.score_function", m.MoE.ScoreFunction,
			"set model.moe.score_function = \"sigmoid\": Glm4MoeForCausalLM routes by sigmoid scores (DeepSeek-V3's router), its outputs weighed by the gates (model.moe.score_before_expert = false)"})
	case gotArch != arch:
		bad = append(bad, ConfigMismatch{"architectures", c["architectures"], false, "model.moe.num_experts", m.MoE.NumExperts, archFix})
	case mt != modelTypes[arch]:
		bad = append(bad, ConfigMismatch{"model_type", c["model_type"], false, "model.moe.num_experts", m.MoE.NumExperts, archFix})
	}
	if len(bad) > 0 {
		return &ConfigError{Path: path, Mismatches: bad}
	}
	defaults := hfDefaults[mt]
	value := func(key string) any {
		if v, ok := c[key]; ok {
			return v
		}
		if v := ropeParameter(c, key); v != nil {
			return v
		}
		return defaults[key]
	}
	want := Config(m)
	setFix := func(key string, v any) string {
		b, _ := json.Marshal(v)
		return fmt.Sprintf("set %s = %s", key, b)
	}
	// same compares key with the value the recipe's model gives it.
	same := func(key, recipeKey string, recipeValue any) {
		got, exp := value(key), want[key]
		if equalJSON(got, exp) {
			return
		}
		fix := "no recipe key changes it: shardline's model has " + string(must(json.Marshal(exp)))
		if recipeKey != "" {
			switch got.(type) {
			case float64, bool, string:
				fix = setFix(recipeKey, got)
			default:
				fix = fmt.Sprintf("the recipe's model needs %s", must(json.Marshal(exp)))
			}
		}
		_, given := c[key]
		given = given || ropeParameter(c, key) != nil
		bad = append(bad, ConfigMismatch{key, got, !given && got != nil, recipeKey, recipeValue, fix})
	}
	same("hidden_size", "model.hidden", m.Hidden)
	same("num_hidden_layers", "model.layers", m.Layers)
	same("num_attention_heads", "model.heads", m.Heads)
	if value("num_key_value_heads") == nil { // Llama: as many as the query heads
		c["num_key_value_heads"] = value("num_attention_heads")
	}
	same("num_key_value_heads", "model.kv_heads", derived(m.KVHeads, m.EffectiveKVHeads(), "model.heads"))
	if value("head_dim") == nil { // hidden_size / num_attention_heads
		// Only whole, positive counts are divided (0.5 heads would divide by
		// zero); any other value is num_attention_heads' or hidden_size's
		// mismatch, reported by same.
		h, _ := value("hidden_size").(float64)
		n, _ := value("num_attention_heads").(float64)
		if whole(h, 0) && whole(n, 1) {
			c["head_dim"] = float64(int64(h) / int64(n))
		}
	}
	same("head_dim", "model.head_dim", derived(m.HeadDim, m.HeadSize(), "model.hidden / model.heads"))
	same("vocab_size", "model.vocab_size", m.VocabSize)
	same("rms_norm_eps", "model.norm_eps", m.NormEps)
	same("rope_theta", "model.rope_theta", m.RopeTheta)
	same("tie_word_embeddings", "model.tie_embeddings", m.TieEmbeddings)
	same("hidden_act", "", nil)
	if m.AttentionChunkSize > 0 && mt != "llama4_text" { // none of these model types attends in chunks (transformers ignores the key on them)
		bad = append(bad, ConfigMismatch{"attention_chunk_size", c["attention_chunk_size"], false, "model.attention_chunk_size", m.AttentionChunkSize,
			fmt.Sprintf("set model.attention_chunk_size = 0: %s attends over the whole sequence", arch)})
	}
	if !equalRopeScaling(value("rope_scaling"), want["rope_scaling"]) {
		fix := "set model.rope_scaling = \"none\""
		if rs, ok := value("rope_scaling").(map[string]any); ok {
			fix = "shardline's RoPE scaling is none or llama3 (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)"
			if ropeType(rs) == "llama3" {
				fix = llama3Fix(rs, fix)
			}
		}
		bad = append(bad, ConfigMismatch{"rope_scaling", value("rope_scaling"), false, "model.rope_scaling", m.RopeScaling, fix})
	}
	switch mt {
	case "llama4_text": // llama4.go
		bad = append(bad, llama4Check(m, c, value, same)...)
	case "llama":
		same("intermediate_size", "model.ffn_hidden", m.FFNHidden)
		same("attention_bias", "", nil)
		same("mlp_bias", "", nil)
	case "qwen3":
		same("intermediate_size", "model.ffn_hidden", m.FFNHidden)
		same("attention_bias", "", nil)
		same("use_sliding_window", "", nil)
	case "qwen3_moe":
		if m.MoE.LayerFreq > 1 {
			same("intermediate_size", "model.ffn_hidden", m.FFNHidden)
		}
		same("moe_intermediate_size", "model.moe.expert_ffn_hidden", m.MoE.ExpertFFNHidden)
		same("num_experts", "model.moe.num_experts", m.MoE.NumExperts)
		same("num_experts_per_tok", "model.moe.top_k", m.MoE.TopK)
		same("decoder_sparse_step", "model.moe.layer_freq", m.MoE.LayerFreq)
		same("norm_topk_prob", "model.moe.norm_top_k", m.MoE.NormTopK)
		same("mlp_only_layers", "", nil)
		same("attention_bias", "", nil)
		same("use_sliding_window", "", nil)
	case "mixtral":
		same("intermediate_size", "model.moe.expert_ffn_hidden", m.MoE.ExpertFFNHidden)
		same("num_local_experts", "model.moe.num_experts", m.MoE.NumExperts)
		same("num_experts_per_tok", "model.moe.top_k", m.MoE.TopK)
		if w, ok := value("sliding_window").(float64); ok && w < float64(m.SeqLen) {
			bad = append(bad, ConfigMismatch{"sliding_window", w, false, "model.seq_len", m.SeqLen, fmt.Sprintf("shardline's attention has no sliding window: set model.seq_len to at most %v", w)})
		}
	case "qwen2_moe":
		if m.MoE.LayerFreq > 1 { // dense layers: their MLP's width
			same("intermediate_size", "model.ffn_hidden", m.FFNHidden)
		}
		same("moe_intermediate_size", "model.moe.expert_ffn_hidden", m.MoE.ExpertFFNHidden)
		same("num_experts", "model.moe.num_experts", m.MoE.NumExperts)
		same("num_experts_per_tok", "model.moe.top_k", m.MoE.TopK)
		same("decoder_sparse_step", "model.moe.layer_freq", m.MoE.LayerFreq)
		if got, exp := value("shared_expert_intermediate_size"), want["shared_expert_intermediate_size"]; !equalJSON(got, exp) {
			fix := "it must be model.moe.shared_experts × model.moe.expert_ffn_hidden"
			if g, ok := got.(float64); ok && m.MoE.ExpertFFNHidden > 0 && int(g)%m.MoE.ExpertFFNHidden == 0 {
				fix = fmt.Sprintf("set model.moe.shared_experts = %d (× model.moe.expert_ffn_hidden %d)", int(g)/m.MoE.ExpertFFNHidden, m.MoE.ExpertFFNHidden)
			}
			bad = append(bad, ConfigMismatch{"shared_expert_intermediate_size", got, c["shared_expert_intermediate_size"] == nil, "model.moe.shared_experts", m.MoE.SharedExperts, fix})
		}
		same("norm_topk_prob", "model.moe.norm_top_k", m.MoE.NormTopK)
		same("mlp_only_layers", "", nil)
		same("use_sliding_window", "", nil)
	case "glm4_moe":
		checkGlm4MoeConfig(m, c, value, same, func(c ConfigMismatch) { bad = append(bad, c) })
	}
	if len(bad) > 0 {
		return &ConfigError{Path: path, Mismatches: bad}
	}
	return nil
}

// equalJSON compares a decoded JSON value with one of Config's (ints and
// float64s as numbers, slices element by element).
func equalJSON(got, want any) bool {
	a, err1 := json.Marshal(got)
	var norm any
	b, err2 := json.Marshal(want)
	if err1 != nil || err2 != nil || json.Unmarshal(b, &norm) != nil {
		return false
	}
	c, _ := json.Marshal(norm)
	return string(a) == string(c)
}

// llama3Fix is the recipe keys that give a llama3 rope_scaling's four numbers
// (model.rope_scaling_factor and the three beside it), or otherwise when one
// is missing or out of what the recipe takes (positive factors, high at least
// low, a whole positive number of original positions).
func llama3Fix(rs map[string]any, otherwise string) string {
	f, fok := rs["factor"].(float64)
	lo, lok := rs["low_freq_factor"].(float64)
	hi, hok := rs["high_freq_factor"].(float64)
	n, nok := rs["original_max_position_embeddings"].(float64)
	if !fok || !lok || !hok || !nok || f <= 0 || lo <= 0 || hi < lo || !whole(n, 1) || n > 1<<24 {
		return otherwise + "; shardline's llama3 scaling takes positive factors with high_freq_factor at least low_freq_factor and a whole number of original positions"
	}
	return fmt.Sprintf("set model.rope_scaling = \"llama3\", model.rope_scaling_factor = %v, model.rope_scaling_low_freq_factor = %v, "+
		"model.rope_scaling_high_freq_factor = %v and model.rope_scaling_original_max_position_embeddings = %v", f, lo, hi, n)
}

// ropeType is a rope_scaling's type (rope_type, or the older type).
func ropeType(rs map[string]any) string {
	if t, ok := rs["rope_type"].(string); ok {
		return t
	}
	t, _ := rs["type"].(string)
	return t
}

// equalRopeScaling compares config.json's rope_scaling with Config's: both
// absent (or null), or both llama3 with the same numbers.
func equalRopeScaling(got, want any) bool {
	g, gok := got.(map[string]any)
	w, wok := want.(map[string]any)
	if !gok || !wok {
		return got == nil && !wok
	}
	if ropeType(g) != "llama3" {
		return false
	}
	for _, k := range []string{"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} {
		if !equalJSON(g[k], w[k]) {
			return false
		}
	}
	return true
}

// derived shows a recipe key whose 0 stands for a value derived from others.
func derived(set, effective int, from string) any {
	if set == 0 {
		return fmt.Sprintf("0 (%s, %d)", from, effective)
	}
	return set
}

func must(b []byte, _ error) []byte { return b }
