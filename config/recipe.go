package config

// This file is the recipe schema. It is also the source of the recipe reference:
// `shardline recipe docs` and docs/recipes.md are generated from the doc comments
// below (the file is embedded and parsed at run time), so every field's comment says
// what the value means, its unit and its constraint. Defaults live in Default().
//
// Struct tags, read by schema.go:
//   toml:"name"        the key inside its section
//   enum:"a,b,c"       the value must be one of these
//   orfile:"true"      besides the enum, a file path (holding a path separator or
//                      ending in .json, .model or .tiktoken) is accepted
//   min:"N" max:"N"    inclusive numeric bounds; gt:"N" an exclusive lower bound
//   flag:"name"        a Megatron-style dashed flag that sets this key (--name)
//   negflag:"name"     a dashed flag that sets this boolean key to false (--name)

// Recipe is a complete training recipe: one struct per TOML section.
type Recipe struct {
	// Run identity, seed and where outputs go.
	Run Run `toml:"run"`
	// Model architecture: a Llama-style decoder, dense or mixture-of-experts.
	Model Model `toml:"model"`
	// Training data and tokenizer.
	Data Data `toml:"data"`
	// Optimisation: steps, batch sizes, learning-rate schedule, AdamW.
	Train Train `toml:"train"`
	// Parallelism degrees, world size and device.
	Parallel Parallel `toml:"parallel"`
	// Megatron-FSDP options, under Megatron's own names.
	FSDP FSDP `toml:"fsdp"`
	// Numeric formats of compute weights and main weights.
	Precision Precision `toml:"precision"`
	// Activation recomputation.
	ActivationCheckpoint ActivationCheckpoint `toml:"activation_checkpoint"`
	// Distributed checkpoints.
	Checkpoint Checkpoint `toml:"checkpoint"`
	// Console and metrics logging.
	Logging Logging `toml:"logging"`
}

// Run names a run and fixes its randomness.
type Run struct {
	// Name of the run, used for the run directory under output_dir: one file
	// name (no path separator, no control characters, at most 255 bytes). Empty
	// means the recipe's file name without extension.
	Name string `toml:"name"`
	// Seed of every random stream (initialisation, data order, dropout-free sampling).
	// Any 64-bit value; the same seed and recipe reproduce a run bit for bit.
	Seed int64 `toml:"seed" flag:"seed"`
	// Directory under which the run directory is created. Relative paths are relative
	// to the working directory.
	OutputDir string `toml:"output_dir"`
}

// Model describes the decoder. A model is mixture-of-experts when model.moe.num_experts > 0.
type Model struct {
	// Architecture family. Only Llama-style decoders (RMSNorm, RoPE, GQA, SwiGLU).
	Family string `toml:"family" enum:"llama"`
	// Number of transformer layers.
	Layers int `toml:"layers" min:"1" max:"4096" flag:"num-layers"`
	// Model width (embedding and residual stream size), in elements.
	Hidden int `toml:"hidden" min:"1" max:"262144" flag:"hidden-size"`
	// Number of attention (query) heads. Must divide model.hidden.
	Heads int `toml:"heads" min:"1" max:"4096" flag:"num-attention-heads"`
	// Size of one attention head, in elements: 0 means model.hidden / model.heads;
	// another value decouples the attention width (heads × head_dim) from hidden
	// (Megatron's --kv-channels; Qwen3-30B-A3B uses 128 with hidden 2048, 32 heads).
	HeadDim int `toml:"head_dim" min:"0" max:"65536" flag:"kv-channels"`
	// Number of key/value heads (grouped-query attention); must divide model.heads.
	// 0 means equal to model.heads (plain multi-head attention).
	KVHeads int `toml:"kv_heads" min:"0" max:"4096" flag:"num-query-groups"`
	// Hidden size of the dense SwiGLU MLP, in elements.
	FFNHidden int `toml:"ffn_hidden" min:"1" max:"1048576" flag:"ffn-hidden-size"`
	// Vocabulary size, in tokens. Must cover the tokenizer's vocabulary (256 for byte).
	VocabSize int `toml:"vocab_size" min:"1" max:"16777216" flag:"vocab-size"`
	// Sequence length (context), in tokens.
	SeqLen int `toml:"seq_len" min:"1" max:"16777216" flag:"seq-length"`
	// RoPE base frequency.
	RopeTheta float64 `toml:"rope_theta" gt:"0" flag:"rotary-base"`
	// RoPE frequency scaling: none, or llama3 (Llama 3.1's, Hugging Face's llama3
	// rope type, Megatron's --use-rope-scaling, torchtitan's RoPEScalingArgs):
	// frequencies whose wavelength exceeds rope_scaling_original_max_position_embeddings
	// / rope_scaling_low_freq_factor positions are divided by rope_scaling_factor,
	// those below original / high_freq_factor kept, and those between blended
	// smoothly (with equal factors, as Llama 4's, there is no blend: a step).
	RopeScaling string `toml:"rope_scaling" enum:"none,llama3"`
	// The llama3 scaling's factor (8 for Llama 3.1, 32 for Llama 3.2, 16 for Llama 4).
	RopeScalingFactor float64 `toml:"rope_scaling_factor" gt:"0" max:"1000000" flag:"rope-scaling-factor"`
	// The llama3 scaling's low_freq_factor: wavelengths above original /
	// low_freq_factor positions are divided by the factor (1 for Llama 3.1 and 4).
	RopeScalingLowFreqFactor float64 `toml:"rope_scaling_low_freq_factor" gt:"0" max:"1000000"`
	// The llama3 scaling's high_freq_factor, at least low_freq_factor: wavelengths
	// below original / high_freq_factor positions are kept (4 for Llama 3.1, 1 for
	// Llama 4).
	RopeScalingHighFreqFactor float64 `toml:"rope_scaling_high_freq_factor" gt:"0" max:"1000000"`
	// The llama3 scaling's original_max_position_embeddings: the context, in
	// positions, the scaled wavelengths are measured against (8192 for Llama 3.1
	// and 4).
	RopeScalingOriginalMaxPositionEmbeddings int `toml:"rope_scaling_original_max_position_embeddings" min:"1" max:"16777216"`
	// Epsilon added to the mean square in RMSNorm.
	NormEps float64 `toml:"norm_eps" gt:"0" flag:"norm-epsilon"`
	// Share the token embedding with the output head.
	TieEmbeddings bool `toml:"tie_embeddings"`
	// Standard deviation of the normal initialisation of weight matrices.
	InitStd float64 `toml:"init_std" gt:"0" flag:"init-method-std"`
	// Chunked (local) attention, Llama 4's attention_chunk_size: a token attends
	// only to the tokens of its own chunk of this many positions (chunk ⌊p /
	// size⌋, so the last chunk may be shorter; seq_len need not be a multiple),
	// still causally. With NoPE layers (nope_interval) only the rotary layers
	// attend in chunks and the NoPE layers over the whole sequence (Llama 4's
	// iRoPE: Hugging Face's chunked_attention layer type is its rotary layers);
	// without them every layer does. 0 means attention over the whole sequence.
	// A size of seq_len or more changes nothing in training (lint notes it, SL307).
	AttentionChunkSize int `toml:"attention_chunk_size" min:"0" max:"16777216"`
	// RMSNorm on each attention head's queries and keys, with a gain of head size
	// per layer for each, before the rotary embedding (Qwen3's QK-norm; Megatron's
	// --qk-layernorm).
	QKNorm bool `toml:"qk_norm" flag:"qk-layernorm"`
	// NoPE layers: every nope_interval-th layer (1-based: layers k·nope_interval)
	// applies no rotary embedding to its queries and keys (Llama 4's iRoPE, which
	// uses 4). 0 makes every layer rotary.
	NoPEInterval int `toml:"nope_interval" min:"0" max:"4096"`
	// The NoPE layers are the first of each nope_interval layers (0-based layers
	// 0, n, 2n…: torchtitan's llama4 every_n_layers_nope) instead of the last
	// (0-based n−1, 2n−1…: Meta's and Hugging Face's Llama 4). Needs nope_interval.
	NoPEFirst bool `toml:"nope_first"`
	// Mixture-of-experts layers; absent or num_experts = 0 for a dense model.
	MoE MoE `toml:"moe"`
}

// MoE configures mixture-of-experts layers.
type MoE struct {
	// Number of routed experts per MoE layer. 0 makes the model dense.
	NumExperts int `toml:"num_experts" min:"0" max:"4096" flag:"num-experts"`
	// Experts each token is routed to. 1 ≤ top_k ≤ num_experts.
	TopK int `toml:"top_k" min:"1" max:"4096" flag:"moe-router-topk"`
	// Hidden size of each routed expert's SwiGLU MLP, in elements.
	ExpertFFNHidden int `toml:"expert_ffn_hidden" min:"1" max:"1048576" flag:"moe-ffn-hidden-size"`
	// Number of shared experts every token passes through, each of expert_ffn_hidden.
	SharedExperts int `toml:"shared_experts" min:"0" max:"64"`
	// Expert capacity as a multiple of the even share of routed tokens; tokens past
	// capacity are dropped. 0 means no capacity limit (no token is dropped).
	CapacityFactor float64 `toml:"capacity_factor" min:"0" max:"1024" flag:"moe-expert-capacity-factor"`
	// Weight of the load-balancing auxiliary loss added to the language-model loss.
	AuxLossCoeff float64 `toml:"aux_loss_coeff" min:"0" flag:"moe-aux-loss-coeff"`
	// The router's score of each expert: softmax over the experts (Mixtral, Qwen3-MoE)
	// or sigmoid of each logit (DeepSeek-V3, Llama 4).
	ScoreFunction string `toml:"score_function" enum:"softmax,sigmoid" flag:"moe-router-score-function"`
	// Divide the chosen experts' scores by their sum, so that a token's gates add
	// up to top_k_scale (Mixtral, DeepSeek-V3); false keeps the scores as they are
	// (Llama 4, Qwen3-MoE's norm_topk_prob = false).
	NormTopK bool `toml:"norm_top_k"`
	// Factor every gate is multiplied by (DeepSeek-V3's routed_scaling_factor, 2.5;
	// Megatron's --moe-router-topk-scaling-factor).
	TopKScale float64 `toml:"top_k_scale" gt:"0" max:"1000000" flag:"moe-router-topk-scaling-factor"`
	// Scale each token by its gate before the expert instead of the expert's output
	// after it (Llama 4: the expert sees gate·x, and its output is summed
	// unweighted). SwiGLU is not linear, so the two differ.
	ScoreBeforeExpert bool `toml:"score_before_expert"`
	// Auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias added to the
	// scores when choosing experts (not to the gates), moved after every step by
	// bias_update_rate towards the experts that got fewer than the mean of the
	// step's routed copies, counted over the whole global batch (every data- and
	// expert-parallel rank holds the same biases). Saved in checkpoints.
	ExpertBias bool `toml:"expert_bias" flag:"moe-router-enable-expert-bias"`
	// Step of the expert-bias update: bias_e += rate · sign(mean load − load_e).
	BiasUpdateRate float64 `toml:"bias_update_rate" gt:"0" max:"1" flag:"moe-router-bias-update-rate"`
	// Group-limited routing (DeepSeek-V3): the experts form num_groups groups of
	// num_experts / num_groups; each token picks its group_top_k groups by the sum
	// of each group's top_k / group_top_k best scores, then its top_k experts among
	// them. 0 routes over all experts.
	NumGroups int `toml:"num_groups" min:"0" max:"4096" flag:"moe-router-num-groups"`
	// Groups each token may route to under group-limited routing (1 ≤ group_top_k ≤
	// num_groups, and group_top_k divides top_k).
	GroupTopK int `toml:"group_top_k" min:"0" max:"4096" flag:"moe-router-group-topk"`
	// Layer interleave: every layer_freq-th layer (1-based: layers k·layer_freq) is an
	// MoE layer, the others dense. 1 makes every layer MoE.
	LayerFreq int `toml:"layer_freq" min:"1" max:"4096" flag:"moe-layer-freq"`
}

// Data names the training text and how it becomes tokens.
type Data struct {
	// Training data: a document source (a text file, JSON lines (.jsonl, .json,
	// .ndjson, also .gz or .zst) or Parquet file, a directory of them, or a glob),
	// a directory written by `shardline data prepare`, or a Megatron indexed
	// dataset (PREFIX, PREFIX.bin or PREFIX.idx). See docs/data.md.
	// ${VAR} expands from the environment; ${GOROOT} falls back to `go env GOROOT`.
	Path string `toml:"path"`
	// Blended training data instead of path (which must then be ""): entries
	// "WEIGHT PATH", each path as path takes it, its samples drawn by weight as
	// Megatron's --data-path blends (docs/data.md).
	Sources []string `toml:"sources"`
	// Validation data (any form path takes), whole; val_fraction must then be 0.
	ValPath string `toml:"val_path"`
	// JSON field or Parquet column holding each document's text.
	Field string `toml:"field"`
	// Tokenizer: byte (vocabulary 256), char (vocabulary from the corpus), gpt2
	// (GPT-2's byte-pair encoding, vocabulary 50257), or the path of a model's own
	// tokenizer: a Hugging Face tokenizer.json (byte-level BPE as Llama 3, Qwen2/3,
	// GPT-NeoX; BPE with byte fallback as Llama 2), a tiktoken rank file (Llama 3's
	// tokenizer.model) or a SentencePiece .model, or a directory holding
	// tokenizer.json or tokenizer.model. A tokenizer_config.json beside it names BOS
	// and EOS. A relative path is read from data_root, like data.path; ${VAR}
	// expands. The file is stored with prepared data and in the run directory.
	Tokenizer string `toml:"tokenizer" enum:"byte,char,gpt2" orfile:"true"`
	// Fraction held out for validation: of the documents (spread evenly through
	// the corpus), or of the text's end for a corpus of one text file.
	ValFraction float64 `toml:"val_fraction" min:"0" max:"0.5"`
	// No loss on the positions whose input token is the tokenizer's end-of-text
	// token (Megatron's --eod-mask-loss): the prediction across a document
	// boundary is not trained. Needs a tokenizer with one (gpt2; not byte or
	// char, SL306).
	EODMaskLoss bool `toml:"eod_mask_loss" flag:"eod-mask-loss"`
	// Attention within documents only (Megatron's --reset-attention-mask,
	// torchtitan's block_causal masks): a token sees the tokens of its own
	// document, the document changing after each end-of-text token, so that
	// documents packed in one sequence train as if apart. Positions are not
	// reset, and need not be: RoPE's scores depend on distances only. Needs a
	// tokenizer with an end-of-text token (SL306).
	ResetAttentionMask bool `toml:"reset_attention_mask" flag:"reset-attention-mask"`
}

// Train configures the optimisation.
type Train struct {
	// Number of optimizer steps.
	Steps int `toml:"steps" min:"1" max:"1000000000" flag:"train-iters"`
	// Sequences per micro-batch on each data-parallel rank.
	MicroBatchSize int `toml:"micro_batch_size" min:"1" max:"1048576" flag:"micro-batch-size"`
	// Sequences per optimizer step over all data-parallel ranks; a multiple of
	// micro_batch_size × data-parallel size (the quotient is the accumulation count).
	GlobalBatchSize int `toml:"global_batch_size" min:"1" max:"1073741824" flag:"global-batch-size"`
	// Optimizer: adamw (decoupled weight decay), adam, or sgd (the optimizers
	// Megatron-FSDP's distributed optimizer supports).
	Optimizer string `toml:"optimizer" flag:"optimizer"`
	// Peak learning rate.
	LR float64 `toml:"lr" gt:"0" flag:"lr"`
	// Decay after warmup: cosine, linear, or constant.
	LRSchedule string `toml:"lr_schedule" enum:"cosine,linear,constant" flag:"lr-decay-style"`
	// Steps of linear warmup from 0 to train.lr.
	WarmupSteps int `toml:"warmup_steps" min:"0" flag:"lr-warmup-iters"`
	// Steps after warmup over which the learning rate decays to
	// min_lr_factor · lr, where it then stays. 0 means the decay ends at the last
	// step (steps − warmup_steps − 1 steps). torchtitan's schedule decays over
	// steps − warmup_steps, so its last step stays just above the minimum.
	LRDecaySteps int `toml:"lr_decay_steps" min:"0" max:"1000000000"`
	// Final learning rate as a fraction of train.lr, in [0, 1].
	MinLRFactor float64 `toml:"min_lr_factor" min:"0" max:"1"`
	// Decoupled weight decay coefficient.
	WeightDecay float64 `toml:"weight_decay" min:"0" flag:"weight-decay"`
	// Apply weight decay to norm gains and embeddings too (off: matrices only).
	DecayNormsAndEmbeddings bool `toml:"decay_norms_and_embeddings"`
	// AdamW first-moment decay.
	Beta1 float64 `toml:"beta1" min:"0" max:"1" flag:"adam-beta1"`
	// AdamW second-moment decay.
	Beta2 float64 `toml:"beta2" min:"0" max:"1" flag:"adam-beta2"`
	// AdamW epsilon.
	Eps float64 `toml:"eps" gt:"0" flag:"adam-eps"`
	// Clip gradients to this global L2 norm. 0 disables clipping.
	ClipGrad float64 `toml:"clip_grad" min:"0" flag:"clip-grad"`
	// Evaluate on the validation split every eval_interval steps. 0 never evaluates.
	EvalInterval int `toml:"eval_interval" min:"0" flag:"eval-interval"`
	// Validation batches per evaluation.
	EvalSteps int `toml:"eval_steps" min:"1" max:"1000000" flag:"eval-iters"`
	// Skip a step whose loss or gradient norm is NaN or Inf instead of stopping the
	// run. Such a step's update is never applied; the trainer learns of it when it
	// reads the step statistics back (every logging.interval steps, before a
	// checkpoint and at the end), and without skip_nonfinite the run stops there.
	SkipNonfinite bool `toml:"skip_nonfinite"`
}

// Parallel sets the parallelism degrees. The dense mesh is tp × cp × dp × pp (tp
// fastest); the expert mesh folds the same ranks as etp × ep × edp per pipeline stage.
type Parallel struct {
	// Total number of ranks (processes or GPUs).
	WorldSize int `toml:"world_size" min:"1" max:"1048576" flag:"world-size"`
	// Tensor-parallel degree (tp): each layer's heads, MLP columns and vocabulary rows split over tp ranks, Megatron-style with sequence parallelism (docs/parallelism.md).
	TensorParallel int `toml:"tensor_parallel" min:"1" max:"1048576" flag:"tensor-model-parallel-size"`
	// Context-parallel degree (cp): each sequence split over cp ranks, attention a ring passing K/V blocks between them (docs/parallelism.md).
	ContextParallel int `toml:"context_parallel" min:"1" max:"1048576" flag:"context-parallel-size"`
	// Expert-parallel degree (ep): experts are partitioned over ep ranks.
	ExpertParallel int `toml:"expert_parallel" min:"1" max:"1048576" flag:"expert-model-parallel-size"`
	// Expert tensor-parallel degree (etp): each expert's matrices split over etp ranks.
	ExpertTensorParallel int `toml:"expert_tensor_parallel" min:"1" max:"1048576" flag:"expert-tensor-parallel-size"`
	// Pipeline-parallel degree (pp).
	PipelineParallel int `toml:"pipeline_parallel" min:"1" max:"1048576" flag:"pipeline-model-parallel-size"`
	// Device to train on: cpu, or cuda (NVIDIA GPUs through CUDA and NCCL).
	Device string `toml:"device" enum:"cpu,cuda"`
	// Ranks (GPUs) per node; groups spanning nodes use the inter-node link.
	// 0 means every rank on one node.
	GPUsPerNode int `toml:"gpus_per_node" min:"0" max:"1048576" flag:"gpus-per-node"`
	// Device profile for the plan's memory and time model: auto picks cpu for
	// device = "cpu" and h100-80gb for device = "cuda"; custom is a device described
	// by the five device_* keys below, all of which it needs.
	DeviceProfile string `toml:"device_profile" enum:"auto,cpu,a100-80gb,h100-80gb,h200-141gb,h800-80gb,h20-96gb,b200-180gb,l40s-48gb,custom" flag:"device-profile"`
	// Device memory per rank in GiB for the plan, overriding the profile. 0 keeps the
	// profile's value.
	DeviceMemoryGiB float64 `toml:"device_memory_gib" min:"0" max:"1048576"`
	// Dense matmul peak of one device in the compute dtype (bf16 on GPUs, fp32 on the
	// CPU), TFLOP/s, for the plan's time model and MFU, overriding the profile. 0
	// keeps the profile's value.
	DevicePeakTFLOPS float64 `toml:"device_peak_tflops" min:"0" max:"1000000"`
	// Device memory bandwidth in GB/s, overriding the profile. 0 keeps the profile's.
	DeviceMemoryGBps float64 `toml:"device_memory_gbps" min:"0" max:"1000000"`
	// Bus bandwidth per rank and direction inside a node, GB/s, overriding the
	// profile. 0 keeps the profile's.
	DeviceIntraNodeGBps float64 `toml:"device_intra_node_gbps" min:"0" max:"1000000"`
	// Bus bandwidth per rank and direction across nodes, GB/s, overriding the
	// profile. 0 keeps the profile's.
	DeviceInterNodeGBps float64 `toml:"device_inter_node_gbps" min:"0" max:"1000000"`
	// The CUDA caching allocator uses expandable segments (as PyTorch's
	// expandable_segments:True). Incompatible with fsdp.use_nccl_ub. Megatron's
	// setting: shardline allocates every buffer before the first step and refuses it.
	CUDAExpandableSegments bool `toml:"cuda_expandable_segments"`
}

// FSDP holds the Megatron-FSDP options, under Megatron's names.
type FSDP struct {
	// Use Megatron-FSDP (fully sharded data parallelism). Off means plain data
	// parallelism with replicated weights.
	UseMegatronFSDP bool `toml:"use_megatron_fsdp" flag:"use-megatron-fsdp"`
	// What is sharded over the data-parallel group: no_shard (nothing; gradients are
	// all-reduced), optim (optimizer state and fp32 main weights), optim_grads (also
	// gradients, reduce-scattered), optim_grads_params (also compute weights, gathered
	// per FSDP unit before use).
	DataParallelShardingStrategy string `toml:"data_parallel_sharding_strategy" enum:"no_shard,optim,optim_grads,optim_grads_params" flag:"data-parallel-sharding-strategy"`
	// Module kinds that each form one FSDP unit (one gather and one reduce per
	// instance): embedding, transformer_layer, attention, mlp, moe, output. Megatron's
	// class paths (e.g. TransformerLayer) are accepted as aliases.
	FSDPUnitModules []string `toml:"fsdp_unit_modules" flag:"fsdp-unit-modules"`
	// Shard optimizer state over data-parallel ranks. Megatron-FSDP requires it.
	UseDistributedOptimizer bool `toml:"use_distributed_optimizer" flag:"use-distributed-optimizer"`
	// Fuse gradient accumulation into the weight-gradient GEMM (Megatron's main_grad
	// path). Must be off with Megatron-FSDP.
	GradientAccumulationFusion bool `toml:"gradient_accumulation_fusion" flag:"gradient-accumulation-fusion" negflag:"no-gradient-accumulation-fusion"`
	// Reduce gradients in the background while backward continues.
	OverlapGradReduce bool `toml:"overlap_grad_reduce" flag:"overlap-grad-reduce"`
	// Gather the next unit's parameters while the current unit computes.
	OverlapParamGather bool `toml:"overlap_param_gather" flag:"overlap-param-gather"`
	// Hold, accumulate and reduce the gradients in bf16 instead of fp32, as
	// Megatron-FSDP's main gradients then are: half the gradient memory and
	// the reduce-scatter bytes (each kernel adds in fp32 and rounds once; the
	// reductions sum in fp32).
	GradReduceInBF16 bool `toml:"grad_reduce_in_bf16" flag:"grad-reduce-in-bf16"`
	// Size the persistent gather buffers for at least two of the largest unit (the
	// unit in use and the next one) even without overlap_param_gather, as NCCL user
	// buffers need; without it they hold what the schedule uses (one unit without
	// prefetch).
	FSDPDoubleBuffer bool `toml:"fsdp_double_buffer" flag:"fsdp-double-buffer"`
	// Register communication buffers with NCCL user buffers (zero-copy collectives):
	// the FSDP units' gather and gradient arenas of a cuda run of several ranks, one
	// GPU each. Turns fsdp_double_buffer on.
	UseNCCLUB bool `toml:"use_nccl_ub" flag:"use-nccl-ub"`
	// Describe the model by shapes only and let each rank initialise its own shard;
	// no rank ever holds the full model. Needs a sharding strategy other than no_shard.
	InitModelWithMetaDevice bool `toml:"init_model_with_meta_device" flag:"init-model-with-meta-device"`
	// Average the loss over all tokens of the global batch (sum of token losses
	// divided by the global token count) instead of averaging per micro-batch.
	CalculatePerTokenLoss bool `toml:"calculate_per_token_loss" flag:"calculate-per-token-loss"`
	// Cap, in parameters, on the bytes in flight per collective: smaller FSDP units
	// are bucketed up to it. 0 means one collective per FSDP unit, uncapped.
	SuggestedCommunicationUnitSize int64 `toml:"suggested_communication_unit_size" min:"0" max:"1099511627776" flag:"suggested-communication-unit-size"`
	// Group over which expert weights are sharded: expert_data_parallel (the ranks
	// holding the same experts; the only correct choice) or data_parallel (also over
	// the ranks of other experts: double sharding, refused when ep > 1).
	ExpertShardingGroup string `toml:"expert_sharding_group" enum:"expert_data_parallel,data_parallel"`
}

// Precision sets the numeric formats.
type Precision struct {
	// Compute in bf16: compute weights and activations are bf16, main weights stay in
	// precision.main_params_dtype.
	BF16 bool `toml:"bf16" flag:"bf16"`
	// Format of the main (master) weights the optimizer updates: fp32, or bf16 to
	// save memory at the cost of update precision (planned; run refuses bf16 until the
	// trainer keeps bf16 main weights).
	MainParamsDtype string `toml:"main_params_dtype" enum:"fp32,bf16" flag:"main-params-dtype"`
	// FP8 training of the linear layers, as Transformer Engine (Megatron's
	// --fp8-* arguments) and torchao (torchtitan's float8 converter) do it.
	FP8 FP8 `toml:"fp8"`
}

// FP8 computes the linear layers' products in 8-bit floats: each GEMM's
// operands are cast to FP8 under a per-tensor scale and the products of the
// dequantised values are summed in fp32; main weights, gradients and optimizer
// state keep their formats. The formats are OCP E4M3 (largest 448) and E5M2
// (largest 57344, with infinities); docs/engine.md, "FP8". shardline run
// computes the dense layers' products (the MoE experts', and the router's
// with router_bf16 = false) in FP8 under tensorwise or delayed scaling, with
// FP8 or bf16 weight gradients, FP8 compute weights under tensorwise
// (param_gather), beside tensor and context parallelism, and refuses what
// the engine does not build (the FP8 head, param_gather or the experts under
// delayed scaling, param_gather with bf16 weight gradients; lint notes each,
// SL114); the plan counts the FP8 copies, and delayed scaling's scales and
// amax histories, in scratch.
type FP8 struct {
	// none (no FP8), hybrid (E4M3 for the forward's weights and activations,
	// E5M2 for the backward's output gradients: Transformer Engine's HYBRID,
	// torchao's default), or e4m3 (E4M3 throughout). Needs precision.bf16: the
	// layers kept out of FP8 compute in bf16.
	Format string `toml:"format" enum:"none,hybrid,e4m3" flag:"fp8-format"`
	// How each tensor's scale is chosen: tensorwise (current scaling: from the
	// tensor's own amax as it is cast, scale = fp8 max / amax), or delayed (from
	// the amaxes of earlier steps, amax_history_len of them, read by
	// amax_compute_algo: scale = (fp8 max / amax) / 2^margin). blockwise and
	// mxfp8 (a scale per block of 128 or 32 values) are Megatron's names for
	// recipes shardline does not have: lint refuses them.
	Recipe string `toml:"recipe" enum:"tensorwise,delayed,blockwise,mxfp8" flag:"fp8-recipe"`
	// Steps of amax history each tensor keeps for delayed scaling (Megatron's
	// default 1: the previous step's alone; Transformer Engine's 1024).
	AmaxHistoryLen int `toml:"amax_history_len" min:"1" max:"65536" flag:"fp8-amax-history-len"`
	// How delayed scaling reads its history: most_recent (the newest amax) or
	// max (the largest in the history).
	AmaxComputeAlgo string `toml:"amax_compute_algo" enum:"most_recent,max" flag:"fp8-amax-compute-algo"`
	// Binades of headroom delayed scaling leaves: the scale maps the amax onto
	// fp8 max / 2^margin.
	Margin int `toml:"margin" min:"0" max:"32" flag:"fp8-margin"`
	// The weight-gradient products (activationsᵀ·output gradients) in FP8 too;
	// false computes them in bf16 (Megatron's --no-fp8-wgrad).
	Wgrad bool `toml:"wgrad" negflag:"no-fp8-wgrad"`
	// Keep the FP8 products' weights (q, k, v, o and the dense MLPs' w1, w3,
	// w2 of the FP8 layers) as FP8 compute weights, one byte a value with one
	// scale per tensor (the whole tensor's amax), quantised from the fp32
	// main weights after each optimizer step, and all-gather them in FP8
	// under FSDP: half those weights' all-gather bytes and gathered-unit
	// memory against bf16 (Megatron's --fp8-param-gather, torchtitan's
	// enable_fsdp_float8_all_gather). Needs a sharded strategy and recipe =
	// "tensorwise".
	ParamGather bool `toml:"param_gather" flag:"fp8-param-gather"`
	// Keep the first layers_at_start_in_bf16 and the last
	// layers_at_end_in_bf16 transformer layers in bf16 (Megatron's
	// --first-last-layers-bf16).
	FirstLastLayersBF16 bool `toml:"first_last_layers_bf16" flag:"first-last-layers-bf16"`
	// Layers kept in bf16 at the start, with first_last_layers_bf16.
	LayersAtStartInBF16 int `toml:"layers_at_start_in_bf16" min:"0" max:"4096" flag:"num-layers-at-start-in-bf16"`
	// Layers kept in bf16 at the end, with first_last_layers_bf16.
	LayersAtEndInBF16 int `toml:"layers_at_end_in_bf16" min:"0" max:"4096" flag:"num-layers-at-end-in-bf16"`
	// Keep the output head's product in bf16 (Megatron always does;
	// torchtitan when filter_fqns names "output").
	HeadBF16 bool `toml:"head_bf16"`
	// Keep an MoE router's product in bf16 (Megatron always does; torchtitan
	// when filter_fqns names the router's gate, or its expert count is not a
	// multiple of 16); false computes it in FP8 like the layer's attention.
	RouterBF16 bool `toml:"router_bf16"`
	// Compute the MoE experts' products in FP8 too, routed and shared
	// (Megatron's grouped GEMM with Transformer Engine; torchtitan's
	// quantize.grouped_mm.float8 converter): the grouped tokens and output
	// gradients under one scale each, each expert's weight under its own,
	// under tensorwise scaling (shardline run refuses them under delayed).
	// false keeps them in bf16.
	Experts bool `toml:"experts"`
}

// ActivationCheckpoint configures activation recomputation.
type ActivationCheckpoint struct {
	// none keeps every activation; selective keeps what each layer's
	// products make and recomputes the rest before the layer's backward (the
	// norms' outputs and the SwiGLU product: torchtitan's operator-level
	// selective checkpointing; Megatron's selective remakes the attention
	// probabilities, which flash attention never keeps); full keeps only
	// each layer's input and recomputes the layer in backward.
	Mode string `toml:"mode" enum:"none,selective,full" flag:"recompute-granularity"`
}

// Checkpoint configures distributed checkpoints: each rank writes its shard of the
// fp32 main weights and optimizer state, in the background, and `shardline run
// --resume` continues a run from one, on any world size, strategy or
// expert-parallel degree. No checkpoint is written when interval is 0 and dir is
// empty (the final weights still are, to the run directory).
type Checkpoint struct {
	// Checkpoint format, under Megatron's names: fsdp_dtensor (sharded,
	// Megatron-FSDP's), torch_dist, or torch. shardline writes fsdp_dtensor's layout
	// (docs/checkpoints.md); run refuses the others while checkpoints are on.
	CkptFormat string `toml:"ckpt_format" enum:"fsdp_dtensor,torch_dist,torch" flag:"ckpt-format"`
	// Directory for checkpoints (Megatron's --save). Empty means <run dir>/checkpoints.
	// Setting it (or interval, or interval_minutes) turns checkpoints on: at the
	// end of the run and on an interrupt.
	Dir string `toml:"dir" flag:"save"`
	// Save every interval steps, and at the end of the run and on SIGINT or
	// SIGTERM. 0 saves only at the end and on an interrupt, and only when dir or
	// interval_minutes is set.
	Interval int `toml:"interval" min:"0" flag:"save-interval"`
	// Also save once interval_minutes of wall-clock time have passed since the
	// last save (or the start): rank 0's clock decides, at a step boundary,
	// and every rank saves after that same step. It goes beside interval
	// (whichever comes first); 0 saves by steps only. A job that may be cut
	// off at any time loses at most this much training.
	IntervalMinutes float64 `toml:"interval_minutes" min:"0" max:"525600"`
	// Keep the newest keep_last checkpoints; 0 keeps all.
	KeepLast int `toml:"keep_last" min:"0"`
}

// Logging configures console output and metrics.
type Logging struct {
	// Minimum console log level.
	Level string `toml:"level" enum:"debug,info,warn,error"`
	// Console format: auto (readable on a terminal, JSON otherwise), console, or json.
	Format string `toml:"format" enum:"auto,console,json"`
	// Log every interval steps. The step statistics (loss, gradient norm, MoE
	// counts) stay in the backend's memory and are read back once per interval
	// (on a GPU each read-back waits for the device), then every step is recorded
	// in metrics.jsonl.
	Interval int `toml:"interval" min:"1" flag:"log-interval"`
	// Tokens sampled from the trained model at the end of the run (temperature
	// 0.8, after the validation text's first token), written to sample.txt and
	// printed. Each is one forward pass over up to seq_len positions, so a large
	// model on the CPU may want fewer. 0 samples nothing (shardline sample
	// RUN_DIR samples a finished run at any time).
	SampleTokens int `toml:"sample_tokens" min:"0" max:"1048576"`
	// Show a progress bar with ETA on a terminal.
	Progress bool `toml:"progress"`
	// Write TensorBoard event files into the run directory
	// (events.out.tfevents.<unix time>.<host>): at every step, every scalar
	// of metrics.jsonl (loss, learning rate, gradient norm, validation loss,
	// tokens/s, measured step time, TFLOP/s and MFU beside the plan's,
	// memory held beside planned), each written as the step is recorded, so
	// that a running `tensorboard --logdir RUN_OUTPUT_DIR` follows the run
	// and `wandb sync RUN_DIR` uploads it. Rank 0 writes them.
	Tensorboard bool `toml:"tensorboard"`
}
