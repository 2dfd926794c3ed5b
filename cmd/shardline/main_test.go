package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/shardline/shardline/trainer"
)

// shardline runs the CLI in-process with an empty environment.
func shardline(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Main(args, &out, &errb, env)
	return code, out.String(), errb.String()
}

func writeRecipe(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "r.toml")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	return p
}

const recipesDir = "../../recipes"

// TestLintShippedRecipes: the shipped recipes lint clean under --strict, with
// at most SL114 notes (settings the trainer refuses for now).
func TestLintShippedRecipes(t *testing.T) {
	code, out, errs := shardline(t, nil, "lint", "--strict", recipesDir)
	assert.Equal(t, 0, code, errs)
	assert.Regexp(t, `0 errors, 0 warnings|no problems found`, out)
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "[SL") {
			assert.Contains(t, line, "note[SL114]", line)
		}
	}
	code, out, errs = shardline(t, nil, "lint", "--strict", filepath.Join(recipesDir, "tiny.toml"), filepath.Join(recipesDir, "moe-tiny.toml"))
	assert.Equal(t, 0, code, errs)
	assert.Equal(t, "no problems found\n", out, "the CPU recipes have nothing to note")
}

func TestLintExitCodes(t *testing.T) {
	bad := writeRecipe(t, "[model]\nlayres = 4\n")
	warn := writeRecipe(t, "[data]\npath = \"/does/not/exist\"\n")
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string // substring of stdout
		err  string // substring of stderr
	}{
		{"errors", []string{"lint", bad}, 1, "r.toml:2:1: error[SL002]: unknown key layres in [model]; did you mean layers?", ""},
		{"warning passes", []string{"lint", warn}, 0, "warning[SL401]", ""},
		{"warning strict", []string{"lint", "--strict", warn}, 1, "warning[SL401]", ""},
		{"missing file", []string{"lint", "/no/such.toml"}, 2, "", "/no/such.toml does not exist"},
		{"empty dir", []string{"lint", t.TempDir()}, 2, "", "holds no .toml recipes"},
		{"unknown flag", []string{"lint", "--num-layerz", "3", bad}, 2, "", "unknown flag: --num-layerz"},
		{"bad format", []string{"lint", "--format", "xml", bad}, 2, "", `--format "xml" is not one of`},
		{"no args", []string{"lint"}, 2, "", "requires at least 1 arg"},
		{"bad flag value", []string{"lint", "--num-layers", "x", filepath.Join(recipesDir, "tiny.toml")}, 1, "flag --num-layers: error[SL007]", ""},
		{"megatron bool", []string{"lint", "--use-nccl-ub", "--fsdp-double-buffer=false", filepath.Join(recipesDir, "tiny.toml")}, 1, "flag --fsdp-double-buffer: error[SL106]", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := shardline(t, nil, tc.args...)
			assert.Equal(t, tc.code, code, "stdout:\n%s\nstderr:\n%s", out, errs)
			assert.Contains(t, out, tc.out)
			assert.Contains(t, errs, tc.err)
		})
	}
}

func TestLintEnvironmentOverride(t *testing.T) {
	tiny := filepath.Join(recipesDir, "tiny.toml")
	code, out, _ := shardline(t, []string{"SHARDLINE_PARALLEL_WORLD_SIZE=3"}, "lint", tiny)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "env SHARDLINE_PARALLEL_WORLD_SIZE: error[SL206]")
}

func TestLintJSON(t *testing.T) {
	bad := writeRecipe(t, "[model]\nlayres = 4\n[train]\nlr = -1.0\n")
	code, out, _ := shardline(t, nil, "lint", "--format", "json", bad)
	assert.Equal(t, 1, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	var d map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &d))
	assert.Equal(t, "SL008", d["code"])
	assert.Equal(t, "error", d["severity"])
	assert.Equal(t, "train.lr", d["key"])
	assert.Equal(t, float64(4), d["line"])
	assert.Equal(t, float64(6), d["column"])
	assert.NotEmpty(t, d["help"])
}

func TestLintSARIF(t *testing.T) {
	bad := writeRecipe(t, "[model]\nlayres = 4\n")
	code, out, _ := shardline(t, nil, "lint", "--format", "sarif", bad, filepath.Join(recipesDir, "tiny.toml"))
	assert.Equal(t, 1, code)
	var log struct {
		Version string `json:"version"`
		Runs    []struct {
			Tool struct {
				Driver struct {
					Name  string `json:"name"`
					Rules []struct {
						ID string `json:"id"`
					} `json:"rules"`
				} `json:"driver"`
			} `json:"tool"`
			Results []struct {
				RuleID    string `json:"ruleId"`
				RuleIndex int    `json:"ruleIndex"`
				Level     string `json:"level"`
				Locations []struct {
					PhysicalLocation struct {
						ArtifactLocation struct {
							URI string `json:"uri"`
						} `json:"artifactLocation"`
						Region struct {
							StartLine   int `json:"startLine"`
							StartColumn int `json:"startColumn"`
						} `json:"region"`
					} `json:"physicalLocation"`
				} `json:"locations"`
			} `json:"results"`
		} `json:"runs"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &log))
	assert.Equal(t, "2.1.0", log.Version)
	require.Len(t, log.Runs, 1)
	run := log.Runs[0]
	assert.Equal(t, "shardline", run.Tool.Driver.Name)
	require.Len(t, run.Results, 1)
	r := run.Results[0]
	assert.Equal(t, "SL002", r.RuleID)
	assert.Equal(t, "SL002", run.Tool.Driver.Rules[r.RuleIndex].ID)
	assert.Equal(t, "error", r.Level)
	assert.Equal(t, 2, r.Locations[0].PhysicalLocation.Region.StartLine)
	assert.Equal(t, 1, r.Locations[0].PhysicalLocation.Region.StartColumn)
	assert.Equal(t, bad, r.Locations[0].PhysicalLocation.ArtifactLocation.URI)
}

func TestExplain(t *testing.T) {
	tiny := filepath.Join(recipesDir, "tiny.toml")
	code, out, errs := shardline(t, []string{"SHARDLINE_MODEL_LAYERS=8"}, "lint", "--explain", "model.layers", tiny, "--num-layers", "12")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "model.layers = 12\n  from flag --num-layers=12\n")
	assert.Contains(t, out, "recipe "+tiny+":9:1 (4)")
	assert.Contains(t, out, `environment SHARDLINE_MODEL_LAYERS="8" (8)`)

	code, _, errs = shardline(t, nil, "lint", "--explain", "model.layres", tiny)
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "did you mean model.layers?")
}

func TestResolveDeterministicAndRoundTrips(t *testing.T) {
	moe := filepath.Join(recipesDir, "moe-tiny.toml")
	code, out1, errs := shardline(t, nil, "recipe", "resolve", moe, "--set", "train.lr=3e-4")
	require.Equal(t, 0, code, errs)
	_, out2, _ := shardline(t, nil, "recipe", "resolve", moe, "--set", "train.lr=3e-4")
	assert.Equal(t, out1, out2, "identical input gives identical bytes")
	assert.Contains(t, out1, "# fingerprint: sha256:")
	assert.Contains(t, out1, "[model.moe]\nnum_experts = 8\n")
	assert.Contains(t, out1, "lr = 0.0003\n")

	again := writeRecipe(t, out1)
	code, out3, errs := shardline(t, nil, "recipe", "resolve", again)
	require.Equal(t, 0, code, errs)
	assert.Equal(t, out1, out3, "resolve -> load -> resolve is the identity")

	code, out, errs := shardline(t, nil, "recipe", "resolve", writeRecipe(t, "[model]\nheads = 3\n"))
	assert.Equal(t, 1, code)
	assert.Empty(t, out, "nothing printed for a recipe with errors")
	assert.Contains(t, errs, "error[SL303]")
}

func TestDocsAndVersionAndHelp(t *testing.T) {
	code, out, _ := shardline(t, nil, "recipe", "docs")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "fsdp.data_parallel_sharding_strategy  (string, default \"optim_grads_params\")")
	code, md, _ := shardline(t, nil, "recipe", "docs", "--format", "markdown")
	assert.Equal(t, 0, code)
	want, err := os.ReadFile("../../docs/recipes.md")
	require.NoError(t, err)
	assert.Equal(t, string(want), md)

	code, out, _ = shardline(t, nil, "version")
	assert.Equal(t, 0, code)
	assert.Regexp(t, `^shardline \S+ \(commit \S+, go`, out)

	code, out, _ = shardline(t, nil, "lint", "--help")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "Megatron-compatible overrides")
	assert.Contains(t, out, "--use-megatron-fsdp")
	assert.Contains(t, out, "--no-gradient-accumulation-fusion")

	code, out, _ = shardline(t, nil, "completion", "bash")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "bash completion")
}

// TestMegatronFlagsAccepted lists the flags the recipe issue requires.
func TestMegatronFlagsAccepted(t *testing.T) {
	tiny := filepath.Join(recipesDir, "tiny.toml")
	flags := []string{"--use-megatron-fsdp", "--data-parallel-sharding-strategy=optim_grads", "--no-gradient-accumulation-fusion",
		"--use-distributed-optimizer", "--ckpt-format=fsdp_dtensor", "--calculate-per-token-loss", "--init-model-with-meta-device",
		"--grad-reduce-in-bf16", "--fsdp-double-buffer", "--use-nccl-ub", "--tensor-model-parallel-size=1", "--context-parallel-size=1",
		"--expert-model-parallel-size=1", "--expert-tensor-parallel-size=1", "--pipeline-model-parallel-size=1", "--num-layers=2",
		"--hidden-size=64", "--num-attention-heads=2", "--num-query-groups=1", "--ffn-hidden-size=128", "--seq-length=64",
		"--micro-batch-size=4", "--global-batch-size=8", "--train-iters=10", "--lr=0.01", "--num-experts=4", "--moe-router-topk=2",
		"--bf16", "--seed=7"}
	code, out, errs := shardline(t, nil, append([]string{"recipe", "resolve", tiny}, flags...)...)
	require.Equal(t, 0, code, "%s\n%s", out, errs)
	for _, want := range []string{"layers = 2\n", "hidden = 64\n", "kv_heads = 1\n", "num_experts = 4\n", "bf16 = true\n", "seed = 7\n",
		"data_parallel_sharding_strategy = \"optim_grads\"\n", "gradient_accumulation_fusion = false\n", "lr = 0.01\n"} {
		assert.Contains(t, out, want)
	}
}

func TestPlanTableAndRank(t *testing.T) {
	moe := filepath.Join(recipesDir, "moe-tiny.toml")
	code, out, errs := shardline(t, nil, "plan", moe, "--world-size", "4", "--global-batch-size", "64", "--expert-model-parallel-size", "2", "--rank", "3")
	require.Equal(t, 0, code, errs)
	for _, want := range []string{"mesh: tp 1 × cp 1 × dp 4 × pp 1; experts: etp 1 × ep 2 × edp 2", "memory per rank", "activations",
		"ep     all_to_all", "step: compute", "rank 3: tp 0, cp 0, dp 3, pp 0; etp 0, ep 1, edp 1", "edp    [1 3]"} {
		assert.Contains(t, out, want)
	}
	code, _, errs = shardline(t, nil, "plan", moe, "--rank", "9")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "--rank 9 is outside the world of 1 ranks")
}

func TestPlanJSON(t *testing.T) {
	code, out, errs := shardline(t, nil, "plan", filepath.Join(recipesDir, "llama-1b.toml"), "--nodes", "2", "--device", "h200-141gb", "--format", "json", "--rank", "9")
	require.Equal(t, 0, code, errs)
	var p struct {
		Fingerprint string `json:"fingerprint"`
		WorldSize   int    `json:"world_size"`
		Device      string `json:"device"`
		Parameters  struct {
			Total   int64 `json:"total"`
			Padding int64 `json:"padding"`
		} `json:"parameters"`
		Memory        map[string]any            `json:"memory"`
		Communication map[string]map[string]any `json:"communication"`
		StepTimeS     float64                   `json:"step_time_s"`
		Rank          struct {
			Rank   int              `json:"rank"`
			Groups map[string][]int `json:"groups"`
		} `json:"rank"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &p))
	assert.Regexp(t, `^sha256:[0-9a-f]{64}$`, p.Fingerprint)
	assert.Equal(t, 16, p.WorldSize)
	assert.Equal(t, "h200-141gb", p.Device)
	assert.Greater(t, p.Parameters.Total, int64(1_000_000_000))
	for _, k := range []string{"weights", "main_weights", "grads", "optimizer_state", "activations", "total"} {
		assert.Contains(t, p.Memory, k)
	}
	assert.Contains(t, p.Communication, "dp_cp")
	assert.Equal(t, true, p.Communication["dp_cp"]["spans_nodes"])
	assert.Greater(t, p.StepTimeS, 0.0)
	assert.Equal(t, 9, p.Rank.Rank)
	assert.Len(t, p.Rank.Groups["dp"], 16)
}

func TestPlanSweep(t *testing.T) {
	code, out, errs := shardline(t, nil, "plan", filepath.Join(recipesDir, "llama4-3bx128e.toml"), "--sweep", "parallel.expert_parallel=1,2,4,8")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "sweep of parallel.expert_parallel over llama4-3bx128e")
	for _, row := range []string{"memory: static", "memory: total", "comm ep: sent/rank", "comm edp: time", "tokens/s per device", "MFU"} {
		assert.Contains(t, out, row)
	}
	code, _, errs = shardline(t, nil, "plan", filepath.Join(recipesDir, "llama4-3bx128e.toml"), "--sweep", "parallel.expert_paralel=1,2")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "did you mean parallel.expert_parallel?")
}

func TestLintReportsPlanThatDoesNotFit(t *testing.T) {
	code, out, _ := shardline(t, nil, "lint", filepath.Join(recipesDir, "llama-1b.toml"), "--micro-batch-size", "32", "--world-size", "8", "--device-profile", "a100-80gb")
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "flag --micro-batch-size: error[SL501]: the plan needs")
	assert.Contains(t, out, "help: any one of these fits")
}

// TestRunPrepareSample trains a very small model on prepared data, then samples it.
func TestRunPrepareSample(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "t.txt")
	require.NoError(t, os.WriteFile(text, []byte(strings.Repeat("to be or not to be, that is the question. ", 300)), 0o644))
	prepared := filepath.Join(dir, "prepared")
	code, out, errs := shardline(t, nil, "data", "prepare", "--tokenizer", "char", "--val-fraction", "0.1", "-o", prepared, text)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "char tokenizer (vocabulary 15)")

	args := []string{"run", filepath.Join(recipesDir, "tiny.toml"), "--set", "data.path=" + prepared, "--set", "data.tokenizer=char",
		"--set", "model.vocab_size=16", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--num-query-groups", "2", "--ffn-hidden-size", "64",
		"--seq-length", "16", "--micro-batch-size", "4", "--global-batch-size", "4", "--train-iters", "5", "--set", "train.eval_interval=5",
		"--set", "run.output_dir=" + filepath.Join(dir, "runs"), "--set", "run.name=cli"}
	code, out, errs = shardline(t, nil, args...)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "run directory: "+filepath.Join(dir, "runs", "cli"))
	assert.Contains(t, errs, `"message":"done"`, "the log is JSON lines off a terminal")

	code, out, errs = shardline(t, nil, "sample", filepath.Join(dir, "runs", "cli"), "--prompt", "to be", "--tokens", "10", "--temperature", "0")
	require.Equal(t, 0, code, errs)
	assert.True(t, strings.HasPrefix(out, "to be"))
	assert.Len(t, []rune(strings.TrimSuffix(out, "\n")), 15)

	// Bad input names the recipe key, its value and the fix.
	code, _, errs = shardline(t, nil, append(args, "--set", "data.path="+filepath.Join(dir, "none.txt"))...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, `flag --set data.path: data.path (`)
	assert.Contains(t, errs, "does not exist")
	code, _, errs = shardline(t, nil, "sample", dir)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "is not a run directory")
	assert.Contains(t, errs, "give the directory shardline run printed", "the error says what to give instead")
}

// TestRunGPT2 prepares data with GPT-2's byte-pair encoding, trains on it, samples it,
// and refuses a model whose vocabulary is smaller than the tokenizer's.
func TestRunGPT2(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "t.txt")
	require.NoError(t, os.WriteFile(text, []byte(strings.Repeat("Of the Reflexions, Refractions, Inflexions and Colours of Light. ", 200)), 0o644))
	prepared := filepath.Join(dir, "prepared")
	code, out, errs := shardline(t, nil, "data", "prepare", "--tokenizer", "gpt2", "-o", prepared, text)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "gpt2 tokenizer (vocabulary 50257)")

	args := []string{"run", filepath.Join(recipesDir, "tiny.toml"), "--set", "data.path=" + prepared, "--set", "data.tokenizer=gpt2",
		"--set", "model.vocab_size=50257", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--num-query-groups", "2",
		"--ffn-hidden-size", "64", "--seq-length", "16", "--micro-batch-size", "4", "--global-batch-size", "4", "--train-iters", "3",
		"--set", "train.eval_interval=3", "--set", "run.output_dir=" + dir, "--set", "run.name=bpe"}
	code, _, errs = shardline(t, nil, args...)
	require.Equal(t, 0, code, errs)
	code, out, errs = shardline(t, nil, "sample", filepath.Join(dir, "bpe"), "--prompt", "Of the", "--tokens", "5", "--temperature", "0")
	require.Equal(t, 0, code, errs)
	assert.True(t, strings.HasPrefix(out, "Of the"))

	code, _, errs = shardline(t, nil, append(args, "--set", "model.vocab_size=256")...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "error[SL305]: model.vocab_size (256) is smaller than the gpt2 tokenizer's 50257 tokens")
}

func TestRunNproc(t *testing.T) {
	dir := t.TempDir()
	args := []string{"run", filepath.Join(recipesDir, "tiny.toml"), "--nproc", "4", "--num-layers", "1", "--hidden-size", "32",
		"--num-attention-heads", "2", "--num-query-groups", "2", "--ffn-hidden-size", "64", "--seq-length", "16", "--micro-batch-size", "2",
		"--global-batch-size", "8", "--train-iters", "3", "--set", "train.eval_interval=0", "--set", "run.output_dir=" + dir, "--set", "run.name=np"}
	code, out, errs := shardline(t, nil, args...)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, errs, `"ranks":4`)
	assert.Contains(t, out, "run directory: "+filepath.Join(dir, "np"))
	code, _, errs = shardline(t, nil, append(args, "--world-size", "2")...)
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "not together with --world-size")
	code, _, errs = shardline(t, nil, append(args[:len(args):len(args)], "--global-batch-size", "6")...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "error[SL206]")
}

// TestLintSARIFValidates: the SARIF log validates against the SARIF 2.1.0 schema,
// and every result has what GitHub code scanning needs: a file and a line (a
// finding from an environment variable or a flag points at the recipe it concerns
// and names the variable). The schema is the one Microsoft publishes in the npm
// package @microsoft/jest-sarif; `make test` fetches it (make sarif-schema) and
// points SHARDLINE_SARIF_SCHEMA at it.
func TestLintSARIFValidates(t *testing.T) {
	path := os.Getenv("SHARDLINE_SARIF_SCHEMA")
	if path == "" {
		t.Skip("SHARDLINE_SARIF_SCHEMA is not set: run `make sarif-schema` and point it at bin/sarif-schema-2.1.0.json (make test does both)")
	}
	f, err := os.Open(path)
	require.NoError(t, err, "make sarif-schema fetches the schema")
	doc, err := jsonschema.UnmarshalJSON(f)
	f.Close()
	require.NoError(t, err)
	c := jsonschema.NewCompiler()
	require.NoError(t, c.AddResource("sarif.json", doc))
	schema, err := c.Compile("sarif.json")
	require.NoError(t, err)

	bad := writeRecipe(t, "[model]\nlayres = 4\n")
	env := []string{"SHARDLINE_PARALLEL_TENSOR_PARALLEL=3"}
	code, out, errs := shardline(t, env, "lint", "--format", "sarif", bad, filepath.Join(recipesDir, "tiny.toml"), "--set", "parallel.context_parallel=3")
	require.Equal(t, 1, code, errs)
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(out))
	require.NoError(t, err)
	require.NoError(t, schema.Validate(inst))

	var log struct {
		Runs []struct {
			Results []struct {
				Message   struct{ Text string }
				Locations []struct {
					PhysicalLocation struct {
						ArtifactLocation struct{ URI string }
						Region           struct{ StartLine int }
					}
				}
			}
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &log))
	var fromEnv, fromFlag bool
	for _, r := range log.Runs[0].Results {
		require.Len(t, r.Locations, 1, r.Message.Text)
		loc := r.Locations[0].PhysicalLocation
		assert.NotEmpty(t, loc.ArtifactLocation.URI, r.Message.Text)
		assert.GreaterOrEqual(t, loc.Region.StartLine, 1, r.Message.Text)
		if strings.HasPrefix(r.Message.Text, "env SHARDLINE_PARALLEL_TENSOR_PARALLEL") {
			fromEnv = true
			assert.Contains(t, loc.ArtifactLocation.URI, "tiny.toml")
		}
		fromFlag = fromFlag || strings.HasPrefix(r.Message.Text, "flag --set parallel.context_parallel")
	}
	assert.True(t, fromEnv, "a finding from the environment: %s", out)
	assert.True(t, fromFlag, "a finding from a flag: %s", out)
}

// TestRerunAndDiff: `shardline run RUN_DIR` runs a finished run again from its
// resolved recipe and reproduces its metrics bit for bit; `shardline diff` names
// the keys two runs differ in, with where each value came from, and their
// results. run.json records the data fingerprint and every override's source.
func TestRerunAndDiff(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "t.txt")
	require.NoError(t, os.WriteFile(text, []byte(strings.Repeat("abcd efgh ijkl mnop. ", 200)), 0o644))
	args := []string{"run", filepath.Join(recipesDir, "tiny.toml"), "--set", "data.path=" + text, "--num-layers", "1", "--seq-length", "16",
		"--train-iters", "4", "--set", "run.output_dir=" + dir}
	code, _, errs := shardline(t, []string{"SHARDLINE_TRAIN_WEIGHT_DECAY=0.05"}, args...)
	require.Equal(t, 0, code, errs)
	first := filepath.Join(dir, "tiny")
	code, _, errs = shardline(t, nil, "run", first)
	require.Equal(t, 0, code, errs)
	again := filepath.Join(dir, "tiny-2")
	a, b := must(os.ReadFile(filepath.Join(first, "metrics.jsonl"))), must(os.ReadFile(filepath.Join(again, "metrics.jsonl")))
	assert.Equal(t, curveLines(a), curveLines(b))

	var info struct {
		DataFingerprint string `json:"data_fingerprint"`
		Overrides       []struct{ Key, Value, From string }
	}
	require.NoError(t, json.Unmarshal(must(os.ReadFile(filepath.Join(first, "run.json"))), &info))
	assert.True(t, strings.HasPrefix(info.DataFingerprint, "sha256:"))
	var decay string
	for _, o := range info.Overrides {
		if o.Key == "train.weight_decay" {
			decay = o.From
		}
	}
	assert.Equal(t, `environment SHARDLINE_TRAIN_WEIGHT_DECAY="0.05"`, decay)

	code, _, errs = shardline(t, nil, append(args, "--lr", "0.002")...)
	require.Equal(t, 0, code, errs)
	code, out, errs := shardline(t, nil, "diff", first, filepath.Join(dir, "tiny-3"))
	require.Equal(t, 0, code, errs)
	assert.Regexp(t, `train\.lr\s+0\.001\s+\(recipe\)\s+0\.002\s+\(flag --lr=0\.002\)`, out)
	assert.Regexp(t, `train\.weight_decay\s+0\.05\s+\(environment SHARDLINE_TRAIN_WEIGHT_DECAY="0\.05"\)`, out)
	assert.Contains(t, out, "final loss")
	code, _, errs = shardline(t, nil, "diff", first, dir)
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "is not a run directory")
}

// TestExportAndInitFrom: ckpt export writes a Hugging Face directory (and says
// what it wrote for the byte tokenizer); run --init-from starts from it (its first loss is the trained model's, well below a
// fresh model's, also on 2 tensor-parallel ranks), and refuses a model of another
// shape, naming the tensor.
func TestExportAndInitFrom(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "t.txt")
	require.NoError(t, os.WriteFile(text, []byte(strings.Repeat("abcd efgh ijkl mnop. ", 200)), 0o644))
	args := []string{"run", filepath.Join(recipesDir, "tiny.toml"), "--set", "data.path=" + text, "--num-layers", "1", "--seq-length", "16",
		"--set", "run.output_dir=" + dir, "--set", "train.eval_interval=0"}
	code, _, errs := shardline(t, nil, append(args, "--train-iters", "60", "--lr", "0.003")...)
	require.Equal(t, 0, code, errs)
	out := filepath.Join(dir, "hf")
	code, stdout, errs := shardline(t, nil, "ckpt", "export", filepath.Join(dir, "tiny"), "-o", out)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, stdout, "Hugging Face model directory written; tokenizer: tokenizer.json: the byte tokenizer as a byte-level BPE of the 256 bytes")
	code, _, errs = shardline(t, nil, append(args, "--train-iters", "1", "--init-from", out)...)
	require.Equal(t, 0, code, errs)
	code, _, errs = shardline(t, nil, append(args, "--train-iters", "1")...)
	require.Equal(t, 0, code, errs)
	trained, fresh := curveLines(must(os.ReadFile(filepath.Join(dir, "tiny-2", "metrics.jsonl")))), curveLines(must(os.ReadFile(filepath.Join(dir, "tiny-3", "metrics.jsonl"))))
	var lt, lf float64
	fmt.Sscanf(strings.Fields(trained[0])[1], "%g", &lt)
	fmt.Sscanf(strings.Fields(fresh[0])[1], "%g", &lf)
	assert.Less(t, lt, lf-1, "loss from the export %v, fresh %v", lt, lf)

	// ckpt import is the same start, under the checkpoint commands.
	code, _, errs = shardline(t, nil, append([]string{"ckpt", "import", out}, append(args[1:], "--train-iters", "1")...)...)
	require.Equal(t, 0, code, errs)
	imported := curveLines(must(os.ReadFile(filepath.Join(dir, "tiny-4", "metrics.jsonl"))))
	assert.Equal(t, trained[0], imported[0])

	// Tensor-parallel ranks each take their slices of the exported tensors: the
	// first loss is the one-rank start's (to the fp32 tolerance of the tp tests).
	code, _, errs = shardline(t, nil, append(args, "--train-iters", "1", "--nproc", "2", "--tensor-model-parallel-size", "2", "--init-from", out)...)
	require.Equal(t, 0, code, errs)
	split := curveLines(must(os.ReadFile(filepath.Join(dir, "tiny-5", "metrics.jsonl"))))
	var ls float64
	fmt.Sscanf(strings.Fields(split[0])[1], "%g", &ls)
	assert.InEpsilon(t, lt, ls, 1e-5, "tp 2 from the export")

	code, _, errs = shardline(t, nil, append(args, "--train-iters", "1", "--hidden-size", "256", "--init-from", out)...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "hidden_size is 128, the recipe's model.hidden is 256: set model.hidden = 128")
}

// TestSettings: shardline.toml at an experiment repository's root, found from a
// subdirectory, says where runs go and where data is read from (relative to the
// file); SHARDLINE_<SETTING> beats it, a recipe that sets the key beats both; an
// unknown setting or a bad duration is refused naming the file and line.
func TestSettings(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "data"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "data", "t.txt"), []byte(strings.Repeat("abcd efgh ijkl mnop. ", 200)), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "shardline.toml"), []byte("# machine settings\nruns_dir = \"out\"\ndata_root = \"data\"\ncomm_timeout = \"90s\"\n"), 0o644))
	recipe := filepath.Join(root, "r.toml")
	tiny, err := os.ReadFile(filepath.Join(recipesDir, "tiny.toml"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(recipe, tiny, 0o644))
	t.Chdir(filepath.Join(root, "sub"))
	args := []string{"run", recipe, "--set", "data.path=t.txt", "--num-layers", "1", "--seq-length", "16", "--train-iters", "2", "--set", "train.eval_interval=0"}

	code, out, errs := shardline(t, nil, args...)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "run directory: "+filepath.Join(root, "out", "tiny"))
	code, out, _ = shardline(t, nil, "lint", "--explain", "run.output_dir", recipe)
	require.Equal(t, 0, code)
	assert.Contains(t, out, "from setting runs_dir in "+filepath.Join(root, "shardline.toml"))
	// Lint finds the data where run reads it: under data_root.
	code, out, _ = shardline(t, nil, "lint", recipe, "--set", "data.path=t.txt")
	require.Equal(t, 0, code)
	assert.NotContains(t, out, "SL401", "t.txt is under data_root")
	code, out, _ = shardline(t, nil, "lint", recipe, "--set", "data.path=missing.txt")
	require.Equal(t, 0, code, "a warning")
	assert.Contains(t, out, "data.path (\"missing.txt\") does not exist here ("+filepath.Join(root, "data", "missing.txt")+", under the data_root setting)")

	code, out, errs = shardline(t, []string{"SHARDLINE_RUNS_DIR=" + filepath.Join(root, "env")}, args...)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "run directory: "+filepath.Join(root, "env", "tiny"))

	// A recipe whose file sets run.output_dir (over its base) beats the setting.
	mine := filepath.Join(root, "mine.toml")
	require.NoError(t, os.WriteFile(mine, []byte("extends = \"r.toml\"\n\n[run]\noutput_dir = \""+filepath.Join(root, "mine")+"\"\n"), 0o644))
	args[1] = mine
	code, out, errs = shardline(t, nil, args...)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "run directory: "+filepath.Join(root, "mine", "tiny"))

	require.NoError(t, os.WriteFile(filepath.Join(root, "shardline.toml"), []byte("runs_dir = \"out\"\n\ncomm_timout = \"1m\"\n"), 0o644))
	code, _, errs = shardline(t, nil, "lint", recipe)
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, filepath.Join(root, "shardline.toml")+":3:1: unknown setting comm_timout; did you mean comm_timeout?")
	require.NoError(t, os.WriteFile(filepath.Join(root, "shardline.toml"), []byte("grace = \"soon\"\n"), 0o644))
	code, _, errs = shardline(t, nil, "lint", recipe)
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, `shardline.toml:1:1: setting grace ("soon"): want a positive duration`)

	// The machine's device, described in the settings: a custom profile needs all
	// five figures (the missing one is named), and the plan uses them.
	custom := "device_profile = \"custom\"\ndevice_memory_gib = 64\ndevice_peak_tflops = 500\ndevice_memory_gbps = 3000\ndevice_intra_node_gbps = 400\n"
	require.NoError(t, os.WriteFile(filepath.Join(root, "shardline.toml"), []byte(custom), 0o644))
	code, _, errs = shardline(t, nil, "plan", recipe)
	assert.Equal(t, exitFindings, code)
	assert.Contains(t, errs, "needs parallel.device_inter_node_gbps > 0")
	require.NoError(t, os.WriteFile(filepath.Join(root, "shardline.toml"), []byte(custom+"device_inter_node_gbps = 25\n"), 0o644))
	code, out, errs = shardline(t, nil, "plan", recipe, "--format", "json")
	require.Equal(t, 0, code, errs)
	var p struct {
		Device string `json:"device"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &p))
	assert.Equal(t, "custom", p.Device)
	require.NoError(t, os.WriteFile(filepath.Join(root, "shardline.toml"), []byte("device_memory_gbps = -3\n"), 0o644))
	code, _, errs = shardline(t, nil, "plan", recipe)
	assert.Equal(t, exitFindings, code)
	assert.Contains(t, errs, "shardline.toml:1:1: error[SL008]: parallel.device_memory_gbps (-3.0) must be ≥ 0")
}

// TestRunCUDAWithoutGPURunner: the shardline everyone runs has no GPU code; a cuda
// run it cannot hand to shardline-cuda says what the machine lacks (a GPU
// driver, libcuda.so.1) or where it looked for the runner and how to get one,
// naming the recipe line.
func TestRunCUDAWithoutGPURunner(t *testing.T) {
	code, _, errs := shardline(t, []string{"PATH=" + t.TempDir()}, "run", filepath.Join(recipesDir, "tiny.toml"), "--device", "cuda", "--train-iters", "1")
	assert.Equal(t, exitFindings, code)
	if _, err := os.Stat("/dev/nvidiactl"); err != nil { // this machine: no GPU driver
		assert.Contains(t, errs, `flag --device`)
		assert.Contains(t, errs, `parallel.device = "cuda": no NVIDIA GPU driver is loaded (/dev/nvidiactl is missing)`)
	} else {
		assert.Contains(t, errs, `parallel.device = "cuda": `)
		assert.Regexp(t, `no shardline-cuda was found|libcuda.so.1 was not found`, errs)
	}
	// A GPU recipe the GPU runner could not carry out is refused before any hand-over.
	code, _, errs = shardline(t, []string{"PATH=" + t.TempDir()}, "run", filepath.Join(recipesDir, "tiny.toml"), "--device", "cuda", "--train-iters", "1",
		"--set", "parallel.cuda_expandable_segments=true")
	assert.Equal(t, exitFindings, code)
	assert.Contains(t, errs, `parallel.cuda_expandable_segments (true): shardline run refuses it: shardline's GPU runs allocate every buffer once`)
	assert.NotContains(t, errs, "no shardline-cuda was found")
}

// TestPlanAgainstRun: plan --against plans a finished run from its resolved recipe
// and sets what the run measured beside each prediction; memory, which the CPU
// trainer allocates as the plan says, agrees to the byte for weights, gradients
// and optimizer state. Bad uses are refused with what to give instead.
func TestPlanAgainstRun(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "t.txt")
	require.NoError(t, os.WriteFile(text, []byte(strings.Repeat("abcd efgh ijkl mnop. ", 200)), 0o644))
	code, out, errs := shardline(t, nil, "run", filepath.Join(recipesDir, "tiny.toml"), "--set", "data.path="+text, "--num-layers", "1",
		"--seq-length", "16", "--train-iters", "3", "--set", "train.eval_interval=0", "--set", "run.output_dir="+filepath.Join(dir, "runs"))
	require.Equal(t, 0, code, errs)
	run := strings.TrimSpace(strings.TrimPrefix(strings.SplitN(out, "\n", 2)[0], "run directory:"))

	code, out, errs = shardline(t, nil, "plan", "--against", run)
	require.Equal(t, 0, code, errs)
	for _, row := range []string{"weights", "optimizer_state", "activations", "total", "step time", "tokens/s"} {
		assert.Regexp(t, `(?m)^\s*`+row+`\s`, out)
	}
	assert.Regexp(t, `(?m)^\s*optimizer_state\s.*\s1\.000\s*$`, out)

	code, out, errs = shardline(t, nil, "plan", "--against", run, "--format", "json")
	require.Equal(t, 0, code, errs)
	var doc struct {
		Comparison []struct {
			What              string
			Planned, Measured float64
			Ratio             *float64
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	found := false
	for _, c := range doc.Comparison {
		if c.What == "grads" {
			found = true
			require.NotNil(t, c.Ratio)
			assert.Equal(t, 1.0, *c.Ratio)
		}
		if c.What == "tokens/s" {
			assert.Greater(t, c.Measured, 0.0)
		}
	}
	assert.True(t, found)

	// --host-probe reruns the calibration's passes here and divides the step
	// ratio by how much slower the host is now (the ratio is the run's; the
	// adjustment is exactly that division).
	code, out, errs = shardline(t, nil, "plan", "--against", run, "--host-probe", "--format", "json")
	require.Equal(t, 0, code, errs)
	var probed struct {
		Comparison []struct {
			What  string
			Ratio *float64
		}
		HostProbe *struct {
			Slowdown          float64
			Passes            int
			StepRatioAdjusted float64 `json:"step_ratio_adjusted"`
		} `json:"host_probe"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &probed))
	require.NotNil(t, probed.HostProbe)
	assert.Greater(t, probed.HostProbe.Passes, 0)
	assert.Greater(t, probed.HostProbe.Slowdown, 0.0)
	for _, c := range probed.Comparison {
		if c.What == "step time" {
			require.NotNil(t, c.Ratio)
			assert.InEpsilon(t, *c.Ratio/probed.HostProbe.Slowdown, probed.HostProbe.StepRatioAdjusted, 1e-12)
		}
	}
	code, out, errs = shardline(t, nil, "plan", "--against", run, "--host-probe")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "step time measured/planned adjusted for that:")
	code, _, errs = shardline(t, nil, "plan", filepath.Join(recipesDir, "tiny.toml"), "--host-probe")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errs, "--host-probe adjusts a comparison with a finished run: give --against RUN_DIR")

	code, _, errs = shardline(t, nil, "plan", filepath.Join(recipesDir, "tiny.toml"), "--against", run)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errs, "give no RECIPE")
	code, _, errs = shardline(t, nil, "plan", "--against", dir)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errs, "no resolved.toml there")
	failed := t.TempDir()
	body, err := os.ReadFile(filepath.Join(run, "resolved.toml"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(failed, "resolved.toml"), body, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(failed, "run.json"), []byte(`{"failure": "step 3: non-finite loss"}`), 0o644))
	code, _, errs = shardline(t, nil, "plan", "--against", failed)
	assert.Equal(t, exitFindings, code)
	assert.Contains(t, errs, "the run has no result to compare (it failed: step 3: non-finite loss)")
	// A result without a throughput (a run stopped before its first timed step):
	// the step time is unmeasured, "-" in text and null in JSON, not an error.
	require.NoError(t, os.WriteFile(filepath.Join(failed, "run.json"), []byte(`{"result": {"steps": 0, "tokens_per_s_median": 0}}`), 0o644))
	code, out, errs = shardline(t, nil, "plan", "--against", failed, "--format", "json")
	require.Equal(t, 0, code, errs)
	var partial struct {
		Comparison []struct {
			What     string
			Measured *float64
			Ratio    *float64
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &partial))
	for _, c := range partial.Comparison {
		if c.What == "step time" {
			assert.Nil(t, c.Measured)
			assert.Nil(t, c.Ratio)
		}
	}
	code, out, errs = shardline(t, nil, "plan", "--against", failed)
	require.Equal(t, 0, code, errs)
	assert.Regexp(t, `(?m)^\s*step time\s.*-\s+-\s*$`, out)
}

// TestLintMegatronLlamaArguments: the model and training arguments of a Megatron-LM
// Llama launch script (as its examples write them) lint clean against a recipe;
// what changes nothing here is a note, what shardline cannot do is refused by
// name with the reason.
func TestLintMegatronLlamaArguments(t *testing.T) {
	args := strings.Fields(`--use-mcore-models --num-layers 4 --hidden-size 128 --ffn-hidden-size 384 --num-attention-heads 4 --kv-channels 64
		--group-query-attention --num-query-groups 2 --seq-length 128 --max-position-embeddings 4096 --position-embedding-type rope
		--rotary-base 500000 --use-rope-scaling --rope-scaling-factor 8.0 --normalization RMSNorm --norm-epsilon 1e-5 --swiglu --disable-bias-linear
		--untie-embeddings-and-output-weights --attention-dropout 0.0 --hidden-dropout 0.0 --micro-batch-size 4 --global-batch-size 16
		--lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 10 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95
		--clip-grad 1.0 --bf16 --use-flash-attn --transformer-impl transformer_engine --log-interval 10 --eval-interval 100 --eval-iters 10`)
	code, out, errs := shardline(t, nil, append([]string{"lint", filepath.Join(recipesDir, "tiny.toml")}, args...)...)
	require.Equal(t, 0, code, out+errs)
	assert.Contains(t, out, "0 errors")
	assert.Contains(t, out, "note[SL011]: --transformer-impl has no effect")
	code, out, _ = shardline(t, nil, append([]string{"lint", "--explain", "model.rope_scaling", filepath.Join(recipesDir, "tiny.toml")}, args...)...)
	require.Equal(t, 0, code)
	assert.Contains(t, out, `model.rope_scaling = "llama3"`)
	assert.Contains(t, out, "from flag --use-rope-scaling")
	code, out, errs = shardline(t, nil, "lint", filepath.Join(recipesDir, "tiny.toml"), "--add-bias-linear", "--normalization", "LayerNorm")
	assert.Equal(t, exitFindings, code, errs)
	assert.Contains(t, out, "error[SL010]: --add-bias-linear: shardline's linear layers have no bias")
	assert.Contains(t, out, "error[SL010]: --normalization LayerNorm: shardline normalises with RMSNorm")
}

// TestRecipeExportMegatron: the export prints a bash array of Megatron-LM
// arguments with the keys no argument carries as comments; the one format is
// megatron.
func TestRecipeExportMegatron(t *testing.T) {
	code, out, errs := shardline(t, nil, "recipe", "export", "megatron", filepath.Join(recipesDir, "llama-1b.toml"))
	require.Equal(t, 0, code, errs)
	for _, want := range []string{"SHARDLINE_ARGS=(\n    --swiglu\n", "    --num-layers 16\n", "    --num-query-groups 8\n", "    --group-query-attention\n",
		"    --use-megatron-fsdp\n", "    --data-parallel-sharding-strategy optim_grads_params\n", "#   parallel.device = \"cuda\"\n",
		"#   model.tie_embeddings = true\n", "recipe fingerprint sha256:"} {
		assert.Contains(t, out, want)
	}
	assert.NotContains(t, out, "--device-profile")
	code, _, errs = shardline(t, nil, "recipe", "export", "torchtitan", filepath.Join(recipesDir, "tiny.toml"))
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errs, "the one format is megatron")
}

// TestRecipeImportMegatron: a launch script becomes a recipe whose keys name the
// arguments they came from, which lints and plans; a script that leaves
// Megatron's GeLU/LayerNorm defaults in place is refused and prints nothing; an
// exported recipe imports back to the same fingerprint through the CLI.
func TestRecipeImportMegatron(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "launch.sh")
	require.NoError(t, os.WriteFile(script, []byte(`#!/bin/bash
NUM_LAYERS=${NUM_LAYERS:-2}
MODEL_ARGS=(
    --num-layers ${NUM_LAYERS} --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128   # small
    --seq-length 128 --max-position-embeddings 128 --vocab-size 50304
    --data-path /data/web_text_document --tokenizer-type GPT2BPETokenizer
    --position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear
    --attention-dropout 0.0 --hidden-dropout 0.0 --use-flash-attn
)
torchrun --nproc-per-node 1 pretrain_gpt.py "${MODEL_ARGS[@]}" \
    --micro-batch-size 4 --global-batch-size 16 --train-iters 100 --lr 1e-3 --min-lr 1e-4
`), 0o644))
	recipe := filepath.Join(dir, "imported.toml")
	code, _, errs := shardline(t, nil, "recipe", "import", "megatron", script, "-o", recipe)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, errs, "note[SL011]: --use-flash-attn has no effect")
	body, err := os.ReadFile(recipe)
	require.NoError(t, err)
	assert.Contains(t, string(body), "layers = 2  # --num-layers=2\n")
	assert.Contains(t, string(body), "min_lr_factor = 0.1  # --min-lr=1e-4\n")
	code, out, errs := shardline(t, nil, "plan", recipe)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "plan launch")

	bare := filepath.Join(dir, "bare.sh")
	require.NoError(t, os.WriteFile(bare, []byte("python pretrain_gpt.py --num-layers 2 --swiglu\n"), 0o644))
	code, out, errs = shardline(t, nil, "recipe", "import", "megatron", bare)
	assert.Equal(t, exitFindings, code)
	assert.Empty(t, out)
	assert.Contains(t, errs, "without --normalization Megatron normalises with LayerNorm")

	// Export, then import: the same fingerprint.
	code, out, errs = shardline(t, nil, "recipe", "export", "megatron", filepath.Join(recipesDir, "moe-tiny.toml"))
	require.Equal(t, 0, code, errs)
	exported := filepath.Join(dir, "moe.sh")
	require.NoError(t, os.WriteFile(exported, []byte(out+"torchrun pretrain_gpt.py \"${SHARDLINE_ARGS[@]}\"\n"), 0o644))
	code, back, errs := shardline(t, nil, "recipe", "import", "megatron", exported)
	require.Equal(t, 0, code, errs)
	_, wantFP, _ := strings.Cut(strings.SplitN(out, "\n", 3)[1], "recipe fingerprint ")
	assert.Contains(t, back, "# fingerprint: "+wantFP+"\n")
}

// TestRecipeImportTorchtitan: torchtitan's 8B job file for 64 GPUs becomes a
// recipe that lints and plans on 64 ranks, each key commented with the setting it
// came from; the llama4 job is refused at its flavour and prints nothing; the
// flag's bounds are checked.
func TestRecipeImportTorchtitan(t *testing.T) {
	dir := t.TempDir()
	job := filepath.Join("..", "..", "config", "testdata", "torchtitan", "llama3_8b.toml")
	recipe := filepath.Join(dir, "llama3-8b.toml")
	// Its data (c4 from the Hugging Face hub) and Llama's tokenizer cannot be
	// carried: the import fails naming them, and writes nothing (config's
	// tests check the rest of the translation).
	code, out, errs := shardline(t, nil, "recipe", "import", "torchtitan", job, "--world-size", "64", "-o", recipe)
	assert.Equal(t, exitFindings, code)
	assert.Empty(t, out)
	assert.Contains(t, errs, `error[SL010]: [training] dataset = "c4": torchtitan downloads "c4" from the Hugging Face hub`)
	assert.Contains(t, errs, "note[SL011]: [profiling] enable_profiling, save_traces_folder, profile_freq: no effect in shardline")
	assert.Contains(t, errs, " 9 | enable_profiling = true\n", "the job file's line is shown")
	_, err := os.Stat(recipe)
	assert.True(t, os.IsNotExist(err), "no recipe is written")

	corpus := filepath.Join(t.TempDir(), "c4.jsonl") // the jobs' C4, from the hub there: a local copy here
	require.NoError(t, os.WriteFile(corpus, []byte(`{"text": "a document"}`+"\n"), 0o644))
	code, out, errs = shardline(t, nil, "recipe", "import", "torchtitan", filepath.Join(filepath.Dir(job), "llama4_17bx16e.toml"), "--set", "data.path="+corpus)
	assert.Equal(t, exitFindings, code)
	assert.Empty(t, out)
	// Scout's router imports; its expert tensor parallelism (8) is what lint refuses.
	assert.Contains(t, errs, "llama4_17bx16e.toml:35:1: error[SL211]: parallel.expert_tensor_parallel (8) is not supported yet")
	assert.NotContains(t, errs, "SL010]: [model]")

	// The torchtitan report's job file, its own llama4 flavour given as keys:
	// notes and the tokenizer directory's warning, a recipe that plans on 8 H20s at
	// EP 1 and 4.
	report := filepath.Join(t.TempDir(), "report.toml")
	args := []string{"recipe", "import", "torchtitan", filepath.Join(filepath.Dir(job), "llama4_3bx128e.toml"), "--world-size", "8", "-o", report,
		"--set", "data.path=" + corpus}
	for _, kv := range []string{"model.layers=48", "model.hidden=2048", "model.heads=32", "model.kv_heads=4", "model.vocab_size=202048", "model.ffn_hidden=8192",
		"model.rope_theta=500000", "model.moe.num_experts=128", "model.moe.expert_ffn_hidden=768", "model.moe.layer_freq=1", "model.moe.top_k=8",
		"parallel.device_profile=h20-96gb"} {
		args = append(args, "--set", kv)
	}
	code, _, errs = shardline(t, nil, args...)
	require.Equal(t, 0, code, errs)
	assert.NotContains(t, errs, "error[")
	// One warning: hf_assets_path, carried into data.tokenizer, names the job
	// machine's directory, which is not on this one.
	assert.Equal(t, 1, strings.Count(errs, "warning["), errs)
	assert.Contains(t, errs, `warning[SL402]: data.tokenizer ("./assets/hf/Llama-4-Scout-17B-16E") does not exist here`)
	body, err := os.ReadFile(report)
	require.NoError(t, err)
	assert.Contains(t, string(body), "score_before_expert = true")
	for _, ep := range []string{"1", "4"} {
		code, out, errs = shardline(t, nil, "plan", report, "--set", "parallel.expert_parallel="+ep)
		require.Equal(t, 0, code, errs)
		assert.Contains(t, out, "h20-96gb")
	}

	code, _, errs = shardline(t, nil, "recipe", "import", "torchtitan", job, "--world-size", "-2")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errs, "--world-size -2")
	code, _, errs = shardline(t, nil, "recipe", "import", "megatron", job, "--world-size", "8")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errs, "--world-size is for torchtitan job files")
	code, _, errs = shardline(t, nil, "recipe", "import", "titan", job)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errs, `recipe import "titan": the formats are megatron`)
}

// TestCalibrationSetting: the calibration setting (shardline.toml or
// SHARDLINE_CALIBRATION) replaces the CPU table the plan times steps from; a file
// that is not a calibration is refused naming the setting, and the next command
// without the setting plans from shardline's own table again.
func TestCalibrationSetting(t *testing.T) {
	dir := t.TempDir()
	shipped := parallel.ShippedCalibrations(trainer.CalibrationHost(cpu.Backend{})).For("cpu") // as every command prefers it
	require.NotNil(t, shipped)
	mine := *shipped
	mine.Host, mine.InStep = "the test's machine", 2*shipped.InStep
	b, err := json.Marshal(&mine)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cal.json"), b, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "shardline.toml"), []byte("calibration = \"cal.json\"\n"), 0o644))
	tiny := filepath.Join(recipesDir, "tiny.toml")
	code, out, errs := shardline(t, nil, "plan", tiny, "--config", filepath.Join(dir, "shardline.toml"))
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "time model: per operation, calibrated on the test's machine")
	// A table from another machine is scaled to this one by a probe, named on
	// stderr with the way to measure this one.
	assert.Contains(t, errs, "note: the step time is timed from a calibration measured on the test's machine")
	assert.Contains(t, errs, "scaled to this machine by a probe")
	assert.Contains(t, errs, "shardline calibrate -o FILE")
	// This machine's own table (measured here: its machine key is this
	// machine's): no probe, no note.
	mine.Host, mine.Machine = trainer.CalibrationHost(cpu.Backend{}), trainer.MachineKey(cpu.Backend{})
	b, err = json.Marshal(&mine)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "here.json"), b, 0o644))
	code, out, errs = shardline(t, []string{"SHARDLINE_CALIBRATION=" + filepath.Join(dir, "here.json")}, "plan", tiny)
	require.Equal(t, 0, code, errs)
	assert.NotContains(t, errs, "note:")
	assert.NotContains(t, out, "scaled to")

	require.NoError(t, os.WriteFile(filepath.Join(dir, "bad.json"), []byte("{\"profile\": \"cpu\"}"), 0o644))
	code, _, errs = shardline(t, []string{"SHARDLINE_CALIBRATION=" + filepath.Join(dir, "bad.json")}, "plan", tiny)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errs, "SHARDLINE_CALIBRATION")
	assert.Contains(t, errs, "a calibration names its profile, date and source; write one with shardline calibrate -o FILE")

	code, out, errs = shardline(t, nil, "plan", tiny)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "time model: per operation, calibrated on "+shipped.Host)

	code, _, errs = shardline(t, nil, "calibrate", "--min-time", "0s")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errs, "--min-time 0s: give a duration in (0, 1m]")

	// --refit redoes a table's in-step fit, keeping its measurements, and writes
	// a table the plan reads; a file that is not a calibration is refused.
	code, _, errs = shardline(t, nil, "calibrate", "--refit", filepath.Join(dir, "here.json"), "-o", filepath.Join(dir, "refit.json"))
	require.Equal(t, 0, code, errs)
	back, err := parallel.ParseCalibration(must(os.ReadFile(filepath.Join(dir, "refit.json"))))
	require.NoError(t, err)
	assert.Equal(t, shipped.GEMM, back.GEMM, "the measured tables are kept")
	assert.Contains(t, back.Source, "in-step fit redone by shardline calibrate --refit")
	code, _, errs = shardline(t, nil, "calibrate", "--refit", filepath.Join(dir, "bad.json"))
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errs, "--refit "+filepath.Join(dir, "bad.json"))
	code, _, errs = shardline(t, nil, "calibrate", "--refit", filepath.Join(dir, "missing.json"))
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errs, "--refit "+filepath.Join(dir, "missing.json"))
}

// TestUnknownSubcommandFails: a word that names no command under ckpt, data or
// recipe fails with a usage error and cobra's suggestion, where cobra alone
// printed the help and exited 0; the group alone still prints its help.
func TestUnknownSubcommandFails(t *testing.T) {
	code, out, errs := shardline(t, nil, "ckpt", "list", "runs/x")
	assert.Equal(t, exitUsage, code)
	assert.Empty(t, out)
	assert.Contains(t, errs, `unknown command "list" for "shardline ckpt"; did you mean ls?`)
	code, _, errs = shardline(t, nil, "data", "frobnicate")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errs, `unknown command "frobnicate" for "shardline data"`)
	code, out, _ = shardline(t, nil, "recipe")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, out, "Available Commands")
}

// TestTokenizeProgress: data prepare's progress line names the input read and
// its share, and draws at most five times a second but always the end.
func TestTokenizeProgress(t *testing.T) {
	var b bytes.Buffer
	p := tokenizeProgress(&b, time.Now().Add(-time.Second))
	p(500_000, 1_000_000)
	assert.Contains(t, b.String(), "tokenizing: read 0.5 of 1.0 MB (50%)")
	b.Reset()
	p(600_000, 1_000_000)
	assert.Empty(t, b.String(), "a call within 200 ms of the last draws nothing")
	p(1_000_000, 1_000_000)
	assert.Contains(t, b.String(), "1.0 of 1.0 MB (100%)", "the end is always drawn")
}

// TestRunTokenizerFile prepares data with a Hugging Face tokenizer.json, trains
// on it, samples from a prompt holding its special token, exports the model
// with the tokenizer beside it, and refuses a model whose vocabulary is smaller
// than the file's (lint reads it) or a --tokenizer path that does not exist.
func TestRunTokenizerFile(t *testing.T) {
	dir := t.TempDir()
	tok, err := filepath.Abs("../../trainer/tokenizer/testdata/tiny-tokenizer.json")
	require.NoError(t, err)
	text := filepath.Join(dir, "t.txt")
	require.NoError(t, os.WriteFile(text, []byte(strings.Repeat("the licence of the program<|endoftext|>and you shall not distribute it. ", 100)), 0o644))
	prepared := filepath.Join(dir, "prepared")
	code, out, errs := shardline(t, nil, "data", "prepare", "--tokenizer", tok, "-o", prepared, text)
	require.Equal(t, 0, code, errs)
	assert.Regexp(t, `hf-[0-9a-f]{13} tokenizer \(vocabulary 557\)`, out)
	code, _, errs = shardline(t, nil, "data", "prepare", "--tokenizer", filepath.Join(dir, "no", "tokenizer.json"), "-o", prepared, text)
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "--tokenizer "+filepath.Join(dir, "no", "tokenizer.json")+": no such file or directory")

	args := []string{"run", filepath.Join(recipesDir, "tiny.toml"), "--set", "data.path=" + prepared, "--set", "data.tokenizer=" + tok,
		"--set", "model.vocab_size=560", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--num-query-groups", "2",
		"--ffn-hidden-size", "64", "--seq-length", "16", "--micro-batch-size", "4", "--global-batch-size", "4", "--train-iters", "3",
		"--set", "train.eval_interval=3", "--set", "run.output_dir=" + dir, "--set", "run.name=hf"}
	code, _, errs = shardline(t, nil, args...)
	require.Equal(t, 0, code, errs)
	code, out, errs = shardline(t, nil, "sample", filepath.Join(dir, "hf"), "--prompt", "the<|endoftext|>", "--tokens", "5", "--temperature", "0")
	require.Equal(t, 0, code, errs)
	assert.True(t, strings.HasPrefix(out, "the<|endoftext|>"), out)
	code, _, errs = shardline(t, nil, "ckpt", "export", filepath.Join(dir, "hf"), "-o", filepath.Join(dir, "export"))
	require.Equal(t, 0, code, errs)
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json", "model.safetensors"} {
		assert.FileExists(t, filepath.Join(dir, "export", f))
	}

	code, _, errs = shardline(t, nil, append(args, "--set", "model.vocab_size=256")...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "error[SL305]: model.vocab_size (256) is smaller than the 557 tokens of the tokenizer")
}

// TestInitFromTakesTheTokenizer: a model trained with a tokenizer file and
// exported carries it; run --init-from that directory with a recipe that
// names no tokenizer trains with the directory's (resolved.toml says so), and
// a recipe that names another tokenizer is refused; a byte run's export gives
// the byte tokenizer back by name.
func TestInitFromTakesTheTokenizer(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "t.txt")
	require.NoError(t, os.WriteFile(text, []byte(strings.Repeat("the cat sat on the mat. ", 300)), 0o644))
	tok, err := filepath.Abs(filepath.Join("..", "..", "trainer", "tokenizer", "testdata", "tiny-tokenizer.json"))
	require.NoError(t, err)
	recipe := writeRecipe(t, "[data]\npath = \""+text+"\"\n[model]\nlayers = 1\nhidden = 64\nheads = 2\nffn_hidden = 96\nvocab_size = 560\nseq_len = 16\n"+
		"[train]\nsteps = 2\neval_interval = 0\n[logging]\nsample_tokens = 0\n[run]\noutput_dir = \""+dir+"\"\nname = \"r\"\n")
	code, _, errs := shardline(t, nil, "run", recipe, "--set", "data.tokenizer="+tok)
	require.Equal(t, 0, code, errs)
	out := filepath.Join(dir, "hf")
	code, _, errs = shardline(t, nil, "ckpt", "export", filepath.Join(dir, "r"), "-o", out)
	require.Equal(t, 0, code, errs)
	code, _, errs = shardline(t, nil, "run", recipe, "--init-from", out, "--train-iters", "1")
	require.Equal(t, 0, code, errs)
	resolved := string(must(os.ReadFile(filepath.Join(dir, "r-2", "resolved.toml"))))
	assert.Contains(t, resolved, `tokenizer = "`+out+`"`)
	code, _, errs = shardline(t, nil, "run", recipe, "--init-from", out, "--train-iters", "1", "--set", "data.tokenizer=char")
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "holds the model's tokenizer (tokenizer.json), but the recipe tokenizes with char")

	// A byte run's export holds the byte tokenizer as a tokenizer.json: a
	// recipe naming no tokenizer takes it back by name.
	code, _, errs = shardline(t, nil, "run", recipe, "--set", "run.name=b")
	require.Equal(t, 0, code, errs)
	byteOut := filepath.Join(dir, "hf-b")
	code, _, errs = shardline(t, nil, "ckpt", "export", filepath.Join(dir, "b"), "-o", byteOut)
	require.Equal(t, 0, code, errs)
	code, _, errs = shardline(t, nil, "run", recipe, "--set", "run.name=b", "--init-from", byteOut, "--train-iters", "1")
	require.Equal(t, 0, code, errs)
	var info struct {
		Overrides []struct{ Key, Value, From string } `json:"overrides"`
	}
	require.NoError(t, json.Unmarshal(must(os.ReadFile(filepath.Join(dir, "b-2", "run.json"))), &info))
	var set []string
	for _, o := range info.Overrides {
		if o.Key == "data.tokenizer" {
			set = append(set, o.Value+" from "+o.From)
		}
	}
	require.Len(t, set, 1, "data.tokenizer is set by --init-from")
	assert.Contains(t, set[0], `"byte" from`)
	assert.Contains(t, set[0], "init-from")
}
