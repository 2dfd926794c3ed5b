package config

import (
	"fmt"
	"sort"
	"strings"
)

// Severity orders diagnostics: errors stop a run, warnings and notes do not.
type Severity int

// Severities, most severe first.
const (
	SevError Severity = iota
	SevWarning
	SevNote
)

func (s Severity) String() string { return [...]string{"error", "warning", "note"}[s] }

// Diagnostic is one finding about a recipe, shaped after hcl.Diagnostic: what, where,
// and how to fix it.
type Diagnostic struct {
	Severity Severity
	Code     string // stable rule code, e.g. "SL202"; see Rules
	Key      string // the recipe key at fault ("" for file-level problems)
	Message  string // names the key, its value and the rule broken
	Help     string // the fix
	Origin   Origin // where the offending value came from
	// Recipe is the recipe file the finding concerns: a finding whose value came
	// from a flag or variable still belongs to a recipe (SARIF points at it).
	Recipe string
	// Err is the cause of a problem found outside lint (ValueProblem), which
	// errors.Is and errors.As see through the Diagnostic; nil for lint's.
	Err error `json:"-"`
}

// KeyProblem is a recipe value that code other than lint cannot use (the
// plan compiler, the trainer), as the one error type every such finding
// has: a Diagnostic of severity error on key, whose message msg names the
// rule broken (prefixed with the key), and fix the way out ("" for none
// beyond the message). It has no rule code and no position until At places
// it; its Error is "[location: ]key: msg[; fix]".
func KeyProblem(key, msg, fix string) *Diagnostic {
	return &Diagnostic{Severity: SevError, Key: key, Message: key + ": " + msg, Help: fix}
}

// ValueProblem is KeyProblem for key's value, refused for cause: its message
// is "key (value): cause", and cause is what it unwraps to.
func ValueProblem(key string, value any, cause error, fix string) *Diagnostic {
	return &Diagnostic{Severity: SevError, Key: key, Message: fmt.Sprintf("%s (%s): %v", key, FormatValue(value), cause), Help: fix, Err: cause}
}

// At positions a problem at where r's value of its key came from (a file
// position, a flag or an environment variable), in r's recipe file, and
// returns it.
func (d *Diagnostic) At(r *Resolved) *Diagnostic {
	if r != nil && d.Key != "" {
		d.Origin, d.Recipe = r.Origin(d.Key), r.Path
	}
	return d
}

// Unwrap is a problem's cause (ValueProblem).
func (d Diagnostic) Unwrap() error { return d.Err }

// InRecipe sets Recipe on every finding that lacks one.
func (ds Diagnostics) InRecipe(path string) {
	for i := range ds {
		if ds[i].Recipe == "" {
			ds[i].Recipe = path
		}
	}
}

// Location is file:line:col, or the flag or environment variable at fault.
func (d Diagnostic) Location() string { return d.Origin.Location() }

// Error is a lint finding as "location: severity[code]: message", and a
// problem (KeyProblem, ValueProblem: no code) as "[location: ]message[; fix]",
// its location once At has placed it.
func (d Diagnostic) Error() string {
	if d.Code != "" {
		return fmt.Sprintf("%s: %s[%s]: %s", d.Location(), d.Severity, d.Code, d.Message)
	}
	s := d.Message
	if d.Help != "" {
		s += "; " + d.Help
	}
	if d.Origin != (Origin{}) {
		s = d.Location() + ": " + s
	}
	return s
}

// Diagnostics is a list of findings, like go/scanner.ErrorList.
type Diagnostics []Diagnostic

// Sort orders by file, line, column, then severity and code; flags and environment
// variables (no file position) come after file positions.
func (ds Diagnostics) Sort() {
	sort.SliceStable(ds, func(i, j int) bool {
		a, b := ds[i], ds[j]
		af, bf := a.Origin.Kind == FromEnv || a.Origin.Kind == FromSet || a.Origin.Kind == FromFlag,
			b.Origin.Kind == FromEnv || b.Origin.Kind == FromSet || b.Origin.Kind == FromFlag
		if af != bf {
			return !af
		}
		if af {
			if a.Location() != b.Location() {
				return a.Location() < b.Location()
			}
		} else {
			pa, pb := a.Origin.Pos, b.Origin.Pos
			if pa.File != pb.File {
				return pa.File < pb.File
			}
			if pa.Line != pb.Line {
				return pa.Line < pb.Line
			}
			if pa.Col != pb.Col {
				return pa.Col < pb.Col
			}
		}
		if a.Severity != b.Severity {
			return a.Severity < b.Severity
		}
		if a.Code != b.Code {
			return a.Code < b.Code
		}
		return a.Message < b.Message
	})
}

// Count returns how many diagnostics have the given severity.
func (ds Diagnostics) Count(s Severity) int {
	n := 0
	for _, d := range ds {
		if d.Severity == s {
			n++
		}
	}
	return n
}

// HasErrors reports whether any diagnostic is an error.
func (ds Diagnostics) HasErrors() bool { return ds.Count(SevError) > 0 }

// Err returns nil when there are no errors, else an error listing them.
func (ds Diagnostics) Err() error {
	if !ds.HasErrors() {
		return nil
	}
	return errorList(ds)
}

type errorList Diagnostics

func (e errorList) Error() string {
	var errs []string
	for _, d := range e {
		if d.Severity == SevError {
			errs = append(errs, d.Error())
		}
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return fmt.Sprintf("%s (and %d more errors)", errs[0], len(errs)-1)
}

// Rule describes one lint rule; every Diagnostic's Code is one of Rules.
type Rule struct {
	Code     string
	Severity Severity // the usual severity (a rule may emit a note in mild cases)
	Title    string
}

// Rules lists every rule shardline reports, in code order. Codes are stable:
// SL0xx loading, SL1xx Megatron-FSDP, SL2xx parallel shape, SL3xx model and FSDP
// units, SL4xx files, SL5xx the compiled plan.
var Rules = []Rule{
	{"SL001", SevError, "TOML syntax error"},
	{"SL002", SevError, "unknown key or section"},
	{"SL003", SevError, "value has the wrong type"},
	{"SL004", SevError, "value outside its allowed set"},
	{"SL005", SevError, "extends: missing, unreadable or cyclic base recipe"},
	{"SL006", SevError, "key defined twice"},
	{"SL007", SevError, "bad override (--set, flag or environment variable)"},
	{"SL008", SevError, "value out of range"},
	{"SL009", SevError, "run.name is not one directory name"},
	{"SL010", SevError, "Megatron argument or torchtitan setting for something shardline does not do"},
	{"SL011", SevNote, "Megatron argument or torchtitan setting with no effect in shardline"},
	{"SL101", SevError, "Megatron-FSDP requires use_distributed_optimizer"},
	{"SL102", SevError, "Megatron-FSDP requires gradient_accumulation_fusion off"},
	{"SL103", SevError, "Megatron-FSDP requires ckpt_format = fsdp_dtensor"},
	{"SL104", SevError, "fsdp_dtensor checkpoints require Megatron-FSDP"},
	{"SL105", SevError, "meta-device init needs a sharding strategy other than no_shard"},
	{"SL106", SevError, "use_nccl_ub turns fsdp_double_buffer on"},
	{"SL107", SevError, "use_nccl_ub is incompatible with expandable segments"},
	{"SL108", SevError, "CUDA_DEVICE_MAX_CONNECTIONS with FSDP overlap"},
	{"SL109", SevError, "optimizer not supported by the distributed optimizer"},
	{"SL110", SevWarning, "calculate_per_token_loss recommended with sharded gradients"},
	{"SL111", SevWarning, "grad_reduce_in_bf16 recommended for bf16 runs"},
	{"SL112", SevWarning, "init_model_with_meta_device recommended for large models"},
	{"SL113", SevError, "sharding gradients or parameters requires Megatron-FSDP"},
	{"SL114", SevNote, "setting the trainer does not carry out yet (run refuses it)"},
	{"SL115", SevError, "FP8 scaling recipe shardline does not have (blockwise, MX)"},
	{"SL116", SevError, "FP8 needs bf16 compute"},
	{"SL117", SevError, "FP8 setting that changes nothing"},
	{"SL201", SevError, "world size not divisible by tp·cp·pp"},
	{"SL202", SevError, "attention heads not divisible by tensor parallel"},
	{"SL203", SevError, "experts not divisible by expert parallel"},
	{"SL204", SevError, "ep·etp does not divide the ranks of a pipeline stage"},
	{"SL205", SevError, "sequence length not divisible by 2·cp"},
	{"SL206", SevError, "global batch not divisible by micro batch × data-parallel size"},
	{"SL207", SevError, "top_k larger than num_experts"},
	{"SL208", SevError, "expert parallelism needs an MoE model"},
	{"SL209", SevError, "pipeline parallelism is not supported yet"},
	{"SL210", SevError, "FFN hidden size not divisible by tensor parallel"},
	{"SL211", SevError, "expert tensor parallelism is not supported yet"},
	{"SL212", SevError, "vocabulary size not divisible by tensor parallel"},
	{"SL213", SevError, "a micro-batch's tokens per rank not divisible by tensor parallel"},
	{"SL301", SevError, "fsdp_unit_modules names a module the model lacks"},
	{"SL302", SevError, "expert weights double-sharded over the data-parallel group"},
	{"SL303", SevError, "inconsistent attention shape"},
	{"SL304", SevError, "layer interleave (MoE, NoPE) leaves no layer of its kind"},
	{"SL305", SevError, "vocabulary smaller than the tokenizer's"},
	{"SL306", SevError, "document masks need a tokenizer with an end-of-text token"},
	{"SL307", SevNote, "attention chunk covers the whole sequence"},
	{"SL308", SevError, "tokenizer file cannot be read"},
	{"SL309", SevError, "RoPE scaling's high-frequency factor below its low one"},
	{"SL310", SevError, "RoPE scaling numbers set without model.rope_scaling = llama3"},
	{"SL401", SevWarning, "data path does not exist"},
	{"SL402", SevWarning, "tokenizer file does not exist"},
	{"SL501", SevError, "plan does not fit device memory"},
	{"SL502", SevError, "plan cannot be compiled"},
}

// RuleFor returns the rule with the given code.
func RuleFor(code string) (Rule, bool) {
	for _, r := range Rules {
		if r.Code == code {
			return r, true
		}
	}
	return Rule{}, false
}

// Suggest returns the candidate closest to s by edit distance, if close enough to
// be a likely typo ("did you mean").
func Suggest(s string, candidates []string) string {
	best, bestD := "", 1<<30
	for _, c := range candidates {
		d := editDistance(strings.ToLower(s), strings.ToLower(c))
		if d < bestD {
			best, bestD = c, d
		}
	}
	limit := len(s) / 3
	if limit < 2 {
		limit = 2
	}
	if bestD <= limit {
		return best
	}
	return ""
}

// editDistance is the Levenshtein distance with adjacent transpositions counted as one.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}
