package model

import (
	"strings"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
	"github.com/stretchr/testify/assert"
)

// qkNorm turns QK-norm on (Qwen3).
func qkNorm(m config.Model) config.Model { m.QKNorm = true; return m }

// nope makes every interval-th layer a NoPE layer (Llama 4's iRoPE).
func nope(m config.Model, interval int) config.Model { m.NoPEInterval = interval; return m }

// newRouters are tiny MoE models (4 experts) with the routers of the models
// of 2025-26: DeepSeek-V3's (sigmoid scores renormalised and scaled, an
// expert bias, two groups of two of which one is kept, a shared expert),
// Llama 4's (sigmoid, top 1, raw gates, the token scaled before its expert, a
// shared expert, an expert bias and no aux loss), Qwen3-MoE's without
// renormalisation (softmax scores as they are) and the default softmax
// router scaled, with a capacity that drops copies.
func newRouters() map[string]config.Model {
	ds := tinyMoE(1, 0, 1)
	ds.MoE.ScoreFunction, ds.MoE.TopKScale, ds.MoE.ExpertBias, ds.MoE.NumGroups, ds.MoE.GroupTopK = "sigmoid", 2.5, true, 2, 1
	l4 := tinyMoE(1, 0, 1)
	l4.MoE.ScoreFunction, l4.MoE.NormTopK, l4.MoE.TopK, l4.MoE.ScoreBeforeExpert, l4.MoE.ExpertBias, l4.MoE.AuxLossCoeff = "sigmoid", false, 1, true, true, 0
	l4.QKNorm, l4.NoPEInterval = true, 2
	qw := tinyMoE(0, 0, 1)
	qw.MoE.NormTopK = false
	sc := tinyMoE(0, 0.6, 1)
	sc.MoE.TopKScale = 1.5
	before := tinyMoE(0, 0.6, 1) // scaled before the expert with copies dropped, aux loss on, top 2
	before.MoE.ScoreBeforeExpert = true
	return map[string]config.Model{"deepseek-v3": ds, "llama4": l4, "qwen3-moe-raw": qw, "softmax-scaled-capacity": sc, "before-capacity": before}
}

// setBias sets each MoE layer's expert bias (when the model balances by bias)
// to values that change which experts the tokens choose.
func setBias[F tensor.Float](w [][]F, table []parallel.Param) {
	for i := range table {
		if table[i].Balance {
			for e := range w[i] {
				w[i][e] = F(0.3 * float64((e+table[i].Layer)%3-1))
			}
		}
	}
}

// TestNewSettingsChangeTheModel: each setting the gradient checks cover
// changes the model's loss (a setting that did nothing would pass them): NoPE
// layers, QK-norm, each router against the default one, and an expert bias
// against none; and with QK-norm every gain has a gradient.
func TestNewSettingsChangeTheModel(t *testing.T) {
	tokens := []int32{1, 4, 2, 9, 0, 3, 3, 10, 5, 6}
	targets := []int32{4, 2, 9, 0, 7, 3, 10, 1, 6, 1}
	loss := func(cfg config.Model, bias bool) float64 {
		m, w, _, table := build[float64](t, cfg, 2, 5)
		if bias {
			setBias(w, table)
		}
		s, n := m.Loss(tokens, targets)
		return s / float64(n)
	}
	base := loss(tinyConfig(false), false)
	assert.NotEqual(t, base, loss(nope(tinyConfig(false), 2), false), "nope")
	assert.NotEqual(t, base, loss(qkNorm(tinyConfig(false)), false), "qk-norm")
	for name, cfg := range newRouters() {
		def := cfg
		def.MoE.ScoreFunction, def.MoE.NormTopK, def.MoE.TopKScale, def.MoE.ScoreBeforeExpert = "softmax", true, 1, false
		def.MoE.ExpertBias, def.MoE.NumGroups, def.MoE.GroupTopK = false, 0, 0
		assert.NotEqual(t, loss(def, false), loss(cfg, true), name)
		if cfg.MoE.ExpertBias {
			assert.NotEqual(t, loss(cfg, false), loss(cfg, true), name+": the bias changes the routing")
		}
	}
	m, _, g, table := build[float64](t, qkNorm(tinyConfig(false)), 2, 5)
	_, n := m.Loss(tokens, targets)
	m.Backward(tokens, targets, 1/float64(n))
	for i := range table {
		if strings.Contains(table[i].Name, "_norm.weight") && strings.Contains(table[i].Name, "attn.") {
			nonzero := false
			for _, v := range g[i] {
				nonzero = nonzero || v != 0
			}
			assert.True(t, nonzero, "%s has no gradient", table[i].Name)
		}
	}
}
