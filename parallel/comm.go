package parallel

import (
	"github.com/shardline/shardline/config"
)

// Collective kinds.
const (
	AllGather     = "all_gather"
	ReduceScatter = "reduce_scatter"
	AllReduce     = "all_reduce"
	AllToAll      = "all_to_all"
	// SendRecv is a ring step: every rank sends Bytes to its next neighbour and
	// receives as much from its previous one.
	SendRecv = "send_recv"
)

// Collective is one kind of collective a step issues on one group kind. Bytes is the
// full buffer of one call (nccl-tests' "size"); a rank moves Bytes·factor of it,
// with factor (n-1)/n for all-gather, reduce-scatter and all-to-all, 2(n-1)/n for
// all-reduce, and 1 for a send/recv ring step (Bytes is what each rank sends).
type Collective struct {
	Kind  string `json:"kind"`
	Axis  Axis   `json:"group"`
	What  string `json:"what"` // e.g. "params fwd", "grads"
	Dtype string `json:"dtype"`
	Bytes int64  `json:"bytes"`
	Calls int64  `json:"calls_per_step"`
	// Overlap says whether the runtime can hide it behind compute.
	Overlap bool `json:"overlappable"`
}

// StepBytes is Bytes·Calls.
func (c Collective) StepBytes() int64 { return c.Bytes * c.Calls }

// rankBytes is what one rank sends per step in a group of n.
func (c Collective) rankBytes(n int) float64 {
	f := float64(n-1) / float64(n)
	switch c.Kind {
	case AllReduce:
		f *= 2
	case SendRecv:
		f = 1
	}
	return float64(c.StepBytes()) * f
}

func dtypeName(bytes int64) string {
	if bytes == 2 {
		return "bf16"
	}
	return "fp32"
}

// fsdpCollectives lists the data-parallel collectives of a step, per group, after
// Megatron-FSDP's table: when each strategy gathers and reduces, and how often.
// micro is the number of micro-batches per step.
func fsdpCollectives(r *config.Recipe, sh Sharding, groups []Group, m Mesh, micro int64, d dtypes) []Collective {
	fsdp := r.FSDP
	var out []Collective
	for i := range groups {
		g := &groups[i]
		if m.Size(g.Axis) == 1 {
			continue
		}
		w, gr := g.Padded*d.compute, g.Padded*d.grad
		wdt, gdt := dtypeName(d.compute), dtypeName(d.grad)
		if g.FP8 { // FP8 compute weights gather a byte a value
			w, wdt = g.Padded, "fp8"
		}
		switch {
		case !sh.Optim: // no_shard
			out = append(out, Collective{AllReduce, g.Axis, "grads", gdt, gr, 1, fsdp.OverlapGradReduce})
		case !sh.Grads: // optim: whole gradients, reduced once a step
			out = append(out,
				Collective{ReduceScatter, g.Axis, "grads", gdt, gr, 1, fsdp.OverlapGradReduce},
				Collective{AllGather, g.Axis, "updated params", wdt, w, 1, fsdp.OverlapParamGather})
		case !sh.Params: // optim_grads
			out = append(out,
				Collective{ReduceScatter, g.Axis, "grads", gdt, gr, micro, fsdp.OverlapGradReduce},
				Collective{AllGather, g.Axis, "updated params", wdt, w, 1, fsdp.OverlapParamGather})
		default: // optim_grads_params
			// One gather before forward and one before backward; full recompute
			// reuses the backward gather for the recompute.
			out = append(out,
				Collective{AllGather, g.Axis, "params fwd", wdt, w, micro, fsdp.OverlapParamGather},
				Collective{AllGather, g.Axis, "params bwd", wdt, w, micro, fsdp.OverlapParamGather},
				Collective{ReduceScatter, g.Axis, "grads", gdt, gr, micro, fsdp.OverlapGradReduce})
		}
	}
	// FP8 compute weights: after each optimizer step every rank's amaxes of
	// its shards of them are summed (each in its own place, the others zero)
	// so that each tensor is quantised with its whole amax: one f32
	// all-reduce of tensors × ranks values.
	if n, R := fp8Tensors(groups), int64(m.Size(AxisDPCP)); n > 0 && R > 1 {
		out = append(out, Collective{AllReduce, AxisDPCP, "fp8 amaxes", "fp32", 4 * n * R, 1, false})
	}
	return mergeCollectives(out)
}

// modelCollectives lists tensor, context and expert parallel collectives: these sit
// on the critical path (the plan assumes no overlap for them).
func modelCollectives(r *config.Recipe, m Mesh, t tokens, micro int64, d dtypes) []Collective {
	mo := r.Model
	h := int64(mo.Hidden)
	dt := dtypeName(d.act) // activations travel in the dtype the engine keeps them in
	layers := int64(mo.Layers)
	var moeLayers int64
	for l := 0; l < mo.Layers; l++ {
		if mo.IsMoELayer(l) {
			moeLayers++
		}
	}
	// Passes over each layer per micro-batch: forward and backward, plus the
	// recompute's forward under full recompute.
	passes := int64(2)
	if r.ActivationCheckpoint.Mode == "full" {
		passes = 3
	}
	var out []Collective
	if tp := int64(m.TP); tp > 1 {
		// Sequence parallelism (trainer/model/tp.go), each call over all of the
		// rank's B·T/cp rows: per layer and forward pass, the normed input is
		// all-gathered before attention and before the MLP and the row-parallel
		// outputs reduce-scattered after them; backward gathers the residual
		// gradient and the normed input again for each, and reduce-scatters the
		// input gradients. The embedding reduce-scatters its rows (backward
		// gathers their gradient), the head gathers the final norm (again in
		// backward, and reduce-scatters its input gradient); the vocabulary-parallel
		// loss exchanges each row's log-sum-exp and target logit; the norm gains'
		// gradients are summed over tp.
		act := t.local * h * d.act
		fwd := passes - 1 // forward passes over a layer: 2 with full recompute
		out = append(out,
			Collective{AllGather, AxisTP, "normed activations", dt, act, ((2*fwd+2)*layers + 2) * micro, false},
			Collective{ReduceScatter, AxisTP, "row-parallel outputs", dt, act, ((2*fwd+2)*layers + 2) * micro, false},
			Collective{AllGather, AxisTP, "activation grads", dt, act, (2*layers + 1) * micro, false},
			Collective{AllGather, AxisTP, "log-sum-exps", "fp32", tp * t.local * 4, micro, false},
			Collective{AllReduce, AxisTP, "target logits", "fp32", t.local * 4, micro, false},
			Collective{AllReduce, AxisTP, "norm gain grads", "fp32", h * 4, (2*layers + 1) * micro, false})
	}
	if cp := int64(m.CP); cp > 1 {
		// Ring attention (trainer/model/cp.go): each forward pass passes the rank's
		// K/V block cp−1 steps along the ring; backward passes K/V again (cp−1
		// steps) and the dK/dV accumulators (cp steps, the last one home). Each step
		// runs beside a block of attention compute.
		kv := 2 * t.local * int64(mo.EffectiveKVHeads()) * int64(mo.HeadSize()) / int64(m.TP) * d.act
		out = append(out,
			Collective{SendRecv, AxisCP, "keys/values", dt, kv, (cp - 1) * (passes - 1) * layers * micro, true},
			Collective{SendRecv, AxisCP, "keys/values bwd", dt, kv, (cp - 1) * layers * micro, true},
			Collective{SendRecv, AxisCP, "key/value grads", dt, kv, cp * layers * micro, true})
		if mo.MoE.NumExperts > 0 && moeLayers > 0 {
			// The router's per-expert counts and probability sums, so the
			// load-balancing loss is the whole sequence's.
			out = append(out, Collective{AllReduce, AxisCP, "router statistics", "fp32", 2 * int64(mo.MoE.NumExperts) * 4, (passes - 1) * moeLayers * micro, false})
		}
	}
	if m.EP > 1 && moeLayers > 0 {
		// Dispatch and combine each pass; each carries the routed copies of a rank.
		out = append(out, Collective{AllToAll, AxisEP, "tokens", dt, t.routed * h * d.act, 2 * passes * moeLayers * micro, false})
	}
	if m.ETP > 1 && moeLayers > 0 {
		out = append(out, Collective{AllReduce, AxisETP, "expert outputs", dt, t.routed * h * d.act, passes * moeLayers * micro, false})
	}
	return out
}

// mergeCollectives sums calls of identical collectives (same kind, group, purpose,
// dtype and size) so a plan lists each once.
func mergeCollectives(cs []Collective) []Collective {
	var out []Collective
	idx := map[Collective]int{}
	for _, c := range cs {
		key := c
		key.Calls = 0
		if i, ok := idx[key]; ok {
			out[i].Calls += c.Calls
			continue
		}
		idx[key] = len(out)
		out = append(out, c)
	}
	return out
}

// AxisComm sums a step's communication on one group kind.
type AxisComm struct {
	Axis       Axis    `json:"group"`
	Size       int     `json:"size"`
	SpansNodes bool    `json:"spans_nodes"`
	Bytes      int64   `json:"bytes"`       // Σ Bytes·Calls
	RankBytes  int64   `json:"rank_bytes"`  // what one rank sends
	TimeS      float64 `json:"time_s"`      // RankBytes over the link's bandwidth
	OverlapS   float64 `json:"overlap_s"`   // the part the runtime may hide behind compute
	Bandwidth  float64 `json:"bandwidth_b"` // bytes/s used
}

func summarize(cs []Collective, m Mesh, topo Topology) []AxisComm {
	var out []AxisComm
	for _, a := range GroupAxes {
		ac := AxisComm{Axis: a, Size: m.Size(a), SpansNodes: m.SpansNodes(a, topo.GPUsPerNode)}
		ac.Bandwidth = topo.Device.IntraNodeBW
		if ac.SpansNodes {
			ac.Bandwidth = topo.Device.InterNodeBW
		}
		any := false
		for _, c := range cs {
			if c.Axis != a {
				continue
			}
			any = true
			rb := c.rankBytes(ac.Size)
			ac.Bytes += c.StepBytes()
			ac.RankBytes += int64(rb)
			ac.TimeS += rb / ac.Bandwidth
			if c.Overlap {
				ac.OverlapS += rb / ac.Bandwidth
			}
		}
		if any {
			out = append(out, ac)
		}
	}
	return out
}
