package parallel

import "github.com/shardline/shardline/config"

// engineMemory is what the one-GPU engine (trainer/gpu, run by shardline-cuda)
// allocates for a recipe, by the plan's components: the model's buffers are made
// once, before the first step, so this is exact, not an estimate. Weights are the
// bf16 compute copy (none in fp32 runs, where the main weights serve); gradients
// and both AdamW moments are fp32; every parameter is padded to a multiple of 8
// values. Activations include backward's reused buffers and the step's inputs;
// Logits are the output head's chunk buffers (config.GPUHeadChunk columns, fp32
// plus the compute dtype) and three fp32 values per token. MoE layers route into
// padded expert segments (capacity from capacity_factor, or every copy).
func engineMemory(r *config.Recipe, params []Param) Memory {
	mo := r.Model
	var P int64
	for i := range params {
		n := params[i].LocalNumel()
		P += n + (8-n%8)%8
	}
	dt := int64(4)
	if r.Precision.BF16 {
		dt = 2
	}
	const f32, i32 = 4, 4
	B, T := int64(r.Train.MicroBatchSize), int64(mo.SeqLen)
	BT, C, NH, NKV, FF := B*T, int64(mo.Hidden), int64(mo.Heads), int64(mo.EffectiveKVHeads()), int64(mo.FFNHidden)
	HD, V, L := int64(mo.HeadSize()), int64(mo.VocabSize), int64(mo.Layers)
	m := Memory{MainWeights: P * f32, Grads: P * f32, OptimizerState: 2 * P * f32}
	if r.Precision.BF16 {
		m.Weights = P * dt
	}
	var act int64
	dense := false
	E, K, EF := int64(mo.MoE.NumExperts), int64(mo.MoE.TopK), int64(mo.MoE.ExpertFFNHidden)
	var R int64 // permuted rows of a MoE layer
	if E > 0 {
		R = E * ExpertCapacity(mo, BT) // padded segments
	}
	for l := 0; l < mo.Layers; l++ {
		act += (4*BT*C + 2*BT*NH*HD + 2*BT*NKV*HD) * dt // resid, ln1, mid, ln2; q, atty; k, v
		act += B*NH*T*f32 + 2*BT*f32                    // lse; rstd of both norms
		if !mo.IsMoELayer(l) {
			dense = true
			act += 3 * BT * FF * dt
			continue
		}
		act += BT*E*dt + BT*E*f32 + BT*K*f32                  // router logits, probabilities, gates
		act += 3*BT*K*i32 + R*i32 + E*i32 + (E+1)*i32         // idx, row, rank; tok; counts; offsets
		act += 2*R*C*dt + 3*R*EF*dt                           // permuted inputs and outputs; the experts' SwiGLU
		act += 3 * BT * EF * dt * int64(mo.MoE.SharedExperts) // the shared experts'
	}
	act += 2*BT*C*dt + 3*BT*f32 // final residual and its norm; rstd, losses, lse of the head
	scratch := (2*BT*C+2*BT*NH*HD+2*BT*NKV*HD)*dt + BT*f32 + (4+2*L)*f32
	if dense {
		scratch += 3 * BT * FF * dt
	}
	if E > 0 {
		scratch += 2*R*C*dt + 3*R*EF*dt + BT*E*dt + BT*K*f32 + E*f32 + 2*f32
		if mo.MoE.SharedExperts > 0 {
			scratch += 3 * BT * EF * dt
		}
	}
	inputs := 2*(T*HD/2)*f32 + 2*BT*i32 + (3*BT+1)*i32 // RoPE tables; tokens, targets; embedding rows
	if r.Data.ResetAttentionMask {
		inputs += BT * i32 // each token's document start
	}
	m.Activations = act + scratch + inputs
	chunk := min(int64(config.GPUHeadChunk), V)
	m.Logits = BT*chunk*(f32+dt) + 3*BT*f32
	return m
}
