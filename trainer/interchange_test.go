package trainer

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/trainer/hf"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Everything ckpt export writes, ckpt import reads back: for every kind of
// model an export takes (tied and untied embeddings, grouped-query attention,
// llama3 RoPE scaling, a decoupled head size, Mixtral, Qwen2-MoE with shared
// experts and dense layers), a run started from the export (--init-from,
// config.json checked) holds exactly the exported weights. Its one step has a
// learning rate of 1e-30, which moves no weight of these sizes in fp32; the
// expert biases (Glm4Moe) move by the step's bias update, ±1e-30 here: within
// 1e-29 of the exported ones (the export's own, shifted under group-limited
// routing: exportedWeights).
func TestImportReadsBackEveryExport(t *testing.T) {
	for _, c := range exportCases {
		t.Run(c.arch, func(t *testing.T) {
			run, out := trainedForExport(t, c.sets, 20000)
			fr, err := loadRun(run)
			require.NoError(t, err)
			sets := append([]string{"train.steps=1", "train.eval_interval=0", "train.lr=1e-30", "train.warmup_steps=0", "logging.sample_tokens=0"}, c.sets...)
			if slices.Contains(c.sets, "model.moe.expert_bias=true") {
				sets = append(sets, "model.moe.bias_update_rate=1e-30")
			}
			res, _ := tinyRun(t, sets...)
			o := opts()
			o.InitFrom = out
			r, err := Run(context.Background(), res, o)
			require.NoError(t, err)
			back, err := loadRun(r.Dir)
			require.NoError(t, err)
			require.Equal(t, len(fr.table), len(back.table))
			want := exportedWeights(fr)
			for i := range fr.table {
				if fr.table[i].Balance {
					require.InDeltaSlice(t, want[i], back.weights[i], 1e-29, fr.table[i].Name)
					continue
				}
				require.Equal(t, want[i], back.weights[i], fr.table[i].Name)
			}
		})
	}
}

// --init-from compares config.json with the recipe's model and refuses every
// key that differs, naming the Hugging Face key and value, the recipe key and
// value and the fix; a key left out takes transformers' default, and a missing
// config.json is refused. (Before, each of these was accepted silently and the
// weights loaded into a model that computes something else.)
func TestInitFromRefusesAnotherModel(t *testing.T) {
	run, out := trainedForExport(t, []string{"model.tie_embeddings=true"}, 1<<30)
	fr, err := loadRun(run)
	require.NoError(t, err)
	m := fr.recipe.Model
	require.True(t, m.TieEmbeddings)
	cfgPath := filepath.Join(out, "config.json")
	orig := must(os.ReadFile(cfgPath))
	for _, c := range []struct {
		name   string
		change map[string]any // nil value: the key is removed
		want   []string
	}{
		{"another architecture", map[string]any{"architectures": []string{"MixtralForCausalLM"}, "model_type": "mixtral"},
			[]string{`architectures is ["MixtralForCausalLM"], the recipe's model.moe.num_experts is 0`}},
		{"another activation", map[string]any{"hidden_act": "gelu"},
			[]string{`hidden_act is "gelu": no recipe key changes it: shardline's model has "silu"`}},
		{"another RoPE base", map[string]any{"rope_theta": 500000},
			[]string{"rope_theta is 500000, the recipe's model.rope_theta is 10000: set model.rope_theta = 500000"}},
		{"another norm epsilon", map[string]any{"rms_norm_eps": 1e-6},
			[]string{"rms_norm_eps is 0.000001, the recipe's model.norm_eps is 1e-05: set model.norm_eps = 0.000001"}},
		{"a norm epsilon left out", map[string]any{"rms_norm_eps": nil},
			[]string{"rms_norm_eps is absent (transformers' default 0.000001), the recipe's model.norm_eps is 1e-05"}},
		{"untied embeddings", map[string]any{"tie_word_embeddings": false},
			[]string{"tie_word_embeddings is false, the recipe's model.tie_embeddings is true: set model.tie_embeddings = false"}},
		{"RoPE scaling", map[string]any{"rope_scaling": map[string]any{"rope_type": "yarn", "factor": 4}},
			[]string{`rope_scaling is {"factor":4,"rope_type":"yarn"}, the recipe's model.rope_scaling is none`}},
		{"several at once", map[string]any{"num_key_value_heads": 1, "vocab_size": 50257, "hidden_act": "relu"},
			[]string{"(3 keys differ)", "num_key_value_heads is 1, the recipe's model.kv_heads is 0 (model.heads, 2): set model.kv_heads = 1",
				"vocab_size is 50257, the recipe's model.vocab_size is 32: set model.vocab_size = 50257", `hidden_act is "relu"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var cfg map[string]any
			require.NoError(t, json.Unmarshal(orig, &cfg))
			for k, v := range c.change {
				if v == nil {
					delete(cfg, k)
				} else {
					cfg[k] = v
				}
			}
			require.NoError(t, os.WriteFile(cfgPath, must(json.Marshal(cfg)), 0o644))
			_, err := readHF(out, m, fr.table)
			require.Error(t, err)
			assert.ErrorContains(t, err, cfgPath+" describes another model than the recipe's")
			for _, w := range c.want {
				assert.ErrorContains(t, err, w)
			}
			assert.ErrorContains(t, err, "set the recipe's keys to the model's (--set KEY=VALUE)")
		})
	}
	require.NoError(t, os.Remove(cfgPath))
	_, err = readHF(out, m, fr.table)
	assert.ErrorContains(t, err, cfgPath+" is missing: without it nothing says which model the weights are")
	require.NoError(t, os.WriteFile(cfgPath, orig, 0o644))
	_, err = readHF(out, m, fr.table)
	assert.NoError(t, err, "the export's own config.json")
}

// --init-from reads no more than the recipe's model needs: a weights file of
// 256 MiB (sparse) for a model of a few hundred kilobytes is refused from its
// size, before a byte is read or allocated (before, anything up to 64 GiB a
// file was read into memory).
func TestInitFromReadsOnlyWhatTheModelNeeds(t *testing.T) {
	run, out := trainedForExport(t, nil, 1<<30)
	fr, err := loadRun(run)
	require.NoError(t, err)
	f, err := os.OpenFile(filepath.Join(out, "model.safetensors"), os.O_WRONLY, 0)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(256<<20))
	require.NoError(t, f.Close())
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = readHF(out, fr.recipe.Model, fr.table)
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, fileio.ErrTooLarge)
	assert.ErrorContains(t, err, "more than the recipe's model needs")
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(16<<20), "bytes allocated")
}

// Glm4Moe always holds e_score_correction_bias: a recipe without
// model.moe.expert_bias imports only zeros there (an export's own), and
// refuses a model whose biases choose otherwise, naming the tensor and the fix.
func TestImportRefusesGlm4MoeBiasesWithoutExpertBias(t *testing.T) {
	run, out := trainedForExport(t, []string{"model.moe.score_function=sigmoid", "model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.expert_ffn_hidden=32"}, 1<<30)
	fr, err := loadRun(run)
	require.NoError(t, err)
	_, err = readHF(out, fr.recipe.Model, fr.table)
	require.NoError(t, err)
	path := filepath.Join(out, "model.safetensors")
	ts, _, err := hf.ReadSafetensors(path, 1<<30)
	require.NoError(t, err)
	name := "model.layers.1.mlp.gate.e_score_correction_bias"
	require.Equal(t, []float32{0, 0, 0, 0}, ts[name].Data)
	ts[name].Data[2] = 0.5
	list := make([]hf.Tensor, 0, len(ts))
	for _, v := range ts {
		list = append(list, v)
	}
	require.NoError(t, hf.WriteSafetensors(path, list, nil))
	_, err = readHF(out, fr.recipe.Model, fr.table)
	assert.ErrorContains(t, err, "tensor "+name+" is not zero and the recipe's model has no expert bias: set model.moe.expert_bias = true")
}
