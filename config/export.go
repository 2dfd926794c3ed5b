package config

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
)

// MegatronExport is a recipe as Megatron-LM arguments: Args in order (each
// argument and its value as separate words), and Unexpressed, the keys whose value
// differs from shardline's default and that no Megatron argument carries
// (key = value, canonical TOML values).
type MegatronExport struct {
	Args        []string
	Unexpressed []string
	// NProc and NNodes are torchrun's --nproc-per-node and --nnodes for the
	// recipe's world size and gpus_per_node (the import reads them back).
	NProc, NNodes int
}

// ExportMegatron writes r as Megatron-LM arguments: every key with a Megatron flag
// (switches only when true, or their negative flag when false), the arguments that
// describe the model shardline trains (SwiGLU, RMSNorm, RoPE, no bias, no
// dropout), and the computed ones (--min-lr = lr · min_lr_factor,
// --max-position-embeddings = seq_len, --group-query-attention,
// --untie-embeddings-and-output-weights, --use-rope-scaling). Loading shardline's
// defaults with Args as flags and Unexpressed as --set gives r back.
func ExportMegatron(r *Recipe) MegatronExport {
	var e MegatronExport
	def := Default()
	e.NProc, e.NNodes = r.Parallel.WorldSize, 1
	if gpn := r.Parallel.GPUsPerNode; gpn > 0 && r.Parallel.WorldSize > gpn {
		e.NProc, e.NNodes = gpn, (r.Parallel.WorldSize+gpn-1)/gpn
	}
	arg := func(words ...string) { e.Args = append(e.Args, words...) }
	m := r.Model
	arg("--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--disable-bias-linear",
		"--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--max-position-embeddings", strconv.Itoa(m.SeqLen))
	if m.EffectiveKVHeads() != m.Heads {
		arg("--group-query-attention")
	}
	if !m.TieEmbeddings {
		arg("--untie-embeddings-and-output-weights")
	} else if !def.Model.TieEmbeddings {
		// Megatron ties by default (no argument says so); shardline's default is
		// untied, so loading the arguments onto shardline's defaults needs the key.
		e.Unexpressed = append(e.Unexpressed, "model.tie_embeddings = true")
	}
	if m.RopeScaling == "llama3" {
		arg("--use-rope-scaling")
	}
	if x, ok := minLR(r.Train.LR, r.Train.MinLRFactor); ok {
		arg("--min-lr", strconv.FormatFloat(x, 'g', -1, 64))
	} else if r.Train.MinLRFactor != def.Train.MinLRFactor {
		e.Unexpressed = append(e.Unexpressed, "train.min_lr_factor = "+FormatValue(r.Train.MinLRFactor))
	}
	// The import takes a script to run on GPUs unless the list says otherwise.
	e.Unexpressed = append(e.Unexpressed, "parallel.device = "+FormatValue(r.Parallel.Device))
	// Megatron writes TensorBoard events only with --tensorboard-dir, which
	// names a directory the recipe does not have (the events go into the run
	// directory): the list says whether the run writes them.
	e.Unexpressed = append(e.Unexpressed, "logging.tensorboard = "+FormatValue(r.Logging.Tensorboard))
	// The data is listed whatever its value: the import refuses a script that
	// names no data (Megatron's --data-path and --tokenizer-type take only
	// indexed datasets and its own tokenizers).
	for _, k := range []string{"data.path", "data.sources", "data.tokenizer"} {
		f, _ := recipeSchema.Lookup(k)
		e.Unexpressed = append(e.Unexpressed, k+" = "+FormatValue(f.Get(r)))
	}
	computed := map[string]bool{"model.tie_embeddings": true, "model.rope_scaling": true, "train.min_lr_factor": true, "parallel.device": true,
		"logging.tensorboard": true, "data.path": true, "data.sources": true, "data.tokenizer": true}
	for _, f := range recipeSchema.Fields {
		v := f.Get(r)
		same := reflect.DeepEqual(v, f.Get(&def))
		if computed[f.Key] {
			continue
		}
		// Flags that are shardline's own (Megatron has no such argument), values
		// Megatron does not take (0 for "derive it", an empty string), and the MoE
		// arguments of a dense model are left out; a value that differs from
		// shardline's default is listed instead.
		// Megatron reads no --fp8-* argument without --fp8-format, whose
		// values are e4m3 and hybrid only (shardline's "none" is its absence).
		absent := shardlineOnly[f.Flag] || (zeroMeansDerived[f.Flag] && isZero(v)) || v == "" ||
			(m.MoE.NumExperts == 0 && strings.HasPrefix(f.Key, "model.moe.")) ||
			(!r.Precision.FP8On() && strings.HasPrefix(f.Key, "precision.fp8."))
		switch {
		case f.Kind == KindBool && f.Flag == "" && f.NegFlag != "" && !absent: // a switch Megatron has only in the negative
			if !v.(bool) {
				arg("--" + f.NegFlag)
			}
		case f.Flag == "" || absent:
			if !same {
				e.Unexpressed = append(e.Unexpressed, f.Key+" = "+FormatValue(v))
			}
		case f.Kind == KindBool:
			switch {
			case v.(bool):
				arg("--" + f.Flag)
			case f.NegFlag != "":
				arg("--" + f.NegFlag)
			case !same: // false where shardline's default is true, and Megatron has no switch for it
				e.Unexpressed = append(e.Unexpressed, f.Key+" = false")
			}
		case f.Kind == KindStrings:
			if !same {
				e.Unexpressed = append(e.Unexpressed, f.Key+" = "+FormatValue(v))
			}
		default:
			arg("--"+f.Flag, plainValue(v))
		}
	}
	return e
}

// shardlineOnly are the recipe flags that are shardline's, not Megatron-LM's.
var shardlineOnly = map[string]bool{"device-profile": true, "world-size": true, "gpus-per-node": true}

// zeroMeansDerived are the flags whose 0 means "derive it" in shardline, which
// Megatron spells by leaving the argument out.
var zeroMeansDerived = map[string]bool{"kv-channels": true, "num-query-groups": true, "suggested-communication-unit-size": true, "moe-expert-capacity-factor": true}

func isZero(v any) bool {
	switch x := v.(type) {
	case int:
		return x == 0
	case int64:
		return x == 0
	case float64:
		return x == 0
	}
	return false
}

// minLR is the --min-lr that gives factor back as min-lr / lr exactly (the
// nearest floats to lr·factor are tried), or false.
func minLR(lr, factor float64) (float64, bool) {
	if lr <= 0 {
		return 0, false
	}
	x := lr * factor
	for _, c := range []float64{x, math.Nextafter(x, math.Inf(1)), math.Nextafter(x, math.Inf(-1))} {
		if c/lr == factor {
			return c, true
		}
	}
	return 0, false
}

// plainValue is a flag value as a command line gives it (no TOML quotes).
func plainValue(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	default:
		return fmt.Sprint(x)
	}
}

// Script is the export as a bash array a Megatron-LM launch script can spread
// ("${SHARDLINE_ARGS[@]}"), with the unexpressed keys listed as comments.
func (e MegatronExport) Script(source, fingerprint string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Megatron-LM arguments for %s (shardline recipe export megatron)\n# recipe fingerprint %s\n", source, fingerprint)
	if len(e.Unexpressed) > 0 {
		b.WriteString("# Keys no Megatron argument carries (shardline keeps them; set them another way):\n")
		for _, u := range e.Unexpressed {
			b.WriteString("#   " + u + "\n")
		}
	}
	b.WriteString("SHARDLINE_ARGS=(\n")
	for i := 0; i < len(e.Args); i++ {
		line := "    " + shellWord(e.Args[i])
		if i+1 < len(e.Args) && !strings.HasPrefix(e.Args[i+1], "--") {
			i++
			line += " " + shellWord(e.Args[i])
		}
		b.WriteString(line + "\n")
	}
	fmt.Fprintf(&b, ")\n# torchrun --nproc-per-node %d --nnodes %d pretrain_gpt.py \"${SHARDLINE_ARGS[@]}\"\n", e.NProc, e.NNodes)
	return b.String()
}

// shellWord quotes a word for bash when it needs it.
func shellWord(w string) string {
	if w != "" && strings.IndexFunc(w, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.,/+=:@%", r))
	}) < 0 {
		return w
	}
	return "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
}
