package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func importTT(t *testing.T, file string, worldSize int) (*Resolved, Diagnostics) {
	t.Helper()
	src, err := os.ReadFile("testdata/torchtitan/" + file)
	require.NoError(t, err)
	return importTTClean(t, file, src, worldSize)
}

func requireNoErrors(t *testing.T, diags Diagnostics) {
	t.Helper()
	for _, d := range diags {
		require.NotEqual(t, SevError, d.Severity, "%s: %s", d.Location(), d.Message)
	}
}

// TestTorchtitanFlavourSizes: the MLP sizes torchtitan's formulas give for its
// flavours are the published models' (Hugging Face config.json intermediate_size of
// meta-llama/Llama-3.1-8B, -70B, -405B; Llama-4-Scout-17B-16E's intermediate_size
// for its experts and intermediate_size_mlp for dense layers).
func TestTorchtitanFlavourSizes(t *testing.T) {
	require.Equal(t, 14336, ttLlama3["8B"].ffnHidden())
	require.Equal(t, 28672, ttLlama3["70B"].ffnHidden())
	require.Equal(t, 53248, ttLlama3["405B"].ffnHidden())
	require.Equal(t, 768, ttLlama3["debugmodel"].ffnHidden())
	require.Equal(t, 8192, ttLlama4["17bx16e"].expertHidden())
	require.Equal(t, 16384, ttLlama4["17bx128e"].ffnHidden())
	require.Equal(t, 512, ttLlama4["debugmodel"].expertHidden()) // 1024·2/3 = 682, /2 = 341, up to 512
	for name, f := range ttLlama3 {
		require.Zero(t, f.experts, name)
	}
}

// TestImportTorchtitanLlama3_8B: torchtitan's 8B preset for 64 GPUs becomes the
// 8B model on 64 ranks with every value traced to its setting, and lints clean.
func TestImportTorchtitanLlama3_8B(t *testing.T) {
	res, diags := importTT(t, "llama3_8b.toml", 64)
	requireNoErrors(t, diags)
	requireNoErrors(t, Lint(res, nil))
	r := res.Recipe
	m := r.Model
	require.Equal(t, []int{32, 4096, 32, 8, 14336, 128256, 8192}, []int{m.Layers, m.Hidden, m.Heads, m.KVHeads, m.FFNHidden, m.VocabSize, m.SeqLen})
	require.Equal(t, "llama3", m.RopeScaling)
	require.Equal(t, 8.0, m.RopeScalingFactor)
	require.Equal(t, 500000.0, m.RopeTheta)
	require.False(t, m.TieEmbeddings)
	require.Zero(t, m.MoE.NumExperts)
	tr := r.Train
	require.Equal(t, []int{1000, 1, 64, 200, 800}, []int{tr.Steps, tr.MicroBatchSize, tr.GlobalBatchSize, tr.WarmupSteps, tr.LRDecaySteps})
	require.Equal(t, 3e-4, tr.LR)
	require.Equal(t, "linear", tr.LRSchedule) // torchtitan's default decay
	require.Zero(t, tr.MinLRFactor)
	require.True(t, tr.DecayNormsAndEmbeddings)
	require.Equal(t, 0, tr.EvalInterval) // [validation] enable = false
	require.Equal(t, 64, r.Parallel.WorldSize)
	require.Equal(t, "cuda", r.Parallel.Device)
	require.Equal(t, "optim_grads_params", r.FSDP.DataParallelShardingStrategy)
	require.True(t, r.Precision.BF16)
	require.Equal(t, "selective", r.ActivationCheckpoint.Mode)
	require.Equal(t, "outputs/checkpoint", r.Checkpoint.Dir)
	require.Equal(t, 500, r.Checkpoint.Interval)
	require.Equal(t, 10, r.Checkpoint.KeepLast) // torchtitan's keep_latest_k default
	require.Equal(t, "./outputs", r.Run.OutputDir)
	require.Equal(t, "./assets/hf/Llama-3.1-8B", r.Data.Tokenizer, "hf_assets_path: the directory's tokenizer.json")

	o := res.Origin("train.micro_batch_size")
	require.Equal(t, FromImport, o.Kind)
	require.Equal(t, "llama3_8b.toml:33:1", o.Location())
	require.Equal(t, "imported from [training] local_batch_size = 1 at llama3_8b.toml:33:1", o.Describe())
	require.Contains(t, res.Origin("train.global_batch_size").Name, "torchtitan's default for [training] global_batch_size")

	body, err := AnnotatedTOML(res)
	require.NoError(t, err)
	require.Contains(t, string(body), `ffn_hidden = 14336  # [model] flavor = "8B" (torchtitan's llama3 table: 2/3 of 4·dim, ×1.3, rounded up to a multiple of 1024) (line 20)`)
	back, diags := LoadBytes("llama3-8b.toml", body, Options{})
	requireNoErrors(t, diags)
	require.Equal(t, res.Recipe, back.Recipe, "the written recipe loads back to the imported one")

	// Notes name what has no effect, grouped by reason and table.
	var notes []string
	for _, d := range diags0(t, "llama3_8b.toml", 64) {
		if d.Code == "SL011" {
			notes = append(notes, d.Message)
		}
	}
	require.Contains(t, notes, "[profiling] enable_profiling, save_traces_folder, profile_freq: no effect in shardline: profile with shardline run --trace (a Chrome trace)")
	// [metrics] enable_tensorboard carries onto logging.tensorboard; where
	// torchtitan puts the files (save_tb_folder) is a note: the run directory
	// holds them.
	require.True(t, r.Logging.Tensorboard)
	require.Equal(t, "imported from [metrics] enable_tensorboard = true at llama3_8b.toml:15:1", res.Origin("logging.tensorboard").Describe())
	require.Contains(t, notes, "[metrics] save_tb_folder: no effect in shardline: shardline writes the TensorBoard event files into the run directory (run.output_dir/run.name), beside metrics.jsonl; tensorboard --logdir run.output_dir shows every run")
}

func diags0(t *testing.T, file string, ws int) Diagnostics {
	_, d := importTT(t, file, ws)
	return d
}

// TestImportTorchtitanDebug: the debug model with awkward TOML (literal strings,
// a dotted key, an array of comments), a decay_ratio whose stable phase is the one
// step torchtitan always has, validation on.
func TestImportTorchtitanDebug(t *testing.T) {
	res, diags := importTT(t, "llama3_debug.toml", 0)
	requireNoErrors(t, diags)
	requireNoErrors(t, Lint(res, nil))
	r := res.Recipe
	require.Equal(t, []int{6, 256, 16, 768, 2048}, []int{r.Model.Layers, r.Model.Hidden, r.Model.Heads, r.Model.FFNHidden, r.Model.VocabSize})
	require.Equal(t, 0, r.Model.KVHeads)
	require.Equal(t, []int{10, 8, 8, 2, 8, 5, 10, 1}, []int{r.Train.Steps, r.Train.MicroBatchSize, r.Train.GlobalBatchSize, r.Train.WarmupSteps,
		r.Train.LRDecaySteps, r.Train.EvalInterval, r.Train.EvalSteps, r.Logging.Interval})
	require.Equal(t, 1, r.Parallel.WorldSize)
	require.Equal(t, "./outputs", r.Run.OutputDir)
	require.False(t, r.Logging.Tensorboard, "torchtitan writes no TensorBoard events unless [metrics] enable_tensorboard")
	require.Contains(t, res.Origin("logging.tensorboard").Name, "torchtitan's default for [metrics] enable_tensorboard")
	require.Contains(t, res.Origin("train.lr_decay_steps").Name, "[lr_scheduler] decay_ratio = 0.8")
	var msgs []string
	for _, d := range diags {
		msgs = append(msgs, d.Location()+" "+d.Message)
	}
	all := strings.Join(msgs, "\n")
	require.Contains(t, all, "llama3_debug.toml:37:1 [training.dataloader] num_workers: no effect in shardline")
	require.Contains(t, all, "llama3_debug.toml:41:1 [parallelism] data_parallel_shard_degree = -1: the shard degree takes the ranks left over; with no --world-size the recipe has world_size 1")
	require.Contains(t, all, "selective_ac_option = '2': torchtitan's selective policy (one layer in every 2 recomputed whole)")
}

// TestImportTorchtitanLlama4: Scout's shape comes from the llama4 table and
// its router from torchtitan's MoEArgs (sigmoid, top 1, the token scaled before
// its expert, unnormalised, expert biases moved by 1e-3, no aux loss): the file
// imports without an error.
func TestImportTorchtitanLlama4(t *testing.T) {
	res, diags := importTT(t, "llama4_17bx16e.toml", 64)
	m := res.Recipe.Model
	require.Equal(t, []int{48, 5120, 40, 8, 16384, 202048}, []int{m.Layers, m.Hidden, m.Heads, m.KVHeads, m.FFNHidden, m.VocabSize})
	require.Equal(t, []int{16, 1, 1, 8192, 1}, []int{m.MoE.NumExperts, m.MoE.TopK, m.MoE.SharedExperts, m.MoE.ExpertFFNHidden, m.MoE.LayerFreq})
	require.Equal(t, []int{64, 8}, []int{res.Recipe.Parallel.WorldSize, res.Recipe.Parallel.TensorParallel})
	require.True(t, res.Recipe.Precision.BF16, "FSDP over 8 shards: mixed precision")
	requireNoErrors(t, diags)
	require.Equal(t, MoE{NumExperts: 16, TopK: 1, ExpertFFNHidden: 8192, SharedExperts: 1, LayerFreq: 1, ScoreFunction: "sigmoid", TopKScale: 1,
		ScoreBeforeExpert: true, ExpertBias: true, BiasUpdateRate: 1e-3}, m.MoE)
	require.Equal(t, "imported from [model] flavor = \"17bx16e\" (torchtitan's llama4 defaults (MoEArgs): score_before_experts) at llama4_17bx16e.toml:8:1",
		res.Origin("model.moe.score_before_expert").Describe())

	// 17bx128e: no RoPE scaling, MoE on every other layer.
	src := []byte("[model]\nname = \"llama4\"\nflavor = \"17bx128e\"\n")
	res, _ = importTTClean(t, "maverick.toml", src, 0)
	require.Equal(t, "none", res.Recipe.Model.RopeScaling)
	require.Equal(t, 2, res.Recipe.Model.MoE.LayerFreq)
	require.Equal(t, 128, res.Recipe.Model.MoE.NumExperts)
}

// TestImportTorchtitan2024: the 2024 layout's keys (degrees under [training] and
// [experimental], batch_size, warmup_steps) land where today's do, and
// diagnostics name them as written.
func TestImportTorchtitan2024(t *testing.T) {
	res, diags := importTT(t, "llama3_2024.toml", 8)
	requireNoErrors(t, diags)
	r := res.Recipe
	require.Equal(t, []int{4, 16, 5, 256, 8, 2}, []int{r.Train.MicroBatchSize, r.Train.GlobalBatchSize, r.Train.WarmupSteps, r.Model.SeqLen,
		r.Parallel.WorldSize, r.Parallel.TensorParallel})
	require.Equal(t, "none", r.ActivationCheckpoint.Mode)
	require.Equal(t, "imported from [training] batch_size = 4 at llama3_2024.toml:17:1", res.Origin("train.micro_batch_size").Describe())
	for _, d := range diags {
		require.NotContains(t, d.Message, "[parallelism]", "the 2024 file has no [parallelism] table: %s", d.Message)
	}
}

// TestImportTorchtitanFP8Experts: torchao's float8 converters on an MoE
// model (the linear one and the grouped one) import as FP8 with the experts'
// products in FP8, which run executes (config.NotExecuted has nothing to
// refuse in FP8), with a note on the grouped products' scaling granularity.
func TestImportTorchtitanFP8Experts(t *testing.T) {
	src := "[model]\nname = \"llama4\"\nflavor = \"debugmodel\"\nconverters = [\"float8\", \"quantize.grouped_mm.float8\"]\n[quantize.linear.float8]\nfilter_fqns = [\"output\"]\n"
	res, diags := importTTClean(t, "x.toml", []byte(src), 0)
	requireNoErrors(t, diags)
	f := res.Recipe.Precision.FP8
	require.Equal(t, [2]string{"hybrid", "tensorwise"}, [2]string{f.Format, f.Recipe})
	require.True(t, f.Experts)
	for _, u := range NotExecuted(&res.Recipe) {
		require.NotContains(t, u.Key, "precision.fp8", "the FP8 settings run: %s", u.Why) // the debug model's head size of 16 is a GPU kernel's refusal
	}
	var notes []string
	for _, d := range diags {
		if d.Code == "SL011" {
			notes = append(notes, d.Message)
		}
	}
	require.Contains(t, strings.Join(notes, "\n"), "torchao's float8 grouped products scale rowwise")
}

// TestImportTorchtitanRefusals: each setting shardline does not do is refused
// with its code, at its line, naming the setting and a fix.
func TestImportTorchtitanRefusals(t *testing.T) {
	cases := []struct {
		name, src string
		ws        int
		code, at  string
		msg       string
	}{
		{"mx", "[model]\nconverters = [\"mx\"]\n", 0, "SL010", "x.toml:2:1", "MX formats"},
		{"fp8 rowwise", "[model]\nconverters = [\"float8\"]\n[float8]\nrecipe_name = \"rowwise\"\n", 0, "SL010", "x.toml:4:1", "scales each row"},
		{"fp8 recipe typo", "[model]\nconverters = [\"float8\"]\n[float8]\nrecipe_name = \"tensorwse\"\n", 0, "SL004", "x.toml:4:1", "torchtitan takes tensorwise"},
		{"fp8 one module", "[model]\nconverters = [\"quantize.linear.float8\"]\n[quantize.linear.float8]\nfilter_fqns = [\"output\", \"attention.wq\"]\n", 0, "SL010", "x.toml:4:1", `keeps module "attention.wq" out of FP8`},
		{"fp8 experts alone", "[model]\nconverters = [\"quantize.grouped_mm.float8\"]\n", 0, "SL010", "x.toml:2:1", "grouped products alone"},
		{"hsdp", "[parallelism]\ndata_parallel_replicate_degree = 2\n", 8, "SL010", "x.toml:2:1", "HSDP (2 replicas of groups sharded 4 ways)"},
		{"stable phase", "[training]\nsteps = 100\n[lr_scheduler]\nwarmup_steps = 10\ndecay_ratio = 0.5\n", 0, "SL010", "x.toml:5:1", "holds the peak for 41 steps"},
		{"ratio range", "[lr_scheduler]\ndecay_ratio = -0.5\n", 0, "SL008", "x.toml:2:1", "a fraction of the steps, in [0, 1]"},
		{"sqrt", "[lr_scheduler]\ndecay_type = \"sqrt\"\n", 0, "SL010", "x.toml:2:1", "1 − √progress"},
		{"adam L2", "[optimizer]\nname = \"Adam\"\n", 0, "SL010", "x.toml:2:1", "torch.optim.Adam adds weight decay (0.1) to the gradient"},
		{"other optimizer", "[optimizer]\nname = \"Muon\"\n", 0, "SL010", "x.toml:2:1", "shardline's optimizers are"},
		{"other model", "[model]\nname = \"deepseek_v3\"\nflavor = \"16B\"\n", 0, "SL010", "x.toml:2:1", "shardline imports torchtitan's llama3 and llama4 flavours"},
		{"flavour typo", "[model]\nflavor = \"8b\"\n", 0, "SL004", "x.toml:2:1", `llama3 has no llama3 flavour "8b"; did you mean "8B"?`},
		{"unknown key", "[training]\nbogus = 1\n", 0, "SL002", "x.toml:2:1", "training.bogus is not a torchtitan job-file key"},
		{"unknown table", "[fancy]\nx = 1\n", 0, "SL002", "x.toml:2:1", "[fancy] is not a torchtitan job-file section"},
		{"wrong type", "[training]\nseq_len = \"long\"\n", 0, "SL003", "x.toml:2:11", `training.seq_len = "long": torchtitan's training.seq_len is an integer`},
		{"alias twice", "[training]\nlocal_batch_size = 2\nbatch_size = 4\n", 0, "SL006", "x.toml:3:1", "training.batch_size is given twice: here and at x.toml:2:1 (training.local_batch_size)"},
		{"world size", "[parallelism]\ntensor_parallel_degree = 3\n", 8, "SL201", "x.toml:1:1", "--world-size 8 is not divisible by replicate × tp × pp × cp = 3"},
		{"world size explicit", "[parallelism]\ndata_parallel_shard_degree = 2\n", 8, "SL201", "x.toml:2:1", "--world-size 8 is not replicate × shard × tp × pp × cp = 2"},
		{"cpu offload", "[training]\nenable_cpu_offload = true\n", 0, "SL010", "x.toml:2:1", "keeps weights and optimizer state on the device"},
		{"torchft", "[fault_tolerance]\nenable = true\n", 0, "SL010", "x.toml:2:1", "TorchFT"},
		{"early step", "[optimizer]\nearly_step_in_backward = true\n", 0, "SL010", "x.toml:2:1", "never clipped"},
		{"memory budget", "[activation_checkpoint]\nmode = \"memory_budget\"\n", 0, "SL010", "x.toml:2:1", "min-cut"},
		{"custom import", "[experimental]\ncustom_import = \"my.model\"\n", 0, "SL010", "x.toml:2:1", "loads Python code"},
		{"zero degree", "[parallelism]\ntensor_parallel_degree = 0\n", 0, "SL008", "x.toml:2:1", "a parallel degree is at least 1"},
		{"syntax", "[training\n", 0, "SL001", "x.toml:1:10", "TOML syntax error"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, diags := importTTClean(t, "x.toml", []byte(c.src), c.ws)
			var got []string
			for _, d := range diags {
				if d.Severity != SevError {
					continue
				}
				got = append(got, d.Code+" "+d.Location()+" "+d.Message)
				if d.Code == c.code && d.Location() == c.at && strings.Contains(d.Message, c.msg) {
					require.NotEmpty(t, d.Help, "a fix")
					return
				}
			}
			t.Fatalf("want %s at %s containing %q; got\n%s", c.code, c.at, c.msg, strings.Join(got, "\n"))
		})
	}
}

// TestImportTorchtitanDDP: replicas with no sharding are torchtitan's DDP, which is
// shardline's plain data parallelism; the global batch counts every replica.
func TestImportTorchtitanDDP(t *testing.T) {
	src := "[parallelism]\ndata_parallel_replicate_degree = 4\ndata_parallel_shard_degree = 1\n[training]\nlocal_batch_size = 2\n"
	res, diags := importTTClean(t, "ddp.toml", []byte(src), 4)
	requireNoErrors(t, diags)
	r := res.Recipe
	require.Equal(t, "no_shard", r.FSDP.DataParallelShardingStrategy)
	require.Equal(t, 8, r.Train.GlobalBatchSize)
	requireNoErrors(t, Lint(res, nil))

	// An explicit global batch accumulates: 32 = 2 × 4 ranks × 4 micro-batches.
	res, diags = importTTClean(t, "ddp.toml", []byte(src+"global_batch_size = 32\n"), 4)
	requireNoErrors(t, diags)
	require.Equal(t, 32, res.Recipe.Train.GlobalBatchSize)
}

// TestImportTorchtitanBlockCausal: the flavours whose attention masks documents
// apart (block_causal: _flex, _varlen) import with data.reset_attention_mask,
// the rest of the model as their base flavour's.
func TestImportTorchtitanBlockCausal(t *testing.T) {
	for _, flavor := range []string{"8B_flex", "debugmodel_varlen_attn"} {
		res, diags := ImportTorchtitan("x.toml", []byte("[model]\nname = \"llama3\"\nflavor = \""+flavor+"\"\n[training]\ndataset_path = \"/data/c4\"\n"), 0)
		requireNoErrors(t, diags)
		require.True(t, res.Recipe.Data.ResetAttentionMask, flavor)
		require.Contains(t, res.Origin("data.reset_attention_mask").Describe(), "x.toml:3:1", flavor)
		base, diags := ImportTorchtitan("x.toml", []byte("[model]\nname = \"llama3\"\nflavor = \""+map[string]string{"8B_flex": "8B", "debugmodel_varlen_attn": "debugmodel"}[flavor]+"\"\n[training]\ndataset_path = \"/data/c4\"\n"), 0)
		requireNoErrors(t, diags)
		require.Equal(t, base.Recipe.Model, res.Recipe.Model, flavor)
		require.False(t, base.Recipe.Data.ResetAttentionMask)
	}
}

// TestImportTorchtitanIRoPE: the _irope flavours import as their base flavour
// with torchtitan's iRoPE: NoPE layers 0, 4, 8… (layer_id %
// every_n_layers_nope == 0: model.nope_first), the others within blocks of
// fixed_attn_block_size positions (256 in the debug model, 8192 otherwise)
// and every layer within documents (flex attention's block_causal masks).
// The imported recipe lints without errors.
func TestImportTorchtitanIRoPE(t *testing.T) {
	for flavor, chunk := range map[string]int{"debugmodel_irope": 256, "17bx16e_irope": 8192, "17bx128e_irope": 8192} {
		src := "[model]\nname = \"llama4\"\nflavor = \"" + flavor + "\"\n[training]\ndataset_path = \"/data/c4\"\n"
		res, diags := ImportTorchtitan("x.toml", []byte(src), 0)
		requireNoErrors(t, diags)
		m := res.Recipe.Model
		require.Equal(t, []any{4, true, chunk}, []any{m.NoPEInterval, m.NoPEFirst, m.AttentionChunkSize}, flavor)
		require.True(t, m.IsNoPELayer(0) && m.IsNoPELayer(4) && !m.IsNoPELayer(3), flavor)
		require.Equal(t, []int{0, chunk}, []int{m.AttentionChunk(0), m.AttentionChunk(1)}, flavor)
		require.True(t, res.Recipe.Data.ResetAttentionMask, flavor)
		require.Contains(t, res.Origin("model.attention_chunk_size").Describe(), "fixed_attn_block_size", flavor)
		base, diags := ImportTorchtitan("x.toml", []byte(strings.Replace(src, "_irope", "", 1)), 0)
		requireNoErrors(t, diags)
		m.NoPEInterval, m.NoPEFirst, m.AttentionChunkSize = 0, false, 0
		require.Equal(t, base.Recipe.Model, m, flavor)
		requireNoErrors(t, Lint(res, nil))
	}
}

// report3bx128e are the recipe keys of the torchtitan report's llama4
// "3bx128e" (its own model code: width 2048, 48 layers all MoE, 32 heads over 4
// key/value heads, 128 experts of ffn 768 with one shared, top 8) and the
// report's GPUs.
var report3bx128e = []string{"model.layers=48", "model.hidden=2048", "model.heads=32", "model.kv_heads=4", "model.vocab_size=202048",
	"model.ffn_hidden=8192", "model.rope_theta=500000", "model.moe.num_experts=128", "model.moe.expert_ffn_hidden=768",
	"model.moe.layer_freq=1", "model.moe.top_k=8", "parallel.device_profile=h20-96gb"}

// TestImportTorchtitanReport: the report's job file, its flavour given as keys,
// imports with notes only (enable_checkpoint, the older name of [checkpoint]
// enable, among them), with the llama4 router and the keys' shape, and lints
// with notes only; without the keys the flavour is an error that says how to
// give them.
func TestImportTorchtitanReport(t *testing.T) {
	path := filepath.Join("testdata", "torchtitan", "llama4_3bx128e.toml")
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	// The report trains on C4 from the hub; its local copy is given here.
	corpus := filepath.Join(t.TempDir(), "c4.jsonl")
	require.NoError(t, os.WriteFile(corpus, []byte(`{"text": "a document"}`+"\n"), 0o644))
	res, diags := ImportTorchtitanWith(path, src, 8, append([]string{"data.path=" + corpus}, report3bx128e...))
	for _, d := range diags {
		require.Equal(t, SevNote, d.Severity, "%s %s %s", d.Location(), d.Code, d.Message)
	}
	r := res.Recipe
	require.Equal(t, []int{48, 2048, 32, 4, 128, 8, 768, 1, 1}, []int{r.Model.Layers, r.Model.Hidden, r.Model.Heads, r.Model.KVHeads,
		r.Model.MoE.NumExperts, r.Model.MoE.TopK, r.Model.MoE.ExpertFFNHidden, r.Model.MoE.SharedExperts, r.Model.MoE.LayerFreq})
	require.Equal(t, []int{8, 4, 8192, 1}, []int{r.Parallel.WorldSize, r.Parallel.ExpertParallel, r.Model.SeqLen, r.Train.MicroBatchSize})
	require.True(t, r.Model.MoE.ExpertBias && r.Model.MoE.ScoreBeforeExpert && r.Model.MoE.ScoreFunction == "sigmoid")
	require.Equal(t, 500, r.Checkpoint.Interval, "enable_checkpoint turns checkpoints on")
	require.Equal(t, "full", r.ActivationCheckpoint.Mode)
	for _, d := range Lint(res, nil) {
		if d.Code == "SL402" {
			// hf_assets_path, carried into data.tokenizer, names the job's
			// machine's directory: not there on this one, a warning that
			// says so.
			require.Equal(t, "./assets/hf/Llama-4-Scout-17B-16E", r.Data.Tokenizer)
			continue
		}
		require.Equal(t, SevNote, d.Severity, "lint: %s %s %s", d.Location(), d.Code, d.Message)
	}

	_, diags = ImportTorchtitanWith(path, src, 8, nil)
	require.True(t, diags.HasErrors())
	var all []string
	for _, d := range diags {
		all = append(all, d.Message+" "+d.Help)
	}
	require.Contains(t, strings.Join(all, "\n"), `llama4 has no llama4 flavour "3bx128e"`)
	require.Contains(t, strings.Join(all, "\n"), "recipe import --set model.layers=… --set model.hidden=…")
}

// TestImportTorchtitanRopeScaling: each flavour imports torchtitan's own
// RoPEScalingArgs (at the pinned commit): llama3's scaling_factor 8,
// low_freq_factor 1, high_freq_factor 4 and 8192 original positions on every
// flavour (its rope_scaling_args defaults to them); llama4's 16, 1, 1 and 8192
// on the flavours that set rope_scaling_args (debugmodel, 17bx16e and their
// _irope flavours), none on 17bx128e and 17bx128e_irope. Each imported recipe
// lints without errors, and its origin names the setting of RoPEScalingArgs.
func TestImportTorchtitanRopeScaling(t *testing.T) {
	type scaling struct {
		kind              string
		factor, low, high float64
		original          int
	}
	llama31, llama4, none := scaling{"llama3", 8, 1, 4, 8192}, scaling{"llama3", 16, 1, 1, 8192}, scaling{"none", 8, 1, 4, 8192}
	cases := map[[2]string]scaling{
		{"llama4", "debugmodel"}: llama4, {"llama4", "17bx16e"}: llama4, {"llama4", "debugmodel_irope"}: llama4, {"llama4", "17bx16e_irope"}: llama4,
		{"llama4", "17bx128e"}: none, {"llama4", "17bx128e_irope"}: none,
	}
	for flavor := range ttLlama3 {
		cases[[2]string{"llama3", flavor}] = llama31
	}
	require.Len(t, cases, len(ttLlama3)+len(ttLlama4), "every flavour of both tables")
	for c, want := range cases {
		src := "[model]\nname = \"" + c[0] + "\"\nflavor = \"" + c[1] + "\"\n[training]\ndataset_path = \"/data/c4\"\n"
		res, diags := ImportTorchtitan("x.toml", []byte(src), 0)
		requireNoErrors(t, diags)
		m := res.Recipe.Model
		got := scaling{m.RopeScaling, m.RopeScalingFactor, m.RopeScalingLowFreqFactor, m.RopeScalingHighFreqFactor, m.RopeScalingOriginalMaxPositionEmbeddings}
		require.Equal(t, want, got, "%s %s", c[0], c[1])
		if want.kind == "llama3" {
			require.Contains(t, res.Origin("model.rope_scaling_high_freq_factor").Describe(), "high_freq_factor", "%s %s", c[0], c[1])
		}
		requireNoErrors(t, Lint(res, nil))
	}
}
