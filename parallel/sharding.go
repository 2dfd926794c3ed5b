package parallel

// Sharding is what a data-parallel sharding strategy distributes over the
// ranks of a group, decoded once from fsdp.data_parallel_sharding_strategy,
// as Megatron-FSDP decodes it into three booleans (param_and_grad_buffer.py);
// everything downstream asks these, never the strategy's name.
type Sharding struct {
	// Optim: the main weights and the optimizer's state are sharded (every
	// strategy but no_shard, which all-reduces whole gradients).
	Optim bool
	// Grads: gradients are reduce-scattered into shards, every micro-batch
	// (optim_grads, optim_grads_params); otherwise whole gradient buffers are
	// kept and reduced once a step.
	Grads bool
	// Params: the compute weights are sharded too and gathered per FSDP unit
	// before its forward and its backward (optim_grads_params).
	Params bool
}

// ShardingOf decodes a strategy (one config accepts: no_shard, optim,
// optim_grads or optim_grads_params).
func ShardingOf(strategy string) Sharding {
	switch strategy {
	case "optim":
		return Sharding{Optim: true}
	case "optim_grads":
		return Sharding{Optim: true, Grads: true}
	case "optim_grads_params":
		return Sharding{Optim: true, Grads: true, Params: true}
	}
	return Sharding{}
}

// ExpertParam is the table index of the routed-expert parameter that expert-
// parallel rank epRank holds where the plan's expert groups hold parameter i
// (dense parameters: i itself). The groups are laid out as ep rank 0's
// experts 0..local−1 of every layer, on every ep rank; rank r's k-th local
// expert is the layer's expert r·local + k, and a layer's experts follow one
// another in the table, each with the same parameters.
func (p *Plan) ExpertParam(i, epRank int) int {
	if p.Mesh.EP == 1 || !p.Params[i].IsExpert() {
		return i
	}
	return i + epRank*p.expertsPerRank*p.paramsPerExpert
}

// firstExpert is the table index of the first routed-expert parameter (0
// when there is none).
func firstExpert(ps []Param) int {
	for i := range ps {
		if ps[i].IsExpert() {
			return i
		}
	}
	return 0
}
