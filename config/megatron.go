package config

import (
	"fmt"
	"github.com/shardline/shardline/trainer/tokenizer"
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
	// anyValue: a mapped argument whose value is never read (only that it is
	// given), so that a script may pass one the import cannot know.
	anyValue bool
}

func isTrue(v string) bool { b, err := strconv.ParseBool(v); return v == "" || (err == nil && b) }

func zeroFloat(v string) bool { f, err := strconv.ParseFloat(v, 64); return err == nil && f == 0 }

// fileTokenizerTypes are Megatron's --tokenizer-type values that read the
// model's own tokenizer file, --tokenizer-model: data.tokenizer reads it.
var fileTokenizerTypes = map[string]bool{"HuggingFaceTokenizer": true, "Llama2Tokenizer": true, "Llama3Tokenizer": true,
	"SentencePieceTokenizer": true, "GPTSentencePieceTokenizer": true}

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
	// --rotary-scaling-factor is not Llama 3.1's factor (that is
	// --rope-scaling-factor) but YaRN's, read only with --position-embedding-type
	// yarn (multi-latent attention): its default 1 describes shardline.
	"rotary-scaling-factor": {kind: describes, takesValue: true, ok: func(v string) bool { f, err := strconv.ParseFloat(v, 64); return err == nil && f == 1 },
		why:   "Megatron reads --rotary-scaling-factor only for YaRN positions (--position-embedding-type yarn), which shardline does not have; Llama 3.1's scaling factor is --rope-scaling-factor (with --use-rope-scaling)",
		usage: "accepted as 1 (YaRN's factor, unused with rope positions); Llama 3.1's scaling factor is --rope-scaling-factor"},
	"untie-embeddings-and-output-weights": {kind: mapped, usage: "sets model.tie_embeddings = false",
		apply: func(l *loader, v string, o Origin) error {
			if !isTrue(v) {
				return fmt.Errorf("takes no value but true")
			}
			f, _ := recipeSchema.Lookup("model.tie_embeddings")
			l.set(f, false, o)
			return nil
		}},
	// Megatron-Core's --use-rope-scaling is Llama 3.1's scaling with its factor
	// from --rope-scaling-factor (default 8) and low_freq_factor 1,
	// high_freq_factor 4 and 8192 original positions fixed (RotaryEmbedding's
	// _apply_scaling): the recipe's defaults for the other three keys.
	"use-rope-scaling": {kind: mapped, usage: "sets model.rope_scaling = llama3 (its factor: --rope-scaling-factor; low and high frequency factors 1 and 4, 8192 original positions, as Megatron-Core fixes them)",
		apply: func(l *loader, v string, o Origin) error {
			if !isTrue(v) {
				return fmt.Errorf("takes no value but true")
			}
			f, _ := recipeSchema.Lookup("model.rope_scaling")
			l.set(f, "llama3", o)
			return nil
		}},
	// With rotary positions a token's attention scores depend only on distances,
	// so positions restarting at each document change nothing once attention
	// stays within documents; without that they would change the distances
	// across a boundary, which shardline does not do.
	"reset-position-ids": {kind: mapped, usage: "accepted with --reset-attention-mask (no effect: rotary positions are relative); refused without it",
		apply: func(l *loader, v string, o Origin) error {
			if !isTrue(v) {
				return fmt.Errorf("takes no value but true")
			}
			if !l.res.Recipe.Data.ResetAttentionMask {
				return fmt.Errorf("restarts positions at each document while attention still crosses documents, which shardline does not do; add --reset-attention-mask (data.reset_attention_mask = true: attention within documents, where restarting positions changes nothing with rotary embeddings), or remove it")
			}
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
	"use-flash-attn":              {kind: noEffect, why: "attention is flash attention on GPUs already (and on the CPU from 512 tokens)", usage: "accepted, no effect"},
	"fp8-interval":                {kind: noEffect, takesValue: true, why: "Megatron ignores it too (deprecated): scales are updated every step", usage: "accepted, no effect (deprecated in Megatron)"},
	"transformer-impl":            {kind: noEffect, takesValue: true, why: "shardline has one transformer implementation", usage: "accepted, no effect"},
	"no-masked-softmax-fusion":    {kind: noEffect, why: "a kernel fusion choice of Megatron's; shardline's kernels are its own", usage: "accepted, no effect"},
	"no-bias-gelu-fusion":         {kind: noEffect, why: "a kernel fusion choice of Megatron's; shardline's kernels are its own", usage: "accepted, no effect"},
	"no-bias-swiglu-fusion":       {kind: noEffect, why: "a kernel fusion choice of Megatron's; shardline's kernels are its own", usage: "accepted, no effect"},
	"no-bias-dropout-fusion":      {kind: noEffect, why: "a kernel fusion choice of Megatron's; shardline's kernels are its own", usage: "accepted, no effect"},
	"no-rope-fusion":              {kind: noEffect, why: "a kernel fusion choice of Megatron's; shardline's kernels are its own", usage: "accepted, no effect"},
	"sequence-parallel":           {kind: noEffect, why: "shardline's tensor parallelism always runs with sequence parallelism (norms and residuals split over the tp ranks)", usage: "accepted, no effect"},
	"distributed-backend":         {kind: noEffect, takesValue: true, why: "shardline picks its collectives (NCCL on GPUs, its own on the CPU)", usage: "accepted, no effect"},
	"distributed-timeout-minutes": {kind: noEffect, takesValue: true, why: "use --comm-timeout (run and launch) or the comm_timeout setting", usage: "accepted, no effect: see --comm-timeout"},
	"tensorboard-dir": {kind: mapped, takesValue: true, anyValue: true, usage: "sets logging.tensorboard = true (the event files go into the run directory, not DIR)",
		apply: func(l *loader, v string, o Origin) error {
			f, _ := recipeSchema.Lookup("logging.tensorboard")
			l.set(f, true, o)
			l.add(Diagnostic{Severity: SevNote, Code: "SL011", Origin: o,
				Message: fmt.Sprintf("--tensorboard-dir %s: logging.tensorboard = true; shardline writes the event files into the run directory (run.output_dir/run.name, beside metrics.jsonl), not into %s", v, v),
				Help:    "point tensorboard --logdir at run.output_dir, which shows every run under it; to keep the events under that directory, set run.output_dir to it"})
			return nil
		}},
	"tensorboard-log-interval":          {kind: noEffect, takesValue: true, why: "every step's scalars go to the event file as the step is recorded (logging.tensorboard)", usage: "accepted, no effect"},
	"tensorboard-queue-size":            {kind: noEffect, takesValue: true, why: "each step's event is written to the file as the step is recorded, not queued", usage: "accepted, no effect"},
	"log-timers-to-tensorboard":         {kind: noEffect, why: "the event file holds every step's time, TFLOP/s and MFU beside the plan's (perf/); shardline run --trace records each operation's time", usage: "accepted, no effect"},
	"log-memory-to-tensorboard":         {kind: describes, why: "the event file holds the memory held and planned (memory/)", ok: isTrue, usage: "accepted: the events hold memory held and planned"},
	"log-validation-ppl-to-tensorboard": {kind: noEffect, why: "the event file holds the validation loss (eval/val_loss), whose exponential is the perplexity", usage: "accepted, no effect"},
	"log-world-size-to-tensorboard":     {kind: noEffect, why: "run.json and resolved.toml record the world size", usage: "accepted, no effect"},
	"log-loss-scale-to-tensorboard":     {kind: noEffect, why: "shardline has no loss scaling (it trains in bf16 or fp32)", usage: "accepted, no effect"},
	"wandb-project":                     {kind: noEffect, takesValue: true, why: wandbWhy, usage: "accepted, no effect"},
	"log-throughput":                    {kind: noEffect, why: "every step's tokens/s, step time, TFLOP/s and MFU are in metrics.jsonl and the event file", usage: "accepted, no effect"},
	"wandb-exp-name":                    {kind: noEffect, takesValue: true, why: wandbWhy, usage: "accepted, no effect"},
	"wandb-save-dir":                    {kind: noEffect, takesValue: true, why: wandbWhy, usage: "accepted, no effect"},
	"attention-backend":                 {kind: noEffect, takesValue: true, why: "attention is shardline's own flash attention", usage: "accepted, no effect"},
	"cross-entropy-loss-fusion":         {kind: noEffect, why: "the head and loss are fused already (the logits are never materialised whole)", usage: "accepted, no effect"},
	"moe-grouped-gemm":                  {kind: noEffect, why: "an MoE layer's experts already run as one batched computation", usage: "accepted, no effect"},
	"moe-token-dispatcher-type":         {kind: noEffect, takesValue: true, why: "a communication choice; shardline's expert dispatch is its own all-to-all", usage: "accepted, no effect"},
	"manual-gc":                         {kind: noEffect, why: "Go's collector needs no schedule", usage: "accepted, no effect"},
	"manual-gc-interval":                {kind: noEffect, takesValue: true, why: "Go's collector needs no schedule", usage: "accepted, no effect"},
	"empty-unused-memory-level":         {kind: noEffect, takesValue: true, why: "the trainer allocates from the plan; there is no cache to empty", usage: "accepted, no effect"},
	"exit-duration-in-mins":             {kind: noEffect, takesValue: true, why: "a run goes to train.steps; stop it (SIGINT saves a checkpoint) and continue with shardline run --resume", usage: "accepted, no effect"},
	"profile":                           {kind: noEffect, why: "profile with shardline run --trace (a Chrome trace)", usage: "accepted, no effect: see run --trace"},
	"profile-step-start":                {kind: noEffect, takesValue: true, why: "profile with shardline run --trace (a Chrome trace)", usage: "accepted, no effect: see run --trace"},
	"profile-step-end":                  {kind: noEffect, takesValue: true, why: "profile with shardline run --trace (a Chrome trace)", usage: "accepted, no effect: see run --trace"},
	"no-load-optim":                     {kind: noEffect, why: "resume with shardline run --resume DIR (all state), or --init-from for weights only", usage: "accepted, no effect"},
	"no-load-rng":                       {kind: noEffect, why: "shardline's random numbers are counter-based: there is no generator state to load", usage: "accepted, no effect"},
	// Data: Megatron's indexed datasets are read as they are (data.path,
	// data.sources); its tokenizers other than GPT-2's cannot be carried.
	"mock-data":       {kind: refused, why: "Megatron's mock data are random tokens, not a corpus; a recipe trains on data.path", usage: "refused: give --data-path"},
	"data-path":       {kind: mapped, takesValue: true, usage: "PREFIX sets data.path; WEIGHT PREFIX ... (or PREFIX PREFIX ...) sets data.sources", apply: dataPath},
	"train-data-path": {kind: mapped, takesValue: true, usage: "as --data-path: the training data", apply: dataPath},
	"valid-data-path": {kind: mapped, takesValue: true, usage: "PREFIX sets data.val_path (and data.val_fraction = 0)",
		apply: func(l *loader, v string, o Origin) error {
			if len(strings.Fields(v)) != 1 {
				return fmt.Errorf("is a blend; shardline validates on one path (data.val_path)")
			}
			f, _ := recipeSchema.Lookup("data.val_path")
			l.set(f, v, o)
			f, _ = recipeSchema.Lookup("data.val_fraction")
			l.set(f, 0.0, o)
			return nil
		}},
	"test-data-path": {kind: noEffect, takesValue: true, why: "shardline has no test split", usage: "accepted, no effect"},
	"split": {kind: mapped, takesValue: true, usage: "TRAIN,VALID,0 sets data.val_fraction = VALID / (TRAIN + VALID); a test part is refused",
		apply: func(l *loader, v string, o Origin) error {
			parts := strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == '/' })
			var w [3]float64
			for i, p := range parts {
				x, err := strconv.ParseFloat(strings.Trim(p, `'"`), 64)
				if i >= 3 || err != nil || x < 0 {
					return fmt.Errorf("is not up to three non-negative weights (train,valid,test)")
				}
				w[i] = x
			}
			if w[0] <= 0 {
				return fmt.Errorf("gives no training part")
			}
			if w[2] > 0 {
				return fmt.Errorf("holds out a test part (%g of %g); shardline has no test split, so those documents would be trained on: give --split %g,%g,0", w[2], w[0]+w[1]+w[2], w[0], w[1])
			}
			f, _ := recipeSchema.Lookup("data.val_fraction")
			if l.res.Recipe.Data.ValPath != "" {
				return nil // --valid-data-path gives the validation data
			}
			l.set(f, w[1]/(w[0]+w[1]), o)
			return nil
		}},
	"data-cache-path":                        {kind: noEffect, takesValue: true, why: "shardline caches tokenized data under its cache_dir setting", usage: "accepted, no effect"},
	"num-workers":                            {kind: noEffect, takesValue: true, why: "shardline's batches are a pure function of (seed, step, rank): no loader workers", usage: "accepted, no effect"},
	"no-mmap-bin-files":                      {kind: noEffect, why: "shardline always memory-maps indexed datasets", usage: "accepted, no effect"},
	"no-create-attention-mask-in-dataloader": {kind: noEffect, why: "attention is causal by construction: no mask is built", usage: "accepted, no effect"},
	"make-vocab-size-divisible-by": {kind: mapped, takesValue: true, usage: "pads the tokenizer's vocabulary to a multiple of it times the tensor-parallel size when --vocab-size is absent",
		apply: func(l *loader, v string, o Origin) error {
			if n, err := strconv.Atoi(v); err != nil || n < 1 {
				return fmt.Errorf("must be a positive integer")
			}
			return nil
		}},
	"tokenizer-model": {kind: mapped, takesValue: true, usage: "sets data.tokenizer to the file (a tokenizer.json, a SentencePiece or tiktoken tokenizer.model, or a directory holding one)",
		apply: func(l *loader, v string, o Origin) error {
			if !tokenizer.IsFileSpec(v) {
				l.add(Diagnostic{Severity: SevNote, Code: "SL011", Origin: o,
					Message: fmt.Sprintf("--tokenizer-model %q has no effect in shardline: it is not a file's path (a Hugging Face hub name is not fetched)", v),
					Help:    "download the model's tokenizer.json and set data.tokenizer to its path"})
				return nil
			}
			f, _ := recipeSchema.Lookup("data.tokenizer")
			l.set(f, v, o)
			return nil
		}},
	"vocab-file":       {kind: noEffect, takesValue: true, why: "GPT-2's vocabulary and merges are built into data.tokenizer = gpt2; for another BPE give its tokenizer.json as data.tokenizer", usage: "accepted, no effect: see data.tokenizer"},
	"merge-file":       {kind: noEffect, takesValue: true, why: "GPT-2's vocabulary and merges are built into data.tokenizer = gpt2; for another BPE give its tokenizer.json as data.tokenizer", usage: "accepted, no effect: see data.tokenizer"},
	"tiktoken-pattern": {kind: noEffect, takesValue: true, why: "shardline reads a tiktoken rank file with Llama 3's pattern only (docs/tokenizers.md)", usage: "accepted, no effect: see data.tokenizer"},
	"tokenizer-type": {kind: mapped, takesValue: true, usage: "GPT2BPETokenizer sets data.tokenizer = gpt2; HuggingFaceTokenizer, Llama2Tokenizer, Llama3Tokenizer and the SentencePiece ones take --tokenizer-model's file; TikTokenizer is refused; NullTokenizer is a note",
		apply: func(l *loader, v string, o Origin) error {
			switch {
			case v == "GPT2BPETokenizer":
				f, _ := recipeSchema.Lookup("data.tokenizer")
				l.set(f, "gpt2", o)
			case fileTokenizerTypes[v]:
				// --tokenizer-model names the file; data.tokenizer reads it.
			case v == "TikTokenizer":
				l.add(Diagnostic{Severity: SevError, Code: "SL010", Origin: o,
					Message: "--tokenizer-type TikTokenizer: Megatron's TikTokenizer puts its special tokens before the ranks (ids shift by --tiktoken-num-special-tokens) and has its own patterns; shardline reads a rank file with Llama 3's ids and pattern",
					Help:    "use --tokenizer-type HuggingFaceTokenizer with the model's tokenizer.json as --tokenizer-model"})
			default:
				l.add(Diagnostic{Severity: SevError, Code: "SL010", Origin: o,
					Message: fmt.Sprintf("--tokenizer-type %s cannot be carried: shardline tokenizes with byte, char, gpt2 (Megatron's GPT2BPETokenizer) or a model's tokenizer file (HuggingFaceTokenizer and the SentencePiece types, with --tokenizer-model), so the recipe would train on other tokens than the script", v),
					Help:    "use --tokenizer-type GPT2BPETokenizer, or HuggingFaceTokenizer with the model's tokenizer.json as --tokenizer-model (docs/tokenizers.md)"})
			}
			return nil
		}},
	"moe-router-load-balancing-type": {kind: mapped, takesValue: true, usage: "aux_loss (shardline's) is accepted; none sets model.moe.aux_loss_coeff = 0",
		apply: func(l *loader, v string, o Origin) error {
			switch v {
			case "aux_loss":
			case "none":
				f, _ := recipeSchema.Lookup("model.moe.aux_loss_coeff")
				l.set(f, 0.0, o)
			default:
				l.add(Diagnostic{Severity: SevError, Code: "SL010", Origin: o,
					Message: fmt.Sprintf("--moe-router-load-balancing-type %s: shardline balances experts with Switch Transformer's auxiliary loss over the micro-batch (aux_loss), or not at all (none)", v),
					Help:    "use aux_loss (with --moe-aux-loss-coeff) or none"})
			}
			return nil
		}},
	"moe-router-pre-softmax": {kind: mapped, usage: "sets model.moe.norm_top_k = false (softmax over all experts, the chosen scores kept as gates)",
		apply: func(l *loader, v string, o Origin) error {
			if v == "true" {
				f, _ := recipeSchema.Lookup("model.moe.norm_top_k")
				l.set(f, false, o)
			}
			return nil
		}},
	"rotary-percent": {kind: describes, takesValue: true, why: "shardline rotates the whole head (--rotary-percent 1.0)",
		ok: func(v string) bool { f, err := strconv.ParseFloat(v, 64); return err == nil && f == 1 }, usage: "accepted as 1.0: RoPE on the whole head"},
	// Sample-counted schedules: steps are samples over the global batch.
	"train-samples":     {kind: mapped, takesValue: true, usage: "sets train.steps = train-samples / global batch", apply: samplesToSteps("train.steps", "train-samples")},
	"lr-warmup-samples": {kind: mapped, takesValue: true, usage: "sets train.warmup_steps = lr-warmup-samples / global batch", apply: samplesToSteps("train.warmup_steps", "lr-warmup-samples")},
	"lr-decay-samples":  {kind: mapped, takesValue: true, usage: "sets train.lr_decay_steps = lr-decay-samples / global batch − warmup steps", apply: samplesToSteps("train.lr_decay_steps", "lr-decay-samples")},
	"lr-decay-iters":    {kind: mapped, takesValue: true, usage: "sets train.lr_decay_steps = lr-decay-iters − warmup steps", apply: decayIters},
	"decoupled-lr":      {kind: refused, takesValue: true, why: "shardline uses one learning rate for every parameter (no separate rate for the embedding and output layers)", usage: "refused: one learning rate"},
	"decoupled-min-lr":  {kind: refused, takesValue: true, why: "shardline uses one learning rate for every parameter (no separate rate for the embedding and output layers)", usage: "refused: one learning rate"},
}

// wandbWhy is why Megatron's W&B arguments change nothing: shardline talks
// to no service; W&B takes the run's TensorBoard events instead.
const wandbWhy = "shardline logs to no service itself; with logging.tensorboard (on by default) `wandb sync RUN_DIR` uploads the run's TensorBoard events"

// samplesToSteps maps a sample count onto a step key: samples over the global
// batch (Megatron's own division, rounding down); for the decay, less the warmup.
func samplesToSteps(key, arg string) func(l *loader, v string, o Origin) error {
	return func(l *loader, v string, o Origin) error {
		n, err := strconv.ParseInt(v, 10, 64)
		gbs := int64(l.res.Recipe.Train.GlobalBatchSize)
		if err != nil || n < 0 {
			return fmt.Errorf("must be a whole number of samples")
		}
		steps := n / gbs
		if key == "train.lr_decay_steps" {
			steps -= int64(l.res.Recipe.Train.WarmupSteps)
			if steps < 0 {
				return fmt.Errorf("ends before warmup does (%d steps)", l.res.Recipe.Train.WarmupSteps)
			}
		}
		if key == "train.steps" && steps < 1 {
			return fmt.Errorf("is less than one global batch (%d sequences)", gbs)
		}
		if n%gbs != 0 {
			l.add(Diagnostic{Severity: SevNote, Code: "SL011", Origin: o,
				Message: fmt.Sprintf("--%s %d is not a whole number of global batches (%d): %s = %d", arg, n, gbs, key, steps),
				Help:    "nothing to change; Megatron rounds down too"})
		}
		f, _ := recipeSchema.Lookup(key)
		l.applyString(f, strconv.FormatInt(steps, 10), o)
		return nil
	}
}

// decayIters maps --lr-decay-iters (Megatron counts them from step 0, warmup
// included) onto train.lr_decay_steps (counted after warmup).
func decayIters(l *loader, v string, o Origin) error {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return fmt.Errorf("must be a whole number of steps")
	}
	w := l.res.Recipe.Train.WarmupSteps
	if n < w {
		return fmt.Errorf("ends before warmup does (%d steps)", w)
	}
	f, _ := recipeSchema.Lookup("train.lr_decay_steps")
	l.set(f, n-w, o)
	return nil
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
func (l *loader) applyMegatronArg(name string, fv FlagValue, o Origin, later *[2][]func()) bool {
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
		pass := 0
		if strings.HasPrefix(name, "lr-decay-") {
			pass = 1 // after the warmup it is counted from
		}
		later[pass] = append(later[pass], func() {
			if err := a.apply(l, v, o); err != nil {
				l.add(Diagnostic{Severity: SevError, Code: "SL007", Origin: o, Message: fmt.Sprintf("--%s %s %v", name, v, err),
					Help: "fix the value as Megatron would require it"})
			}
		})
	}
	return true
}

// dataPath maps Megatron's --data-path: one prefix becomes data.path; a list
// of weight and prefix pairs, or of prefixes alone (equal weights), becomes
// data.sources with data.path "".
func dataPath(l *loader, v string, o Origin) error {
	words := strings.Fields(v)
	pathKey, _ := recipeSchema.Lookup("data.path")
	srcKey, _ := recipeSchema.Lookup("data.sources")
	if len(words) == 1 {
		l.set(pathKey, words[0], o)
		l.set(srcKey, []string{}, o)
		return nil
	}
	weighted := len(words)%2 == 0
	for i := 0; weighted && i < len(words); i += 2 {
		w, err := strconv.ParseFloat(words[i], 64)
		weighted = err == nil && w > 0
	}
	var sources []string
	if weighted {
		for i := 0; i < len(words); i += 2 {
			sources = append(sources, words[i]+" "+words[i+1])
		}
	} else {
		for _, w := range words {
			if _, err := strconv.ParseFloat(w, 64); err == nil {
				return fmt.Errorf("mixes weights and prefixes: give WEIGHT PREFIX pairs, or prefixes alone")
			}
			sources = append(sources, "1 "+w)
		}
	}
	l.set(pathKey, "", o)
	l.set(srcKey, sources, o)
	return nil
}
