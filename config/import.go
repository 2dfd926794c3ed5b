package config

import (
	"fmt"
	"github.com/shardline/shardline/trainer/tokenizer"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// megatronAbsent are Megatron-LM defaults shardline does not train, which a
// launch script gets by leaving an argument out: each is refused unless the
// script gives one of the arguments named.
var megatronAbsent = []struct {
	needs []string
	why   string
	fix   string
}{
	{[]string{"swiglu"}, "without --swiglu Megatron's MLP is GeLU; shardline's is SwiGLU", "add --swiglu"},
	{[]string{"normalization"}, "without --normalization Megatron normalises with LayerNorm; shardline with RMSNorm", "add --normalization RMSNorm"},
	{[]string{"position-embedding-type", "use-rotary-position-embeddings"}, "without --position-embedding-type Megatron learns absolute positions; shardline's are rotary", "add --position-embedding-type rope"},
	{[]string{"disable-bias-linear"}, "without --disable-bias-linear Megatron's linear layers have biases; shardline's have none", "add --disable-bias-linear"},
	{[]string{"attention-dropout"}, "without --attention-dropout Megatron drops 10% of attention probabilities; shardline trains without dropout", "add --attention-dropout 0.0"},
	{[]string{"hidden-dropout"}, "without --hidden-dropout Megatron drops 10% of hidden activations; shardline trains without dropout", "add --hidden-dropout 0.0"},
}

// megatronDefault is the value Megatron-LM gives a recipe key when the script
// leaves out the argument that sets it.
type megatronDefault struct{ key, value, why string }

// megatronDefaults are Megatron-LM's defaults (megatron/training/arguments.py) for
// the arguments a script did not give, where they differ from shardline's: no
// Megatron-FSDP, no distributed optimizer and no overlap unless asked for, a linear
// decay to 0 with no warmup, weight decay 0.01, beta2 0.999, per-micro-batch loss
// averaging, evaluation every 1000 steps over 100 batches, logging every 100, no
// TensorBoard events without --tensorboard-dir, the SwiGLU size rounded down to
// a multiple of 64, experts as wide as the dense MLP,
// no auxiliary loss, one key/value group under --group-query-attention, a global
// batch of one micro-batch per data-parallel rank, torch_dist checkpoints without
// Megatron-FSDP, and GPUs.
func megatronDefaults(r Recipe, given map[string]bool, vals map[string]string) []megatronDefault {
	var out []megatronDefault
	absent := func(args ...string) bool {
		for _, a := range args {
			if given[a] {
				return false
			}
		}
		return true
	}
	add := func(key, value, why string) { out = append(out, megatronDefault{key, value, why}) }
	fsdp, distOpt := r.FSDP.UseMegatronFSDP, r.FSDP.UseDistributedOptimizer
	if absent("use-megatron-fsdp") {
		fsdp = false
		add("fsdp.use_megatron_fsdp", "false", "no --use-megatron-fsdp")
	}
	if absent("use-distributed-optimizer") {
		distOpt = false
		add("fsdp.use_distributed_optimizer", "false", "no --use-distributed-optimizer")
	}
	if absent("data-parallel-sharding-strategy") {
		strategy := "no_shard"
		if !fsdp && distOpt {
			strategy = "optim" // the distributed optimizer shards optimizer state and main weights
		}
		add("fsdp.data_parallel_sharding_strategy", strategy, "no --data-parallel-sharding-strategy")
	}
	if absent("ckpt-format") && !fsdp {
		add("checkpoint.ckpt_format", "torch_dist", "no --ckpt-format")
	}
	for _, d := range []struct{ arg, key, value string }{
		{"overlap-grad-reduce", "fsdp.overlap_grad_reduce", "false"},
		{"overlap-param-gather", "fsdp.overlap_param_gather", "false"},
		{"calculate-per-token-loss", "fsdp.calculate_per_token_loss", "false"},
		{"lr-decay-style", "train.lr_schedule", "linear"},
		{"weight-decay", "train.weight_decay", "0.01"},
		{"adam-beta2", "train.beta2", "0.999"},
		{"eval-interval", "train.eval_interval", "1000"},
		{"eval-iters", "train.eval_steps", "100"},
		{"log-interval", "logging.interval", "100"},
		{"tensorboard-dir", "logging.tensorboard", "false"}, // Megatron writes TensorBoard events only with --tensorboard-dir
		{"min-lr", "train.min_lr_factor", "0"},
	} {
		if absent(d.arg) {
			add(d.key, d.value, "no --"+d.arg)
		}
	}
	if absent("lr-warmup-iters", "lr-warmup-samples", "lr-warmup-fraction") {
		add("train.warmup_steps", "0", "no --lr-warmup-iters")
	}
	if absent("ffn-hidden-size") {
		ffn := 4 * r.Model.Hidden * 2 / 3 / 64 * 64 // SwiGLU: two thirds of 4·hidden, down to a multiple of 64
		add("model.ffn_hidden", strconv.Itoa(max(ffn, 1)), "no --ffn-hidden-size (with --swiglu)")
		r.Model.FFNHidden = max(ffn, 1)
	}
	if given["num-experts"] {
		if absent("moe-ffn-hidden-size") {
			add("model.moe.expert_ffn_hidden", strconv.Itoa(r.Model.FFNHidden), "no --moe-ffn-hidden-size (the dense --ffn-hidden-size)")
		}
		if absent("moe-aux-loss-coeff") {
			add("model.moe.aux_loss_coeff", "0", "no --moe-aux-loss-coeff")
		}
	}
	if given["group-query-attention"] && absent("num-query-groups") {
		add("model.kv_heads", "1", "--group-query-attention without --num-query-groups")
	}
	if absent("global-batch-size") {
		p := r.Parallel
		if mp := p.TensorParallel * p.ContextParallel * p.PipelineParallel; mp > 0 && p.WorldSize%mp == 0 {
			add("train.global_batch_size", strconv.Itoa(r.Train.MicroBatchSize*p.WorldSize/mp), "no --global-batch-size (one micro-batch per data-parallel rank)")
		}
	}
	if absent("vocab-size") && given["tokenizer-type"] && r.Data.Tokenizer != "byte" {
		// Megatron pads the tokenizer's vocabulary to a multiple of
		// --make-vocab-size-divisible-by (128) times the tensor-parallel size.
		div := 128
		if n, err := strconv.Atoi(vals["make-vocab-size-divisible-by"]); err == nil && n > 0 {
			div = n
		}
		multiple := div * max(r.Parallel.TensorParallel, 1)
		n := tokenizerVocab[r.Data.Tokenizer]
		if n == 0 && tokenizer.IsFileSpec(r.Data.Tokenizer) {
			// --tokenizer-model's file, where this machine has it (lint reads it
			// too, and refuses a vocabulary smaller than its tokens).
			if t, err := tokenizer.Load(r.Data.Tokenizer); err == nil {
				n = t.VocabSize()
			}
		}
		if n > 0 {
			v := (n + multiple - 1) / multiple * multiple
			add("model.vocab_size", strconv.Itoa(v), fmt.Sprintf("no --vocab-size: the %s tokenizer's %d tokens padded to a multiple of %d (--make-vocab-size-divisible-by %d × tensor parallel %d)",
				r.Data.Tokenizer, n, multiple, div, max(r.Parallel.TensorParallel, 1)))
		}
	}
	add("parallel.device", "cuda", "Megatron-LM trains on GPUs; shardline run --device cpu trains the recipe on the CPU")
	return out
}

// importOnlyNotes are Megatron arguments that are shardline run's own flags (so
// not recipe overrides): a script's are noted.
var importOnlyNotes = map[string]string{
	"load": "Megatron's --load resumes a run; shardline run --load DIR (or --resume DIR) does that, and --init-from starts from Hugging Face weights",
}

// multiValue are Megatron arguments that take several words.
var multiValue = map[string]bool{"data-path": true, "train-data-path": true, "valid-data-path": true, "test-data-path": true}

// exportHeader is the first line recipe export megatron writes, and
// exportedLaunch its commented torchrun line.
var (
	exportHeader   = regexp.MustCompile(`^# Megatron-LM arguments for .* \(shardline recipe export megatron\)$`)
	exportedLaunch = regexp.MustCompile(`^#\s*(torchrun .*pretrain_gpt\.py .*)$`)
)

// exportedKey is a key = value line of recipe export megatron's comment list.
var exportedKey = regexp.MustCompile(`^#\s+([a-z0-9_]+(?:\.[a-z0-9_]+)+) = (.+)$`)

// ImportMegatron reads a Megatron-LM launch script (bash: the arguments given to
// pretrain_gpt.py, through variables, arrays and continuations) or a plain argument
// file, and resolves them onto shardline's defaults with Megatron's own defaults
// where an argument is absent (tied embeddings; and the GeLU MLP, LayerNorm,
// learned positions, biases and dropout, each refused with the argument that
// would say otherwise). Keys listed by recipe export megatron's comments are set
// too. Every value remembers the argument it came from.
func ImportMegatron(path string, src []byte) (*Resolved, Diagnostics) {
	ls, err := megatronArgv(string(src))
	if err != nil {
		at := Pos{File: path}
		if se, ok := err.(*scriptError); ok {
			at.Line, at.Col = se.line, 1
		}
		return nil, Diagnostics{{Severity: SevError, Code: "SL001", Origin: Origin{Kind: FromImport, Pos: at},
			Message: fmt.Sprintf("reading the launch script: %v", err), Help: "give the script pretrain_gpt.py runs from, or a file of its arguments"}}
	}
	args, sets := ls.args, ls.sets
	var flags []FlagValue
	var notes, unknown Diagnostics
	given := map[string]bool{}
	vals := map[string]string{}
	var stray []string
	launcher := Pos{File: path, Line: ls.launcherLine, Col: 1}
	if ls.launcherLine == 0 {
		launcher = Pos{File: path}
	}
	// opaque refuses an argument whose words the import cannot know (a command's
	// output, the environment): reading it as empty would import another job.
	opaque := func(words ...string) bool {
		for _, w := range words {
			ref, ok := ls.vars.opaqueIn(w)
			if !ok {
				continue
			}
			what := strings.Join(words, " ")
			unknown = append(unknown, Diagnostic{Severity: SevError, Code: "SL007", Origin: Origin{Kind: FromImport, Pos: Pos{File: path, Line: ref.line, Col: 1}},
				Message: fmt.Sprintf("%s: the import cannot know its value: %s", ls.vars.written(what), ref.why),
				Help:    fmt.Sprintf("write the value into the script in place of %s (or set the variable in the script) and import again", ref.text)})
			return true
		}
		return false
	}
	if ls.ranksUnknown != "" {
		unknown = append(unknown, Diagnostic{Severity: SevError, Code: "SL007", Key: "parallel.world_size", Origin: Origin{Kind: FromImport, Pos: launcher},
			Message: fmt.Sprintf("torchrun's ranks are unknown, so is the world size: %s", ls.ranksUnknown),
			Help:    "write the numbers in the script (torchrun --nproc_per_node 8 --nnodes 4) and import again"})
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") {
			if ref, ok := ls.vars.opaqueIn(a); ok && ref.env && ls.vars.written(a) == ref.text {
				// $EXTRA_ARGS where an argument starts, set by no one: bash with
				// nothing exported passes no words, and so does the import.
				notes = append(notes, Diagnostic{Severity: SevNote, Code: "SL011", Origin: Origin{Kind: FromImport, Pos: Pos{File: path, Line: ref.line, Col: 1}},
					Message: fmt.Sprintf("%s (line %d) is read as no arguments: %s", ref.text, ref.line, ref.why),
					Help:    fmt.Sprintf("if the job passes arguments through %s, write them into the script and import again", ref.text)})
				continue
			}
			if !opaque(a) {
				stray = append(stray, a)
			}
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !hasValue {
			value = "true"
			if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
				i++
				value = args[i]
			}
			// Data paths take a list: weight prefix weight prefix ...
			for multiValue[name] && i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
				i++
				value += " " + args[i]
			}
		}
		given[name] = true
		if ma, ok := megatronArgs[name]; (ok && (ma.kind == noEffect || ma.anyValue)) || importOnlyNotes[name] != "" {
			// Its value changes nothing here (--tensorboard-dir $LOGS): noted as
			// the script wrote it.
			value = ls.vars.written(value)
		} else if opaque(a, value) {
			continue
		}
		if why, ok := importOnlyNotes[name]; ok {
			notes = append(notes, Diagnostic{Severity: SevNote, Code: "SL011", Origin: Origin{Kind: FromFlag, Name: "--" + name, Raw: value, Pos: Pos{File: path}},
				Message: fmt.Sprintf("--%s %s: not part of the recipe: %s", name, value, why), Help: "nothing to change in the recipe"})
			continue
		}
		flags = append(flags, FlagValue{Name: name, Value: value})
		vals[name] = value
	}
	if !given["untie-embeddings-and-output-weights"] {
		sets = append([]string{"model.tie_embeddings=true"}, sets...) // Megatron's default: tied
	}
	// A key the export's comment list sets keeps that value: the list is the
	// exporter's exact statement of the recipe.
	listed := map[string]bool{}
	for _, s := range sets {
		k, _, _ := strings.Cut(s, "=")
		listed[k] = true
	}
	var imported []ImportedValue
	if ls.nproc > 0 {
		o := Origin{Name: ls.launcherDescribed, Pos: Pos{File: path, Line: ls.launcherLine, Col: 1}}
		if !listed["parallel.world_size"] {
			imported = append(imported, ImportedValue{Key: "parallel.world_size", Value: strconv.Itoa(ls.nproc * ls.nnodes), Origin: o})
		}
		if (ls.nnodes > 1 || ls.nproc > Default().Parallel.GPUsPerNode) && !listed["parallel.gpus_per_node"] { // on one node, any gpus_per_node ≥ nproc says the same
			imported = append(imported, ImportedValue{Key: "parallel.gpus_per_node", Value: strconv.Itoa(ls.nproc), Origin: o})
		}
	}
	opts := Options{Flags: flags, Sets: sets, Imported: imported}
	res, diags := LoadBytes(path, nil, opts)
	if res != nil && !diags.HasErrors() {
		// Megatron's defaults for what the script leaves out, computed from what it
		// gives.
		for _, d := range megatronDefaults(res.Recipe, given, vals) {
			if !listed[d.key] {
				opts.Imported = append(opts.Imported, ImportedValue{Key: d.key, Value: d.value,
					Origin: Origin{Name: "Megatron's default: " + d.why, Pos: Pos{File: path}}})
			}
		}
		res, diags = LoadBytes(path, nil, opts)
	}
	for _, a := range megatronAbsent {
		found := false
		for _, n := range a.needs {
			found = found || given[n]
		}
		if !found {
			diags = append(diags, Diagnostic{Severity: SevError, Code: "SL010", Origin: Origin{Kind: FromFile, Pos: Pos{File: path}},
				Message: a.why, Help: a.fix})
		}
	}
	// The data and its tokens: a script that names neither trains on what
	// Megatron would refuse to start without; the recipe's Opticks in bytes
	// is not it.
	if !given["data-path"] && !given["train-data-path"] && !given["mock-data"] && !listed["data.path"] && !listed["data.sources"] {
		diags = append(diags, Diagnostic{Severity: SevError, Code: "SL010", Key: "data.path", Origin: Origin{Kind: FromFile, Pos: Pos{File: path}},
			Message: "the script names no --data-path: the data it trains on cannot be carried, and the recipe's default (Newton's Opticks in bytes) is not it",
			Help:    "add --data-path PREFIX (a Megatron indexed dataset, or any path data.path takes) to the script"})
	}
	if !given["tokenizer-type"] && !listed["data.tokenizer"] && (given["data-path"] || given["train-data-path"]) {
		diags = append(diags, Diagnostic{Severity: SevError, Code: "SL010", Key: "data.tokenizer", Origin: Origin{Kind: FromFile, Pos: Pos{File: path}},
			Message: "the script names no --tokenizer-type: the tokens of its data cannot be told",
			Help:    "add --tokenizer-type GPT2BPETokenizer (the tokenizer shardline carries) to the script"})
	}
	if tok := ""; res != nil && given["tokenizer-type"] && !listed["data.tokenizer"] && fileTokenizerTypes[vals["tokenizer-type"]] {
		tok = res.Recipe.Data.Tokenizer
		switch {
		case !tokenizer.IsFileSpec(tok):
			diags = append(diags, Diagnostic{Severity: SevError, Code: "SL010", Key: "data.tokenizer", Origin: Origin{Kind: FromFile, Pos: Pos{File: path}},
				Message: fmt.Sprintf("--tokenizer-type %s reads --tokenizer-model's file, and the script gives none (a hub name is not fetched): its tokens cannot be told", vals["tokenizer-type"]),
				Help:    "give --tokenizer-model the path of the model's tokenizer.json (or SentencePiece tokenizer.model)"})
		case !given["vocab-size"] && !listed["model.vocab_size"]:
			if _, err := tokenizer.Load(tok); err != nil {
				diags = append(diags, Diagnostic{Severity: SevWarning, Code: "SL402", Key: "model.vocab_size", Origin: Origin{Kind: FromFile, Pos: Pos{File: path}},
					Message: fmt.Sprintf("no --vocab-size, and the vocabulary of --tokenizer-model %s cannot be read here (%v): model.vocab_size stays %d", tok, err, res.Recipe.Model.VocabSize),
					Help:    "give --vocab-size (Megatron's padded vocabulary), or --set model.vocab_size"})
			}
		}
	}
	if len(stray) > 0 {
		diags = append(diags, Diagnostic{Severity: SevError, Code: "SL007", Origin: Origin{Kind: FromFile, Pos: Pos{File: path}},
			Message: fmt.Sprintf("words that are no --argument: %q", stray), Help: "check the script's quoting; arguments start with --"})
	}
	if len(unknown) > 0 {
		// What the script leaves unknown comes first; the rest may follow from it.
		return nil, append(unknown, notes...)
	}
	return res, append(diags, notes...)
}

// launchScript is what a Megatron-LM launch script gives pretrain_*.py: its
// arguments, the keys recipe export megatron listed in comments, and the ranks
// torchrun starts (0 when the script does not say).
type launchScript struct {
	args, sets        []string
	nproc, nnodes     int
	launcherLine      int
	launcherDescribed string
	// ranksUnknown says why torchrun's ranks cannot be read ("" when they can,
	// or when there is no torchrun).
	ranksUnknown string
	// vars is the script's state at its end: what its opaque markers stand for.
	vars *shellVars
	// exportLaunch is the commented torchrun line of a script recipe export
	// megatron wrote, and its line.
	exportLaunch     string
	exportLaunchLine int
}

// scriptError is a problem at a line of the script.
type scriptError struct {
	line int
	msg  string
}

func (e *scriptError) Error() string { return e.msg }

// shellFrame is an if/elif/else (or a loop or case, whose body the import cannot
// follow) the script is inside.
type shellFrame struct {
	line   int
	cond   string
	known  bool // the condition was evaluated
	active bool // the branch being read is taken
	taken  bool // some branch was taken
	loop   bool
}

// megatronArgv reads a launch script as bash would run it, as far as that takes:
// variables and arrays (=, +=), if/elif/else on conditions it can evaluate ([ ] and
// [[ ]] with -n, -z, ==, =, != on strings, !, && and ||), and the command that runs
// pretrain_*.py, directly or through a launcher (torchrun, python, srun, ...).
// A plain file of arguments has no such command: all its words are the arguments.
// A line that sets a variable or runs pretrain_*.py inside a condition or loop it
// cannot follow is an error naming both lines.
func megatronArgv(src string) (launchScript, error) {
	v := &shellVars{scalar: map[string]string{}, array: map[string][]string{}}
	var ls launchScript
	var all []string
	found := false
	var frames []shellFrame
	first, _, _ := strings.Cut(src, "\n")
	exported := exportHeader.MatchString(first)
	// statement runs one simple command: an assignment, the pretrain command, or
	// (in a file of arguments) words.
	statement := func(t string, line int) error {
		v.line = line
		t = strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(t, "export "), "declare -a "), "local ")
		if first, _, _ := strings.Cut(t, " "); (first == "source" || first == ".") && v.sourced == "" {
			v.sourced = fmt.Sprintf("`%s` (line %d)", t, line)
			return nil
		}
		if name, rest, add, ok := assignment(t); ok {
			if err := v.assign(name, rest, add); err != nil {
				return &scriptError{line, fmt.Sprintf("line %d: %v", line, err)}
			}
			return nil
		}
		words, err := v.lexWords(t)
		if err != nil {
			return &scriptError{line, fmt.Sprintf("line %d: %v", line, err)}
		}
		if i, ok := pretrainIndex(words); ok && !found {
			ls.args, found = append(ls.args, words[i+1:]...), true
			ls.nproc, ls.nnodes, ls.launcherDescribed, ls.ranksUnknown = torchrunRanks(v, words[:i])
			ls.launcherLine = line
			return nil
		}
		all = append(all, words...)
		return nil
	}
	// context says whether the enclosing frames skip a line, and the first frame
	// the import cannot follow (-1: none).
	context := func() (skip bool, unknown int) {
		unknown = -1
		for i, f := range frames {
			if !f.known || f.loop {
				if unknown < 0 {
					unknown = i
				}
			} else if !f.active {
				skip = true
			}
		}
		return skip, unknown
	}
	for _, ll := range logicalLines(src) {
		t := strings.TrimSpace(ll.text)
		if t == "" {
			continue
		}
		if strings.HasPrefix(t, "#") {
			if m := exportedKey.FindStringSubmatch(t); m != nil {
				ls.sets = append(ls.sets, m[1]+"="+tomlToSet(m[2]))
			}
			if m := exportedLaunch.FindStringSubmatch(t); m != nil && exported && ls.exportLaunch == "" {
				ls.exportLaunch, ls.exportLaunchLine = m[1], ll.line
			}
			continue
		}
		first, _, _ := strings.Cut(t, " ")
		first = strings.TrimSuffix(first, ";")
		switch first {
		case "if", "elif":
			cond := strings.TrimSpace(strings.TrimPrefix(t, first))
			oneLine := strings.HasSuffix(cond, "fi") && strings.Contains(cond, "then")
			cond = strings.TrimSuffix(strings.TrimSpace(strings.TrimSuffix(cond, "then")), ";")
			if oneLine && first == "if" {
				// if COND; then A; B; [else C;] fi on one line.
				skip, unknown := context()
				if skip {
					continue
				}
				c, body, _ := strings.Cut(strings.TrimPrefix(t, "if "), "; then ")
				body = strings.TrimSuffix(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(body), "fi")), ";")
				yes, no, _ := strings.Cut(body, "; else ")
				val, known := v.evalCond(strings.TrimSpace(c))
				condLine, condText := ll.line, strings.TrimSpace(c)
				if unknown >= 0 {
					known, condLine, condText = false, frames[unknown].line, frames[unknown].cond
				}
				branch := no
				if val {
					branch = yes
				}
				for _, stmt := range strings.Split(yes+";"+no, ";") {
					if stmt = strings.TrimSpace(stmt); stmt != "" && !known {
						if err := unfollowable(v, stmt, ll.line, condLine, condText); err != nil {
							return ls, err
						}
					}
				}
				if known {
					for _, stmt := range strings.Split(branch, ";") {
						if stmt = strings.TrimSpace(stmt); stmt != "" {
							if err := statement(stmt, ll.line); err != nil {
								return ls, err
							}
						}
					}
				}
				continue
			}
			if oneLine {
				if err := unfollowable(v, t, ll.line, ll.line, t); err != nil {
					return ls, err
				}
				continue
			}
			val, known := v.evalCond(cond)
			if first == "if" {
				frames = append(frames, shellFrame{line: ll.line, cond: cond, known: known, active: val, taken: val})
				continue
			}
			if len(frames) == 0 || frames[len(frames)-1].loop {
				return ls, &scriptError{ll.line, fmt.Sprintf("line %d: elif without if", ll.line)}
			}
			f := &frames[len(frames)-1]
			f.known = f.known && known
			f.active = !f.taken && val
			f.taken = f.taken || val
			f.cond, f.line = cond, ll.line
			continue
		case "else":
			if len(frames) == 0 || frames[len(frames)-1].loop {
				return ls, &scriptError{ll.line, fmt.Sprintf("line %d: else without if", ll.line)}
			}
			f := &frames[len(frames)-1]
			f.active, f.taken = !f.taken, true
			continue
		case "fi", "done", "esac":
			if len(frames) > 0 {
				frames = frames[:len(frames)-1]
			}
			continue
		case "for", "while", "until", "case", "select":
			frames = append(frames, shellFrame{line: ll.line, cond: t, loop: true})
			continue
		case "then", "do", "{", "}":
			continue
		}
		skip, unknown := context()
		if skip {
			continue
		}
		if unknown >= 0 {
			if err := unfollowable(v, t, ll.line, frames[unknown].line, frames[unknown].cond); err != nil {
				return ls, err
			}
			continue
		}
		if err := statement(t, ll.line); err != nil {
			return ls, err
		}
	}
	if !found && ls.exportLaunch != "" && len(frames) == 0 {
		// recipe export megatron's own output: its torchrun line is a comment, so
		// that the file can be sourced into a launch script; read as that line.
		if err := statement(ls.exportLaunch, ls.exportLaunchLine); err != nil {
			return ls, err
		}
	}
	if !found {
		ls.args = all // a file of arguments
	}
	ls.vars = v
	return ls, nil
}

// unfollowable refuses a line inside a condition or loop the import cannot follow
// when the line matters: it sets a variable or runs pretrain_*.py.
func unfollowable(v *shellVars, t string, line, condLine int, cond string) error {
	stmt := strings.TrimPrefix(strings.TrimPrefix(t, "export "), "declare -a ")
	_, _, _, assigns := assignment(stmt)
	words, _ := v.lexWords(t)
	_, runs := pretrainIndex(words)
	if !assigns && !runs {
		return nil
	}
	return &scriptError{line, fmt.Sprintf("line %d depends on `%s` (line %d), which the import cannot evaluate (it follows if/elif/else on [ ] and [[ ]] string tests of the script's own variables, not loops, file tests or commands)", line, cond, condLine)}
}

// launchers run pretrain_*.py: the script's path is among their arguments.
var launchers = map[string]bool{"torchrun": true, "srun": true, "deepspeed": true, "mpirun": true, "mpiexec": true, "accelerate": true,
	"uv": true, "exec": true, "nohup": true, "time": true, "numactl": true, "env": true}

// pretrainIndex finds the word naming pretrain_*.py in a command: the command
// itself (after NAME=value prefixes), or an argument of a launcher.
func pretrainIndex(words []string) (int, bool) {
	i := 0
	for i < len(words) && isEnvAssignment(words[i]) {
		i++
	}
	if i == len(words) {
		return 0, false
	}
	if isPretrain(words[i]) {
		return i, true
	}
	cmd := filepath.Base(words[i])
	if !launchers[cmd] && !strings.HasPrefix(cmd, "python") {
		return 0, false
	}
	for j := i + 1; j < len(words); j++ {
		if isPretrain(words[j]) {
			return j, true
		}
	}
	return 0, false
}

func isPretrain(w string) bool {
	base := filepath.Base(w)
	return !strings.ContainsAny(w, " \t") && strings.HasPrefix(base, "pretrain_") && strings.HasSuffix(base, ".py")
}

func isEnvAssignment(w string) bool {
	name, _, ok := strings.Cut(w, "=")
	return ok && validName(name)
}

// maxRanks is the most ranks a recipe has (parallel.world_size's bound).
const maxRanks = 1 << 20

// torchrunRanks reads torchrun's --nproc_per_node (--nproc-per-node) and --nnodes
// among the words before the script (0 when not torchrun: python -m
// torch.distributed.run counts as torchrun). torchrun's default is one process
// on one node. A value that is not a positive whole number (a command's output,
// a variable the script does not set, "gpu", an elastic range "1:4") leaves the
// world size unknown: unknown says why, naming the value as written.
func torchrunRanks(v *shellVars, words []string) (nproc, nnodes int, described, unknown string) {
	isTorchrun := false
	for i, w := range words {
		if filepath.Base(w) == "torchrun" || (w == "-m" && i+1 < len(words) && strings.HasPrefix(words[i+1], "torch.distributed.")) {
			isTorchrun = true
		}
	}
	if !isTorchrun {
		return 0, 0, "", ""
	}
	// torchrun's options parse with argparse, which takes any unambiguous
	// prefix: --nproc and --np are --nproc-per-node, --nn is --nnodes.
	value := func(name string) (n int, desc, bad string) {
		for i, w := range words {
			opt, r, hasValue := strings.Cut(w, "=")
			given := strings.ReplaceAll(strings.TrimPrefix(opt, "--"), "_", "-")
			if !strings.HasPrefix(opt, "--") || len(given) < 2 || !strings.HasPrefix(name, given) {
				continue
			}
			raw := r
			switch {
			case hasValue:
				desc = v.written(w)
			case i+1 < len(words):
				raw, desc = words[i+1], opt+" "+v.written(words[i+1])
			default:
				continue
			}
			if n, err := strconv.Atoi(raw); err == nil && n > 0 && n <= maxRanks {
				return n, desc, ""
			} else if err == nil && n > maxRanks {
				return 0, desc, fmt.Sprintf("%s is over the %d ranks a recipe has", desc, maxRanks)
			}
			bad = fmt.Sprintf("%s is not a positive whole number", desc)
			if ref, opaque := v.opaqueIn(raw); opaque {
				bad = fmt.Sprintf("%s: %s (line %d)", desc, ref.why, ref.line)
			}
			return 0, desc, bad
		}
		return 0, "", ""
	}
	nproc, a, badA := value("nproc-per-node")
	nnodes, b, badB := value("nnodes")
	if badA != "" || badB != "" {
		return 0, 0, "", strings.Trim(badA+"; "+badB, "; ")
	}
	if nproc*nnodes > maxRanks { // each is at most maxRanks: no overflow
		return 0, 0, "", fmt.Sprintf("%s × %s is over the %d ranks a recipe has", a, b, maxRanks)
	}
	if nproc == 0 && nnodes == 0 {
		return 0, 0, "", ""
	}
	described = "torchrun"
	if nproc == 0 {
		nproc, described = 1, described+" (one process per node, torchrun's default)"
	} else {
		described += " " + a
	}
	if nnodes == 0 {
		nnodes = 1
	} else {
		described += " " + b
	}
	return nproc, nnodes, described, ""
}

// assignment recognises NAME=value (one word), NAME=( ... ) and their += forms.
func assignment(s string) (name, rest string, add, ok bool) {
	n, r, ok := strings.Cut(s, "=")
	if !ok {
		return "", "", false, false
	}
	n, add = strings.CutSuffix(n, "+")
	if !validName(n) {
		return "", "", false, false
	}
	if !strings.HasPrefix(r, "(") && strings.ContainsAny(strings.TrimSpace(unquotedSpan(blankSubstitutions(r))), " \t") {
		return "", "", false, false // FOO=1 cmd ...: an environment prefix, not an assignment line
	}
	return n, r, add, true
}

func validName(n string) bool {
	if n == "" {
		return false
	}
	for _, c := range n {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// assign sets (or with add, appends to) a variable or array.
func (v *shellVars) assign(name, rest string, add bool) error {
	if inner, isArray := strings.CutPrefix(rest, "("); isArray {
		words, err := v.lexWords(strings.TrimSuffix(strings.TrimSpace(inner), ")"))
		if err != nil {
			return err
		}
		if add {
			if s, ok := v.scalar[name]; ok && v.array[name] == nil {
				words = append([]string{s}, words...)
			}
			// Appended in place: the map holds the only reference to an array (a
			// spread copies its elements), and copying it whole on every += made
			// 100,000 lines of A+=( x ) take minutes.
			words = append(v.array[name], words...)
		}
		delete(v.scalar, name)
		v.array[name] = words
		return nil
	}
	words, err := v.lexWords(rest)
	if err != nil {
		return err
	}
	val := strings.Join(words, " ")
	if add {
		// A string grows by copying: the copy counts against the expansion budget,
		// so A+=x repeated is refused before it costs quadratic time.
		if !v.spend(len(v.scalar[name]) + len(val)) {
			return v.overBudget()
		}
		val = v.scalar[name] + val
	}
	v.scalar[name] = val
	return nil
}

// blankSubstitutions blanks the insides of $(...) and `...` in s, so that
// GPUS=$(nvidia-smi -L | wc -l) reads as one assignment.
func blankSubstitutions(s string) string {
	b := []byte(s)
	for i := 0; i < len(b); i++ {
		end := 0
		switch {
		case b[i] == '`':
			end = backtickEnd(s, i)
		case b[i] == '$' && i+1 < len(b) && b[i+1] == '(':
			end = substitutionEnd(s, i)
		default:
			continue
		}
		for j := i; j < end; j++ {
			b[j] = 'x'
		}
		i = end - 1
	}
	return string(b)
}

// unquotedSpan blanks quoted parts of s so spaces inside quotes do not count.
func unquotedSpan(s string) string {
	var b strings.Builder
	var q byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case q != 0:
			if c == q {
				q = 0
			}
			b.WriteByte('x')
		case c == '\'' || c == '"':
			q = c
			b.WriteByte('x')
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// tomlToSet turns a TOML value of the export's comment list into --set syntax.
func tomlToSet(v string) string {
	v = strings.TrimSpace(v)
	if s, err := strconv.Unquote(v); err == nil {
		return s
	}
	return v
}

// commentSafe is s as a TOML comment may hold it: valid UTF-8 without control
// characters (tab aside). A script's argument can hold any byte; each such byte
// or character is written as Go escapes it (\xff for a byte that is not UTF-8,
// \x1a for a control character), so the annotated recipe still loads.
func commentSafe(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, notInComment) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case notInComment(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// notInComment says whether TOML forbids r in a comment: the control
// characters but tab.
func notInComment(r rune) bool { return r != '\t' && (r < 0x20 || r == 0x7f) }

// AnnotatedTOML is the resolved recipe as canonical TOML with each key that an
// argument, a job-file setting (or, for a key Megatron has no argument for, the
// import) set commented with where it came from; keys at shardline's defaults stay
// bare.
func AnnotatedTOML(r *Resolved) ([]byte, error) {
	body, _, err := ResolvedTOML(&r.Recipe)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	section := ""
	for _, line := range strings.Split(strings.TrimSuffix(string(body), "\n"), "\n") {
		b.WriteString(line)
		t := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(t, "[") && strings.HasSuffix(t, "]"):
			section = strings.Trim(t, "[]")
		case t != "" && !strings.HasPrefix(t, "#"):
			if k, _, ok := strings.Cut(t, " = "); ok {
				switch o := r.Origin(section + "." + k); o.Kind {
				case FromFlag:
					b.WriteString("  # " + commentSafe(strings.TrimPrefix(o.Describe(), "flag ")))
				case FromSet:
					b.WriteString("  # set by the import (" + commentSafe(strings.TrimPrefix(o.Name, "--set ")) + ")")
				case FromImport:
					b.WriteString("  # " + commentSafe(o.Name))
					if o.Pos.Line > 0 {
						b.WriteString(fmt.Sprintf(" (line %d)", o.Pos.Line))
					}
				}
			}
		}
		b.WriteString("\n")
	}
	return []byte(b.String()), nil
}
