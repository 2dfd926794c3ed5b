package parallel

import (
	"strconv"
	"strings"

	"github.com/shardline/shardline/config"
)

// FP8 compute weights (precision.fp8.param_gather; docs/engine.md, "FP8
// parameters"). The weights of the products a layer computes in FP8 (q, k,
// v and o of the layers in the recipe's FP8 range, and w1, w3 and w2 of
// their dense MLPs; not the norms, the embedding, the head, an MoE layer's
// router or experts) are kept as E4M3 codes with one scale inverse per
// tensor: each unit lays them out in an FP8 group of their own (Group.FP8),
// sharded as the unit's dense group, whose compute shard is quantised from
// the fp32 main weights after each optimizer step and all-gathered a byte a
// value.

// FP8Weight reports whether r keeps parameter p as an FP8 compute weight.
func FP8Weight(r *config.Recipe, p *Param) bool {
	f := r.Precision.FP8
	if !r.Precision.FP8On() || !f.ParamGather || p.Layer < 0 || p.IsExpert() {
		return false
	}
	if lo, hi := r.FP8LayerRange(); p.Layer < lo || p.Layer >= hi {
		return false
	}
	switch strings.TrimPrefix(p.Name, "layers."+strconv.Itoa(p.Layer)+".") {
	case "attn.wq", "attn.wk", "attn.wv", "attn.wo":
		return true
	case "mlp.w1", "mlp.w3", "mlp.w2":
		return !r.Model.IsMoELayer(p.Layer)
	}
	return false
}

// FP8ScaleBytes is what the scales of tensors FP8 compute weights take on a
// rank whose FP8 groups shard over ranks ranks (the trainer's layout,
// trainer/state.go's fp8Scales): per tensor its scale inverse and its scale
// (f32 each), its amax (f64) and each rank's amax (f64, ranks of them: the
// shards' amaxes, which an all-reduce makes the whole tensor's), the f32
// wire of that all-reduce (only when ranks > 1), and one code and one f32
// zero that give a scale inverse to a tensor of which the rank holds no
// element.
func FP8ScaleBytes(tensors, ranks int64) int64 {
	if tensors == 0 {
		return 0
	}
	b := tensors * (4 + 4 + 8 + 8*ranks)
	if ranks > 1 {
		b += 4 * tensors * ranks
	}
	return b + 1 + 4
}

// fp8Tensors counts the FP8 compute weights of groups.
func fp8Tensors(groups []Group) (n int64) {
	for i := range groups {
		if groups[i].FP8 {
			n += int64(len(groups[i].Entries))
		}
	}
	return n
}
