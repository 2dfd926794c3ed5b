package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/shardline/shardline/trainer/tokenizer"
)

// Lint checks a resolved recipe against shardline's rules and returns every finding,
// sorted by position. env is the environment (os.Environ() form): a few rules read
// variables that change how CUDA and NCCL behave. Lint reads the file system only to
// warn about data paths that do not exist.
func Lint(r *Resolved, env []string) Diagnostics { return LintWith(r, env, LintOptions{}) }

// LintOptions are the CLI settings lint needs to judge a recipe as run would.
type LintOptions struct {
	// DataRoot is the directory a relative data.path is read from (the data_root
	// setting); empty means the working directory.
	DataRoot string
}

// LintWith is Lint with the CLI's settings.
func LintWith(r *Resolved, env []string, o LintOptions) Diagnostics {
	c := &checker{r: r, rc: &r.Recipe, env: EnvMap(env), opts: o}
	c.megatronFSDP()
	c.fp8()
	c.parallelShape()
	c.model()
	c.units()
	c.files()
	c.runName()
	c.unexecuted()
	c.diags.InRecipe(r.Path)
	c.diags.Sort()
	return c.diags
}

type checker struct {
	r     *Resolved
	rc    *Recipe
	env   map[string]string
	opts  LintOptions
	diags Diagnostics
}

// EnvMap turns an os.Environ()-style list into a map (later entries win).
func EnvMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

func (c *checker) report(sev Severity, code, msg, help string, keys ...string) {
	c.diags = append(c.diags, DiagnosticAt(c.r, sev, code, msg, help, keys...))
}

// DiagnosticAt builds a finding located at the key among keys that the most specific
// layer set (a flag beats --set, which beats the environment, which beats a file):
// the override that broke the rule is the setting to look at. Ties go to the first
// key; when no key was set explicitly the finding points at the first key's file.
func DiagnosticAt(r *Resolved, sev Severity, code, msg, help string, keys ...string) Diagnostic {
	at, best := keys[0], FromDefault
	for _, k := range keys {
		if kind := r.Origin(k).Kind; kind != FromImplied && kind > best {
			at, best = k, kind
		}
	}
	return Diagnostic{Severity: sev, Code: code, Key: at, Message: msg, Help: help, Origin: r.Origin(at), Recipe: r.Path}
}

// runName refuses a run name that would place the run directory outside
// run.output_dir.
func (c *checker) runName() {
	if err := CheckRunName(c.rc.Run.Name); err != nil {
		c.report(SevError, "SL009", fmt.Sprintf("run.name (%q) must be one directory name: %v", c.rc.Run.Name, err),
			`use letters, digits, "-", "_" and "." (e.g. name = "tiny-lr3e-4"); choose where runs go with run.output_dir`, "run.name")
	}
}

func (c *checker) megatronFSDP() {
	f, rc := c.rc.FSDP, c.rc
	strategy := f.DataParallelShardingStrategy
	if f.UseMegatronFSDP {
		if !f.UseDistributedOptimizer {
			c.report(SevError, "SL101", "fsdp.use_distributed_optimizer (false) must be true when fsdp.use_megatron_fsdp is true",
				"set use_distributed_optimizer = true (Megatron-FSDP shards optimizer state through it)",
				"fsdp.use_distributed_optimizer", "fsdp.use_megatron_fsdp")
		}
		if f.GradientAccumulationFusion {
			c.report(SevError, "SL102", "fsdp.gradient_accumulation_fusion (true) must be false with Megatron-FSDP",
				"set gradient_accumulation_fusion = false, or pass --no-gradient-accumulation-fusion",
				"fsdp.gradient_accumulation_fusion", "fsdp.use_megatron_fsdp")
		}
		if rc.Checkpoint.CkptFormat != "fsdp_dtensor" {
			c.report(SevError, "SL103", fmt.Sprintf("checkpoint.ckpt_format (%q) must be \"fsdp_dtensor\" with Megatron-FSDP", rc.Checkpoint.CkptFormat),
				`set ckpt_format = "fsdp_dtensor" under [checkpoint]`, "checkpoint.ckpt_format", "fsdp.use_megatron_fsdp")
		}
	} else {
		if rc.Checkpoint.CkptFormat == "fsdp_dtensor" {
			c.report(SevError, "SL104", `checkpoint.ckpt_format ("fsdp_dtensor") needs fsdp.use_megatron_fsdp = true`,
				`set use_megatron_fsdp = true, or ckpt_format = "torch_dist"`, "checkpoint.ckpt_format", "fsdp.use_megatron_fsdp")
		}
		if strategy == "optim_grads" || strategy == "optim_grads_params" {
			c.report(SevError, "SL113", fmt.Sprintf("fsdp.data_parallel_sharding_strategy (%q) shards gradients and needs fsdp.use_megatron_fsdp = true", strategy),
				`set use_megatron_fsdp = true, or data_parallel_sharding_strategy = "optim" (distributed optimizer) or "no_shard"`,
				"fsdp.data_parallel_sharding_strategy", "fsdp.use_megatron_fsdp")
		}
	}
	if f.InitModelWithMetaDevice && strategy == "no_shard" {
		c.report(SevError, "SL105", `fsdp.init_model_with_meta_device (true) needs a sharding strategy other than "no_shard"`,
			`with no_shard every rank holds the whole model anyway: set init_model_with_meta_device = false, or data_parallel_sharding_strategy = "optim_grads_params"`,
			"fsdp.init_model_with_meta_device", "fsdp.data_parallel_sharding_strategy")
	}
	if f.UseNCCLUB {
		if c.r.Explicit("fsdp.fsdp_double_buffer") && !f.FSDPDoubleBuffer {
			c.report(SevError, "SL106", "fsdp.fsdp_double_buffer (false) must be true with fsdp.use_nccl_ub: NCCL user buffers are registered once, so gather buffers must be persistent",
				"remove fsdp_double_buffer = false, or set use_nccl_ub = false", "fsdp.fsdp_double_buffer")
		} else if c.r.Origin("fsdp.fsdp_double_buffer").Kind == FromImplied {
			c.report(SevNote, "SL106", "fsdp.use_nccl_ub turns fsdp.fsdp_double_buffer on",
				"set fsdp_double_buffer = true to make it explicit", "fsdp.use_nccl_ub")
		}
		if rc.Parallel.CUDAExpandableSegments {
			c.report(SevError, "SL107", "fsdp.use_nccl_ub (true) cannot be used with parallel.cuda_expandable_segments (true)",
				"NCCL user buffers need fixed allocations: set one of them to false", "parallel.cuda_expandable_segments", "fsdp.use_nccl_ub")
		} else if conf := c.env["PYTORCH_CUDA_ALLOC_CONF"]; rc.Parallel.Device == "cuda" && strings.Contains(strings.ReplaceAll(conf, " ", ""), "expandable_segments:True") {
			c.report(SevError, "SL107", fmt.Sprintf("fsdp.use_nccl_ub (true) cannot be used with PYTORCH_CUDA_ALLOC_CONF=%q (expandable segments)", conf),
				"remove expandable_segments:True from PYTORCH_CUDA_ALLOC_CONF, or set use_nccl_ub = false", "fsdp.use_nccl_ub")
		}
	}
	overlap := f.UseMegatronFSDP && (f.OverlapGradReduce || f.OverlapParamGather)
	if v, ok := c.env["CUDA_DEVICE_MAX_CONNECTIONS"]; ok && overlap && rc.Parallel.Device == "cuda" {
		tradeoff := ""
		if rc.Parallel.TensorParallel > 1 || rc.Parallel.ContextParallel > 1 {
			tradeoff = "; with tp or cp > 1, Megatron sets it to 1 to order TP/CP communication before compute, which costs FSDP its overlap: prefer FSDP overlap and unset it, or turn FSDP overlap off to keep TP/CP ordering"
		}
		if strings.TrimSpace(v) == "1" {
			c.report(SevError, "SL108", "CUDA_DEVICE_MAX_CONNECTIONS=1 serialises the communication and compute streams, so fsdp.overlap_grad_reduce / overlap_param_gather cannot overlap anything",
				"unset CUDA_DEVICE_MAX_CONNECTIONS, or set overlap_grad_reduce = false and overlap_param_gather = false"+tradeoff,
				"fsdp.overlap_param_gather", "fsdp.overlap_grad_reduce")
		} else {
			c.report(SevWarning, "SL108", fmt.Sprintf("CUDA_DEVICE_MAX_CONNECTIONS=%s is set while Megatron-FSDP overlaps communication", v),
				"Megatron-FSDP is tuned with the variable unset (the driver default of 8 queues); unset it unless you measured otherwise"+tradeoff,
				"fsdp.overlap_param_gather", "fsdp.overlap_grad_reduce")
		}
	}
	switch rc.Train.Optimizer {
	case "adamw", "adam", "sgd":
	default:
		msg := fmt.Sprintf("train.optimizer (%q) is not supported: Megatron-FSDP's distributed optimizer runs adamw, adam or sgd", rc.Train.Optimizer)
		if m := Suggest(rc.Train.Optimizer, []string{"adamw", "adam", "sgd"}); m != "" {
			msg += fmt.Sprintf("; did you mean %q?", m)
		}
		c.report(SevError, "SL109", msg, `set optimizer = "adamw" (or "adam", "sgd")`, "train.optimizer")
	}
	if (strategy == "optim_grads" || strategy == "optim_grads_params") && !f.CalculatePerTokenLoss {
		c.report(SevWarning, "SL110", fmt.Sprintf("fsdp.calculate_per_token_loss is off while gradients are sharded (%s): micro-batch averages then weight tokens unevenly", strategy),
			"set calculate_per_token_loss = true so the loss is the sum of token losses over the global token count",
			"fsdp.calculate_per_token_loss", "fsdp.data_parallel_sharding_strategy")
	}
	if rc.Precision.BF16 && !f.GradReduceInBF16 && c.dataParallel()*rc.Parallel.ContextParallel > 1 {
		sev := SevWarning
		if c.r.Origin("fsdp.grad_reduce_in_bf16").Kind == FromImport {
			sev = SevNote // the imported job's own choice, kept: a suggestion, not a defect
		}
		c.report(sev, "SL111", "precision.bf16 is on but fsdp.grad_reduce_in_bf16 is off: gradients are held and reduced in fp32, twice the memory and bytes",
			"set grad_reduce_in_bf16 = true (gradients are then held and accumulated in bf16, as Megatron-FSDP's; each kernel and reduction sums in fp32 and rounds once)", "fsdp.grad_reduce_in_bf16", "precision.bf16")
	}
}

// dataParallel is the data-parallel degree, or 0 when the world size does not divide.
func (c *checker) dataParallel() int {
	p := c.rc.Parallel
	mp := p.TensorParallel * p.ContextParallel * p.PipelineParallel
	if mp == 0 || p.WorldSize%mp != 0 {
		return 0
	}
	return p.WorldSize / mp
}

// parallelShape reports the shape rules (ShapeProblems, shared with the plan
// compiler) and what the trainer does not run at all: pipeline schedules and
// expert tensor parallelism.
func (c *checker) parallelShape() {
	p := c.rc.Parallel
	for _, sp := range ShapeProblems(c.rc) {
		c.report(SevError, sp.Code, sp.Msg, sp.Help, sp.Keys...)
	}
	if p.PipelineParallel > 1 {
		c.report(SevError, "SL209", fmt.Sprintf("parallel.pipeline_parallel (%d) is not supported yet: shardline's trainer runs no pipeline schedule", p.PipelineParallel),
			"set pipeline_parallel = 1 and use FSDP (optim_grads_params), tensor or expert parallelism to fit the model", "parallel.pipeline_parallel")
	}
	if c.rc.Model.MoE.NumExperts > 0 && p.ExpertTensorParallel > 1 {
		c.report(SevError, "SL211", fmt.Sprintf("parallel.expert_tensor_parallel (%d) is not supported yet: shardline splits experts over ranks (expert_parallel), not within an expert", p.ExpertTensorParallel),
			"set expert_tensor_parallel = 1 and raise expert_parallel instead (`shardline plan --sweep parallel.expert_parallel=...` compares)", "parallel.expert_tensor_parallel")
	}
}

func (c *checker) model() {
	m := c.rc.Model
	if tokenizer.IsFileSpec(c.rc.Data.Tokenizer) {
		c.tokenizerFile()
		return
	}
	if tok := c.rc.Data.Tokenizer; tokenizerVocab[tok] > m.VocabSize {
		c.report(SevError, "SL305", fmt.Sprintf("model.vocab_size (%d) is smaller than the %s tokenizer's %d tokens", m.VocabSize, tok, tokenizerVocab[tok]),
			fmt.Sprintf("set vocab_size = %d (or more)", tokenizerVocab[tok]), "model.vocab_size", "data.tokenizer")
	}
	d := c.rc.Data
	for _, k := range []struct {
		key string
		on  bool
	}{{"data.eod_mask_loss", d.EODMaskLoss}, {"data.reset_attention_mask", d.ResetAttentionMask}} {
		if k.on && !TokenizerHasEOS(d.Tokenizer) {
			c.report(SevError, "SL306", fmt.Sprintf("%s = true needs the tokenizer's end-of-text token to find document boundaries, and the %s tokenizer has none", k.key, d.Tokenizer),
				`set data.tokenizer = "gpt2" (documents end with <|endoftext|>), or remove `+k.key, k.key, "data.tokenizer")
		}
	}
	c.ropeScaling()
	if n := m.AttentionChunkSize; n > 0 && n >= m.SeqLen {
		c.report(SevNote, "SL307", fmt.Sprintf("model.attention_chunk_size (%d) is not below model.seq_len (%d): every sequence lies in one chunk, so training attends as without chunks", n, m.SeqLen),
			"lower attention_chunk_size below seq_len to train chunked attention, set it to 0, or keep it as part of the model's definition (Llama 4 keeps 8192 at any context)", "model.attention_chunk_size", "model.seq_len")
	}
}

// ropeScaling checks the llama3 RoPE scaling's numbers: its high-frequency
// factor is at least its low one (SL309: with it below, the band the scaling
// blends over is turned inside out; equal factors, Llama 4's, are a step), and
// none differs from its default while model.rope_scaling is none, where it
// would change nothing (SL310).
func (c *checker) ropeScaling() {
	m := c.rc.Model
	def := Default().Model
	if m.RopeScaling != "llama3" {
		for _, k := range []struct {
			key      string
			val, def any
		}{
			{"model.rope_scaling_factor", m.RopeScalingFactor, def.RopeScalingFactor},
			{"model.rope_scaling_low_freq_factor", m.RopeScalingLowFreqFactor, def.RopeScalingLowFreqFactor},
			{"model.rope_scaling_high_freq_factor", m.RopeScalingHighFreqFactor, def.RopeScalingHighFreqFactor},
			{"model.rope_scaling_original_max_position_embeddings", m.RopeScalingOriginalMaxPositionEmbeddings, def.RopeScalingOriginalMaxPositionEmbeddings},
		} {
			if k.val != k.def {
				c.report(SevError, "SL310", fmt.Sprintf("%s = %s while model.rope_scaling = %q: the llama3 scaling's numbers change nothing without it", k.key, FormatValue(k.val), m.RopeScaling),
					fmt.Sprintf(`set model.rope_scaling = "llama3" to scale the frequencies, or remove %s (default %s)`, k.key, FormatValue(k.def)), k.key, "model.rope_scaling")
			}
		}
		return
	}
	if lo, hi := m.RopeScalingLowFreqFactor, m.RopeScalingHighFreqFactor; hi < lo {
		c.report(SevError, "SL309", fmt.Sprintf("model.rope_scaling_high_freq_factor (%s) is below model.rope_scaling_low_freq_factor (%s): the llama3 scaling keeps wavelengths below original/high and divides those above original/low, so high must be at least low", FormatValue(hi), FormatValue(lo)),
			fmt.Sprintf("set rope_scaling_high_freq_factor = %s or more (Llama 3.1: low 1, high 4; Llama 4: 1 and 1, a step without blend), or swap the two", FormatValue(lo)),
			"model.rope_scaling_high_freq_factor", "model.rope_scaling_low_freq_factor")
	}
}

// TokenizerHasEOS reports whether the tokenizer data.tokenizer names has an
// end-of-text token (data.Tokenizer's Specials: gpt2's <|endoftext|>; byte and
// char have none). A tokenizer file is taken to have one here (the trainer
// reads its specials and refuses a file without one). Document masks
// (data.eod_mask_loss, data.reset_attention_mask) need one.
func TokenizerHasEOS(name string) bool { return name != "byte" && name != "char" }

// tokenizerFile checks a data.tokenizer that names a file: it exists here
// (a warning, as for data.path: lint may run on another machine), it is a
// tokenizer shardline reads, and model.vocab_size covers its vocabulary (a
// larger one pads the embedding).
func (c *checker) tokenizerFile() {
	spec := c.rc.Data.Tokenizer
	path, err := TokenizerPath(spec, c.env, c.opts.DataRoot)
	if err != nil {
		c.report(SevWarning, "SL402", fmt.Sprintf("data.tokenizer (%q): %v", spec, err),
			"set the variable, or give a literal path with --set data.tokenizer=/path/to/tokenizer.json", "data.tokenizer")
		return
	}
	if _, err := os.Stat(path); err != nil {
		where := path
		if len(PathVars(spec)) > 0 {
			where = "expanded from the environment, whose values are not shown"
		}
		c.report(SevWarning, "SL402", fmt.Sprintf("data.tokenizer (%q) does not exist here (%s)", spec, where),
			"fix the path, or override it on this machine with --set data.tokenizer=/path/to/tokenizer.json", "data.tokenizer")
		return
	}
	tok, err := tokenizer.Load(path)
	if err != nil {
		msg := err.Error()
		if len(PathVars(spec)) > 0 {
			msg = RedactVars(msg, spec, c.env)
		}
		c.report(SevError, "SL308", fmt.Sprintf("data.tokenizer (%q): %s", spec, msg),
			"give a Hugging Face tokenizer.json, a tiktoken rank file (Llama 3's tokenizer.model), a SentencePiece .model or a directory holding one (docs/tokenizers.md)", "data.tokenizer")
		return
	}
	if v := tok.VocabSize(); v > c.rc.Model.VocabSize {
		c.report(SevError, "SL305", fmt.Sprintf("model.vocab_size (%d) is smaller than the %d tokens of the tokenizer %q", c.rc.Model.VocabSize, v, spec),
			fmt.Sprintf("set vocab_size = %d (or more: extra rows pad the embedding)", v), "model.vocab_size", "data.tokenizer")
	}
}

// tokenizerVocab is the vocabulary of each tokenizer whose vocabulary is fixed
// (char's comes from the corpus and is checked when the data is read).
var tokenizerVocab = map[string]int{"byte": 256, "gpt2": 50257}

// unitKinds maps each name fsdp_unit_modules accepts, Megatron's class names and
// paths included, to a module kind.
var unitKinds = map[string]string{
	"embedding": "embedding", "transformer_layer": "transformer_layer", "attention": "attention",
	"mlp": "mlp", "moe": "moe", "output": "output",
	"LanguageModelEmbedding": "embedding",
	"megatron.core.models.common.embeddings.language_model_embedding.LanguageModelEmbedding": "embedding",
	"TransformerLayer": "transformer_layer",
	"megatron.core.transformer.transformer_layer.TransformerLayer": "transformer_layer",
	"SelfAttention": "attention", "megatron.core.transformer.attention.SelfAttention": "attention",
	"MLP": "mlp", "megatron.core.transformer.mlp.MLP": "mlp",
	"MoELayer": "moe", "megatron.core.transformer.moe.moe_layer.MoELayer": "moe",
}

// UnitKind returns the module kind an fsdp_unit_modules entry names.
func UnitKind(name string) (string, bool) {
	k, ok := unitKinds[name]
	return k, ok
}

// ModuleKinds lists the module kinds the model has, in forward order.
func (m Model) ModuleKinds() []string {
	kinds := []string{"embedding", "transformer_layer", "attention"}
	if m.MoE.NumExperts == 0 || m.MoE.LayerFreq > 1 {
		kinds = append(kinds, "mlp")
	}
	if m.MoE.NumExperts > 0 {
		kinds = append(kinds, "moe")
	}
	return append(kinds, "output")
}

// EffectiveKVHeads resolves kv_heads = 0 to heads.
// HeadSize is the size of one attention head: head_dim, or hidden / heads.
func (m Model) HeadSize() int {
	if m.HeadDim > 0 {
		return m.HeadDim
	}
	if m.Heads == 0 {
		return 0
	}
	return m.Hidden / m.Heads
}

func (m Model) EffectiveKVHeads() int {
	if m.KVHeads == 0 {
		return m.Heads
	}
	return m.KVHeads
}

// IsNoPELayer reports whether layer l (0-based) applies no rotary embedding
// (model.nope_interval, model.nope_first).
func (m Model) IsNoPELayer(l int) bool {
	if m.NoPEInterval == 0 {
		return false
	}
	if m.NoPEFirst {
		return l%m.NoPEInterval == 0
	}
	return (l+1)%m.NoPEInterval == 0
}

// AttentionChunk is layer l's (0-based) attention chunk: model.attention_chunk_size
// for a rotary layer, 0 (the whole sequence) for a NoPE layer (Llama 4's iRoPE).
func (m Model) AttentionChunk(l int) int {
	if m.IsNoPELayer(l) {
		return 0
	}
	return m.AttentionChunkSize
}

// IsMoELayer reports whether layer l (0-based) is an MoE layer.
func (m Model) IsMoELayer(l int) bool {
	return m.MoE.NumExperts > 0 && (l+1)%m.MoE.LayerFreq == 0
}

func (c *checker) units() {
	f, m, p := c.rc.FSDP, c.rc.Model, c.rc.Parallel
	have := m.ModuleKinds()
	names := []string{"embedding", "transformer_layer", "attention", "mlp", "moe", "output"}
	for _, u := range f.FSDPUnitModules {
		kind, ok := UnitKind(u)
		if !ok {
			msg := fmt.Sprintf("fsdp.fsdp_unit_modules names %q, which is not a module kind", u)
			if s := Suggest(u, names); s != "" {
				msg += fmt.Sprintf("; did you mean %q?", s)
			}
			c.report(SevError, "SL301", msg, "module kinds are "+quoteAll(names)+" (or Megatron's class names for them)", "fsdp.fsdp_unit_modules")
			continue
		}
		if !contains(have, kind) {
			c.report(SevError, "SL301", fmt.Sprintf("fsdp.fsdp_unit_modules names %q, but this model has no %s module", u, kind),
				"this model's module kinds are "+quoteAll(have)+"; remove "+fmt.Sprintf("%q", u), "fsdp.fsdp_unit_modules")
		}
	}
	if f.ExpertShardingGroup == "data_parallel" && p.ExpertParallel > 1 && m.MoE.NumExperts > 0 {
		c.report(SevError, "SL302", fmt.Sprintf("fsdp.expert_sharding_group (\"data_parallel\") with parallel.expert_parallel (%d) would shard expert weights over the full data-parallel group as well as over experts (double sharding)", p.ExpertParallel),
			`set expert_sharding_group = "expert_data_parallel": expert weights shard over the ranks holding the same experts only`,
			"fsdp.expert_sharding_group", "parallel.expert_parallel")
	}
}

func (c *checker) files() {
	path := c.rc.Data.Path
	if path == "" && len(c.rc.Data.Sources) > 0 {
		return // the sources are opened, and checked, by run
	}
	if path == "" {
		c.report(SevWarning, "SL401", "data.path is empty: there is no text to train on",
			`set path under [data] to a text file or a directory from "shardline data prepare"`, "data.path")
		return
	}
	// Messages quote data.path as written: a variable's value is never shown, since
	// a recipe under review could otherwise print any secret of the environment
	// lint runs in (data.path = "/x/${CI_TOKEN}").
	expanded, err := ExpandPath(path, c.env)
	if err != nil {
		c.report(SevWarning, "SL401", fmt.Sprintf("data.path (%q): %v", path, err),
			"set the variable, or give a literal path with --set data.path=/path/to/text", "data.path")
		return
	}
	vars := PathVars(path)
	var where []string // how the path was read, for the message
	if len(vars) == 0 {
		where = append(where, expanded)
	} else {
		where = append(where, fmt.Sprintf("%s expanded from the environment, whose values are not shown", strings.Join(vars, ", ")))
	}
	if c.opts.DataRoot != "" && !filepath.IsAbs(expanded) {
		expanded = filepath.Join(c.opts.DataRoot, expanded)
		if len(vars) == 0 {
			where[0] = expanded
		}
		where = append(where, "under the data_root setting")
	}
	if strings.ContainsAny(expanded, "*?[") {
		if m, err := filepath.Glob(expanded); err != nil || len(m) == 0 {
			c.report(SevWarning, "SL401", fmt.Sprintf("data.path (%q) matches no file here (%s)", path, strings.Join(where, ", ")),
				"fix the pattern, or override it on this machine with --set data.path=/path/to/text", "data.path")
		}
		return
	}
	if _, err := os.Stat(expanded + ".idx"); err == nil { // a Megatron dataset's prefix
		return
	}
	if _, err := os.Stat(expanded); err != nil {
		c.report(SevWarning, "SL401", fmt.Sprintf("data.path (%q) does not exist here (%s)", path, strings.Join(where, ", ")),
			"fix the path, or override it on this machine with --set data.path=/path/to/text", "data.path")
	}
}
