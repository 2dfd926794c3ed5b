package config

// torchtitan's published model tables, as of the last release line with TOML job
// files (pytorch/torchtitan at 238fa9953e4aec2a62582121564273d7cbb1e9f1, the
// parent of "Config System Refactor: TOML to Python Dataclass Registry"):
//   - llama3: torchtitan/models/llama3/__init__.py (llama3_args) with the defaults
//     of torchtitan/models/llama3/model/args.py (TransformerModelArgs:
//     vocab_size 128256, multiple_of 256, norm_eps 1e-5, rope_theta 10000, and
//     RoPEScalingArgs scaling_factor 8, low_freq_factor 1, high_freq_factor 4,
//     original_max_position_embeddings 8192, which model.py's
//     precompute_freqs_cis applies to every llama3 flavour).
//   - llama4: torchtitan/models/llama4/__init__.py (llama4_args) with
//     torchtitan/models/llama4/model/args.py (vocab_size 202048, multiple_of
//     256, rope_scaling_args None unless a flavour sets it, interleave_moe_layer_step
//     2, auto_scale_hidden_dim true; its own RoPEScalingArgs, which debugmodel,
//     17bx16e and their _irope flavours set: scaling_factor 16, low_freq_factor 1,
//     high_freq_factor 1, original_max_position_embeddings 8192, applied by
//     llama4's precompute_freqs_cis) and torchtitan/models/moe/moe.py (MoEArgs:
//     num_experts 8, num_shared_experts 1, top_k 1, score_func sigmoid,
//     score_before_experts true, load_balance_coeff 1e-3).

// ttRope is a flavour's RoPEScalingArgs: scaling_factor, low_freq_factor,
// high_freq_factor and original_max_position_embeddings (model.rope_scaling =
// llama3 with its four numbers).
type ttRope struct {
	factor, low, high float64
	original          int
}

var (
	// ttLlama3Rope is llama3's RoPEScalingArgs (model/args.py): Llama 3.1's.
	ttLlama3Rope = &ttRope{factor: 8, low: 1, high: 4, original: 8192}
	// ttLlama4Rope is llama4's RoPEScalingArgs (model/args.py): Llama 4's,
	// equal low and high factors (a step at 8192 positions, no blend).
	ttLlama4Rope = &ttRope{factor: 16, low: 1, high: 1, original: 8192}
)

// ttFlavour is one row of a torchtitan model table.
type ttFlavour struct {
	dim, layers, heads, kvHeads, vocab int
	multipleOf                         int
	ffnMultiplier                      float64 // 0: none
	ropeTheta                          float64
	rope                               *ttRope // RoPE scaling (rope_scaling_args), nil: none
	// MoE (llama4): experts per MoE layer (0: dense) and the interleave step.
	experts, interleave int
	// blockCausal: attention within documents (attn_mask_type block_causal,
	// ttBlockCausal), data.reset_attention_mask.
	blockCausal bool
	// iRoPE (llama4's every_n_layers_nope, fixed_attn_block_size): every
	// nopeEvery-th layer, from layer 0, is NoPE and attends over the whole
	// sequence; the others attend within blocks of chunk positions
	// (model.nope_interval, model.nope_first, model.attention_chunk_size).
	nopeEvery, chunk int
}

const (
	ttBlockCausal = "attention within documents (attn_mask_type block_causal, %s attention): data.reset_attention_mask"
)

var ttLlama3 = map[string]ttFlavour{
	"debugmodel":             {dim: 256, layers: 6, heads: 16, vocab: 2048, multipleOf: 256, ropeTheta: 500000, rope: ttLlama3Rope},
	"debugmodel_flex_attn":   {dim: 256, layers: 6, heads: 16, vocab: 2048, multipleOf: 256, ropeTheta: 500000, rope: ttLlama3Rope, blockCausal: true},
	"debugmodel_varlen_attn": {dim: 256, layers: 6, heads: 16, vocab: 2048, multipleOf: 256, ropeTheta: 500000, rope: ttLlama3Rope, blockCausal: true},
	"8B":                     {dim: 4096, layers: 32, heads: 32, kvHeads: 8, vocab: 128256, multipleOf: 1024, ffnMultiplier: 1.3, ropeTheta: 500000, rope: ttLlama3Rope},
	"8B_flex":                {dim: 4096, layers: 32, heads: 32, kvHeads: 8, vocab: 128256, multipleOf: 1024, ffnMultiplier: 1.3, ropeTheta: 500000, rope: ttLlama3Rope, blockCausal: true},
	"8B_varlen":              {dim: 4096, layers: 32, heads: 32, kvHeads: 8, vocab: 128256, multipleOf: 1024, ffnMultiplier: 1.3, ropeTheta: 500000, rope: ttLlama3Rope, blockCausal: true},
	"70B":                    {dim: 8192, layers: 80, heads: 64, kvHeads: 8, vocab: 128256, multipleOf: 4096, ffnMultiplier: 1.3, ropeTheta: 500000, rope: ttLlama3Rope},
	"405B":                   {dim: 16384, layers: 126, heads: 128, kvHeads: 8, vocab: 128256, multipleOf: 4096, ffnMultiplier: 1.2, ropeTheta: 500000, rope: ttLlama3Rope},
}

var ttLlama4 = map[string]ttFlavour{
	"debugmodel": {dim: 256, layers: 6, heads: 16, vocab: 2048, multipleOf: 256, ropeTheta: 500000, rope: ttLlama4Rope, experts: 8, interleave: 2},
	"17bx16e":    {dim: 5120, layers: 48, heads: 40, kvHeads: 8, vocab: 202048, multipleOf: 2048, ffnMultiplier: 1.2, ropeTheta: 500000, rope: ttLlama4Rope, experts: 16, interleave: 1},
	"17bx128e":   {dim: 5120, layers: 48, heads: 40, kvHeads: 8, vocab: 202048, multipleOf: 2048, ffnMultiplier: 1.2, ropeTheta: 500000, experts: 128, interleave: 2},
	// The _irope flavours: flex attention with block_causal masks, NoPE
	// layers 0, 4, 8… (layer_id % every_n_layers_nope == 0) and the other
	// layers within fixed blocks (fixed_attn_block_size: 256 in the debug
	// model, TransformerModelArgs' 8192 otherwise).
	"debugmodel_irope": {dim: 256, layers: 6, heads: 16, vocab: 2048, multipleOf: 256, ropeTheta: 500000, rope: ttLlama4Rope, experts: 8, interleave: 2, blockCausal: true, nopeEvery: 4, chunk: 256},
	"17bx16e_irope":    {dim: 5120, layers: 48, heads: 40, kvHeads: 8, vocab: 202048, multipleOf: 2048, ffnMultiplier: 1.2, ropeTheta: 500000, rope: ttLlama4Rope, experts: 16, interleave: 1, blockCausal: true, nopeEvery: 4, chunk: 8192},
	"17bx128e_irope":   {dim: 5120, layers: 48, heads: 40, kvHeads: 8, vocab: 202048, multipleOf: 2048, ffnMultiplier: 1.2, ropeTheta: 500000, experts: 128, interleave: 2, blockCausal: true, nopeEvery: 4, chunk: 8192},
}

// ffnHidden is torchtitan's FeedForward hidden size for a SwiGLU MLP whose nominal
// hidden size is 4·dim: two thirds of it, times the multiplier, rounded up to a
// multiple of multiple_of (llama3 and llama4's model.py, in integer arithmetic as
// Python's int() truncates).
func (f ttFlavour) ffnHidden() int {
	h := 2 * (4 * f.dim) / 3
	if f.ffnMultiplier != 0 {
		h = int(f.ffnMultiplier * float64(h))
	}
	return f.multipleOf * ((h + f.multipleOf - 1) / f.multipleOf)
}

// expertHidden is llama4's routed (and shared) expert hidden size: the same two
// thirds and multiplier, divided by top_k + num_shared_experts (auto_scale_hidden_dim;
// 1 + 1 for every published flavour), rounded up to a multiple of multiple_of.
func (f ttFlavour) expertHidden() int {
	h := 2 * (4 * f.dim) / 3
	if f.ffnMultiplier != 0 {
		h = int(f.ffnMultiplier * float64(h))
	}
	h /= 2
	return h + (f.multipleOf-h%f.multipleOf)%f.multipleOf
}
