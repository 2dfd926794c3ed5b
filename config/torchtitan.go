package config

import (
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// torchtitan job files (TOML; torchtitan read them from 2024 until its February
// 2026 move to Python config registries). ttDefaults are JobConfig's defaults
// (torchtitan/config/job_config.py at the commit torchtitan_flavours.go names) for
// every key the import translates: a key the file leaves out has torchtitan's
// value, not shardline's.
var ttDefaults = map[string]any{
	"job.dump_folder":                                      "./outputs",
	"model.name":                                           "llama3",
	"model.flavor":                                         "debugmodel",
	"model.converters":                                     []string{},
	"model.norm_type":                                      "rmsnorm",
	"optimizer.name":                                       "AdamW",
	"optimizer.lr":                                         8e-4,
	"optimizer.eps":                                        1e-8,
	"optimizer.beta1":                                      0.9,
	"optimizer.beta2":                                      0.95,
	"optimizer.weight_decay":                               0.1,
	"optimizer.early_step_in_backward":                     false,
	"lr_scheduler.warmup_steps":                            int64(200),
	"lr_scheduler.total_steps":                             int64(-1), // None: training.steps
	"lr_scheduler.decay_ratio":                             -1.0,      // None: decay from the end of warmup
	"lr_scheduler.decay_type":                              "linear",
	"lr_scheduler.min_lr_factor":                           0.0,
	"training.local_batch_size":                            int64(8),
	"training.global_batch_size":                           int64(-1),
	"training.seq_len":                                     int64(2048),
	"training.max_norm":                                    1.0,
	"training.steps":                                       int64(10000),
	"training.enable_cpu_offload":                          false,
	"training.dtype":                                       "float32",
	"training.mixed_precision_param":                       "bfloat16",
	"training.mixed_precision_reduce":                      "float32",
	"training.seed":                                        int64(-1), // None
	"debug.seed":                                           int64(-1),
	"debug.moe_force_load_balance":                         false,
	"parallelism.data_parallel_replicate_degree":           int64(1),
	"parallelism.data_parallel_shard_degree":               int64(-1),
	"parallelism.fsdp_reshard_after_forward":               "default",
	"parallelism.tensor_parallel_degree":                   int64(1),
	"parallelism.pipeline_parallel_degree":                 int64(1),
	"parallelism.context_parallel_degree":                  int64(1),
	"parallelism.expert_parallel_degree":                   int64(1),
	"parallelism.expert_tensor_parallel_degree":            int64(1),
	"activation_checkpoint.mode":                           "selective",
	"activation_checkpoint.selective_ac_option":            "2",
	"checkpoint.enable":                                    false,
	"checkpoint.folder":                                    "checkpoint",
	"checkpoint.interval":                                  int64(500),
	"checkpoint.keep_latest_k":                             int64(10),
	"metrics.log_freq":                                     int64(10),
	"metrics.enable_tensorboard":                           false,
	"validation.enable":                                    false,
	"training.dataset":                                     "c4_test",
	"training.dataset_path":                                "",
	"validation.dataset":                                   "c4_validation",
	"validation.dataset_path":                              "",
	"model.hf_assets_path":                                 "./tests/assets/tokenizer",
	"model.tokenizer_path":                                 "",
	"validation.freq":                                      int64(10),
	"validation.steps":                                     int64(-1),
	"fault_tolerance.enable":                               false,
	"experimental.custom_import":                           "",
	"experimental.custom_args_module":                      "",
	"job.custom_config_module":                             "",
	"float8.enable_float8_linear":                          false,
	"quantize.linear.float8.enable_fsdp_float8_all_gather": false,
	"quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp": false,
	"quantize.linear.float8.recipe_name":                              "",
	"quantize.linear.float8.filter_fqns":                              []string{},
	"quantize.linear.float8.emulate":                                  false,
	"quantize.linear.float8.force_recompute_fp8_weight_in_bwd":        false,
	"quantize.grouped_mm.float8.fqns":                                 []string{},
}

// ttAliases are keys of older job files (2024 to early 2025) and the key that
// replaced each.
var ttAliases = map[string]string{
	"training.batch_size":                     "training.local_batch_size",
	"training.warmup_steps":                   "lr_scheduler.warmup_steps",
	"training.data_parallel_replicate_degree": "parallelism.data_parallel_replicate_degree",
	"training.data_parallel_shard_degree":     "parallelism.data_parallel_shard_degree",
	"training.tensor_parallel_degree":         "parallelism.tensor_parallel_degree",
	"experimental.context_parallel_degree":    "parallelism.context_parallel_degree",
	"experimental.pipeline_parallel_degree":   "parallelism.pipeline_parallel_degree",
	"training.compile":                        "compile.enable",
	"optimizer.fused":                         "optimizer.implementation",
	"checkpoint.enable_checkpoint":            "checkpoint.enable",
	// [float8] became [quantize.linear.float8] in 2025.
	"float8.enable_fsdp_float8_all_gather":            "quantize.linear.float8.enable_fsdp_float8_all_gather",
	"float8.precompute_float8_dynamic_scale_for_fsdp": "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
	"float8.recipe_name":                              "quantize.linear.float8.recipe_name",
	"float8.filter_fqns":                              "quantize.linear.float8.filter_fqns",
	"float8.emulate":                                  "quantize.linear.float8.emulate",
	"float8.force_recompute_fp8_weight_in_bwd":        "quantize.linear.float8.force_recompute_fp8_weight_in_bwd",
}

// ttNoEffect are the job-file settings that change nothing shardline computes,
// by section (or "section.key" for one key), with why. Each one given is a note.
var ttNoEffect = map[string]string{
	"job.description":                                                    "a label only",
	"job.print_config":                                                   "shardline lint --explain shows the resolved recipe",
	"job.save_config_file":                                               "every run directory keeps its resolved.toml",
	"job.config_file":                                                    "the job file is the one being imported",
	"profiling":                                                          "profile with shardline run --trace (a Chrome trace)",
	"metrics":                                                            "shardline writes metrics.jsonl and loss.png in the run directory",
	"metrics.save_tb_folder":                                             "shardline writes the TensorBoard event files into the run directory (run.output_dir/run.name), beside metrics.jsonl; tensorboard --logdir run.output_dir shows every run",
	"metrics.enable_wandb":                                               "shardline logs to no service itself; with logging.tensorboard `wandb sync RUN_DIR` uploads the run's TensorBoard events",
	"model.print_after_conversion":                                       "nothing is converted",
	"optimizer.implementation":                                           "shardline has one fused optimizer kernel",
	"training.gc_freq":                                                   "Go's collector needs no schedule",
	"training.gc_debug":                                                  "Go's collector needs no schedule",
	"training.dataloader":                                                "shardline's batches are a pure function of (seed, step, rank): no loader workers",
	"training.deterministic":                                             "shardline runs are deterministic by construction",
	"training.deterministic_warn_only":                                   "shardline runs are deterministic by construction",
	"debug.deterministic":                                                "shardline runs are deterministic by construction",
	"debug.deterministic_warn_only":                                      "shardline runs are deterministic by construction",
	"parallelism.disable_loss_parallel":                                  "shardline computes the loss from vocabulary chunks and never gathers the logits",
	"parallelism.enable_async_tensor_parallel":                           "a scheduling choice of torch.compile",
	"parallelism.pipeline_parallel_schedule":                             "the pipeline degree is what the recipe keeps (lint refuses pp > 1)",
	"parallelism.pipeline_parallel_schedule_csv":                         "the pipeline degree is what the recipe keeps (lint refuses pp > 1)",
	"parallelism.pipeline_parallel_microbatch_size":                      "the pipeline degree is what the recipe keeps (lint refuses pp > 1)",
	"parallelism.pipeline_parallel_layers_per_stage":                     "the pipeline degree is what the recipe keeps (lint refuses pp > 1)",
	"parallelism.pipeline_parallel_first_stage_less_layers":              "the pipeline degree is what the recipe keeps (lint refuses pp > 1)",
	"parallelism.pipeline_parallel_last_stage_less_layers":               "the pipeline degree is what the recipe keeps (lint refuses pp > 1)",
	"parallelism.pipeline_parallel_expert_parallel_overlap":              "the pipeline degree is what the recipe keeps (lint refuses pp > 1)",
	"parallelism.module_fqns_per_model_part":                             "the pipeline degree is what the recipe keeps (lint refuses pp > 1)",
	"parallelism.pipeline_parallel_split_points":                         "the pipeline degree is what the recipe keeps (lint refuses pp > 1)",
	"parallelism.context_parallel_load_balancer":                         "shardline's context parallelism pairs chunks i and 2·cp−1−i (head-tail) always",
	"parallelism.context_parallel_rotate_method":                         "a communication choice; the result is the same",
	"parallelism.expert_parallel_comm_backend":                           "a communication choice; the result is the same",
	"activation_checkpoint.selective_ac_option":                          "see activation_checkpoint.mode",
	"activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns": "see activation_checkpoint.mode",
	"activation_checkpoint.early_stop":                                   "recomputation here recomputes whole",
	"activation_checkpoint.preserve_rng_state":                           "shardline trains without dropout: no random state to preserve",
	"activation_checkpoint.determinism_check":                            "recomputation is deterministic",
	"activation_checkpoint.debug":                                        "a debugging switch",
	"activation_checkpoint.memory_budget":                                "used by mode = \"memory_budget\" only",
	"activation_checkpoint.visualize_memory_budget_pareto":               "used by mode = \"memory_budget\" only",
	"compile":                                     "shardline has no graph compiler: its kernels are fused by hand",
	"comm":                                        "the collective timeout is shardline run's --comm-timeout (or comm_timeout in shardline.toml)",
	"memory_estimation":                           "shardline plan estimates memory from the recipe",
	"fault_tolerance":                             "fault_tolerance.enable is what matters",
	"validation.local_batch_size":                 "shardline validates with the training micro-batch and sequence length",
	"validation.seq_len":                          "shardline validates with the training micro-batch and sequence length",
	"validation.dataloader":                       "shardline's batches are a pure function of (seed, step, rank): no loader workers",
	"checkpoint.async_mode":                       "shardline always saves in the background from a snapshot",
	"checkpoint.last_save_model_only":             "shardline's last checkpoint is a full training checkpoint; shardline ckpt export writes the model as Hugging Face safetensors",
	"checkpoint.export_dtype":                     "shardline's last checkpoint is a full training checkpoint; shardline ckpt export writes the model as Hugging Face safetensors",
	"checkpoint.last_save_in_hf":                  "shardline's last checkpoint is a full training checkpoint; shardline ckpt export writes the model as Hugging Face safetensors",
	"checkpoint.initial_load_path":                "start from weights with shardline run --init-from DIR (Hugging Face safetensors) or --resume DIR",
	"checkpoint.initial_load_model_only":          "start from weights with shardline run --init-from DIR (Hugging Face safetensors) or --resume DIR",
	"checkpoint.initial_load_in_hf":               "start from weights with shardline run --init-from DIR (Hugging Face safetensors) or --resume DIR",
	"checkpoint.initial_load_in_hf_quantized":     "start from weights with shardline run --init-from DIR (Hugging Face safetensors) or --resume DIR",
	"checkpoint.load_step":                        "resume a step with shardline run --resume DIR",
	"checkpoint.load_only":                        "resume a step with shardline run --resume DIR",
	"checkpoint.exclude_from_loading":             "resume a step with shardline run --resume DIR",
	"checkpoint.enable_ft_dataloader_checkpoints": "batches are a pure function of the step: no loader state to save",
	"checkpoint.enable_first_step_checkpoint":     "shardline saves at checkpoint.interval, at the end and on an interrupt",
	"checkpoint.create_seed_checkpoint":           "shardline initialises from run.seed on every world size alike (counter-based random numbers)",
	"float8":                                      "FP8 is off unless model.converters names float8 (as in torchtitan)",
	"quantize":                                    "FP8 and MX are off unless model.converters names them (as in torchtitan)",
	"experimental":                                "experimental switches",
}

// ttSetting is one torchtitan setting: its value and where it was given (pos.Line
// 0 for torchtitan's default).
type ttSetting struct {
	key     string // the current name
	written string // the name in the file (an older alias), or key
	val     rawValue
	pos     Pos
}

func (s ttSetting) given() bool { return s.pos.Line > 0 }

// ttImport translates one job file.
type ttImport struct {
	path     string
	sets     map[string]bool      // recipe keys given with --set: the model of a flavour no table has
	set      map[string]ttSetting // given in the file (canonical keys)
	imported []ImportedValue
	diags    Diagnostics
}

// ImportTorchtitan reads a torchtitan job file (TOML) and resolves it onto
// shardline's defaults: the model from torchtitan's llama3 and llama4 flavour
// tables, and every [training], [optimizer], [lr_scheduler], [parallelism],
// [activation_checkpoint], [checkpoint], [validation] and [metrics] setting,
// with torchtitan's default wherever the file is silent. worldSize is the number
// of ranks torchrun would start (0: the product of the file's explicit degrees,
// data_parallel_shard_degree = -1 counting as 1). Each value remembers the
// setting it came from. What shardline cannot train is refused by name (SL010);
// what does not matter here is a note (SL011); a key no torchtitan version has is
// an error (SL007).
func ImportTorchtitan(path string, src []byte, worldSize int) (*Resolved, Diagnostics) {
	return ImportTorchtitanWith(path, src, worldSize, nil)
}

// ImportTorchtitanWith is ImportTorchtitan with recipe keys set as --set
// does ("section.key=value"), over what the job file gives: the way to bring a
// flavour no torchtitan table has (a job's own model code, such as the
// torchtitan report's llama4 3bx128e) with the rest of its job file. Such a
// flavour needs its shape given (ttShapeKeys); the llama4 router and every
// other model default of torchtitan's still apply under it.
func ImportTorchtitanWith(path string, src []byte, worldSize int, sets []string) (*Resolved, Diagnostics) {
	doc, diags := parseTOML(path, src)
	if doc == nil {
		for i := range diags {
			diags[i].Origin.Pos.File = path
		}
		return nil, diags
	}
	t := &ttImport{path: path, set: map[string]ttSetting{}, sets: map[string]bool{}}
	for _, s := range sets {
		k, _, _ := strings.Cut(s, "=")
		t.sets[strings.TrimSpace(k)] = true
	}
	t.read(doc)
	t.translate(worldSize)
	// A key given with --set beats the job file's value for it.
	kept := t.imported[:0]
	for _, v := range t.imported {
		if !t.sets[v.Key] {
			kept = append(kept, v)
		}
	}
	t.imported = kept
	res, ldiags := LoadBytes(path, nil, Options{Imported: t.imported, Sets: sets})
	if res != nil {
		res.Sources[path] = src
	}
	all := append(t.diags, ldiags...)
	all.Sort()
	return res, all
}

// read collects the file's settings under their current names, checking each
// against torchtitan's keys and its default's type.
func (t *ttImport) read(doc *tomlDoc) {
	noEffect := map[string][]ttSetting{}
	for _, e := range doc.entries {
		key := e.key
		if to, ok := ttAliases[key]; ok {
			key = to
		}
		s := ttSetting{key: key, written: e.key, val: e.val, pos: e.keyPos}
		if prev, dup := t.set[key]; dup {
			t.errorf(e.keyPos, "SL006", fmt.Sprintf("%s is given twice: here and at %s (%s)", e.key, prev.pos, prev.written), "keep one of them")
			continue
		}
		if def, ok := ttDefaults[key]; ok {
			if !ttKindFits(def, e.val) {
				t.errorf(e.val.pos, "SL003", fmt.Sprintf("%s = %s: torchtitan's %s is %s", e.key, e.val.text, key, ttKindName(def)), "write a value of that type")
				continue
			}
			t.set[key] = s
			continue
		}
		if why, ok := ttNoEffectOf(key); ok {
			noEffect[why] = append(noEffect[why], s)
			continue
		}
		section, _, _ := strings.Cut(key, ".")
		msg := fmt.Sprintf("%s is not a torchtitan job-file key that shardline knows", e.key)
		if _, known := ttSections[section]; !known {
			msg = fmt.Sprintf("[%s] is not a torchtitan job-file section that shardline knows", section)
		}
		t.errorf(e.keyPos, "SL002", msg, "remove it, or check its spelling against torchtitan's job_config.py")
	}
	whys := make([]string, 0, len(noEffect))
	for why := range noEffect {
		whys = append(whys, why)
	}
	sort.Slice(whys, func(i, j int) bool { return noEffect[whys[i]][0].pos.Offset < noEffect[whys[j]][0].pos.Offset })
	for _, why := range whys {
		var keys []string
		section := ""
		for _, s := range noEffect[why] {
			sec, k := ttSplit(s.written)
			if sec != section {
				k, section = "["+sec+"] "+k, sec
			}
			keys = append(keys, k)
		}
		t.add(SevNote, noEffect[why][0].pos, "SL011", fmt.Sprintf("%s: no effect in shardline: %s", strings.Join(keys, ", "), why), "")
	}
}

// ttSections are the job file's top-level sections.
var ttSections = map[string]bool{"job": true, "profiling": true, "metrics": true, "model": true, "optimizer": true, "lr_scheduler": true,
	"training": true, "parallelism": true, "checkpoint": true, "activation_checkpoint": true, "compile": true, "float8": true, "quantize": true,
	"comm": true, "memory_estimation": true, "fault_tolerance": true, "experimental": true, "validation": true, "debug": true, "mx": true}

// ttSplit splits a dotted key into its table and the key within it:
// "quantize.linear.float8.filter_fqns" is [quantize.linear.float8] filter_fqns.
func ttSplit(key string) (section, k string) {
	i := strings.LastIndexByte(key, '.')
	if i < 0 {
		return "", key
	}
	return key[:i], key[i+1:]
}

// ttNoEffectOf finds why a key has no effect: by the key, by a prefix of it, or by
// its section.
func ttNoEffectOf(key string) (string, bool) {
	for k := key; ; {
		if why, ok := ttNoEffect[k]; ok {
			return why, true
		}
		i := strings.LastIndexByte(k, '.')
		if i < 0 {
			return "", false
		}
		k = k[:i]
	}
}

func ttKindFits(def any, v rawValue) bool {
	switch def.(type) {
	case string:
		return v.kind == vString
	case bool:
		return v.kind == vBool
	case int64:
		return v.kind == vInt
	case float64:
		return v.kind == vFloat || v.kind == vInt
	case []string:
		if v.kind == vString { // converters = "float8" in 2024's files
			return true
		}
		if v.kind != vArray {
			return false
		}
		for _, el := range v.elems {
			if el.kind != vString {
				return false
			}
		}
		return true
	}
	return false
}

func ttKindName(def any) string {
	switch def.(type) {
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case int64:
		return "an integer"
	case float64:
		return "a number"
	}
	return "an array of strings"
}

// get returns the setting of key: the file's, or torchtitan's default.
func (t *ttImport) get(key string) ttSetting {
	if s, ok := t.set[key]; ok {
		return s
	}
	s := ttSetting{key: key, written: key, pos: Pos{File: t.path}}
	switch d := ttDefaults[key].(type) {
	case string:
		s.val = rawValue{kind: vString, s: d, text: strconv.Quote(d)}
	case bool:
		s.val = rawValue{kind: vBool, b: d, text: strconv.FormatBool(d)}
	case int64:
		s.val = rawValue{kind: vInt, i: d, text: strconv.FormatInt(d, 10)}
	case float64:
		s.val = rawValue{kind: vFloat, f: d, text: strconv.FormatFloat(d, 'g', -1, 64)}
	case []string:
		s.val = rawValue{kind: vArray, text: "[]"}
	}
	return s
}

func (s ttSetting) str() string { return s.val.s }
func (s ttSetting) flag() bool  { return s.val.b }
func (s ttSetting) int() int64  { return s.val.i }
func (s ttSetting) num() float64 {
	if s.val.kind == vInt {
		return float64(s.val.i)
	}
	return s.val.f
}
func (s ttSetting) strs() []string {
	if s.val.kind == vString {
		return strings.Split(s.val.s, ",")
	}
	var out []string
	for _, e := range s.val.elems {
		out = append(out, e.s)
	}
	return out
}

// name is how an origin names the setting: "[training] seq_len", or "torchtitan's
// default for [training] seq_len".
func (s ttSetting) name() string {
	section, key := ttSplit(s.written)
	n := "[" + section + "] " + key
	if !s.given() {
		return "torchtitan's default for " + n
	}
	if s.val.kind == vArray && s.val.text == "" { // the parser keeps no text for arrays
		return fmt.Sprintf("%s (an array of %d)", n, len(s.val.elems))
	}
	return n + " = " + s.val.text
}

func (t *ttImport) add(sev Severity, at Pos, code, msg, help string) {
	if help == "" {
		help = "nothing to change: the recipe says what shardline will do"
	}
	t.diags = append(t.diags, Diagnostic{Severity: sev, Code: code, Origin: Origin{Kind: FromImport, Pos: at}, Message: msg, Help: help})
}

func (t *ttImport) errorf(at Pos, code, msg, help string) { t.add(SevError, at, code, msg, help) }

// at is where a diagnostic about s points: its key, or the top of the file for a
// default.
func (t *ttImport) at(s ttSetting) Pos {
	if s.given() {
		return s.pos
	}
	return Pos{File: t.path, Line: 1, Col: 1}
}

// refuse reports a setting shardline does not train (SL010).
func (t *ttImport) refuse(s ttSetting, msg, help string) {
	t.errorf(t.at(s), "SL010", fmt.Sprintf("%s: %s", s.name(), msg), help)
}

func (t *ttImport) note(s ttSetting, msg, help string) {
	t.add(SevNote, t.at(s), "SL011", fmt.Sprintf("%s: %s", s.name(), msg), help)
}

// to sets a recipe key from a setting; because, when set, says how the value
// follows from it.
func (t *ttImport) to(key, value string, s ttSetting, because string) {
	name := s.name()
	if because != "" {
		name += " (" + because + ")"
	}
	t.imported = append(t.imported, ImportedValue{Key: key, Value: value, Origin: Origin{Name: name, Pos: s.pos}})
}

func itoa(v int64) string   { return strconv.FormatInt(v, 10) }
func ftoa(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// translate maps every setting onto recipe keys.
func (t *ttImport) translate(worldSize int) {
	t.model()
	t.optimizer()
	dp := t.parallelism(worldSize)
	t.training(dp)
	t.schedule()
	t.activationCheckpoint()
	t.checkpoint()
	t.validation()
	t.data()
	if s := t.get("metrics.log_freq"); s.int() >= 1 {
		t.to("logging.interval", itoa(s.int()), s, "")
	}
	// torchtitan writes TensorBoard events only with enable_tensorboard (its
	// default is off); shardline's go into the run directory.
	tb := t.get("metrics.enable_tensorboard")
	t.to("logging.tensorboard", strconv.FormatBool(tb.flag()), tb, "")
	if s := t.get("fault_tolerance.enable"); s.flag() {
		t.refuse(s, "TorchFT's fault-tolerant replica groups are not part of shardline", "set enable = false")
	}
	for _, k := range []string{"experimental.custom_import", "experimental.custom_args_module", "job.custom_config_module"} {
		if s := t.get(k); s.str() != "" {
			t.refuse(s, "it loads Python code that changes the job; shardline cannot read it", "remove it and describe the model by [model] name and flavor")
		}
	}
	if s := t.get("debug.moe_force_load_balance"); s.flag() {
		t.refuse(s, "shardline routes every token by its scores; there is no forced round-robin", "set moe_force_load_balance = false")
	}
	if s := t.get("job.dump_folder"); s.given() {
		t.to("run.output_dir", s.str(), s, "")
	}
	seed := t.get("debug.seed")
	if !seed.given() {
		seed = t.get("training.seed")
	}
	if seed.given() && seed.int() >= 0 {
		t.to("run.seed", itoa(seed.int()), seed, "")
	}
}

func (t *ttImport) model() {
	name, flavor := t.get("model.name"), t.get("model.flavor")
	var table map[string]ttFlavour
	switch name.str() {
	case "llama3":
		table = ttLlama3
	case "llama4":
		table = ttLlama4
	default:
		t.refuse(name, "shardline imports torchtitan's llama3 and llama4 flavours", `set name = "llama3" (or "llama4") with one of their flavours, or write the recipe's [model] by hand`)
		return
	}
	f, ok := table[flavor.str()]
	if !ok && t.givesShape(name.str()) {
		// The job's own flavour: its shape from --set, the rest torchtitan's.
		t.note(flavor, fmt.Sprintf("torchtitan's %s table has no flavour %q: its shape is the keys given with --set (%s)", name.str(), flavor.str(), strings.Join(ttShapeKeys(name.str()), ", ")), "")
		if name.str() == "llama4" {
			f = ttFlavour{experts: 1, interleave: 2} // MoEArgs' and TransformerModelArgs' defaults below
		}
		t.modelDefaults(name.str(), f, flavor)
		return
	}
	if !ok {
		names := make([]string, 0, len(table))
		for n := range table {
			names = append(names, n)
		}
		sort.Strings(names)
		msg := fmt.Sprintf("%s has no %s flavour %q", name.str(), name.str(), flavor.str())
		if m := Suggest(flavor.str(), names); m != "" {
			msg += fmt.Sprintf("; did you mean %q?", m)
		}
		t.errorf(t.at(flavor), "SL004", msg, "flavours are "+quoteAll(names)+", or give a flavour of your own as keys: recipe import --set "+strings.Join(ttShapeKeys(name.str()), "=… --set ")+"=…")
		return
	}
	because := fmt.Sprintf("torchtitan's %s table", name.str())
	t.to("model.layers", strconv.Itoa(f.layers), flavor, because)
	t.to("model.hidden", strconv.Itoa(f.dim), flavor, because)
	t.to("model.heads", strconv.Itoa(f.heads), flavor, because)
	if f.kvHeads != 0 {
		t.to("model.kv_heads", strconv.Itoa(f.kvHeads), flavor, because)
	}
	t.to("model.vocab_size", strconv.Itoa(f.vocab), flavor, because)
	mult := ""
	if f.ffnMultiplier != 0 {
		mult = fmt.Sprintf(", ×%g", f.ffnMultiplier)
	}
	t.to("model.ffn_hidden", strconv.Itoa(f.ffnHidden()), flavor, fmt.Sprintf("%s: 2/3 of 4·dim%s, rounded up to a multiple of %d", because, mult, f.multipleOf))
	t.to("model.rope_theta", ftoa(f.ropeTheta), flavor, because)
	if r := f.rope; r != nil {
		args := because + ": rope_scaling_args (RoPEScalingArgs)"
		t.to("model.rope_scaling", "llama3", flavor, args)
		t.to("model.rope_scaling_factor", ftoa(r.factor), flavor, args+": scaling_factor")
		t.to("model.rope_scaling_low_freq_factor", ftoa(r.low), flavor, args+": low_freq_factor")
		t.to("model.rope_scaling_high_freq_factor", ftoa(r.high), flavor, args+": high_freq_factor")
		t.to("model.rope_scaling_original_max_position_embeddings", strconv.Itoa(r.original), flavor, args+": original_max_position_embeddings")
	} else {
		t.to("model.rope_scaling", "none", flavor, because)
	}
	if f.blockCausal {
		kind := strings.TrimPrefix(strings.TrimPrefix(flavor.str(), "debugmodel_"), "8B_")
		if f.nopeEvery > 0 {
			kind = "flex"
		}
		t.to("data.reset_attention_mask", "true", flavor, because+": "+fmt.Sprintf(ttBlockCausal, kind))
	}
	if f.nopeEvery > 0 {
		t.to("model.nope_interval", strconv.Itoa(f.nopeEvery), flavor, because+": every_n_layers_nope (iRoPE)")
		t.to("model.nope_first", "true", flavor, because+": its NoPE layers are those whose layer_id % every_n_layers_nope == 0, layers 0, 4, 8…")
		t.to("model.attention_chunk_size", strconv.Itoa(f.chunk), flavor, because+": fixed_attn_block_size, on the RoPE layers (the NoPE layers attend over the whole sequence)")
	}
	if f.experts > 0 {
		t.to("model.moe.num_experts", strconv.Itoa(f.experts), flavor, because)
		t.to("model.moe.expert_ffn_hidden", strconv.Itoa(f.expertHidden()), flavor, because+": the dense size over top_k + shared experts, rounded up")
		t.to("model.moe.layer_freq", strconv.Itoa(f.interleave), flavor, because+": interleave_moe_layer_step")
	}
	t.modelDefaults(name.str(), f, flavor)
}

// ttShapeKeys are the recipe keys a flavour no table has must be given with
// --set: what a table row gives (the llama4 rows' experts too).
func ttShapeKeys(name string) []string {
	keys := []string{"model.layers", "model.hidden", "model.heads", "model.kv_heads", "model.vocab_size", "model.ffn_hidden", "model.rope_theta"}
	if name == "llama4" {
		keys = append(keys, "model.moe.num_experts", "model.moe.expert_ffn_hidden", "model.moe.layer_freq")
	}
	return keys
}

// givesShape reports whether --set gives every ttShapeKeys key of model name.
func (t *ttImport) givesShape(name string) bool {
	if name != "llama3" && name != "llama4" {
		return false
	}
	for _, k := range ttShapeKeys(name) {
		if !t.sets[k] {
			return false
		}
	}
	return true
}

// modelDefaults sets what every flavour of model name shares (torchtitan's
// TransformerModelArgs and, for llama4, MoEArgs: a sigmoid router whose top 1
// score scales the token before its expert, unnormalised and unscaled, a
// shared expert, and auxiliary-loss-free balancing by expert biases moved by
// load_balance_coeff 1e-3 before each optimizer step), then the notes and
// refusals of the rest of [model].
func (t *ttImport) modelDefaults(name string, f ttFlavour, flavor ttSetting) {
	because := fmt.Sprintf("torchtitan's %s defaults", name)
	t.to("model.norm_eps", "1e-05", flavor, because)
	t.to("model.tie_embeddings", "false", flavor, because)
	if f.experts > 0 {
		moe := because + " (MoEArgs)"
		t.to("model.moe.top_k", "1", flavor, moe)
		t.to("model.moe.shared_experts", "1", flavor, moe)
		t.to("model.moe.score_function", "sigmoid", flavor, moe+": score_func sigmoid")
		t.to("model.moe.norm_top_k", "false", flavor, moe+": route_norm false")
		t.to("model.moe.top_k_scale", "1", flavor, moe+": route_scale 1")
		t.to("model.moe.score_before_expert", "true", flavor, moe+": score_before_experts")
		t.to("model.moe.expert_bias", "true", flavor, moe+": load_balance_coeff 1e-3")
		t.to("model.moe.bias_update_rate", "0.001", flavor, moe+": load_balance_coeff")
		t.to("model.moe.aux_loss_coeff", "0", flavor, moe+": no auxiliary loss")
		t.note(flavor, "torchtitan centres each expert-bias update on zero (delta − mean(delta)); shardline moves each bias by ±load_balance_coeff as Megatron does: the same experts are chosen (a bias common to all experts changes no choice)", "")
	}
	// The tokenizer: tokenizer_path, else hf_assets_path (torchtitan's default
	// is its repository's test tokenizer), a tokenizer file or a directory
	// holding one, as data.tokenizer reads it.
	tok := t.get("model.tokenizer_path")
	if tok.str() == "" {
		tok = t.get("model.hf_assets_path")
	}
	if tok.str() != "" {
		t.to("data.tokenizer", tok.str(), tok, "its tokenizer.json, read from the directory")
	}
	t.note(flavor, "weights start from shardline's initialisation (normal, std model.init_std = 0.02), not torchtitan's (truncated normal with depth-scaled output projections): the same model from another starting point", "")
	if s := t.get("model.norm_type"); s.str() != "rmsnorm" {
		t.refuse(s, "shardline normalises with RMSNorm", `set norm_type = "rmsnorm"`)
	}
	t.float8(f)
}

func (t *ttImport) optimizer() {
	name, wd := t.get("optimizer.name"), t.get("optimizer.weight_decay")
	switch name.str() {
	case "AdamW":
		t.to("train.optimizer", "adamw", name, "")
	case "Adam":
		if wd.num() != 0 {
			t.refuse(name, fmt.Sprintf("torch.optim.Adam adds weight decay (%g) to the gradient (L2); shardline's adam and adamw decay the weights directly (decoupled)", wd.num()),
				`set name = "AdamW" (decoupled decay), or weight_decay = 0`)
		}
		t.to("train.optimizer", "adamw", name, "with weight_decay 0, Adam and AdamW are one update")
	default:
		t.refuse(name, "shardline's optimizers are AdamW, Adam and SGD (Megatron-FSDP's)", `set name = "AdamW"`)
	}
	t.to("train.lr", ftoa(t.get("optimizer.lr").num()), t.get("optimizer.lr"), "")
	t.to("train.eps", ftoa(t.get("optimizer.eps").num()), t.get("optimizer.eps"), "")
	t.to("train.beta1", ftoa(t.get("optimizer.beta1").num()), t.get("optimizer.beta1"), "")
	t.to("train.beta2", ftoa(t.get("optimizer.beta2").num()), t.get("optimizer.beta2"), "")
	t.to("train.weight_decay", ftoa(wd.num()), wd, "")
	t.to("train.decay_norms_and_embeddings", "true", wd, "torchtitan decays every parameter, norms and embeddings included")
	if s := t.get("optimizer.early_step_in_backward"); s.flag() {
		t.refuse(s, "it steps each parameter during backward, so gradients are never clipped by their global norm; shardline steps once all gradients are in", "set early_step_in_backward = false")
	}
}

// parallelism sets the mesh and returns the data-parallel degree (the number of
// data-parallel ranks torchtitan's batch counts).
// ttMaxRanks is the most ranks a recipe has (parallel.world_size's bound).
const ttMaxRanks = maxRanks

func (t *ttImport) parallelism(worldSize int) int64 {
	deg := func(k string) ttSetting { return t.get("parallelism." + k) }
	rep, shard, tp, pp, cp := deg("data_parallel_replicate_degree"), deg("data_parallel_shard_degree"), deg("tensor_parallel_degree"), deg("pipeline_parallel_degree"), deg("context_parallel_degree")
	ep, etp := deg("expert_parallel_degree"), deg("expert_tensor_parallel_degree")
	bad := false
	for _, s := range []ttSetting{rep, tp, pp, cp, ep, etp} {
		if s.int() < 1 {
			t.errorf(t.at(s), "SL008", fmt.Sprintf("%s: a parallel degree is at least 1", s.name()), "set it to 1 or more")
			bad = true
		}
	}
	if shard.int() == 0 || shard.int() < -1 {
		t.errorf(t.at(shard), "SL008", fmt.Sprintf("%s: the shard degree is -1 (the ranks left over) or at least 1", shard.name()), "set it to -1")
		bad = true
	}
	// Degrees are bounded before they are multiplied: two degrees of 2^32 made
	// the product wrap to 0, which then divided the world size.
	for _, s := range []ttSetting{rep, shard, tp, pp, cp, ep, etp} {
		if s.int() > ttMaxRanks {
			t.errorf(t.at(s), "SL008", fmt.Sprintf("%s: a parallel degree is at most %d, the most ranks a recipe has", s.name(), ttMaxRanks), fmt.Sprintf("set it to at most %d", ttMaxRanks))
			bad = true
		}
	}
	if bad {
		return 1
	}
	other := int64(1)
	for _, s := range []ttSetting{rep, tp, pp, cp} {
		if other *= s.int(); other > ttMaxRanks {
			t.errorf(t.at(s), "SL008", fmt.Sprintf("replicate × tp × pp × cp reaches %d at %s, over the %d ranks a recipe has", other, s.name(), ttMaxRanks),
				"lower the parallel degrees")
			return 1
		}
	}
	n := shard.int()
	switch {
	case n == -1 && worldSize == 0:
		n = 1
		t.note(shard, fmt.Sprintf("the shard degree takes the ranks left over; with no --world-size the recipe has world_size %d (data_parallel_shard_degree 1)", other),
			"pass recipe import torchtitan --world-size N (the ranks torchrun starts)")
	case n == -1:
		if int64(worldSize)%other != 0 {
			t.errorf(t.at(shard), "SL201", fmt.Sprintf("--world-size %d is not divisible by replicate × tp × pp × cp = %d, so %s leaves no whole shard degree", worldSize, other, shard.name()),
				fmt.Sprintf("use a world size that is a multiple of %d", other))
			return 1
		}
		n = int64(worldSize) / other
	case worldSize != 0 && n*other != int64(worldSize):
		t.errorf(t.at(shard), "SL201", fmt.Sprintf("--world-size %d is not replicate × shard × tp × pp × cp = %d (as torchtitan's ParallelDims requires)", worldSize, n*other),
			"set data_parallel_shard_degree = -1, or pass the matching --world-size")
		return 1
	}
	world := n * other
	if world > ttMaxRanks {
		t.errorf(t.at(shard), "SL008", fmt.Sprintf("replicate × shard × tp × pp × cp = %d ranks, over the %d a recipe has", world, ttMaxRanks), "lower the parallel degrees")
		return 1
	}
	because := fmt.Sprintf("replicate %d × shard %d × tp %d × pp %d × cp %d", rep.int(), n, tp.int(), pp.int(), cp.int())
	t.to("parallel.world_size", itoa(world), shard, because)
	t.to("parallel.device", "cuda", shard, "torchtitan trains on GPUs; shardline run --device cpu trains the recipe on the CPU")
	for _, m := range []struct {
		key string
		s   ttSetting
	}{{"parallel.tensor_parallel", tp}, {"parallel.pipeline_parallel", pp}, {"parallel.context_parallel", cp}, {"parallel.expert_parallel", ep}, {"parallel.expert_tensor_parallel", etp}} {
		if m.s.given() || m.s.int() != 1 {
			t.to(m.key, itoa(m.s.int()), m.s, "")
		}
	}
	fsdp := n*cp.int() > 1
	switch {
	case rep.int() > 1 && fsdp:
		t.refuse(rep, fmt.Sprintf("HSDP (%d replicas of groups sharded %d ways); shardline's FSDP shards over the whole data-parallel group", rep.int(), n*cp.int()),
			"set data_parallel_replicate_degree = 1 and data_parallel_shard_degree = -1: every data-parallel rank then holds a shard")
	case rep.int() > 1:
		t.to("fsdp.data_parallel_sharding_strategy", "no_shard", rep, "data_parallel_shard_degree 1: torchtitan's DDP, replicated weights and all-reduced gradients")
	case fsdp:
		t.to("fsdp.data_parallel_sharding_strategy", "optim_grads_params", shard, "torchtitan's FSDP2 shards parameters, gradients and optimizer state")
		t.to("fsdp.init_model_with_meta_device", "true", shard, "torchtitan builds the model on the meta device and initialises each rank's shard")
	}
	if s := deg("fsdp_reshard_after_forward"); s.given() {
		switch s.str() {
		case "default", "always":
		case "never":
			t.note(s, "shardline gathers each unit again for backward (optim_grads_params): the same numbers, less memory, more communication", "")
		default:
			t.errorf(t.at(s), "SL004", fmt.Sprintf("%s: torchtitan takes default, always or never", s.name()), `set it to "default"`)
		}
	}
	// torchtitan trains in mixed precision under FSDP, and under autocast otherwise
	// unless tensor or pipeline parallelism is on (maybe_enable_amp).
	mp := t.get("training.mixed_precision_param")
	switch {
	case mp.str() == "bfloat16" && (fsdp || (tp.int() == 1 && pp.int() == 1)):
		t.to("precision.bf16", "true", mp, "")
	case mp.str() == "bfloat16":
		t.note(mp, "torchtitan computes in fp32 with tensor or pipeline parallelism and no FSDP (no autocast there); so does the recipe", "")
	case mp.str() == "float32":
	default:
		t.errorf(t.at(mp), "SL004", fmt.Sprintf("%s: torchtitan takes bfloat16 or float32", mp.name()), `set it to "bfloat16"`)
	}
	if s := t.get("training.mixed_precision_reduce"); s.str() != "float32" {
		t.errorf(t.at(s), "SL004", fmt.Sprintf("%s: torchtitan reduces gradients in float32 only", s.name()), `set it to "float32"`)
	} else {
		t.to("fsdp.grad_reduce_in_bf16", "false", s, "torchtitan reduces gradients in float32")
	}
	if s := t.get("training.dtype"); s.str() == "bfloat16" {
		t.to("precision.main_params_dtype", "bf16", s, "weights and optimizer state in bf16")
	} else if s.str() != "float32" {
		t.errorf(t.at(s), "SL004", fmt.Sprintf("%s: torchtitan takes bfloat16 or float32", s.name()), `set it to "float32"`)
	}
	return rep.int() * n
}

func (t *ttImport) training(dp int64) {
	local, global := t.get("training.local_batch_size"), t.get("training.global_batch_size")
	t.to("train.micro_batch_size", itoa(local.int()), local, "")
	if global.int() < 0 && (local.int() < 1 || local.int() > 1<<30) {
		t.errorf(t.at(local), "SL008", fmt.Sprintf("%s: a micro-batch is 1 to %d sequences", local.name(), 1<<30), "set local_batch_size to the sequences each rank takes per step")
	} else if global.int() < 0 {
		t.to("train.global_batch_size", itoa(local.int()*dp), global, fmt.Sprintf("local_batch_size %d × data-parallel degree %d: one micro-batch per step", local.int(), dp))
	} else {
		t.to("train.global_batch_size", itoa(global.int()), global, "")
	}
	t.to("model.seq_len", itoa(t.get("training.seq_len").int()), t.get("training.seq_len"), "")
	t.to("train.clip_grad", ftoa(t.get("training.max_norm").num()), t.get("training.max_norm"), "")
	t.to("train.steps", itoa(t.get("training.steps").int()), t.get("training.steps"), "")
	if s := t.get("training.enable_cpu_offload"); s.flag() {
		t.refuse(s, "shardline keeps weights and optimizer state on the device", "set enable_cpu_offload = false; FSDP (optim_grads_params) over more ranks lowers the memory per rank")
	}
}

// schedule maps torchtitan's warmup-stable-decay schedule
// (components/lr_scheduler.py): linear warmup, one step at the peak, then decay
// over decay_steps to min_lr_factor; shardline's schedule equals it when the stable
// phase is that one step.
func (t *ttImport) schedule() {
	steps := t.get("training.steps")
	total := steps.int()
	if s := t.get("lr_scheduler.total_steps"); s.given() && s.int() > 0 {
		total = s.int()
	}
	wu := t.get("lr_scheduler.warmup_steps")
	warmup := wu.int()
	if warmup > total {
		t.note(wu, fmt.Sprintf("more warmup steps than the schedule's %d; torchtitan cuts warmup to %d, and so does the recipe", total, total), "")
		warmup = total
	}
	if warmup < 0 {
		t.errorf(t.at(wu), "SL008", fmt.Sprintf("%s: warmup steps are 0 or more", wu.name()), "set it to 0 or more")
		warmup = 0
	}
	decay := total - warmup
	ratio := t.get("lr_scheduler.decay_ratio")
	if ratio.given() && (ratio.num() < 0 || ratio.num() > 1) {
		t.errorf(t.at(ratio), "SL008", fmt.Sprintf("%s: a fraction of the steps, in [0, 1]", ratio.name()), "remove it (decay from the end of warmup), or set it in [0, 1]")
		return
	}
	if ratio.given() {
		d := int64(math.RoundToEven(float64(total) * ratio.num())) // Python's round()
		if d < decay {
			decay = d
		}
	}
	stepsGiven := steps.given() || t.get("lr_scheduler.total_steps").given()
	if stable := total + 1 - warmup - decay; stable > 1 && !stepsGiven {
		// Not SL010: the stable phase comes from torchtitan's default step count,
		// which a job usually overrides on torchtitan's command line.
		t.errorf(t.at(ratio), "SL007", fmt.Sprintf("%s: the file sets no [training] steps, and with torchtitan's default of %d (and %d of warmup) the schedule would hold the peak for %d steps before decaying; the import cannot tell the job's step count", ratio.name(), total, warmup, stable),
			"set [training] steps in the job file to the job's step count (a --training.steps on torchtitan's command line is not in the file) and import again")
	} else if stable > 1 {
		t.refuse(ratio, fmt.Sprintf("with %d steps and %d of warmup it holds the peak for %d steps before decaying (warmup-stable-decay); shardline's schedule decays right after warmup", total, warmup, stable),
			fmt.Sprintf("remove decay_ratio, or set it to at least %g", float64(total-warmup)/float64(total)))
	}
	t.to("train.warmup_steps", itoa(warmup), wu, "")
	if decay > 0 {
		from, because := steps, "steps − warmup: torchtitan decays from the step after warmup to the end of the schedule"
		if s := t.get("lr_scheduler.total_steps"); s.given() && s.int() > 0 {
			from = s
		}
		if ratio.given() {
			from, because = ratio, "round(steps × decay_ratio), at most steps − warmup"
		}
		t.to("train.lr_decay_steps", itoa(decay), from, because)
	}
	dt := t.get("lr_scheduler.decay_type")
	switch dt.str() {
	case "linear", "cosine":
		t.to("train.lr_schedule", dt.str(), dt, "")
	case "sqrt":
		t.refuse(dt, "1 − √progress decay; shardline decays linearly or by a cosine", `set decay_type = "linear" or "cosine"`)
	default:
		t.errorf(t.at(dt), "SL004", fmt.Sprintf("%s: torchtitan takes linear, sqrt or cosine", dt.name()), `set decay_type = "linear"`)
	}
	t.to("train.min_lr_factor", ftoa(t.get("lr_scheduler.min_lr_factor").num()), t.get("lr_scheduler.min_lr_factor"), "")
}

func (t *ttImport) activationCheckpoint() {
	s := t.get("activation_checkpoint.mode")
	switch s.str() {
	case "none", "full":
		t.to("activation_checkpoint.mode", s.str(), s, "")
	case "selective":
		opt := t.get("activation_checkpoint.selective_ac_option")
		t.to("activation_checkpoint.mode", "selective", s, "")
		if opt.str() != "op" {
			t.note(opt, fmt.Sprintf("torchtitan's selective policy (one layer in every %s recomputed whole) differs from shardline's, which keeps every layer's products and recomputes their elementwise rest (torchtitan's op policy): the same numbers, another memory and time trade", opt.str()), "")
		}
	case "memory_budget":
		t.refuse(s, "the memory-budget policy is torch.compile's min-cut partitioner", `set mode = "selective" or "full"`)
	default:
		t.errorf(t.at(s), "SL004", fmt.Sprintf("%s: torchtitan takes none, selective, full or memory_budget", s.name()), `set mode = "selective"`)
	}
}

func (t *ttImport) checkpoint() {
	enable := t.get("checkpoint.enable")
	if !enable.flag() {
		return
	}
	folder, dump := t.get("checkpoint.folder"), t.get("job.dump_folder")
	t.to("checkpoint.dir", filepath.Join(dump.str(), folder.str()), folder, "torchtitan saves under [job] dump_folder")
	if s := t.get("checkpoint.interval"); s.int() > 0 {
		t.to("checkpoint.interval", itoa(s.int()), s, "")
	} else {
		t.errorf(t.at(s), "SL008", fmt.Sprintf("%s: torchtitan saves every interval steps, a positive number", s.name()),
			"set interval to a positive number of steps, or enable = false for no checkpoints")
	}
	if s := t.get("checkpoint.keep_latest_k"); s.int() >= 0 {
		t.to("checkpoint.keep_last", itoa(s.int()), s, "")
	} else {
		t.errorf(t.at(s), "SL008", fmt.Sprintf("%s: the number of checkpoints to keep is 0 (all) or more", s.name()),
			"set keep_latest_k to 0 (keep all) or a positive number")
	}
}

// data carries the job's data or refuses it: a dataset_path becomes data.path
// (and the validation one data.val_path); a dataset torchtitan downloads from
// the Hugging Face hub cannot be carried (the tokenizer is model's). A recipe
// that trained on other data than the job never imports clean.
func (t *ttImport) data() {
	switch s := t.get("training.dataset_path"); {
	case s.str() != "":
		t.to("data.path", s.str(), s, "")
	case t.sets["data.path"] || t.sets["data.sources"]:
		ds := t.get("training.dataset")
		t.note(ds, fmt.Sprintf("torchtitan downloads %q from the Hugging Face hub; the recipe trains on the data given with --set instead", ds.str()), "")
	default:
		ds := t.get("training.dataset")
		t.refuse(ds, fmt.Sprintf("torchtitan downloads %q from the Hugging Face hub; shardline reads files, so the data cannot be carried", ds.str()),
			"set [training] dataset_path to a local copy (C4's .json.gz files are JSON lines read from their text field; docs/data.md), or give its path with --set data.path=PATH")
	}
	if t.get("validation.enable").flag() {
		if s := t.get("validation.dataset_path"); s.str() != "" {
			t.to("data.val_path", s.str(), s, "")
			t.to("data.val_fraction", "0", s, "the validation data is data.val_path")
		} else if t.sets["data.val_path"] {
			ds := t.get("validation.dataset")
			t.note(ds, fmt.Sprintf("torchtitan downloads %q from the Hugging Face hub; the recipe validates on the data given with --set instead", ds.str()), "")
		} else {
			ds := t.get("validation.dataset")
			t.refuse(ds, fmt.Sprintf("torchtitan downloads %q from the Hugging Face hub; shardline reads files, so the validation data cannot be carried", ds.str()),
				"set [validation] dataset_path to a local copy")
		}
	}
}

func (t *ttImport) validation() {
	enable := t.get("validation.enable")
	if !enable.flag() {
		t.to("train.eval_interval", "0", enable, "no validation")
		return
	}
	t.to("train.eval_interval", itoa(t.get("validation.freq").int()), t.get("validation.freq"), "")
	if s := t.get("validation.steps"); s.int() > 0 {
		t.to("train.eval_steps", itoa(s.int()), s, "")
	} else {
		t.note(s, "torchtitan's -1 validates on the whole validation set; shardline validates train.eval_steps batches (10 unless set)", "set train.eval_steps in the recipe")
	}
}

// ttFloat8Keys are the float8 converters' settings (current names).
var ttFloat8Keys = []string{
	"quantize.linear.float8.enable_fsdp_float8_all_gather", "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
	"quantize.linear.float8.recipe_name", "quantize.linear.float8.filter_fqns", "quantize.linear.float8.emulate",
	"quantize.linear.float8.force_recompute_fp8_weight_in_bwd", "quantize.grouped_mm.float8.fqns",
}

// float8 maps model.converters and the float8 settings onto precision.fp8.
// torchtitan's float8 converter swaps the linear layers for torchao's
// Float8Linear (its tensorwise recipe unless recipe_name says otherwise:
// E4M3 weights and activations, E5M2 output gradients, each tensor scaled by
// its own amax), except the modules filter_fqns names and those with a size
// that is not a multiple of 16; quantize.grouped_mm.float8 converts the MoE
// experts' grouped products. MX converters are refused.
func (t *ttImport) float8(f ttFlavour) {
	conv := t.get("model.converters")
	linear, grouped := false, false
	seen := map[string]bool{}
	for _, c := range conv.strs() {
		c = strings.TrimSpace(c)
		switch {
		case seen[c] || c == "": // refused once
		case strings.Contains(c, "float8") && strings.Contains(c, "grouped_mm"):
			grouped = true
		case strings.Contains(c, "float8"):
			linear = true
		case strings.Contains(c, "mx"):
			t.refuse(conv, fmt.Sprintf("converter %q trains in MX formats (a power-of-two scale per block of 32 values); shardline's FP8 scales per tensor", c),
				`use the float8 converter (precision.fp8 with recipe "tensorwise"), or remove it`)
		default:
			t.refuse(conv, fmt.Sprintf("converter %q changes the model's modules; shardline has no converters", c), "remove it")
		}
		seen[c] = true
	}
	old := t.get("float8.enable_float8_linear")
	if old.flag() {
		linear = true
	}
	if !linear && !grouped {
		for _, k := range ttFloat8Keys {
			if s, ok := t.set[k]; ok {
				t.note(s, "no effect in shardline: FP8 is off unless model.converters names float8 (as in torchtitan)", "")
			}
		}
		return
	}
	from := conv
	if !conv.given() {
		from = old
	}
	if !linear {
		t.refuse(conv, "FP8 for the MoE experts' grouped products alone; shardline's FP8 (precision.fp8) covers the linear layers, the experts' optionally",
			`add "float8" to converters as well, or remove the grouped_mm converter`)
		return
	}
	t.to("precision.fp8.format", "hybrid", from, "torchao's Float8Linear: E4M3 weights and activations, E5M2 output gradients")
	recipe := t.get("quantize.linear.float8.recipe_name")
	switch recipe.str() {
	case "", "tensorwise":
		t.to("precision.fp8.recipe", "tensorwise", recipe, "each tensor scaled by its own amax as it is cast")
	case "rowwise", "rowwise_with_gw_hp":
		t.refuse(recipe, "scales each row of a tensor (torchao's rowwise recipes); shardline's FP8 scales per tensor", `remove recipe_name (tensorwise), or set recipe_name = "tensorwise"`)
	default:
		t.errorf(t.at(recipe), "SL004", fmt.Sprintf("%s: torchtitan takes tensorwise, rowwise or rowwise_with_gw_hp", recipe.name()), `set recipe_name = "tensorwise"`)
	}
	gather := t.get("quantize.linear.float8.enable_fsdp_float8_all_gather")
	t.to("precision.fp8.param_gather", strconv.FormatBool(gather.flag()), gather, "")
	for _, k := range []string{"quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp", "quantize.linear.float8.force_recompute_fp8_weight_in_bwd", "quantize.linear.float8.emulate"} {
		if s, ok := t.set[k]; ok && s.flag() {
			why := map[string]string{
				"quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp": "a communication schedule of torchao's (every weight's amax in one all-reduce); the scales are the same",
				"quantize.linear.float8.force_recompute_fp8_weight_in_bwd":        "a memory choice of torchao's backward (recast the weight rather than keep its FP8 copy); the products are the same",
				"quantize.linear.float8.emulate":                                  "torchao's emulation computes the same products without FP8 hardware",
			}[k]
			t.note(s, "no effect in shardline: "+why, "")
		}
	}
	filter := t.get("quantize.linear.float8.filter_fqns")
	head, router := false, false
	for _, q := range filter.strs() {
		switch q = strings.TrimSpace(q); {
		case q == "output":
			head = true
		case q == "router" || strings.HasSuffix(q, "router.gate") || strings.HasSuffix(q, ".router"):
			router = true
		case q == "":
		default:
			t.refuse(filter, fmt.Sprintf("keeps module %q out of FP8; shardline keeps the head (\"output\"), the router (\"router.gate\") or whole first and last layers (precision.fp8.first_last_layers_bf16) out of FP8, not single modules", q),
				`keep "output" and "router.gate" in filter_fqns and remove the others`)
		}
	}
	t.to("precision.fp8.head_bf16", strconv.FormatBool(head), filter, `"output" in filter_fqns keeps the head out of FP8`)
	if f.experts > 0 {
		if !router && f.experts%16 != 0 {
			router = true
			t.to("precision.fp8.router_bf16", "true", filter, fmt.Sprintf("torchao skips a linear layer with a size that is not a multiple of 16: the router's %d experts", f.experts))
		} else {
			t.to("precision.fp8.router_bf16", strconv.FormatBool(router), filter, `"router.gate" in filter_fqns keeps the router out of FP8`)
		}
		t.to("precision.fp8.experts", strconv.FormatBool(grouped), t.get("quantize.grouped_mm.float8.fqns"), "the quantize.grouped_mm.float8 converter computes the experts' products in FP8")
		if grouped {
			t.note(conv, "torchao's float8 grouped products scale rowwise (a scale per token row and per row of each expert's weight); shardline scales per tensor, as the linear layers: the grouped tokens under one scale, each expert's weight under its own (docs/engine.md, \"FP8\"): the same products at a coarser scaling", "")
		}
	} else if grouped {
		t.note(conv, "no effect in shardline: the grouped_mm converter converts MoE experts, and the model has none", "remove it")
	}
}
