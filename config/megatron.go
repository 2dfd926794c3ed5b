package config

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Megatron-LM arguments beyond the recipe's own flags (the `flag:` tags of the
// schema): arguments that describe what shardline trains anyway (accepted, their
// value checked), that map onto a recipe key through a computation, that ask for
// something shardline does not do (refused by name, SL010, with the reason), or
// that change nothing here (accepted with a note, SL011). A launch script pasted
// into `shardline lint` so stops only where shardline truly differs.

type megatronKind int

const (
	describes megatronKind = iota // what shardline does: accepted when ok(value) says so
	refused                       // asks for what shardline does not do
	noEffect                      // changes nothing in shardline
	mapped                        // sets a recipe key once every override is in (apply)
)

type megatronArg struct {
	kind megatronKind
	// takesValue: the argument has a value (else it is a switch).
	takesValue bool
	// why: for refused, the reason; for noEffect, what the note says; for describes,
	// what shardline does (the refusal when ok says no).
	why string
	// ok checks a describing argument's value ("" for a switch); nil accepts any.
	ok func(v string) bool
	// apply computes a mapped argument from its value and the resolved recipe, and
	// sets its key (or returns a problem with the value).
	apply func(l *loader, v string, o Origin) error
	// usage is the help line.
	usage string
}

func isTrue(v string) bool { b, err := strconv.ParseBool(v); return v == "" || (err == nil && b) }

func zeroFloat(v string) bool { f, err := strconv.ParseFloat(v, 64); return err == nil && f == 0 }

var megatronArgs = map[string]megatronArg{
	// The model shardline trains: a Llama-style decoder.
	"swiglu":                         {kind: describes, why: "shardline's MLP is SwiGLU", ok: isTrue, usage: "accepted: the MLP is SwiGLU"},
	"normalization":                  {kind: describes, takesValue: true, why: "shardline normalises with RMSNorm", ok: func(v string) bool { return v == "RMSNorm" }, usage: "accepted as RMSNorm, the only normalisation"},
	"position-embedding-type":        {kind: describes, takesValue: true, why: "shardline's positions are rotary (RoPE)", ok: func(v string) bool { return v == "rope" }, usage: "accepted as rope, the only position embedding"},
	"use-rotary-position-embeddings": {kind: describes, why: "shardline's positions are rotary (RoPE)", ok: isTrue, usage: "accepted: positions are rotary"},
	"no-position-embedding":          {kind: describes, why: "shardline has no learned position embedding", ok: isTrue, usage: "accepted: no learned position embedding"},
	"disable-bias-linear":            {kind: describes, why: "shardline's linear layers have no bias", ok: isTrue, usage: "accepted: linear layers have no bias"},
	"group-query-attention":          {kind: describes, why: "key/value heads come from --num-query-groups", ok: isTrue, usage: "accepted: key/value heads from --num-query-groups"},
	"attention-dropout":              {kind: describes, takesValue: true, why: "shardline trains without dropout (Megatron's default is 0.1: pass 0)", ok: zeroFloat, usage: "accepted as 0: no dropout"},
	"hidden-dropout":                 {kind: describes, takesValue: true, why: "shardline trains without dropout (Megatron's default is 0.1: pass 0)", ok: zeroFloat, usage: "accepted as 0: no dropout"},
	"untie-embeddings-and-output-weights": {kind: mapped, usage: "sets model.tie_embeddings = false",
		apply: func(l *loader, v string, o Origin) error {
			if !isTrue(v) {
				return fmt.Errorf("takes no value but true")
			}
			f, _ := recipeSchema.Lookup("model.tie_embeddings")
			l.set(f, false, o)
			return nil
		}},
	"use-rope-scaling": {kind: mapped, usage: "sets model.rope_scaling = llama3 (its factor: --rotary-scaling-factor)",
		apply: func(l *loader, v string, o Origin) error {
			if !isTrue(v) {
				return fmt.Errorf("takes no value but true")
			}
			f, _ := recipeSchema.Lookup("model.rope_scaling")
			l.set(f, "llama3", o)
			return nil
		}},
	"max-position-embeddings": {kind: mapped, takesValue: true, usage: "checked: at least model.seq_len (rotary positions need no table)",
		apply: func(l *loader, v string, o Origin) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return fmt.Errorf("must be a positive integer")
			}
			if seq := l.res.Recipe.Model.SeqLen; n < seq {
				return fmt.Errorf("is below model.seq_len (%d): Megatron requires max_position_embeddings >= seq_length", seq)
			}
			return nil
		}},
	"min-lr": {kind: mapped, takesValue: true, usage: "sets train.min_lr_factor = min-lr / lr",
		apply: func(l *loader, v string, o Origin) error {
			x, err := strconv.ParseFloat(v, 64)
			lr := l.res.Recipe.Train.LR
			switch {
			case err != nil || x < 0:
				return fmt.Errorf("must be a number >= 0")
			case lr <= 0:
				return fmt.Errorf("needs train.lr > 0 to become train.min_lr_factor")
			case x > lr:
				return fmt.Errorf("is above train.lr (%g): the schedule decays from lr down to min-lr", lr)
			}
			f, _ := recipeSchema.Lookup("train.min_lr_factor")
			l.set(f, x/lr, o)
			return nil
		}},
	// What shardline does not do.
	"add-bias-linear":                       {kind: refused, why: "shardline's linear layers have no bias", usage: "refused: linear layers have no bias"},
	"apply-layernorm-1p":                    {kind: refused, why: "shardline normalises with RMSNorm, not LayerNorm", usage: "refused: no LayerNorm"},
	"fp16":                                  {kind: refused, why: "fp16 with loss scaling is not supported; use --bf16", usage: "refused: use --bf16"},
	"num-layers-per-virtual-pipeline-stage": {kind: refused, takesValue: true, why: "pipeline schedules are not executed (pipeline parallelism is not supported yet)", usage: "refused: no pipeline schedules"},
	// What changes nothing here.
	"use-mcore-models":            {kind: noEffect, why: "shardline has one model implementation", usage: "accepted, no effect"},
	"use-flash-attn":              {kind: noEffect, why: "attention is flash attention on GPUs already (and on the CPU from 2048 tokens)", usage: "accepted, no effect"},
	"transformer-impl":            {kind: noEffect, takesValue: true, why: "shardline has one transformer implementation", usage: "accepted, no effect"},
	"no-masked-softmax-fusion":    {kind: noEffect, why: "a kernel fusion choice of Megatron's; shardline's kernels are its own", usage: "accepted, no effect"},
	"no-bias-gelu-fusion":         {kind: noEffect, why: "a kernel fusion choice of Megatron's; shardline's kernels are its own", usage: "accepted, no effect"},
	"no-bias-swiglu-fusion":       {kind: noEffect, why: "a kernel fusion choice of Megatron's; shardline's kernels are its own", usage: "accepted, no effect"},
	"no-bias-dropout-fusion":      {kind: noEffect, why: "a kernel fusion choice of Megatron's; shardline's kernels are its own", usage: "accepted, no effect"},
	"no-rope-fusion":              {kind: noEffect, why: "a kernel fusion choice of Megatron's; shardline's kernels are its own", usage: "accepted, no effect"},
	"sequence-parallel":           {kind: noEffect, why: "sequence parallelism pairs with tensor parallelism, which the plan lays out from tensor_parallel alone", usage: "accepted, no effect"},
	"distributed-backend":         {kind: noEffect, takesValue: true, why: "shardline picks its collectives (NCCL on GPUs, its own on the CPU)", usage: "accepted, no effect"},
	"distributed-timeout-minutes": {kind: noEffect, takesValue: true, why: "use --comm-timeout (run and launch) or the comm_timeout setting", usage: "accepted, no effect: see --comm-timeout"},
	"tensorboard-dir":             {kind: noEffect, takesValue: true, why: "shardline writes metrics.jsonl and loss.png in the run directory", usage: "accepted, no effect"},
	"wandb-project":               {kind: noEffect, takesValue: true, why: "shardline writes metrics.jsonl and loss.png in the run directory", usage: "accepted, no effect"},
	"log-throughput":              {kind: noEffect, why: "every step's tokens/s is in metrics.jsonl", usage: "accepted, no effect"},
}

// MegatronArgs lists the Megatron arguments beyond the schema's flags, sorted, with
// whether each takes a value and its help line.
func MegatronArgs() []struct {
	Name       string
	TakesValue bool
	Usage      string
} {
	var out []struct {
		Name       string
		TakesValue bool
		Usage      string
	}
	for name, a := range megatronArgs {
		out = append(out, struct {
			Name       string
			TakesValue bool
			Usage      string
		}{name, a.takesValue, a.usage})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// applyMegatronArg handles a Megatron argument beyond the schema's flags (false
// when name is none); mapped ones are kept for after every override is in.
func (l *loader) applyMegatronArg(name string, fv FlagValue, o Origin, later *[]func()) bool {
	a, ok := megatronArgs[name]
	if !ok {
		return false
	}
	v := strings.TrimSpace(fv.Value)
	switch a.kind {
	case describes:
		if a.ok != nil && !a.ok(v) {
			l.add(Diagnostic{Severity: SevError, Code: "SL010", Origin: o,
				Message: fmt.Sprintf("--%s %s: %s", name, v, a.why), Help: "drop the argument or give the value shardline trains with"})
		}
	case refused:
		l.add(Diagnostic{Severity: SevError, Code: "SL010", Origin: o, Message: fmt.Sprintf("--%s: %s", name, a.why),
			Help: "drop the argument: shardline cannot train what it asks for"})
	case noEffect:
		l.add(Diagnostic{Severity: SevNote, Code: "SL011", Origin: o, Message: fmt.Sprintf("--%s has no effect in shardline: %s", name, a.why),
			Help: "it can stay in a shared launch script; drop it from shardline's own"})
	case mapped:
		*later = append(*later, func() {
			if err := a.apply(l, v, o); err != nil {
				l.add(Diagnostic{Severity: SevError, Code: "SL007", Origin: o, Message: fmt.Sprintf("--%s %s %v", name, v, err),
					Help: "fix the value as Megatron would require it"})
			}
		})
	}
	return true
}
