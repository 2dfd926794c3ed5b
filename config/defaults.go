package config

// GPUHeadChunk is the logits per token the output head makes at a time: the
// whole rows that fit in as many values per token (parallel.HeadRows: the
// engine's head on every backend).
const GPUHeadChunk = 8192

// Default returns the recipe every file starts from: a byte-level Llama of about one
// million parameters on Newton's Opticks, one CPU rank, Megatron-FSDP with the full
// sharding strategy. A recipe file only states what differs.
func Default() Recipe {
	return Recipe{
		Run: Run{Seed: 1234, OutputDir: "runs"},
		Model: Model{
			Family:            "llama",
			Layers:            4,
			Hidden:            128,
			Heads:             4,
			FFNHidden:         384,
			VocabSize:         256,
			SeqLen:            128,
			RopeTheta:         10000,
			RopeScaling:       "none",
			RopeScalingFactor: 8,
			NormEps:           1e-5,
			InitStd:           0.02,

			// Llama 3.1's (Megatron-Core's fixed values).
			RopeScalingLowFreqFactor:                 1,
			RopeScalingHighFreqFactor:                4,
			RopeScalingOriginalMaxPositionEmbeddings: 8192,

			MoE: MoE{
				TopK:            2,
				ExpertFFNHidden: 256,
				AuxLossCoeff:    0.01,
				LayerFreq:       1,
				ScoreFunction:   "softmax",
				NormTopK:        true,
				TopKScale:       1,
				BiasUpdateRate:  1e-3,
			},
		},
		Data: Data{
			Path:        "${GOROOT}/src/testdata/Isaac.Newton-Opticks.txt",
			Sources:     []string{},
			Field:       "text",
			Tokenizer:   "byte",
			ValFraction: 0.1,
		},
		Train: Train{
			Steps:           1000,
			MicroBatchSize:  16,
			GlobalBatchSize: 16,
			Optimizer:       "adamw",
			LR:              1e-3,
			LRSchedule:      "cosine",
			WarmupSteps:     100,
			MinLRFactor:     0.1,
			WeightDecay:     0.1,
			Beta1:           0.9,
			Beta2:           0.95,
			Eps:             1e-8,
			ClipGrad:        1.0,
			EvalInterval:    100,
			EvalSteps:       10,
		},
		Parallel: Parallel{
			WorldSize:            1,
			TensorParallel:       1,
			ContextParallel:      1,
			ExpertParallel:       1,
			ExpertTensorParallel: 1,
			PipelineParallel:     1,
			Device:               "cpu",
			GPUsPerNode:          8,
			DeviceProfile:        "auto",
		},
		FSDP: FSDP{
			UseMegatronFSDP:              true,
			DataParallelShardingStrategy: "optim_grads_params",
			FSDPUnitModules:              []string{"embedding", "transformer_layer", "output"},
			UseDistributedOptimizer:      true,
			OverlapGradReduce:            true,
			OverlapParamGather:           true,
			CalculatePerTokenLoss:        true,
			ExpertShardingGroup:          "expert_data_parallel",
		},
		Precision: Precision{MainParamsDtype: "fp32", FP8: FP8{Format: "none", Recipe: "delayed", AmaxHistoryLen: 1, AmaxComputeAlgo: "most_recent",
			Wgrad: true, LayersAtStartInBF16: 1, LayersAtEndInBF16: 1, HeadBF16: true, RouterBF16: true, Experts: true}},
		ActivationCheckpoint: ActivationCheckpoint{Mode: "none"},
		Checkpoint:           Checkpoint{CkptFormat: "fsdp_dtensor"},
		Logging:              Logging{Level: "info", Format: "auto", Interval: 10, SampleTokens: 300, Progress: true, Tensorboard: true},
	}
}
