package config

import "fmt"

// ShapeProblem is a recipe shape the layout cannot represent: its lint code, the
// message, a fix, and the keys involved (the first is where it is reported).
type ShapeProblem struct {
	Code, Msg, Help string
	Keys            []string
}

// ShapeProblems checks every divisibility and size rule the model and the
// parallel layout need: the one set of shape rules, which lint reports and the plan
// compiler refuses by (so a recipe lint accepts is one the plan lays out, and the
// trainer, which runs from the plan, trains). The rules follow the layout
// (parallel.ParamTable): tensor parallelism splits the attention heads, the MLP,
// the shared experts and the vocabulary (vocabulary-parallel embedding and output);
// expert tensor parallelism splits each routed expert; context parallelism splits
// every sequence into 2·cp chunks, pairing chunk i with chunk 2·cp−1−i so each rank's
// causal work is even.
func ShapeProblems(r *Recipe) []ShapeProblem {
	var out []ShapeProblem
	add := func(code, msg, help string, keys ...string) {
		out = append(out, ShapeProblem{Code: code, Msg: msg, Help: help, Keys: keys})
	}
	p, m, t := r.Parallel, r.Model, r.Train
	// The model itself.
	switch {
	case m.HeadDim > 0 && m.HeadDim%2 != 0:
		add("SL303", fmt.Sprintf("model.head_dim (%d) must be even for rotary embeddings", m.HeadDim), "pick an even head size", "model.head_dim")
	case m.HeadDim == 0 && m.Hidden%m.Heads != 0:
		add("SL303", fmt.Sprintf("model.heads (%d) must divide model.hidden (%d)", m.Heads, m.Hidden),
			"pick hidden = heads × head size, or set model.head_dim (Megatron's --kv-channels)", "model.heads", "model.hidden")
	case m.HeadDim == 0 && (m.Hidden/m.Heads)%2 != 0:
		add("SL303", fmt.Sprintf("head size model.hidden / model.heads (%d / %d = %d) must be even for rotary embeddings", m.Hidden, m.Heads, m.Hidden/m.Heads),
			"pick an even head size", "model.heads", "model.hidden")
	}
	if kv := m.EffectiveKVHeads(); m.Heads%kv != 0 {
		add("SL303", fmt.Sprintf("model.kv_heads (%d) must divide model.heads (%d) for grouped-query attention", kv, m.Heads),
			"pick kv_heads among the divisors of heads (kv_heads = heads is plain multi-head attention)", "model.kv_heads", "model.heads")
	}
	moe := m.MoE
	if moe.NumExperts > 0 && moe.LayerFreq > m.Layers {
		add("SL304", fmt.Sprintf("model.moe.layer_freq (%d) exceeds model.layers (%d): no layer would be MoE", moe.LayerFreq, m.Layers),
			"set layer_freq = 1 for all-MoE layers, or set num_experts = 0 for a dense model", "model.moe.layer_freq")
	}
	if m.NoPEFirst && m.NoPEInterval == 0 {
		add("SL304", "model.nope_first is set without model.nope_interval: there are no NoPE layers to place",
			"set nope_interval (torchtitan's every_n_layers_nope, 4 in Llama 4), or remove nope_first", "model.nope_first", "model.nope_interval")
	}
	if m.NoPEInterval == 1 && m.AttentionChunkSize > 0 {
		add("SL304", fmt.Sprintf("model.attention_chunk_size (%d) with model.nope_interval = 1: every layer is NoPE, and NoPE layers attend over the whole sequence, so no layer would attend in chunks", m.AttentionChunkSize),
			"set attention_chunk_size = 0, or nope_interval above 1 (Llama 4 uses 4: its RoPE layers attend in chunks)", "model.attention_chunk_size", "model.nope_interval")
	}
	if m.NoPEInterval > m.Layers && !m.NoPEFirst {
		add("SL304", fmt.Sprintf("model.nope_interval (%d) exceeds model.layers (%d): no layer would be NoPE", m.NoPEInterval, m.Layers),
			"set nope_interval to at most the layer count (Llama 4 uses 4), or 0 for rotary embeddings in every layer", "model.nope_interval")
	}
	// The mesh.
	mp := p.TensorParallel * p.ContextParallel * p.PipelineParallel
	if p.WorldSize%mp != 0 {
		add("SL201", fmt.Sprintf("parallel.world_size (%d) must be divisible by tensor_parallel × context_parallel × pipeline_parallel (%d×%d×%d = %d)",
			p.WorldSize, p.TensorParallel, p.ContextParallel, p.PipelineParallel, mp),
			fmt.Sprintf("use a world size that is a multiple of %d, or lower the tp/cp/pp degrees", mp),
			"parallel.world_size", "parallel.tensor_parallel", "parallel.context_parallel", "parallel.pipeline_parallel")
	}
	// Tensor parallelism: heads, MLP, vocabulary.
	tp := p.TensorParallel
	if m.Heads%tp != 0 {
		add("SL202", fmt.Sprintf("parallel.tensor_parallel (%d) must divide model.heads (%d)", tp, m.Heads),
			"choose a tensor-parallel degree that divides the number of heads", "parallel.tensor_parallel", "model.heads")
	}
	if kv := m.EffectiveKVHeads(); kv%tp != 0 {
		add("SL202", fmt.Sprintf("parallel.tensor_parallel (%d) must divide model.kv_heads (%d)", tp, kv),
			"choose a tensor-parallel degree that divides the number of key/value heads", "parallel.tensor_parallel", "model.kv_heads")
	}
	if m.FFNHidden%tp != 0 {
		add("SL210", fmt.Sprintf("parallel.tensor_parallel (%d) must divide model.ffn_hidden (%d)", tp, m.FFNHidden),
			"choose an ffn_hidden that is a multiple of the tensor-parallel degree", "model.ffn_hidden", "parallel.tensor_parallel")
	}
	if m.VocabSize%tp != 0 {
		add("SL212", fmt.Sprintf("parallel.tensor_parallel (%d) must divide model.vocab_size (%d): the embedding and output are split by vocabulary rows", tp, m.VocabSize),
			fmt.Sprintf("pad vocab_size up to %d (Megatron pads to a multiple of 128 × tp)", (m.VocabSize+tp-1)/tp*tp), "parallel.tensor_parallel", "model.vocab_size")
	}
	// Context parallelism: 2·cp chunks per sequence.
	if cp := p.ContextParallel; cp > 1 && m.SeqLen%(2*cp) != 0 {
		add("SL205", fmt.Sprintf("model.seq_len (%d) must be divisible by 2 × parallel.context_parallel (%d) for load-balanced causal attention", m.SeqLen, 2*cp),
			fmt.Sprintf("use a sequence length that is a multiple of %d", 2*cp), "model.seq_len", "parallel.context_parallel")
	}
	// Sequence parallelism splits each rank's micro-batch rows over tp.
	if cp := p.ContextParallel; tp > 1 && cp > 0 && m.SeqLen%cp == 0 && t.MicroBatchSize*(m.SeqLen/cp)%tp != 0 {
		add("SL213", fmt.Sprintf("train.micro_batch_size × model.seq_len / context_parallel (%d × %d / %d = %d tokens per rank) must be divisible by parallel.tensor_parallel (%d): sequence parallelism splits them over the tp ranks",
			t.MicroBatchSize, m.SeqLen, cp, t.MicroBatchSize*(m.SeqLen/cp), tp),
			fmt.Sprintf("use a sequence length (or micro-batch size) that makes the tokens per rank a multiple of %d", tp), "model.seq_len", "train.micro_batch_size", "parallel.tensor_parallel")
	}
	// The batch.
	if mp > 0 && p.WorldSize%mp == 0 {
		if dp := p.WorldSize / mp; t.GlobalBatchSize%(t.MicroBatchSize*dp) != 0 {
			add("SL206", fmt.Sprintf("train.global_batch_size (%d) must be divisible by micro_batch_size × data-parallel size (%d × %d = %d)",
				t.GlobalBatchSize, t.MicroBatchSize, dp, t.MicroBatchSize*dp),
				fmt.Sprintf("set global_batch_size to a multiple of %d", t.MicroBatchSize*dp), "train.global_batch_size", "train.micro_batch_size", "parallel.world_size")
		}
	}
	// Experts.
	if moe.NumExperts == 0 {
		if p.ExpertParallel > 1 || p.ExpertTensorParallel > 1 {
			add("SL208", fmt.Sprintf("parallel.expert_parallel (%d) and expert_tensor_parallel (%d) need an MoE model (model.moe.num_experts > 0)", p.ExpertParallel, p.ExpertTensorParallel),
				"set expert_parallel = 1 and expert_tensor_parallel = 1, or give the model experts", "parallel.expert_parallel", "parallel.expert_tensor_parallel")
		}
		return out
	}
	if moe.NumExperts%p.ExpertParallel != 0 {
		add("SL203", fmt.Sprintf("parallel.expert_parallel (%d) must divide model.moe.num_experts (%d)", p.ExpertParallel, moe.NumExperts),
			"choose an expert-parallel degree that divides the number of experts", "parallel.expert_parallel", "model.moe.num_experts")
	}
	if stage := p.WorldSize / p.PipelineParallel; p.WorldSize%p.PipelineParallel != 0 || stage%(p.ExpertParallel*p.ExpertTensorParallel) != 0 {
		add("SL204", fmt.Sprintf("expert_parallel × expert_tensor_parallel (%d×%d = %d) must divide the %d ranks of a pipeline stage (world_size / pipeline_parallel)",
			p.ExpertParallel, p.ExpertTensorParallel, p.ExpertParallel*p.ExpertTensorParallel, stage),
			"lower expert_parallel or expert_tensor_parallel, or raise the world size", "parallel.expert_parallel", "parallel.expert_tensor_parallel", "parallel.world_size")
	}
	if moe.TopK > moe.NumExperts {
		add("SL207", fmt.Sprintf("model.moe.top_k (%d) must be ≤ model.moe.num_experts (%d)", moe.TopK, moe.NumExperts),
			fmt.Sprintf("set top_k to at most %d", moe.NumExperts), "model.moe.top_k", "model.moe.num_experts")
	}
	if g := moe.NumGroups; g > 0 {
		switch {
		case moe.NumExperts%g != 0:
			add("SL207", fmt.Sprintf("model.moe.num_groups (%d) must divide model.moe.num_experts (%d): each group holds num_experts / num_groups experts", g, moe.NumExperts),
				"choose a group count that divides the number of experts (DeepSeek-V3: 8 groups of 32), or 0 to route over all experts", "model.moe.num_groups", "model.moe.num_experts")
		case moe.GroupTopK < 1 || moe.GroupTopK > g:
			add("SL207", fmt.Sprintf("model.moe.group_top_k (%d) must be between 1 and model.moe.num_groups (%d) under group-limited routing", moe.GroupTopK, g),
				"set group_top_k to the groups a token may use (DeepSeek-V3: 4 of 8)", "model.moe.group_top_k", "model.moe.num_groups")
		case moe.TopK%moe.GroupTopK != 0:
			add("SL207", fmt.Sprintf("model.moe.group_top_k (%d) must divide model.moe.top_k (%d): a group's score is the sum of its top_k / group_top_k best scores", moe.GroupTopK, moe.TopK),
				"pick group_top_k among the divisors of top_k", "model.moe.group_top_k", "model.moe.top_k")
		case moe.TopK > moe.GroupTopK*(moe.NumExperts/g):
			add("SL207", fmt.Sprintf("model.moe.top_k (%d) exceeds the %d experts of model.moe.group_top_k (%d) groups of %d", moe.TopK, moe.GroupTopK*(moe.NumExperts/g), moe.GroupTopK, moe.NumExperts/g),
				"raise group_top_k or lower top_k", "model.moe.top_k", "model.moe.group_top_k")
		}
	} else if moe.GroupTopK > 0 {
		add("SL207", fmt.Sprintf("model.moe.group_top_k (%d) is set without model.moe.num_groups: group-limited routing needs both", moe.GroupTopK),
			"set num_groups too, or group_top_k = 0 to route over all experts", "model.moe.group_top_k", "model.moe.num_groups")
	}
	if moe.ExpertFFNHidden%p.ExpertTensorParallel != 0 {
		add("SL210", fmt.Sprintf("parallel.expert_tensor_parallel (%d) must divide model.moe.expert_ffn_hidden (%d)", p.ExpertTensorParallel, moe.ExpertFFNHidden),
			"choose an expert ffn size that is a multiple of the expert tensor-parallel degree", "model.moe.expert_ffn_hidden", "parallel.expert_tensor_parallel")
	}
	if moe.SharedExperts > 0 && moe.ExpertFFNHidden%tp != 0 {
		add("SL210", fmt.Sprintf("parallel.tensor_parallel (%d) must divide model.moe.expert_ffn_hidden (%d): shared experts are split like the dense MLP", tp, moe.ExpertFFNHidden),
			"choose an expert ffn size that is a multiple of the tensor-parallel degree", "model.moe.expert_ffn_hidden", "parallel.tensor_parallel")
	}
	return out
}
