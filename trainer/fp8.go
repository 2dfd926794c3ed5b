package trainer

import (
	"fmt"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/trainer/ckpt"
	"github.com/shardline/shardline/trainer/model"
)

// FP8 in the trainer (docs/engine.md, "FP8"): the model's FP8 compute from
// the recipe (fp8Of), and delayed scaling's state, which the world's ranks
// keep alike (their amaxes reduced with a maximum every step),
// checkpoints hold once (metadata.json's fp8_scaling, ckpt.FP8Scaling) and a
// resume on any world size restores.

// fp8Of is the model's FP8 compute for r (precision.fp8; config.NotExecuted
// refuses what the engine does not build): the output gradients in E5M2 for
// the hybrid format, E4M3 for e4m3, the layers first_last_layers_bf16
// leaves in FP8, the weight gradients apart in bf16 under wgrad = false,
// the MoE router in FP8 under router_bf16 = false, the MoE experts in FP8
// under experts, and under recipe "delayed" delayed scaling over ranks
// ranks of the group g (nil for one rank). ok is false without FP8.
func fp8Of(r *config.Recipe, ranks int, g model.Gatherer) (f model.FP8, ok bool) {
	if !r.Precision.FP8On() {
		return f, false
	}
	p := r.Precision.FP8
	f.Grad = tensor.E5M2
	if p.Format == "e4m3" {
		f.Grad = tensor.E4M3
	}
	f.First, f.Last = r.FP8LayerRange()
	f.BF16Wgrad = !p.Wgrad
	f.Router = r.Model.MoE.NumExperts > 0 && !p.RouterBF16
	f.Experts = p.Experts && r.Model.MoE.NumExperts > 0
	if p.Recipe == "delayed" {
		algo := tensor.AmaxMax
		if p.AmaxComputeAlgo == "most_recent" {
			algo = tensor.AmaxMostRecent
		}
		f.Delayed = &model.Delayed{History: p.AmaxHistoryLen, Algo: algo, Margin: p.Margin, Ranks: ranks, Comm: g}
	}
	return f, true
}

// fp8Snapshot reads the delayed-scaling state back for a checkpoint (nil
// without delayed scaling).
func (t *run) fp8Snapshot() *ckpt.FP8Scaling {
	scales, hist := t.m.FP8Scaling()
	if scales.Len() == 0 {
		return nil
	}
	s, h := make([]float32, scales.Len()), make([]float32, hist.Len())
	t.st.mem.Read(s, scales)
	t.st.mem.Read(h, hist)
	return ckpt.NewFP8Scaling(s, h)
}

// restoreFP8 writes a checkpoint's delayed-scaling state (dir's metadata m)
// into the model: the same tensors and history length, since the checkpoint's
// recipe is the run's in precision and model (checkResumable).
func (t *run) restoreFP8(dir string, m *ckpt.Meta) error {
	scales, hist := t.m.FP8Scaling()
	if scales.Len() == 0 {
		return nil
	}
	n, steps := scales.Len(), hist.Len()/max(scales.Len(), 1)
	if m.FP8 == nil || m.FP8.Tensors != n || m.FP8.History != steps {
		var has string
		if m.FP8 == nil {
			has = "no delayed scaling state"
		} else {
			has = fmt.Sprintf("the delayed scaling of %d tensors over %d steps", m.FP8.Tensors, m.FP8.History)
		}
		return config.ValueProblem("precision.fp8.recipe", "delayed", fmt.Errorf("the checkpoint in %s holds %s, the run scales %d FP8 tensors with histories of %d steps", dir, has, n, steps),
			"resume from a checkpoint this recipe wrote (shardline ckpt ls lists them)")
	}
	s, h := m.FP8.Values()
	t.st.mem.Write(scales, s)
	t.st.mem.Write(hist, h)
	return t.st.mem.Err()
}
