package trainer

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/shardline/shardline/trainer/model"
)

// BenchmarkExpertBalance trains recipes/moe-tiny.toml for 200 steps three
// ways: without balancing (aux_loss_coeff = 0), with the auxiliary loss (its
// 0.01) and with expert-bias balancing (no aux loss, rate 1e-3), and prints,
// for each, the load imbalance of the trained model, max/mean kept copies per
// expert over 16 validation batches averaged over the layers (1 is perfect
// balance, 4 all copies on two of 8 experts), and its final validation loss.
// make bench runs it (scripts/bench-router.sh); the bias run should be more
// balanced than the unbalanced one with a validation loss no worse than the
// aux-loss run's.
func BenchmarkExpertBalance(b *testing.B) {
	for i := 0; i < b.N; i++ {
		fmt.Printf("%-10s %12s %10s\n", "balancing", "max/mean", "val loss")
		for _, c := range []struct {
			name string
			sets []string
		}{
			{"none", []string{"model.moe.aux_loss_coeff=0"}},
			{"aux loss", nil},
			{"bias", []string{"model.moe.aux_loss_coeff=0", "model.moe.expert_bias=true"}},
		} {
			imb, val := balanceRun(b, c.sets)
			fmt.Printf("%-10s %12.3f %10.4f\n", c.name, imb, val)
		}
	}
}

// balanceRun trains moe-tiny with sets and returns its trained model's load
// imbalance over validation batches and its final validation loss.
func balanceRun(b *testing.B, sets []string) (imbalance, val float64) {
	b.Helper()
	dir := b.TempDir()
	sets = append([]string{"train.steps=200", "train.eval_interval=200", "logging.sample_tokens=0", "logging.progress=false",
		"logging.level=warn", "run.output_dir=" + dir}, sets...)
	res, diags := config.Load(filepath.Join("..", "recipes", "moe-tiny.toml"), config.Options{Sets: sets})
	if diags.HasErrors() {
		b.Fatal(diags)
	}
	out, err := Run(context.Background(), res, Options{Backend: cpu.Backend{}, Version: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	r := &res.Recipe
	table, err := parallel.ParamTable(r.Model, 1, 1)
	if err != nil {
		b.Fatal(err)
	}
	views := make([][]float32, len(table))
	for i := range table {
		views[i] = make([]float32, table[i].LocalNumel())
	}
	if err := loadWeights(filepath.Join(out.Dir, "weights.bin"), table, views); err != nil {
		b.Fatal(err)
	}
	ds, err := openData(r, Options{})
	if err != nil {
		b.Fatal(err)
	}
	be := cpu.Backend{}
	mem := be.NewMemory()
	w := tensor.Upload(mem, tensor.Float32, views)
	B, T := r.Train.MicroBatchSize, r.Model.SeqLen
	m, err := model.New[float32](r.Model, table, w, w, be, B, T, model.WithMemory(mem))
	if err != nil {
		b.Fatal(err)
	}
	tokens, targets := make([]int32, B*T), make([]int32, B*T)
	const batches = 16
	var sum float64
	var n int
	for i := 0; i < batches; i++ {
		ds.ValSampler.Fill(tokens, targets, i*B, B)
		m.Forward(tokens, nil, tensor.Buffer{}, false)
		for _, c := range m.ExpertCounts() {
			var most, all float64
			for _, v := range c {
				most, all = max(most, v), all+v
			}
			sum += most / (all / float64(len(c)))
			n++
		}
	}
	return sum / float64(n), *out.FinalValLoss
}
