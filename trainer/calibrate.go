package trainer

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/trainer/model"
)

// CalibrationGrid is the set of shapes Calibrate measures. Matmuls cover the row
// counts of micro-batches and expert slices and the widths of small to mid-size
// models; attention the sequence lengths and head sizes a CPU trains.
type CalibrationGrid struct {
	GEMMRows, GEMMDims []int
	AttnT, AttnHD      []int
	// FP8Rows and FP8Dims are the matmul shapes also timed on FP8 operands
	// (parallel.Calibration.GEMMFP8): some of GEMMRows and of GEMMDims,
	// since an FP8 product is timed as the fp32 one times their ratio,
	// which varies slowly with the shape. None: no FP8 products timed.
	FP8Rows, FP8Dims []int
	CollectiveSizes  []int
	// InStepRounds is how many times each calibration model's pass is timed
	// for the in-step fit, the rounds interleaved (every model in fp32 and
	// bf16, then all again), so that other work slowing the machine for a
	// while reaches one round of a model rather than all of them, and the fit
	// takes each model's median round (parallel.Calibration.InStepModels).
	// 0 stands for 1.
	InStepRounds int
	// ShareModels name the calibration models trained by in-process ranks to fit
	// how ranks sharing the cores divide them (Calibration.HostShare), at 1 and
	// ShareRanks ranks, ShareSteps steps a run, every run repeated ShareRounds
	// times (the runs interleaved, so that a drift of the machine's speed reaches
	// every rank count alike). No models: no host-share fit.
	ShareModels []string
	ShareRanks  []int
	ShareSteps  int
	ShareRounds int
	// RingCP are the context-parallel degrees the ShareModels are also trained at
	// (every sequence split over a ring of that many ranks; each degree must be
	// among ShareRanks, whose data-parallel runs it is compared with) to fit how
	// much longer ring steps take (Calibration.RingShare). None: no ring fit.
	RingCP []int
}

// DefaultCalibrationGrid is the grid `shardline calibrate` measures.
var DefaultCalibrationGrid = CalibrationGrid{
	GEMMRows:        []int{16, 64, 256, 1024, 4096, 8192},
	GEMMDims:        []int{16, 32, 64, 128, 256, 512, 1024, 2048},
	AttnT:           []int{16, 32, 64, 256, 1024, 4096}, // 16 and 32: context-parallel chunks of short sequences
	AttnHD:          []int{16, 32, 64, 128},
	FP8Rows:         []int{64, 1024, 8192},
	FP8Dims:         []int{64, 256, 1024},
	CollectiveSizes: []int{2, 4},
	InStepRounds:    3,
	// The share models: since 2026-11-28 the four-layer dense model at
	// micro-batch 16 (the shapes a CPU trains) in place of 2×384 at 4, which
	// took as long.
	ShareModels: []string{"dense 2×192, ffn 512, seq 128, vocab 512, batch 8", "dense 4×160, ffn 448, seq 128, vocab 256, batch 16",
		"moe 2×160, 4 experts top-2 of 256, seq 128, batch 8"},
	ShareRanks:  []int{2, 4},
	ShareSteps:  10,
	ShareRounds: 3, // the median of three runs: one disturbed run is left out
	RingCP:      []int{2, 4},
}

// Calibrate measures the backend's kernels over grid: each matmul (with fp32 and
// with bf16 weights), attention and memory-bound kernel of the engine, and the
// in-process collectives; then it fits the in-step factors to whole passes of its
// models (fp32 and bf16 weights), and the host-share and ring efficiencies to its
// models trained by in-process ranks splitting the batch and by context-parallel
// rings. A shape is timed by the median of repeated calls
// totalling at least minTime (one call for shapes longer than that). progress, if
// not nil, gets a line per table.
func Calibrate(be tensor.Backend, grid CalibrationGrid, minTime time.Duration, progress io.Writer) (*parallel.Calibration, error) {
	c := &parallel.Calibration{Profile: "cpu", Threads: runtime.GOMAXPROCS(0), Date: time.Now().UTC().Format(time.RFC3339),
		Host: CalibrationHost(be), Machine: MachineKey(be), Stream: map[string]parallel.Linear{}, Collectives: map[string]parallel.Linear{}}
	say := func(format string, a ...any) {
		if progress != nil {
			fmt.Fprintf(progress, format+"\n", a...)
		}
	}
	timeIt := func(f func()) float64 { return medianTime(f, minTime) }

	// Matmuls: forward, and backward (input and weight gradients), with fp32 and
	// with bf16 weights.
	if b, ok := be.(interface{ BF16Matmul() string }); ok {
		c.BF16Matmul = b.BF16Matmul()
	}
	say("matmul: %d shapes, fp32 and bf16 weights", len(grid.GEMMRows)*len(grid.GEMMDims)*len(grid.GEMMDims))
	for _, m := range grid.GEMMRows {
		for _, k := range grid.GEMMDims {
			for _, n := range grid.GEMMDims {
				mem := be.NewMemory() // the shape's operands; dropped with it
				op := newGEMMOperands(mem, m, k, n)
				inp, w, out, dinp, dw := op.inp, op.w, op.out, op.dinp, op.dw
				wh, ih := mem.Alloc(tensor.BFloat16, n*k), mem.Alloc(tensor.BFloat16, m*k)
				mem.Copy(wh, w)
				mem.Copy(ih, inp)
				s := tensor.MatmulShape{BT: m, C: k, OC: n}
				// bf16: the weights and the input (a bf16 run's saved activation) in bf16.
				for _, v := range []struct {
					inp, w tensor.Buffer
					out    *[]parallel.GEMMPoint
				}{{inp, w, &c.GEMM}, {ih, wh, &c.GEMMBF16}} {
					fwd := timeIt(func() { be.Matmul(out, v.inp, v.w, s, false) })
					bwd := timeIt(func() { be.MatmulBackward(dinp, dw, out, v.inp, v.w, s, false) })
					*v.out = append(*v.out, parallel.GEMMPoint{M: m, K: k, N: n, Fwd: fwd, Bwd: bwd})
				}
				if err := mem.Err(); err != nil {
					return nil, err
				}
			}
		}
	}
	if err := fp8Products(be, c, grid, timeIt, say); err != nil {
		return nil, err
	}
	// Flash attention (the engine's only attention), causal and without the mask,
	// one (batch, head) pair scaled up to enough work to time.
	say("attention: %d shapes, flash with and without the causal mask", 2*len(grid.AttnT)*len(grid.AttnHD))
	for _, full := range []bool{false, true} {
		for _, t := range grid.AttnT {
			for _, hd := range grid.AttnHD {
				bh := max(1, min(64, (1<<22)/(t*t*hd/16+1)))
				mem := be.NewMemory()
				n := bh * t * hd
				q, k, v := upload(mem, filled(n)), upload(mem, filled(n)), upload(mem, filled(n))
				out, dout := mem.Alloc(tensor.Float32, n), upload(mem, filled(n))
				dq, dk, dv := mem.Alloc(tensor.Float32, n), mem.Alloc(tensor.Float32, n), mem.Alloc(tensor.Float32, n)
				lse := mem.Alloc(tensor.Float32, bh*t)
				s := tensor.AttentionShape{B: bh, Tq: t, Tk: t, NH: 1, NKV: 1, HD: hd, Causal: !full}
				fwd := timeIt(func() { be.FlashAttention(out, lse, q, k, v, s) })
				bwd := timeIt(func() { be.FlashAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, s, false) })
				if err := mem.Err(); err != nil {
					return nil, err
				}
				c.Attention = append(c.Attention, parallel.AttentionPoint{Flash: true, Full: full, T: t, HD: hd, Fwd: fwd / float64(bh), Bwd: bwd / float64(bh)})
			}
		}
	}
	// Memory-bound kernels: a small and a large call give the per-call and the
	// per-element cost. Each size is timed over streamAllocs allocations of
	// its operands and the median taken: on a VM the same large call runs
	// 1.5 or 2.7 ms from one allocation to the next (how its pages were
	// placed), and one unlucky allocation set a table's figure for it.
	kinds := append(slices.Clone(parallel.StreamKinds), parallel.LaterStreamKinds...)
	say("memory-bound kernels: %d", len(kinds))
	for _, kind := range kinds {
		var pts [2][2]float64
		for i, n := range []int{1 << 12, 1 << 22} {
			var ts []float64
			for range streamAllocs {
				f, err := streamKernel(be, kind, n)
				if err != nil {
					return nil, err
				}
				// The earlier kernels' operands are garbage by now: collected
				// here, not by a collection running beside the timing on the
				// other core, and through the memory the kernel streams.
				runtime.GC()
				ts = append(ts, timeIt(f))
			}
			pts[i] = [2]float64{float64(n), parallel.Median(ts)}
		}
		per := (pts[1][1] - pts[0][1]) / (pts[1][0] - pts[0][0])
		c.Stream[kind] = parallel.Linear{Fixed: math.Max(0, pts[0][1]-per*pts[0][0]), PerUnit: math.Max(per, 0)}
	}
	// In-process collectives: per call and per byte a rank sends.
	say("collectives: group sizes %v", grid.CollectiveSizes)
	for _, size := range grid.CollectiveSizes {
		for _, kind := range []string{parallel.AllGather, parallel.ReduceScatter, parallel.AllReduce, parallel.AllToAll, parallel.SendRecv} {
			var pts [2][2]float64
			for i, n := range []int{1 << 10, 1 << 22} { // elements of the full buffer
				t, err := collectiveTime(kind, size, n, minTime)
				if err != nil {
					return nil, err
				}
				f := float64(size-1) / float64(size)
				switch kind {
				case parallel.AllReduce:
					f *= 2
				case parallel.SendRecv: // each rank sends n/size elements (a ring step)
					f = 1 / float64(size)
				}
				pts[i] = [2]float64{4 * float64(n) * f, t}
			}
			per := (pts[1][1] - pts[0][1]) / (pts[1][0] - pts[0][0])
			c.Collectives[parallel.CollectiveKey(kind, size)] = parallel.Linear{Fixed: math.Max(0, pts[0][1]-per*pts[0][0]), PerUnit: math.Max(per, 0)}
		}
	}
	// The in-step factor: whole forward and backward passes of small models, beside
	// what the tables above predict for them.
	c.Index()
	rounds := max(grid.InStepRounds, 1)
	say("in-step factors: %d models, fp32 and bf16 weights, %d rounds", len(calibrationModels), rounds)
	for round := 0; round < rounds; round++ {
		for _, bf16 := range []bool{false, true} {
			for _, cm := range calibrationModels {
				pt, err := stepTime(be, cm.model, cm.batch, minTime, bf16)
				if err != nil {
					return nil, err
				}
				smp := parallel.InStepSample{Model: cm.name, BF16: bf16, Measured: pt.whole, GEMMMeasured: pt.gemm, AttnMeasured: pt.attn,
					ExpertsMeasured: pt.experts, OptMeasured: pt.tail}
				modelled(&smp, &cm, c)
				c.InStepSamples = append(c.InStepSamples, smp)
			}
		}
	}
	c.FitInStep()
	if w := disturbedWarning(c); w != "" {
		say("%s", w)
	}
	// The fits above relate passes timed minutes after the tables to them: a
	// machine whose speed changed in between (other work running) skews them.
	drift, err := gemmDrift(be, c, grid, minTime)
	if err != nil {
		return nil, err
	}
	c.Drift = drift
	if w := driftWarning(drift); w != "" {
		say("%s", w)
	}
	if len(grid.ShareModels) > 0 {
		say("ranks sharing the cores: %d models at 1 and %v ranks, %d rounds", len(grid.ShareModels), grid.ShareRanks, grid.ShareRounds)
	}
	if len(grid.RingCP) > 0 && len(grid.ShareModels) > 0 {
		say("context-parallel rings: the same models at cp %v", grid.RingCP)
	}
	for round := 0; round < grid.ShareRounds; round++ {
		for _, name := range grid.ShareModels {
			for _, ranks := range append([]int{1}, grid.ShareRanks...) {
				smp, err := hostShareStep(be, name, ranks, 1, grid.ShareSteps, c)
				if err != nil {
					return nil, err
				}
				c.HostShareSamples = append(c.HostShareSamples, smp)
			}
			for _, cp := range grid.RingCP {
				smp, err := hostShareStep(be, name, cp, cp, grid.ShareSteps, c)
				if err != nil {
					return nil, err
				}
				c.HostShareSamples = append(c.HostShareSamples, smp)
			}
		}
	}
	c.FitHostShare()
	return c, nil
}

// fp8Products times Matmul and MatmulBackward on FP8 operands at the
// shapes grid.FP8Rows × FP8Dims × FP8Dims, as an FP8 layer runs them
// (trainer/model's fp8.go): the input and the weight quantised to E4M3, the
// output gradient to E5M2 (the hybrid format), each under current scaling
// with its scale inverse; into c.GEMMFP8. A shape outside the fp32 grid is
// an error (the table times an FP8 product by its ratio to the fp32 one).
func fp8Products(be tensor.Backend, c *parallel.Calibration, grid CalibrationGrid, timeIt func(func()) float64, say func(string, ...any)) error {
	for _, r := range grid.FP8Rows {
		if !slices.Contains(grid.GEMMRows, r) {
			return fmt.Errorf("calibration grid: FP8 rows %d are not among the matmul rows %v", r, grid.GEMMRows)
		}
	}
	for _, d := range grid.FP8Dims {
		if !slices.Contains(grid.GEMMDims, d) {
			return fmt.Errorf("calibration grid: FP8 width %d is not among the matmul widths %v", d, grid.GEMMDims)
		}
	}
	if len(grid.FP8Rows) == 0 || len(grid.FP8Dims) == 0 {
		return nil
	}
	say("FP8 matmuls: %d shapes", len(grid.FP8Rows)*len(grid.FP8Dims)*len(grid.FP8Dims))
	for _, m := range grid.FP8Rows {
		for _, k := range grid.FP8Dims {
			for _, n := range grid.FP8Dims {
				mem := be.NewMemory()
				op := newGEMMOperands(mem, m, k, n)
				dout := upload(mem, filled(m*n))
				xq, wq := mem.Alloc(tensor.Float8E4M3, m*k), mem.Alloc(tensor.Float8E4M3, n*k)
				dq := mem.Alloc(tensor.Float8E5M2, m*n)
				inv, amax, scale := mem.Alloc(tensor.Float32, 3), mem.Alloc(tensor.Float64, 1), mem.Alloc(tensor.Float32, 1)
				for _, q := range []struct {
					codes, x tensor.Buffer
					f        tensor.FP8Format
					i        int
				}{{xq, op.inp, tensor.E4M3, 0}, {wq, op.w, tensor.E4M3, 1}, {dq, dout, tensor.E5M2, 2}} {
					be.Amax(amax, q.x, false)
					be.FP8Scale(scale, amax, q.f, 0)
					be.Quantize(q.codes, inv.Slice(q.i, q.i+1), q.x, scale)
				}
				s := tensor.MatmulShape{BT: m, C: k, OC: n, Scales: tensor.MatmulScales{Inp: inv.Slice(0, 1), Weight: inv.Slice(1, 2)}}
				sb := s
				sb.Scales.Dout = inv.Slice(2, 3)
				fwd := timeIt(func() { be.Matmul(op.out, xq, wq, s, false) })
				bwd := timeIt(func() { be.MatmulBackward(op.dinp, op.dw, dq, xq, wq, sb, false) })
				if err := mem.Err(); err != nil {
					return err
				}
				c.GEMMFP8 = append(c.GEMMFP8, parallel.GEMMPoint{M: m, K: k, N: n, Fwd: fwd, Bwd: bwd})
			}
		}
	}
	return nil
}

// disturbedWarning is what Calibrate says of the in-step passes its fit left
// out as disturbed (parallel.InStepSample.Disturbed): which, of how many (""
// when none).
func disturbedWarning(c *parallel.Calibration) string {
	var out []string
	models := c.InStepModels()
	for _, s := range models {
		if s.Disturbed {
			dt := "fp32"
			if s.BF16 {
				dt = "bf16"
			}
			out = append(out, fmt.Sprintf("%s (%s)", s.Model, dt))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return fmt.Sprintf("warning: %d of %d models' in-step passes took their tables' time beyond 1.5× the others' median ratio and were left out of the fit (other work running?): %s; if many are, calibrate again on a quiet machine",
		len(out), len(models), strings.Join(out, ", "))
}

// driftLimit is how far (either way) the matmuls timed again may stray from
// their table before Calibrate warns: this project's development VMs drift
// by up to 10% within minutes when idle.
const driftLimit = 1.15

// driftWarning is what Calibrate says of a drift beyond driftLimit either way
// ("" within it).
func driftWarning(drift float64) string {
	if drift >= 1/driftLimit && drift <= driftLimit {
		return ""
	}
	return fmt.Sprintf("warning: matmuls timed again after the in-step passes took %.2f× their table's time: this machine's speed changed while it was calibrated (other work running?), which skews the in-step factors; calibrate again on a quiet machine", drift)
}

// gemmDrift times again a few of the fp32 matmul grid's points (driftShapes:
// the middle of every axis; the most rows; the next width up) and returns the
// median over them, forward and backward, of the time now over the table's.
func gemmDrift(be tensor.Backend, c *parallel.Calibration, grid CalibrationGrid, minTime time.Duration) (float64, error) {
	shapes := driftShapes(slices.Sorted(slices.Values(grid.GEMMRows)), slices.Sorted(slices.Values(grid.GEMMDims)))
	if len(shapes) == 0 {
		return 0, nil
	}
	var ratios []float64
	for _, sh := range shapes {
		i := slices.IndexFunc(c.GEMM, func(p parallel.GEMMPoint) bool { return [3]int{p.M, p.K, p.N} == sh })
		if i < 0 {
			return 0, fmt.Errorf("matmul %v: not in the grid just measured", sh)
		}
		mem := be.NewMemory()
		op := newGEMMOperands(mem, sh[0], sh[1], sh[2])
		s := tensor.MatmulShape{BT: sh[0], C: sh[1], OC: sh[2]}
		fwd := medianTime(func() { be.Matmul(op.out, op.inp, op.w, s, false) }, minTime)
		bwd := medianTime(func() { be.MatmulBackward(op.dinp, op.dw, op.out, op.inp, op.w, s, false) }, minTime)
		if err := mem.Err(); err != nil {
			return 0, err
		}
		ratios = append(ratios, fwd/c.GEMM[i].Fwd, bwd/c.GEMM[i].Bwd)
	}
	return parallel.Median(ratios), nil
}

// gemmOperands are an (m, k, n) matmul's fp32 operands: the input and the
// weight, filled; the output and the two gradients.
type gemmOperands struct{ inp, w, out, dinp, dw tensor.Buffer }

func newGEMMOperands(mem tensor.Memory, m, k, n int) gemmOperands {
	return gemmOperands{inp: upload(mem, filled(m*k)), w: upload(mem, filled(n*k)), out: mem.Alloc(tensor.Float32, m*n),
		dinp: mem.Alloc(tensor.Float32, m*k), dw: mem.Alloc(tensor.Float32, n*k)}
}

// hostShareStep trains the calibration model called name with ranks in-process
// ranks for steps steps, each rank a micro-batch of the model's batch, or with
// cp > 1 the ranks splitting every sequence of one micro-batch over a
// context-parallel ring (optim_grads_params, on a generated text in a temporary
// directory), and returns its median step time beside what the plan under c,
// with its HostShare and RingShare cleared, puts in compute and in exposed
// communication for that run.
func hostShareStep(be tensor.Backend, name string, ranks, cp, steps int, c *parallel.Calibration) (parallel.HostShareSample, error) {
	res, dir, err := hostShareRecipe(name, ranks, cp, max(steps, 2))
	if dir != "" {
		defer os.RemoveAll(dir)
	}
	if err != nil {
		return parallel.HostShareSample{}, err
	}
	compute, comm, stall, err := planShare(&res.Recipe, c)
	if err != nil {
		return parallel.HostShareSample{}, err
	}
	out, err := Run(context.Background(), res, Options{Backend: be, Version: "calibrate"})
	if err != nil {
		return parallel.HostShareSample{}, fmt.Errorf("calibrating %d ranks on %q: %w", ranks, name, err)
	}
	tokens := float64(res.Recipe.Train.GlobalBatchSize * res.Recipe.Model.SeqLen)
	smp := parallel.HostShareSample{Model: name, Ranks: ranks, Measured: tokens / out.TokensPerS, Compute: compute, Comm: comm, Stall: stall}
	if cp > 1 {
		smp.CP = cp
	}
	return smp, nil
}

// hostSharePlanned is what the plan under c (HostShare cleared) puts in compute,
// in exposed communication and in the experts' stall for hostShareStep's run.
func hostSharePlanned(name string, ranks, cp int, c *parallel.Calibration) (compute, comm, stall float64, err error) {
	res, dir, err := hostShareRecipe(name, ranks, cp, 2)
	if dir != "" {
		defer os.RemoveAll(dir)
	}
	if err != nil {
		return 0, 0, 0, err
	}
	return planShare(&res.Recipe, c)
}

// planShare compiles r's plan timed by c with HostShare and RingShare cleared,
// and returns its compute (kernels and optimizer, less the experts' stall),
// exposed communication and the experts' stall (which sharing does not scale).
func planShare(r *config.Recipe, c *parallel.Calibration) (compute, comm, stall float64, err error) {
	topo, err := parallel.TopologyOf(r.Parallel, nil)
	if err != nil {
		return 0, 0, 0, err
	}
	plain := *c
	plain.HostShare, plain.RingShare = nil, nil
	topo.Calibration = &plain
	plan, err := parallel.Compile(r, topo)
	if err != nil {
		return 0, 0, 0, err
	}
	return plan.ComputeS + plan.OptimizerS - plan.StallS, plan.ExposedCommS, plan.StallS, nil
}

// hostShareRecipe is the recipe hostShareStep trains for steps steps (over a
// context-parallel ring of cp when cp > 1), with the temporary directory holding
// its text and run directory.
func hostShareRecipe(name string, ranks, cp, steps int) (*config.Resolved, string, error) {
	var cm *calibrationModel
	for i := range calibrationModels {
		if calibrationModels[i].name == name {
			cm = &calibrationModels[i]
		}
	}
	if cm == nil {
		return nil, "", fmt.Errorf("host-share sample %q: not a model shardline calibrate trains; measure the table again", name)
	}
	dir, err := os.MkdirTemp("", "shardline-calibrate-")
	if err != nil {
		return nil, "", err
	}
	// A text of 64 KiB over 27 characters, the same for every run.
	var b strings.Builder
	x := uint32(12345)
	for b.Len() < 1<<16 {
		x = x*1664525 + 1013904223
		b.WriteByte("abcdefghijklmnopqrstuvwxyz "[(x>>16)%27])
	}
	text := filepath.Join(dir, "text.txt")
	if err := os.WriteFile(text, []byte(b.String()), 0o644); err != nil {
		return nil, dir, err
	}
	mo := cm.model
	sets := []string{"data.path=" + text, "data.tokenizer=char", "data.val_fraction=0",
		fmt.Sprintf("model.layers=%d", mo.Layers), fmt.Sprintf("model.hidden=%d", mo.Hidden), fmt.Sprintf("model.heads=%d", mo.Heads),
		fmt.Sprintf("model.kv_heads=%d", mo.Heads), fmt.Sprintf("model.ffn_hidden=%d", mo.FFNHidden), fmt.Sprintf("model.seq_len=%d", mo.SeqLen),
		fmt.Sprintf("model.vocab_size=%d", mo.VocabSize),
		fmt.Sprintf("train.steps=%d", steps), "train.eval_interval=0", fmt.Sprintf("train.micro_batch_size=%d", cm.batch),
		fmt.Sprintf("train.global_batch_size=%d", cm.batch*ranks/max(cp, 1)), fmt.Sprintf("parallel.world_size=%d", ranks),
		fmt.Sprintf("parallel.context_parallel=%d", max(cp, 1)),
		"logging.progress=false", "run.output_dir=" + filepath.Join(dir, "runs"), "run.name=share"}
	if e := mo.MoE.NumExperts; e > 0 {
		sets = append(sets, fmt.Sprintf("model.moe.num_experts=%d", e), fmt.Sprintf("model.moe.top_k=%d", mo.MoE.TopK),
			fmt.Sprintf("model.moe.expert_ffn_hidden=%d", mo.MoE.ExpertFFNHidden))
	}
	res, diags := config.LoadBytes(filepath.Join(dir, "calibrate.toml"), nil, config.Options{Sets: sets})
	if diags.HasErrors() {
		return nil, dir, fmt.Errorf("the host-share recipe of %q: %v", name, diags)
	}
	return res, dir, nil
}

// modelled fills an in-step sample of cm's pass with what c's tables say of
// it: the whole pass, its matmuls (the experts' among them, and apart),
// attention, the kernels launched, the operand bytes, and the step's tail when
// it was measured.
func modelled(smp *parallel.InStepSample, cm *calibrationModel, c *parallel.Calibration) {
	mt := parallel.MicroCompute(cm.model, cm.batch, "none", smp.BF16, c)
	smp.Tables, smp.Calls, smp.AttnTables = mt.Tables(), mt.Calls, mt.Attention
	smp.GEMMTables, smp.GEMMBytes = mt.Products()
	smp.ExpertsTables, smp.ExpertsBytes, smp.RoutedRows = mt.Experts, mt.ExpertBytes, mt.Routed
	smp.OptTables = 0
	if smp.OptMeasured > 0 {
		smp.OptTables = c.StepTail(paramCount(cm.model))
	}
}

// Refit redoes a calibration's in-step fit without measuring anything: each
// sample's model-derived figures (the tables' time, the kernels launched, the
// matmuls' operand bytes) are computed again from its model, by the current step
// model over the calibration's own tables, and FitInStep runs on them beside the
// measured times. It is how a table measured before a change of the step model
// is brought up to it. A sample of a model Calibrate does not time is an error.
func Refit(c *parallel.Calibration) error {
	c.Index()
	for i := range c.InStepSamples {
		smp := &c.InStepSamples[i]
		found := false
		for _, cm := range calibrationModels {
			if cm.name != smp.Model {
				continue
			}
			found = true
			modelled(smp, &cm, c)
		}
		if !found {
			return fmt.Errorf("in-step sample %q: not a model shardline calibrate times; measure the table again", smp.Model)
		}
	}
	c.FitInStep()
	for i := range c.HostShareSamples {
		smp := &c.HostShareSamples[i]
		var err error
		if smp.Compute, smp.Comm, smp.Stall, err = hostSharePlanned(smp.Model, smp.Ranks, smp.CP, c); err != nil {
			return err
		}
	}
	c.FitHostShare()
	return nil
}

// calibrationModels are the models whose steps fit the in-step factor: unlike the
// recipes the plan is checked against (tiny, moe-tiny, the nanoGPT shape), so the
// check tests the model rather than the fit, but spanning their shapes: the
// first five are two layers at micro-batches of 4 and 8 (1,024 and 2,048
// rows), the last two four layers at 16 (2,048 rows; its MoE routing 4,096
// rows a layer, where moe-tiny's experts stall most), added on 2026-11-28
// after a table fitted to the first five alone planned tiny and moe-tiny
// (four layers at 16) 1.2–1.4 times too slow. Their order is the tables'
// order of samples: new models go last, so that Refit keeps older tables'.
var calibrationModels = func() []calibrationModel {
	mk := func(layers, hidden, heads, ffn, seq, vocab, experts, expertFFN int) config.Model {
		m := config.Default().Model
		m.Layers, m.Hidden, m.Heads, m.FFNHidden, m.SeqLen, m.VocabSize = layers, hidden, heads, ffn, seq, vocab
		m.MoE.NumExperts, m.MoE.TopK, m.MoE.ExpertFFNHidden = experts, 2, expertFFN
		return m
	}
	return []calibrationModel{
		{"dense 2×192, ffn 512, seq 128, vocab 512, batch 8", mk(2, 192, 6, 512, 128, 512, 0, 0), 8},
		{"dense 2×384, ffn 1024, seq 256, vocab 256, batch 4", mk(2, 384, 6, 1024, 256, 256, 0, 0), 4},
		{"moe 2×160, 4 experts top-2 of 256, seq 128, batch 8", mk(2, 160, 5, 448, 128, 256, 4, 256), 8},
		{"dense 2×96, ffn 256, seq 64, vocab 128, batch 8", mk(2, 96, 3, 256, 64, 128, 0, 0), 8},
		{"moe 2×96, 16 experts top-2 of 64, seq 64, batch 8", mk(2, 96, 3, 256, 64, 128, 16, 64), 8},
		{"dense 4×160, ffn 448, seq 128, vocab 256, batch 16", mk(4, 160, 5, 448, 128, 256, 0, 0), 16},
		{"moe 4×160, 8 experts top-2 of 128, seq 128, batch 16", mk(4, 160, 5, 448, 128, 256, 8, 128), 16},
	}
}()

// calibrationModel is a model Calibrate times, with its batch.
type calibrationModel struct {
	name  string
	model config.Model
	batch int
}

// paramCount is a model's parameters.
func paramCount(cfg config.Model) float64 {
	table, err := parallel.ParamTable(cfg, 1, 1)
	if err != nil {
		return 0
	}
	var n float64
	for i := range table {
		n += float64(table[i].Numel())
	}
	return n
}

// stepTime is the median seconds of one forward and backward pass of a model
// with batch sequences of its full length, its weights and saved activations in
// fp32 or (bf16) in bf16 (as a bf16 run keeps them), and of the matmuls (the
// routed experts' products among them, and apart) and of attention inside that
// pass (timed call by call, in the pass whose whole time is the median); and the median seconds of the step's tail after a pass: the
// gradients' square sum and AdamW, a call per parameter group (a layer's dense
// parameters, its experts', the embedding, the head: the trainer's groups on
// one rank, the gradients one buffer per group), on the operands the pass
// left cold.
func stepTime(be tensor.Backend, cfg config.Model, batch int, minTime time.Duration, bf16 bool) (passTimes, error) {
	table, err := parallel.ParamTable(cfg, 1, 1)
	if err != nil {
		return passTimes{}, err
	}
	w, g := make([][]float32, len(table)), make([]tensor.Buffer, len(table))
	mem := be.NewMemory()
	type group struct {
		grads, main, m, v tensor.Buffer
		params            []int
	}
	var groups []*group
	byKey := map[[2]int]*group{}
	for i := range table {
		key := [2]int{table[i].Layer, 0}
		switch {
		case table[i].Expert >= 0:
			key[1] = 1
		case table[i].Layer < 0 && i > 0:
			key[1] = 2 // the head, apart from the embedding
		}
		if byKey[key] == nil {
			byKey[key] = &group{}
			groups = append(groups, byKey[key])
		}
		byKey[key].params = append(byKey[key].params, i)
	}
	for _, gr := range groups {
		var n int
		for _, i := range gr.params {
			n += int(table[i].LocalNumel())
		}
		gr.grads, gr.main, gr.m, gr.v = mem.Alloc(tensor.Float32, n), mem.Alloc(tensor.Float32, n), mem.Alloc(tensor.Float32, n), mem.Alloc(tensor.Float32, n)
		off := 0
		for _, i := range gr.params {
			k := int(table[i].LocalNumel())
			g[i] = gr.grads.Slice(off, off+k)
			off += k
		}
	}
	for i := range table {
		w[i] = make([]float32, table[i].LocalNumel())
		model.InitParam(w[i], &table[i], 0, 1, cfg.InitStd, cfg.Layers)
	}
	sq, stats := mem.Alloc(tensor.Float64, 1), appliedStats(mem)
	wdt, opts := tensor.Float32, []model.Option{model.WithMemory(mem)}
	if bf16 {
		wdt = tensor.BFloat16
		opts = append(opts, model.WithBF16Activations())
	}
	tb := &kernelTimed{Backend: be}
	m, err := model.New[float32](cfg, table, tensor.Upload(mem, wdt, w), g, tb, batch, cfg.SeqLen, opts...)
	if err != nil {
		return passTimes{}, err
	}
	n := batch * cfg.SeqLen
	tokens, targets := make([]int32, n), make([]int32, n)
	for i := range tokens {
		tokens[i], targets[i] = int32(i*7%cfg.VocabSize), int32((i*7+3)%cfg.VocabSize)
	}
	var passes []passTimes
	loss := mem.Alloc(tensor.Float64, 1)
	pass1 := func() {
		tb.gemm, tb.attn, tb.experts = 0, 0, 0
		t0 := time.Now()
		m.ForwardBackward(tokens, targets, loss, false, 1/float64(n))
		t1 := time.Now()
		for k, gr := range groups {
			be.SumSquares(sq, k > 0, gr.grads)
		}
		for _, gr := range groups {
			be.AdamW(gr.main, tensor.Buffer{}, gr.grads, gr.m, gr.v, 1e-3, 0.9, 0.95, 1e-8, 0.1, stats)
		}
		mem.Sync()
		passes = append(passes, passTimes{whole: t1.Sub(t0).Seconds(), gemm: tb.gemm.Seconds(), experts: tb.experts.Seconds(), attn: tb.attn.Seconds(),
			tail: time.Since(t1).Seconds()})
	}
	pass1() // warm-up
	passes = passes[:0]
	start := time.Now()
	for len(passes) < 3 || time.Since(start) < max(minTime, 200*time.Millisecond) {
		pass1()
		if len(passes) >= 1000 {
			break
		}
	}
	tails := make([]float64, len(passes))
	for i, p := range passes {
		tails[i] = p.tail
	}
	sort.Float64s(tails)
	sort.Slice(passes, func(i, j int) bool { return passes[i].whole < passes[j].whole })
	mid := passes[len(passes)/2]
	mid.tail = tails[len(tails)/2]
	return mid, mem.Err()
}

// passTimes are stepTime's seconds: the whole pass, its matmuls (the routed
// experts' products among them, and apart), its attention, and the step's tail
// after it.
type passTimes struct{ whole, gemm, experts, attn, tail float64 }

// kernelTimed is a backend that adds up the time its matmuls take (the routed
// experts' products among them, as the plan counts them, and those apart too),
// and apart the time attention takes (forward and backward).
type kernelTimed struct {
	tensor.Backend
	gemm, experts, attn time.Duration
}

func (b *kernelTimed) Matmul(out, inp, weight tensor.Buffer, s tensor.MatmulShape, acc bool) {
	t0 := time.Now()
	b.Backend.Matmul(out, inp, weight, s, acc)
	b.gemm += time.Since(t0)
}

func (b *kernelTimed) MatmulBackward(dinp, dweight, dout, inp, weight tensor.Buffer, s tensor.MatmulShape, acc bool) {
	t0 := time.Now()
	b.Backend.MatmulBackward(dinp, dweight, dout, inp, weight, s, acc)
	b.gemm += time.Since(t0)
}

func (b *kernelTimed) ExpertsMatmul(out, inp tensor.Buffer, w []tensor.Buffer, offsets tensor.Buffer, s tensor.ExpertsShape, acc bool) {
	t0 := time.Now()
	b.Backend.ExpertsMatmul(out, inp, w, offsets, s, acc)
	d := time.Since(t0)
	b.gemm, b.experts = b.gemm+d, b.experts+d
}

func (b *kernelTimed) ExpertsMatmulBackward(dinp tensor.Buffer, dw []tensor.Buffer, dout, inp tensor.Buffer, w []tensor.Buffer, offsets tensor.Buffer, s tensor.ExpertsShape, acc bool) {
	t0 := time.Now()
	b.Backend.ExpertsMatmulBackward(dinp, dw, dout, inp, w, offsets, s, acc)
	d := time.Since(t0)
	b.gemm, b.experts = b.gemm+d, b.experts+d
}

// HeadLoss (the output head's products and its loss together) is timed among
// the matmuls: its products are 2·C flops a logit where the loss is a few.
func (b *kernelTimed) HeadLoss(losses, dx, dw, work, x, w, targets, dloss tensor.Buffer, s tensor.HeadShape) {
	t0 := time.Now()
	b.Backend.HeadLoss(losses, dx, dw, work, x, w, targets, dloss, s)
	b.gemm += time.Since(t0)
}

func (b *kernelTimed) FlashAttention(out, lse, q, k, v tensor.Buffer, s tensor.AttentionShape) {
	t0 := time.Now()
	b.Backend.FlashAttention(out, lse, q, k, v, s)
	b.attn += time.Since(t0)
}

func (b *kernelTimed) FlashAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v tensor.Buffer, s tensor.AttentionShape, accumulate bool) {
	t0 := time.Now()
	b.Backend.FlashAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, s, accumulate)
	b.attn += time.Since(t0)
}

// medianTime is the median seconds of f over repeated calls totalling minTime (at
// least three calls), after one warm-up call.
// streamAllocs is how many allocations of a memory-bound kernel's operands
// calibrate and the probe time it over (the median stands).
const streamAllocs = 3

func medianTime(f func(), minTime time.Duration) float64 {
	f()
	var ts []float64
	start := time.Now()
	for len(ts) < 3 || time.Since(start) < minTime {
		t0 := time.Now()
		f()
		ts = append(ts, time.Since(t0).Seconds())
		if len(ts) >= 1000 {
			break
		}
	}
	sort.Float64s(ts)
	return ts[len(ts)/2]
}

// filled is n deterministic values in [-1, 1).
func filled(n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i%251)/125.5 - 1
	}
	return x
}

// appliedStats is a statistics buffer of mem's whose step applies, at optimizer
// step 1: what an optimizer kernel timed alone reads.
func appliedStats(mem tensor.Memory) tensor.Buffer {
	st := mem.Alloc(tensor.Float64, tensor.NumStats)
	mem.Write(st.Slice(tensor.StatApplied, tensor.NumStats), []float64{1, 1})
	return st
}

// streamKernel is the memory-bound kernel of kind over n elements, ready to time;
// a kind it has no kernel for is an error (parallel.StreamKinds and this switch
// are kept together). Its operands are buffers of a memory of be's.
func streamKernel(be tensor.Backend, kind string, n int) (func(), error) {
	const C = 256
	rows := max(n/C, 1)
	mem := be.NewMemory()
	up := func(x []float32) tensor.Buffer { return upload(mem, x) }
	zeros := func(n int) tensor.Buffer { return mem.Alloc(tensor.Float32, n) }
	a, b, o := up(filled(n)), up(filled(n)), zeros(n)
	switch kind {
	case parallel.StreamRMSNorm:
		rstd, w := zeros(rows), up(filled(C))
		return func() { be.RMSNorm(o, rstd, a, w, rows, C, 1e-5) }, mem.Err()
	case parallel.StreamRMSNormBwd:
		rstd, w, dw := up(filled(rows)), up(filled(C)), zeros(C)
		return func() { be.RMSNormBackward(o, dw, b, a, w, rstd, rows, C, true) }, mem.Err()
	case parallel.StreamRope, parallel.StreamRopeBwd:
		const HD = 64
		T := max(n/HD, 1) // one sequence of n elements, one head
		cos, sin := zeros(T*HD/2), zeros(T*HD/2)
		be.RopeTables(cos, sin, T, tensor.RopeInvFreq(HD, 10000, tensor.RopeScaling{}))
		x := up(filled(T * HD))
		if kind == parallel.StreamRope {
			return func() { be.Rope(x, cos, sin, tensor.RopeShape{B: 1, T: T, NH: 1, HD: HD}) }, mem.Err()
		}
		return func() { be.RopeBackward(x, cos, sin, tensor.RopeShape{B: 1, T: T, NH: 1, HD: HD}) }, mem.Err()
	case parallel.StreamSwiGLU:
		return func() { be.SwiGLU(o, a, b, n) }, mem.Err()
	case parallel.StreamSwiGLUBwd:
		d1, d2 := zeros(n), zeros(n)
		return func() { be.SwiGLUBackward(d1, d2, o, a, b, n, false) }, mem.Err()
	case parallel.StreamEmbedding, parallel.StreamEmbeddingBwd:
		const V = 1024
		ids := make([]int32, rows)
		for i := range ids {
			ids[i] = int32(i % V)
		}
		tok := ints(mem, ids)
		wte := up(filled(V * C))
		if kind == parallel.StreamEmbedding {
			return func() { be.Embedding(o.Slice(0, rows*C), tok, wte, tensor.EmbeddingShape{BT: rows, C: C, N: V}) }, mem.Err()
		}
		return func() {
			be.EmbeddingBackward(wte, b.Slice(0, rows*C), tok, tensor.EmbeddingShape{BT: rows, C: C, N: V})
		}, mem.Err()
	case parallel.StreamCrossEntropy, parallel.StreamCrossEntropyBw:
		const V = 256
		bt := max(n/V, 1)
		ids := make([]int32, bt)
		for i := range ids {
			ids[i] = int32(i % V)
		}
		tgt := ints(mem, ids)
		losses, dloss := zeros(bt), up(filled(bt))
		if kind == parallel.StreamCrossEntropy {
			return func() { be.CrossEntropy(losses, o, a, tgt, tensor.VocabShape{BT: bt, V: V, Parts: 1}) }, mem.Err()
		}
		return func() { be.CrossEntropyBackward(b, dloss, o, tgt, tensor.VocabShape{BT: bt, V: V, Parts: 1}) }, mem.Err()
	case parallel.StreamAdamW:
		mb, vb := zeros(n), zeros(n)
		st := appliedStats(mem)
		return func() { be.AdamW(a, tensor.Buffer{}, b, mb, vb, 1e-3, 0.9, 0.95, 1e-8, 0.1, st) }, mem.Err()
	case parallel.StreamSumSquares:
		st := mem.Alloc(tensor.Float64, 1)
		return func() { be.SumSquares(st, false, a) }, mem.Err()
	case parallel.StreamAdd:
		return func() { be.AddInto(o, a, n) }, mem.Err()
	case parallel.StreamAmax:
		st := mem.Alloc(tensor.Float64, 1)
		return func() { be.Amax(st, a, false) }, mem.Err()
	case parallel.StreamQuantize:
		q, inv, scale, st := mem.Alloc(tensor.Float8E4M3, n), mem.Alloc(tensor.Float32, 1), mem.Alloc(tensor.Float32, 1), mem.Alloc(tensor.Float64, 1)
		be.Amax(st, a, false)
		be.FP8Scale(scale, st, tensor.E4M3, 0)
		return func() { be.Quantize(q, inv, a, scale) }, mem.Err()
	case parallel.StreamCopy:
		return func() { mem.Copy(o, a) }, mem.Err()
	case parallel.StreamToBF16:
		h := mem.Alloc(tensor.BFloat16, n)
		return func() { mem.Copy(h, a) }, mem.Err()
	case parallel.StreamFromBF16:
		h := mem.Alloc(tensor.BFloat16, n)
		mem.Copy(h, a)
		return func() { mem.Copy(o, h) }, mem.Err()
	case parallel.StreamDispatch, parallel.StreamDispatchBwd, parallel.StreamCombine, parallel.StreamCombineBwd:
		// n elements of routed copies: 8 experts, top 2, rows of C; every expert
		// keeps every copy (no capacity limit).
		const E, K = 8, 2
		bt := max(n/(K*C), 1)
		s := tensor.MoEShape{BT: bt, E: E, K: K, C: C, Capacity: bt * K}
		idx := make([]int32, bt*K)
		for t := 0; t < bt; t++ {
			idx[t*K], idx[t*K+1] = int32(t%E), int32((t+3)%E)
		}
		rt := tensor.Routing{Idx: ints(mem, idx), Row: mem.Alloc(tensor.Int32, bt*K), Tok: mem.Alloc(tensor.Int32, bt*K),
			Offsets: mem.Alloc(tensor.Int32, E+1), Cursor: mem.Alloc(tensor.Int32, E)}
		x, xperm, gates := up(filled(bt*C)), zeros(bt*K*C), up(filled(bt*K))
		be.Dispatch(xperm, x, rt, s)
		switch kind {
		case parallel.StreamDispatch:
			return func() { be.Dispatch(xperm, x, rt, s) }, mem.Err()
		case parallel.StreamDispatchBwd:
			return func() { be.DispatchBackward(x, xperm, rt, s) }, mem.Err()
		case parallel.StreamCombine:
			return func() { be.Combine(x, xperm, gates, rt, s) }, mem.Err()
		}
		dy, dgates := zeros(bt*K*C), zeros(bt*K)
		return func() { be.CombineBackward(dy, dgates, x, xperm, gates, rt, s) }, mem.Err()
	case parallel.StreamAttnMerge:
		// n elements of one head's rows of 64 values, with finite log-sum-exps.
		const HD = 64
		T := max(n/HD, 1)
		out, outB, lse, lseB := up(filled(T*HD)), up(filled(T*HD)), up(filled(T)), up(filled(T))
		s := tensor.AttentionShape{B: 1, Tq: T, Tk: T, NH: 1, NKV: 1, HD: HD}
		return func() { be.MergeAttention(out, lse, outB, lseB, s) }, mem.Err()
	case parallel.StreamRouter, parallel.StreamRouterBwd:
		const E, K = 8, 2
		bt := max(n/E, 1)
		s := tensor.MoEShape{BT: bt, E: E, K: K, C: 1, Capacity: bt * K}
		probs, logits, gates := zeros(bt*E), up(filled(bt*E)), zeros(bt*K)
		rt := tensor.Routing{Idx: mem.Alloc(tensor.Int32, bt*K)}
		be.Router(probs, gates, logits, rt, s)
		if kind == parallel.StreamRouter {
			return func() { be.Router(probs, gates, logits, rt, s) }, mem.Err()
		}
		dlogits, dgates, dprobs := zeros(bt*E), up(filled(bt*K)), up(filled(bt*E))
		return func() { be.RouterBackward(dlogits, dgates, dprobs, gates, probs, rt, s) }, mem.Err()
	}
	return nil, fmt.Errorf("calibrate: no kernel times the stream kind %q; a shardline bug", kind)
}

// ints is host int32 values in a new int32 buffer of mem's.
func ints(mem tensor.Memory, x []int32) tensor.Buffer {
	b := mem.Alloc(tensor.Int32, len(x))
	mem.Write(b, x)
	return b
}

// upload is host values x in a new f32 buffer of mem's.
func upload(mem tensor.Memory, x []float32) tensor.Buffer {
	b := mem.Alloc(tensor.Float32, len(x))
	mem.Write(b, x)
	return b
}

// collectiveTime is the median seconds of one in-process collective over a full
// buffer of n float32 elements in a group of size ranks.
func collectiveTime(kind string, size, n int, minTime time.Duration) (float64, error) {
	n = n / size * size
	w := comm.NewWorld(size, time.Minute)
	members := make([]comm.Communicator, size)
	for r := range members {
		members[r] = w.Rank(r)
	}
	type bufs struct{ full, part, out []float32 }
	b := make([]bufs, size)
	for r := range b {
		b[r] = bufs{filled(n), filled(n / size), make([]float32, n)}
	}
	counts := make([]int, size)
	for i := range counts {
		counts[i] = n / size
	}
	var firstErr error
	var mu sync.Mutex
	call := func() {
		var wg sync.WaitGroup
		for r, c := range members {
			wg.Add(1)
			go func(r int, c comm.Communicator) {
				defer wg.Done()
				full, part := b[r].full, b[r].part
				var err error
				switch kind {
				case parallel.AllGather:
					err = c.AllGather(full, part)
				case parallel.ReduceScatter:
					err = c.ReduceScatter(part, full)
				case parallel.AllReduce:
					err = c.AllReduce(full)
				case parallel.AllToAll:
					err = c.AllToAll(b[r].out, full, counts, counts)
				case parallel.SendRecv:
					err = c.SendRecv(b[r].out[:n/size], part, (r+1)%size, (r-1+size)%size)
				}
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
				}
			}(r, c)
		}
		wg.Wait()
	}
	t := medianTime(call, minTime)
	return t, firstErr
}
