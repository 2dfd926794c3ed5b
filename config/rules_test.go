package config

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// lintString loads src as x.toml (in a temp dir holding extra files) and lints it when
// it loads cleanly.
func lintString(t *testing.T, src string, opts Options, files map[string]string) Diagnostics {
	t.Helper()
	all := map[string]string{"x.toml": src}
	for name, body := range files {
		all[name] = body
	}
	dir := writeFiles(t, all)
	res, diags := Load(filepath.Join(dir, "x.toml"), opts)
	if res != nil && !diags.HasErrors() {
		diags = append(diags, Lint(res, opts.Env)...)
	}
	// Locations are reported relative to the temp dir for stable expectations.
	for i := range diags {
		diags[i].Origin.Pos.File = strings.TrimPrefix(diags[i].Origin.Pos.File, dir+string(filepath.Separator))
	}
	return diags
}

// The data path of every test recipe exists, so SL401 only fires where a case asks.
const okData = "[data]\npath = \"/\"\n"

type ruleCase struct {
	name  string
	src   string
	opts  Options
	files map[string]string
	code  string
	sev   Severity
	loc   string // Location() of the finding
	msg   string // substring of the message
}

var ruleCases = []ruleCase{
	{name: "syntax", src: "[model]\nlayers = = 4\n", code: "SL001", loc: "x.toml:2:10", msg: "TOML syntax error"},
	{name: "unclosed string", src: "[run]\nname = \"abc\n", code: "SL001", loc: "x.toml:2:", msg: "TOML syntax error"},
	{name: "unknown key with suggestion", src: "[model]\nlayres = 4\n", code: "SL002", loc: "x.toml:2:1", msg: "did you mean layers?"},
	{name: "key in wrong section", src: "[train]\nheads = 4\n", code: "SL002", loc: "x.toml:2:1", msg: "did you mean model.heads?"},
	{name: "unknown section", src: "[modle]\nlayers = 4\n", code: "SL002", loc: "x.toml:1:2", msg: "did you mean [model]?"},
	{name: "top-level key", src: "layers = 4\n", code: "SL002", loc: "x.toml:1:1", msg: "did you mean model.layers?"},
	{name: "array of tables", src: "[[model]]\nlayers = 4\n", code: "SL002", loc: "x.toml:1:3", msg: "array of tables"},
	{name: "wrong type string", src: "[model]\nlayers = \"four\"\n", code: "SL003", loc: "x.toml:2:10", msg: "must be an integer, got string"},
	{name: "float for integer", src: "[model]\nlayers = 4.0\n", code: "SL003", loc: "x.toml:2:10", msg: "got float 4.0"},
	{name: "bool type", src: "[fsdp]\nuse_nccl_ub = 1\n", code: "SL003", loc: "x.toml:2:15", msg: "must be a boolean"},
	{name: "section as value", src: "[model]\nmoe = 3\n", code: "SL003", loc: "x.toml:2:1", msg: "is a section"},
	{name: "value as section", src: "[model.layers]\n", code: "SL003", loc: "x.toml:1:2", msg: "is a value, not a section"},
	{name: "date", src: "[run]\nname = 1979-05-27\n", code: "SL003", loc: "x.toml:2:8", msg: "got date-time"},
	{name: "enum", src: "[fsdp]\ndata_parallel_sharding_strategy = \"optim_grad\"\n", code: "SL004", loc: "x.toml:2:35", msg: `did you mean "optim_grads"?`},
	{name: "enum in array env", src: okData, opts: Options{Env: []string{"SHARDLINE_PARALLEL_DEVICE=gpu"}}, code: "SL004", loc: "env SHARDLINE_PARALLEL_DEVICE", msg: "must be one of"},
	{name: "extends missing", src: "extends = \"nope.toml\"\n", code: "SL005", loc: "x.toml:1:11", msg: "does not exist"},
	{name: "extends cycle", src: "extends = \"a.toml\"\n", files: map[string]string{"a.toml": "extends = \"x.toml\"\n"}, code: "SL005", loc: "a.toml:1:11", msg: "cycle"},
	{name: "extends not string", src: "extends = 3\n", code: "SL003", loc: "x.toml:1:11", msg: "extends must be a string"},
	{name: "duplicate key", src: "[model]\nlayers = 4\nlayers = 5\n", code: "SL006", loc: "x.toml:3:1", msg: "defined twice (first at "},
	{name: "duplicate section", src: "[model]\n[model]\n", code: "SL006", loc: "x.toml:2:2", msg: "defined twice"},
	{name: "bad set syntax", src: okData, opts: Options{Sets: []string{"model.layers"}}, code: "SL007", loc: "flag --set model.layers", msg: "not of the form"},
	{name: "unknown set key", src: okData, opts: Options{Sets: []string{"model.layrs=3"}}, code: "SL002", loc: "flag --set model.layrs", msg: "did you mean layers?"},
	{name: "bad flag value", src: okData, opts: Options{Flags: []FlagValue{{Name: "num-layers", Value: "x"}}}, code: "SL007", loc: "flag --num-layers", msg: "must be an integer"},
	{name: "unknown flag", src: okData, opts: Options{Flags: []FlagValue{{Name: "num-layer", Value: "3"}}}, code: "SL007", loc: "flag --num-layer", msg: "did you mean --num-layers?"},
	{name: "megatron refused", src: okData, opts: Options{Flags: []FlagValue{{Name: "add-bias-linear", Value: "true"}}}, code: "SL010", loc: "flag --add-bias-linear", msg: "linear layers have no bias"},
	{name: "megatron describes, other value", src: okData, opts: Options{Flags: []FlagValue{{Name: "normalization", Value: "LayerNorm"}}}, code: "SL010", loc: "flag --normalization", msg: "normalises with RMSNorm"},
	{name: "megatron dropout", src: okData, opts: Options{Flags: []FlagValue{{Name: "hidden-dropout", Value: "0.1"}}}, code: "SL010", loc: "flag --hidden-dropout", msg: "without dropout"},
	{name: "megatron no effect", src: okData, opts: Options{Flags: []FlagValue{{Name: "use-flash-attn", Value: "true"}}}, code: "SL011", sev: SevNote, loc: "flag --use-flash-attn", msg: "no effect in shardline"},
	{name: "megatron max positions", src: okData, opts: Options{Flags: []FlagValue{{Name: "max-position-embeddings", Value: "16"}}}, code: "SL007", loc: "flag --max-position-embeddings", msg: "below model.seq_len"},
	{name: "megatron min lr above lr", src: okData, opts: Options{Flags: []FlagValue{{Name: "lr", Value: "0.001"}, {Name: "min-lr", Value: "0.01"}}}, code: "SL007", loc: "flag --min-lr", msg: "above train.lr"},
	{name: "unknown env", src: okData, opts: Options{Env: []string{"SHARDLINE_MODEL_LAYRES=3"}}, code: "SL007", sev: SevWarning, loc: "env SHARDLINE_MODEL_LAYRES", msg: "did you mean SHARDLINE_MODEL_LAYERS?"},
	{name: "min", src: "[model]\nlayers = 0\n", code: "SL008", loc: "x.toml:2:10", msg: "model.layers (0) must be ≥ 1"},
	{name: "gt", src: "[train]\nlr = 0.0\n", code: "SL008", loc: "x.toml:2:6", msg: "must be > 0"},
	{name: "max", src: "[train]\nbeta2 = 1.5\n", code: "SL008", loc: "x.toml:2:9", msg: "must be ≤ 1"},
	{name: "nan", src: "[train]\nlr = nan\n", code: "SL008", loc: "x.toml:2:6", msg: "finite"},

	{name: "fsdp needs distributed optimizer", src: okData + "[fsdp]\nuse_distributed_optimizer = false\n", code: "SL101", loc: "x.toml:4:1"},
	{name: "fsdp no grad accumulation fusion", src: okData, opts: Options{Flags: []FlagValue{{Name: "gradient-accumulation-fusion", Value: "true"}}}, code: "SL102", loc: "flag --gradient-accumulation-fusion"},
	{name: "fsdp needs fsdp_dtensor", src: okData + "[checkpoint]\nckpt_format = \"torch_dist\"\n", code: "SL103", loc: "x.toml:4:1"},
	{name: "fsdp_dtensor needs fsdp", src: okData + "[fsdp]\nuse_megatron_fsdp = false\ndata_parallel_sharding_strategy = \"optim\"\n", code: "SL104", loc: "x.toml:4:1"},
	{name: "meta init with no_shard", src: okData + "[fsdp]\ninit_model_with_meta_device = true\ndata_parallel_sharding_strategy = \"no_shard\"\n", code: "SL105", loc: "x.toml:4:1"},
	{name: "nccl ub with double buffer off", src: okData + "[fsdp]\nuse_nccl_ub = true\nfsdp_double_buffer = false\n", code: "SL106", loc: "x.toml:5:1"},
	{name: "run name leaves the output directory", src: okData + "[run]\nname = \"../../etc\"\n", code: "SL009", sev: SevError, loc: "x.toml:4:1", msg: "must be one directory name: it holds a path separator"},
	{name: "run name with a terminal escape", src: okData + "[run]\nname = \"a\\u001b]0;title\\u0007\"\n", code: "SL009", sev: SevError, loc: "x.toml:4:1", msg: "it holds the control character U+001B"},
	{name: "run name longer than a file name", src: okData + "[run]\nname = \"" + strings.Repeat("r", 256) + "\"\n", code: "SL009", sev: SevError, loc: "x.toml:4:1", msg: "it is 256 bytes long, over the 255"},
	{name: "fp8 head not built", src: okData + "[precision]\nbf16 = true\n[precision.fp8]\nformat = \"hybrid\"\nhead_bf16 = false\n", code: "SL114", sev: SevNote, loc: "x.toml:7:1", msg: "output head"},
	{name: "fp8 blockwise", src: okData + "[precision]\nbf16 = true\n[precision.fp8]\nformat = \"e4m3\"\nrecipe = \"blockwise\"\n", code: "SL115", loc: "x.toml:7:1", msg: "per block of 128 values"},
	{name: "fp8 mxfp8", src: okData + "[precision]\nbf16 = true\n[precision.fp8]\nformat = \"e4m3\"\nrecipe = \"mxfp8\"\n", code: "SL115", loc: "x.toml:7:1", msg: "E8M0"},
	{name: "fp8 in fp32", src: okData + "[precision.fp8]\nformat = \"hybrid\"\n", code: "SL116", loc: "x.toml:4:1", msg: "needs precision.bf16 = true"},
	{name: "fp8 key without fp8", src: okData + "[precision.fp8]\namax_history_len = 1024\n", code: "SL117", loc: "x.toml:4:1", msg: `precision.fp8.format is "none"`},
	{name: "fp8 history with tensorwise", src: okData + "[precision]\nbf16 = true\n[precision.fp8]\nformat = \"hybrid\"\nrecipe = \"tensorwise\"\namax_compute_algo = \"max\"\n", code: "SL117", loc: "x.toml:8:1", msg: "configures delayed scaling"},
	{name: "fp8 bf16 layers unused", src: okData + "[precision]\nbf16 = true\n[precision.fp8]\nformat = \"hybrid\"\nlayers_at_end_in_bf16 = 2\n", code: "SL117", loc: "x.toml:7:1", msg: "first_last_layers_bf16 is false"},
	{name: "fp8 every layer bf16", src: okData + "[precision]\nbf16 = true\n[precision.fp8]\nformat = \"hybrid\"\nfirst_last_layers_bf16 = true\nlayers_at_start_in_bf16 = 2\nlayers_at_end_in_bf16 = 2\n", code: "SL117", loc: "x.toml:7:1", msg: "every one of the model's 4"},
	{name: "fp8 experts in a dense model", src: okData + "[precision]\nbf16 = true\n[precision.fp8]\nformat = \"hybrid\"\nexperts = false\n", code: "SL117", loc: "x.toml:7:1", msg: "no experts"},
	{name: "fp8 gather without sharding", src: okData + "[precision]\nbf16 = true\n[precision.fp8]\nformat = \"hybrid\"\nparam_gather = true\n[fsdp]\ndata_parallel_sharding_strategy = \"no_shard\"\n", code: "SL117", loc: "x.toml:7:1", msg: "nothing is all-gathered"},
	{name: "checkpoints kept but none written", src: okData + "[checkpoint]\nkeep_last = 3\n", code: "SL114", sev: SevNote, loc: "x.toml:4:1", msg: "so there are none to keep"},
	{name: "nccl ub implies double buffer", src: okData + "[fsdp]\nuse_nccl_ub = true\n", code: "SL106", sev: SevNote, loc: "x.toml:4:1", msg: "turns fsdp.fsdp_double_buffer on"},
	{name: "nccl ub with expandable segments", src: okData + "[fsdp]\nuse_nccl_ub = true\n[parallel]\ncuda_expandable_segments = true\n", code: "SL107", loc: "x.toml:6:1"},
	{name: "nccl ub with alloc conf", src: okData + "[fsdp]\nuse_nccl_ub = true\n[parallel]\ndevice = \"cuda\"\n",
		opts: Options{Env: []string{"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"}}, code: "SL107", loc: "x.toml:4:1", msg: "PYTORCH_CUDA_ALLOC_CONF"},
	{name: "max connections 1", src: okData + "[parallel]\ndevice = \"cuda\"\n", opts: Options{Env: []string{"CUDA_DEVICE_MAX_CONNECTIONS=1"}}, code: "SL108", loc: "x.toml", msg: "CUDA_DEVICE_MAX_CONNECTIONS=1"},
	{name: "max connections other", src: okData + "[parallel]\ndevice = \"cuda\"\n", opts: Options{Env: []string{"CUDA_DEVICE_MAX_CONNECTIONS=4"}}, code: "SL108", sev: SevWarning, loc: "x.toml"},
	{name: "optimizer", src: okData + "[train]\noptimizer = \"sdg\"\n", code: "SL109", loc: "x.toml:4:1", msg: `did you mean "sgd"?`},
	{name: "per token loss", src: okData + "[fsdp]\ncalculate_per_token_loss = false\n", code: "SL110", sev: SevWarning, loc: "x.toml:4:1"},
	{name: "bf16 reduce", src: okData + "[precision]\nbf16 = true\n[parallel]\nworld_size = 2\n[train]\nglobal_batch_size = 32\n", code: "SL111", sev: SevWarning, loc: "x.toml:4:1"},
	{name: "sharding without fsdp", src: okData + "[fsdp]\nuse_megatron_fsdp = false\n[checkpoint]\nckpt_format = \"torch_dist\"\n", code: "SL113", loc: "x.toml:4:1"},

	{name: "world size", src: okData + "[parallel]\nworld_size = 6\ntensor_parallel = 4\n", code: "SL201", loc: "x.toml:4:1"},
	{name: "heads by tp", src: okData + "[parallel]\nworld_size = 3\ntensor_parallel = 3\n[train]\nglobal_batch_size = 16\n", code: "SL202", loc: "x.toml:5:1", msg: "parallel.tensor_parallel (3) must divide model.heads (4)"},
	{name: "experts by ep", src: okData + "[model.moe]\nnum_experts = 6\n[parallel]\nworld_size = 4\nexpert_parallel = 4\n[train]\nglobal_batch_size = 64\n", code: "SL203", loc: "x.toml:7:1"},
	{name: "ep etp by stage", src: okData + "[model.moe]\nnum_experts = 8\n[parallel]\nworld_size = 2\nexpert_parallel = 4\n[train]\nglobal_batch_size = 32\n", code: "SL204", loc: "x.toml:7:1"},
	{name: "seq by 2cp", src: okData + "[model]\nseq_len = 100\n[parallel]\nworld_size = 8\ncontext_parallel = 8\n", code: "SL205", loc: "x.toml:4:1"},
	{name: "global batch", src: okData + "[parallel]\nworld_size = 4\n", code: "SL206", loc: "x.toml", msg: "(16 × 4 = 64)"},
	{name: "top k", src: okData + "[model.moe]\nnum_experts = 2\ntop_k = 3\n", code: "SL207", loc: "x.toml:5:1"},
	{name: "ep needs moe", src: okData + "[parallel]\nexpert_parallel = 1\nexpert_tensor_parallel = 1\n", opts: Options{Flags: []FlagValue{{Name: "expert-model-parallel-size", Value: "2"}}}, code: "SL208", loc: "flag --expert-model-parallel-size"},
	{name: "expert tensor parallel", src: okData + "[model.moe]\nnum_experts = 4\n[parallel]\nworld_size = 2\nexpert_tensor_parallel = 2\n[train]\nglobal_batch_size = 32\n", code: "SL211", loc: "x.toml:7:1"},
	{name: "pipeline", src: okData + "[parallel]\npipeline_parallel = 2\nworld_size = 2\n", code: "SL209", loc: "x.toml:4:1"},
	{name: "ffn by tp", src: okData + "[model]\nffn_hidden = 383\n[parallel]\nworld_size = 2\ntensor_parallel = 2\n", code: "SL210", loc: "x.toml:4:1"},
	{name: "tokens by tp", src: okData + "[model]\nseq_len = 9\n[parallel]\nworld_size = 2\ntensor_parallel = 2\n[train]\nmicro_batch_size = 1\nglobal_batch_size = 16\n", code: "SL213", loc: "x.toml:4:1", msg: "(1 × 9 / 1 = 9 tokens per rank)"},
	{name: "vocab by tp", src: okData + "[model]\nvocab_size = 257\n[parallel]\nworld_size = 2\ntensor_parallel = 2\n", code: "SL212", loc: "x.toml:7:1", msg: "must divide model.vocab_size (257)"},

	{name: "unit name", src: okData + "[fsdp]\nfsdp_unit_modules = [\"embeding\"]\n", code: "SL301", loc: "x.toml:4:1", msg: `did you mean "embedding"?`},
	{name: "unit absent", src: okData + "[fsdp]\nfsdp_unit_modules = [\"moe\"]\n", code: "SL301", loc: "x.toml:4:1", msg: "has no moe module"},
	{name: "double sharding", src: okData + "[model.moe]\nnum_experts = 8\n[parallel]\nworld_size = 4\nexpert_parallel = 4\n[train]\nglobal_batch_size = 64\n[fsdp]\nexpert_sharding_group = \"data_parallel\"\n", code: "SL302", loc: "x.toml:11:1"},
	{name: "heads divide hidden", src: okData + "[model]\nheads = 3\n", code: "SL303", loc: "x.toml:4:1"},
	{name: "even head size", src: okData + "[model]\nhidden = 12\nheads = 4\n", code: "SL303", loc: "x.toml:5:1", msg: "must be even"},
	{name: "kv heads", src: okData + "[model]\nkv_heads = 3\n", code: "SL303", loc: "x.toml:4:1"},
	{name: "layer freq", src: okData + "[model.moe]\nnum_experts = 4\nlayer_freq = 5\n", code: "SL304", loc: "x.toml:5:1"},
	{name: "chunks without rope layers", src: okData + "[model]\nnope_interval = 1\nattention_chunk_size = 8\n", code: "SL304", loc: "x.toml:5:1", msg: "no layer would attend in chunks"},
	{name: "nope first alone", src: okData + "[model]\nnope_first = true\n", code: "SL304", loc: "x.toml:4:1", msg: "nope_first is set without model.nope_interval"},
	{name: "vocab", src: okData + "[model]\nvocab_size = 100\n", code: "SL305", loc: "x.toml:4:1"},
	{name: "vocab gpt2", src: "[data]\npath = \"/\"\ntokenizer = \"gpt2\"\n[model]\nvocab_size = 50000\n", code: "SL305", loc: "x.toml:5:1", msg: "gpt2 tokenizer's 50257 tokens"},
	{name: "eod mask byte", src: okData + "eod_mask_loss = true\n", code: "SL306", loc: "x.toml:3:1", msg: "the byte tokenizer has none"},
	{name: "reset mask char", src: "[data]\npath = \"/\"\ntokenizer = \"char\"\nreset_attention_mask = true\n", code: "SL306", loc: "x.toml:4:1", msg: "data.reset_attention_mask = true needs the tokenizer's end-of-text token"},
	{name: "rope high below low", src: okData + "[model]\nrope_scaling = \"llama3\"\nrope_scaling_low_freq_factor = 2.0\nrope_scaling_high_freq_factor = 1.5\n", code: "SL309", loc: "x.toml:6:1", msg: "model.rope_scaling_high_freq_factor (1.5) is below model.rope_scaling_low_freq_factor (2.0)"},
	{name: "rope numbers without scaling", src: okData + "[model]\nrope_scaling_original_max_position_embeddings = 4096\n", code: "SL310", loc: "x.toml:4:1", msg: "model.rope_scaling_original_max_position_embeddings = 4096 while model.rope_scaling = \"none\""},
	{name: "chunk covers sequence", src: okData + "[model]\nseq_len = 64\nattention_chunk_size = 64\n", code: "SL307", sev: SevNote, loc: "x.toml:5:1", msg: "every sequence lies in one chunk"},
	{name: "tokenizer file", src: okData + "tokenizer = \"./rules_test.go\"\n", code: "SL308", loc: "x.toml:3:1", msg: "neither a Hugging Face tokenizer.json"},
	{name: "tokenizer dir", src: okData + "tokenizer = \"./testdata\"\n", code: "SL308", loc: "x.toml:3:1", msg: "holds neither tokenizer.json nor tokenizer.model"},
	{name: "data path", src: "[data]\npath = \"/no/such/file.txt\"\n", code: "SL401", sev: SevWarning, loc: "x.toml:2:1"},
	{name: "tokenizer missing", src: okData + "tokenizer = \"/no/such/tokenizer.json\"\n", code: "SL402", sev: SevWarning, loc: "x.toml:3:1"},
	{name: "data path var", src: "[data]\npath = \"${SHARDLINE_TEST_UNSET_VAR}/x\"\n", code: "SL401", sev: SevWarning, loc: "x.toml:2:1", msg: "SHARDLINE_TEST_UNSET_VAR is not set"},
}

func TestRules(t *testing.T) {
	for _, tc := range ruleCases {
		t.Run(tc.name, func(t *testing.T) {
			diags := lintString(t, tc.src, tc.opts, tc.files)
			for _, d := range diags {
				if d.Code == tc.code {
					assert.Equal(t, tc.sev, d.Severity, "severity of %s", d)
					assert.Equal(t, tc.loc, d.Location()[:min(len(tc.loc), len(d.Location()))], "location of %s", d)
					assert.Contains(t, d.Message, tc.msg)
					assert.NotEmpty(t, d.Help, "every finding says how to fix it")
					_, known := RuleFor(d.Code)
					assert.True(t, known, "code %s is registered in Rules", d.Code)
					return
				}
			}
			t.Fatalf("want %s, got:\n%v", tc.code, diags)
		})
	}
}

// TestEveryRuleTested keeps Rules and the table above in step: a rule without a
// case is untested, a case without a rule is unregistered. SL5xx rules are tested in
// parallel, where the plan is compiled.
func TestEveryRuleTested(t *testing.T) {
	tested := map[string]bool{}
	for _, tc := range ruleCases {
		tested[tc.code] = true
	}
	for _, r := range Rules {
		if strings.HasPrefix(r.Code, "SL5") || r.Code == "SL112" {
			continue
		}
		assert.True(t, tested[r.Code], "rule %s (%s) has no test case", r.Code, r.Title)
	}
}

func TestCleanDefaultRecipe(t *testing.T) {
	diags := lintString(t, okData, Options{}, nil)
	assert.Empty(t, diags)
}

func TestAllProblemsAtOnce(t *testing.T) {
	diags := lintString(t, "[modle]\nx = 1\n[model]\nlayres = 1\nheads = \"x\"\n[train]\nlr_schedule = \"x\"\n", Options{}, nil)
	var codes []string
	for _, d := range diags {
		codes = append(codes, d.Location()+" "+d.Code)
	}
	assert.Equal(t, []string{"x.toml:1:2 SL002", "x.toml:4:1 SL002", "x.toml:5:9 SL003", "x.toml:7:15 SL004"}, codes)
}
