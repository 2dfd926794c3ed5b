package parallel

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/shardline/shardline/config"
)

// Check compiles the resolved recipe for its own topology and returns the plan and
// the findings lint adds: a plan that cannot be compiled (SL502), one that does not
// fit the device (SL501, with the changes that would make it fit and their predicted
// memory), and advice that depends on the model's size (SL112). cals time the
// CPU (TopologyOf).
func Check(res *config.Resolved, cals Calibrations) (*Plan, config.Diagnostics) {
	r := &res.Recipe
	topo, err := TopologyOf(r.Parallel, cals)
	if err != nil {
		return nil, config.Diagnostics{compileDiag(res, err)}
	}
	p, err := Compile(r, topo)
	if err != nil {
		return nil, config.Diagnostics{compileDiag(res, err)}
	}
	var ds config.Diagnostics
	if !p.Fits() {
		ds = append(ds, config.DiagnosticAt(res, config.SevError, "SL501",
			fmt.Sprintf("the plan needs %s per rank but %s has %s: %s", FormatBytes(p.Memory.Total), topo.Device.Name,
				FormatBytes(topo.Device.MemoryBytes), breakdown(p.Memory)),
			suggestFits(r, topo, p),
			"fsdp.data_parallel_sharding_strategy", "activation_checkpoint.mode", "train.micro_batch_size",
			"parallel.expert_parallel", "parallel.tensor_parallel", "parallel.world_size", "parallel.device_profile", "parallel.device_memory_gib"))
	}
	if full := p.ParamsTotal * 4; !r.FSDP.InitModelWithMetaDevice && p.Sharding.Optim && full > topo.Device.MemoryBytes/4 {
		ds = append(ds, config.DiagnosticAt(res, config.SevWarning, "SL112",
			fmt.Sprintf("fsdp.init_model_with_meta_device is off, so every rank first builds the whole model: %s parameters are %s in fp32, more than a quarter of %s",
				formatCount(p.ParamsTotal), FormatBytes(full), topo.Device.Name),
			"set init_model_with_meta_device = true: each rank then initialises only its own shard (bit-identical to a full init)",
			"fsdp.init_model_with_meta_device"))
	}
	return p, ds
}

func compileDiag(res *config.Resolved, err error) config.Diagnostic {
	key := "parallel.world_size"
	var d *config.Diagnostic
	if errors.As(err, &d) {
		key = d.Key
	}
	return config.DiagnosticAt(res, config.SevError, "SL502", "the plan cannot be compiled: "+err.Error(),
		fmt.Sprintf("change %s; `shardline plan` shows the layout once it compiles", key), key)
}

func breakdown(m Memory) string {
	var parts []string
	for _, c := range m.Components() {
		if c.Bytes > 0 {
			parts = append(parts, fmt.Sprintf("%s %s", c.Name, FormatBytes(c.Bytes)))
		}
	}
	return strings.Join(parts, ", ")
}

// variant is one change to a recipe that might make a plan fit.
type variant struct {
	desc  string
	apply func(*config.Recipe)
}

// suggestFits compiles the usual ways to save memory and reports those that fit,
// with their predicted memory, or the best few when none does alone.
func suggestFits(r *config.Recipe, topo Topology, p *Plan) string {
	var vs []variant
	for _, s := range []string{"optim_grads_params", "optim_grads", "optim"} {
		if s != r.FSDP.DataParallelShardingStrategy {
			vs = append(vs, variant{fmt.Sprintf("data_parallel_sharding_strategy = %q", s), func(c *config.Recipe) { c.FSDP.DataParallelShardingStrategy = s }})
		}
	}
	for _, m := range []string{"selective", "full"} {
		if m != r.ActivationCheckpoint.Mode {
			vs = append(vs, variant{fmt.Sprintf("activation_checkpoint.mode = %q", m), func(c *config.Recipe) { c.ActivationCheckpoint.Mode = m }})
		}
	}
	if mb := r.Train.MicroBatchSize; mb > 1 {
		vs = append(vs, variant{fmt.Sprintf("micro_batch_size = %d", mb/2), func(c *config.Recipe) { c.Train.MicroBatchSize = mb / 2 }})
	}
	if ep := r.Parallel.ExpertParallel * 2; r.Model.MoE.NumExperts > 0 {
		vs = append(vs, variant{fmt.Sprintf("expert_parallel = %d", ep), func(c *config.Recipe) { c.Parallel.ExpertParallel = ep }})
	}
	if tp := r.Parallel.TensorParallel * 2; tp <= topo.GPUsPerNode {
		vs = append(vs, variant{fmt.Sprintf("tensor_parallel = %d", tp), func(c *config.Recipe) { c.Parallel.TensorParallel = tp }})
	}
	type result struct {
		desc  string
		total int64
	}
	var fits, all []result
	for _, v := range vs {
		c := *r
		c.FSDP.FSDPUnitModules = append([]string(nil), r.FSDP.FSDPUnitModules...)
		v.apply(&c)
		if refusesMore(r, &c) {
			continue // a change shardline run would refuse is no way out
		}
		if c.Train.GlobalBatchSize%(c.Train.MicroBatchSize*max(1, topo.WorldSize/(c.Parallel.TensorParallel*c.Parallel.ContextParallel*c.Parallel.PipelineParallel))) != 0 {
			continue
		}
		q, err := Compile(&c, topo)
		if err != nil {
			continue
		}
		res := result{v.desc, q.Memory.Total}
		all = append(all, res)
		if q.Fits() {
			fits = append(fits, res)
		}
	}
	pick := fits
	lead := "any one of these fits"
	if len(fits) == 0 {
		sort.Slice(all, func(i, j int) bool { return all[i].total < all[j].total })
		pick = all[:min(3, len(all))]
		lead = "no single change fits; the largest savings are"
	}
	if len(pick) == 0 {
		return "raise the world size, or use a device with more memory (parallel.device_profile)"
	}
	var parts []string
	for _, x := range pick {
		parts = append(parts, fmt.Sprintf("%s (%s)", x.desc, FormatBytes(x.total)))
	}
	return fmt.Sprintf("%s: %s; or more ranks or a larger device", lead, strings.Join(parts, "; "))
}

// refusesMore says whether shardline run refuses a setting of c that it does not
// refuse in r (config.NotExecuted).
func refusesMore(r, c *config.Recipe) bool {
	before := map[string]bool{}
	for _, u := range config.NotExecuted(r) {
		before[u.Key] = true
	}
	for _, u := range config.NotExecuted(c) {
		if !before[u.Key] {
			return true
		}
	}
	return false
}
