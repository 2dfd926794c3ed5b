package trainer

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/trainer/data"
	"github.com/shardline/shardline/trainer/hf"
	"github.com/shardline/shardline/trainer/model"
)

// runInfo is run.json.
type runInfo struct {
	Name string `json:"name"`
	// RunID names the run (its checkpoints carry it; a resume in place keeps
	// it, a branch gets a new one); ResumedFrom is the checkpoint it started
	// from and ResumedFromStep its step; CheckpointDir is checkpoint.dir,
	// absolute, when the checkpoints are not under the run directory.
	RunID           string `json:"run_id,omitempty"`
	ResumedFrom     string `json:"resumed_from,omitempty"`
	ResumedFromStep *int   `json:"resumed_from_step,omitempty"`
	CheckpointDir   string `json:"checkpoint_dir,omitempty"`
	// TensorBoard is the run's TensorBoard event file in the run directory
	// (logging.tensorboard), absent when it writes none.
	TensorBoard string      `json:"tensorboard_events,omitempty"`
	Version     string      `json:"shardline_version"`
	Revision    string      `json:"vcs_revision,omitempty"` // the commit shardline was built from
	Modified    bool        `json:"vcs_modified,omitempty"` // built from a tree with uncommitted changes
	Go          string      `json:"go"`
	Backend     string      `json:"backend"`
	Machine     machineInfo `json:"machine"`
	// RecipeFiles is where the recipe came from: its file and the bases it
	// extends (bases first), each a path as given, or shipped:NAME for a
	// recipe shipped inside shardline (the version and vcs_revision say
	// which build's copy).
	RecipeFiles       []string        `json:"recipe_files,omitempty"`
	RecipeFingerprint string          `json:"recipe_fingerprint"`
	PlanFingerprint   string          `json:"plan_fingerprint"`
	DataFingerprint   string          `json:"data_fingerprint"` // sha256 of the tokens trained and validated on
	Overrides         []overrideInfo  `json:"overrides,omitempty"`
	Seed              int64           `json:"seed"`
	Started           string          `json:"started"`
	Tokenizer         string          `json:"tokenizer"`
	Result            *resultInfo     `json:"result,omitempty"`
	Failure           string          `json:"failure,omitempty"` // why the run failed: alone, or beside the result when it failed after writing it (the trace)
	Memory            *memoryCompared `json:"memory,omitempty"`
	// ModelCommSent is what rank 0 sent per training step on each model-parallel
	// group (ep, cp, tp), by the ring algorithms' accounting (comm.Counted): the
	// measured counterpart of the plan's sent-per-rank.
	ModelCommSent map[string]int64 `json:"model_comm_sent_per_step,omitempty"`
}

// overrideInfo is a recipe key set by the environment or a flag, not the file.
type overrideInfo struct {
	Key   string `json:"key"`
	Value string `json:"value"`
	From  string `json:"from"`
}

// machineInfo says where the run ran.
type machineInfo struct {
	Host string `json:"host,omitempty"`
	OS   string `json:"os"`
	Arch string `json:"arch"`
	CPUs int    `json:"cpus"`
	// Threads is GOMAXPROCS: the kernels' worker threads in this process
	// (launch gives each rank its share of the node's CPUs).
	Threads int    `json:"threads"`
	CPU     string `json:"cpu,omitempty"` // the model name /proc/cpuinfo gives
}

type resultInfo struct {
	Steps        int      `json:"steps"`
	FinalLoss    float64  `json:"final_loss"`
	FinalValLoss *float64 `json:"final_val_loss,omitempty"` // absent without a validation split
	UnigramLoss  float64  `json:"unigram_entropy"`
	TokensPerS   float64  `json:"tokens_per_s_median"`
	Interrupted  bool     `json:"interrupted,omitempty"`
	// StepS is the median step time measured (the tokens of a step over
	// TokensPerS), PlannedStepS the plan's, TimeModel how the plan timed it,
	// and Probe the probe of this machine that scaled the plan's calibration
	// to it, if one did (parallel.Calibration.Scaled).
	StepS        float64         `json:"step_s_median,omitempty"`
	PlannedStepS float64         `json:"planned_step_s,omitempty"`
	TimeModel    string          `json:"time_model,omitempty"`
	Probe        *parallel.Probe `json:"probe,omitempty"`
	// TFLOPS and MFU are the model's FLOPs per device over the median step
	// time, and that over the device's peak (PeakTFLOPS); PlannedTFLOPS and
	// PlannedMFU the plan's (measure).
	TFLOPS        float64 `json:"tflops_median,omitempty"`
	PlannedTFLOPS float64 `json:"planned_tflops,omitempty"`
	MFU           float64 `json:"mfu_median,omitempty"`
	PlannedMFU    float64 `json:"planned_mfu,omitempty"`
	PeakTFLOPS    float64 `json:"peak_tflops,omitempty"`
}

// memoryCompared sets what the run held beside the plan's prediction, per component,
// and the process's peak resident memory (which adds the Go runtime, the data and
// the sampler's activations).
type memoryCompared struct {
	Held      Memory          `json:"held"`
	Predicted parallel.Memory `json:"predicted"`
	PeakRSS   int64           `json:"peak_rss"`
}

// info is run.json without the result: what ran, from which build, on which
// data and machine, with which overrides.
func (t *run) info() runInfo {
	fp, _ := config.Fingerprint(t.r)
	if o := t.opts.own; o != nil && t.started.IsZero() {
		t.started = o.started
	}
	if t.started.IsZero() {
		t.started = time.Now()
	}
	in := runInfo{Name: t.r.Run.Name, Version: t.opts.Version, Go: runtime.Version(), Backend: t.opts.Backend.Name(),
		RecipeFiles: t.res.Files, RecipeFingerprint: fp, PlanFingerprint: t.plan.Fingerprint, DataFingerprint: t.ds.Fingerprint(), Seed: t.r.Run.Seed,
		Started: t.started.UTC().Format(time.RFC3339), Tokenizer: t.ds.Tok.Name(), Machine: thisMachine()}
	if o := t.opts.own; o != nil {
		in.RunID, in.ResumedFrom, in.CheckpointDir, in.TensorBoard = o.runID, o.resumedFrom, o.ckptDir, o.events
	}
	if m := t.opts.resume; m != nil {
		step := m.Step
		in.ResumedFromStep = &step
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				in.Revision = s.Value
			case "vcs.modified":
				in.Modified = s.Value == "true"
			}
		}
	}
	for _, f := range config.RecipeSchema().Fields {
		switch o := t.res.Origin(f.Key); o.Kind {
		case config.FromEnv, config.FromSet, config.FromFlag:
			in.Overrides = append(in.Overrides, overrideInfo{Key: f.Key, Value: config.FormatValue(f.Get(t.r)), From: o.Describe()})
		}
	}
	return in
}

// CalibrationHost names this machine as a calibration records its host: the CPU
// model, the CPU count and the backend's kernels. The plan's per-operation time is
// this machine's when a calibration's host equals it.
func CalibrationHost(be tensor.Backend) string {
	m := thisMachine()
	return CalibrationHostOf(m.CPU, m.CPUs, be.Name())
}

// CalibrationHostOf is CalibrationHost for a machine described by its CPU model,
// CPU count and backend name (as run.json records them).
func CalibrationHostOf(cpuModel string, cpus int, backend string) string {
	return fmt.Sprintf("%s, %d CPUs, %s kernels", cpuModel, cpus, backend)
}

func thisMachine() machineInfo {
	m := machineInfo{OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), Threads: runtime.GOMAXPROCS(0)}
	m.Host, _ = os.Hostname()
	if b, err := fileio.ReadRegular("/proc/cpuinfo", 1<<22); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// writeJSON writes v as indented JSON to path, atomically and never through a
// link (fileio.WriteAtomic).
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return fileio.WriteAtomic(path, append(b, '\n'))
}

// writeHeader writes what is known before the first step: the resolved recipe, the
// plan, the tokenizer and run.json.
func (t *run) writeHeader() error {
	if t.opts.own != nil {
		t.opts.own.header = true // the directory changes from here on
	}
	resolved, _, err := config.ResolvedTOML(t.r)
	if err != nil {
		return err
	}
	var plan strings.Builder
	if err := t.plan.WriteTable(&plan); err != nil {
		return err
	}
	for name, body := range map[string][]byte{"resolved.toml": resolved, "plan.txt": []byte(plan.String())} {
		if err := fileio.WriteAtomic(filepath.Join(t.dir, name), body); err != nil {
			return fmt.Errorf("run directory %s: %w", t.dir, err)
		}
	}
	if err := data.SaveTokenizer(filepath.Join(t.dir, "tokenizer.json"), t.ds.Tok); err != nil {
		return err
	}
	return writeJSON(filepath.Join(t.dir, "run.json"), t.info())
}

// finish commits weights.bin (a device engine's run writes its whole model
// into it first), then writes the loss curve, the sample and the final
// run.json. Weights that are not all finite are refused first, and nothing
// else is written then.
func (t *run) finish(out *Result) error {
	if t.weightsOut == nil {
		w, err := writeWeights(filepath.Join(t.dir, "weights.bin"), t.finalTable, t.finalViews)
		if err != nil {
			return fmt.Errorf("saving weights: %w", err)
		}
		t.weightsOut = w
	}
	if s := t.weightsOut.nonFinite(); s != "" {
		t.abortWeights()
		return t.nonFinite(fmt.Errorf("%s: %w; %s; lower train.lr", s, ErrNonFinite, describeGood(t.goodAtEnd())))
	}
	err := t.weightsOut.commit()
	t.weightsOut = nil
	if err != nil {
		return fmt.Errorf("saving weights: %w", err)
	}
	if err := writeLossPNG(filepath.Join(t.dir, "loss.png"), t.r.Run.Name, t.curve); err != nil {
		return fmt.Errorf("writing loss.png: %w", err)
	}
	if err := t.sample(out); err != nil {
		return err
	}
	out.Held = t.held()
	out.PeakRSS = peakRSS()
	info := t.info()
	info.Result = &resultInfo{Steps: out.Steps, FinalLoss: out.FinalLoss, FinalValLoss: out.FinalValLoss, UnigramLoss: out.UnigramBits, TokensPerS: out.TokensPerS, Interrupted: out.Interrupted,
		PlannedStepS: out.PlannedStepS, TimeModel: t.plan.TimeModel}
	if out.TokensPerS > 0 {
		info.Result.StepS = float64(t.r.Train.GlobalBatchSize*t.r.Model.SeqLen) / out.TokensPerS
	}
	var perf Metrics
	measure(&perf, t.plan, info.Result.StepS)
	info.Result.TFLOPS, info.Result.MFU, info.Result.PlannedTFLOPS, info.Result.PlannedMFU = perf.TFLOPS, perf.MFU, perf.TFLOPSPlan, perf.MFUPlan
	info.Result.PeakTFLOPS = t.plan.Topology.Device.PeakFLOPS / 1e12
	if c := t.plan.Topology.Calibration; c != nil {
		info.Result.Probe = c.Probe
	}
	p := t.plan.Memory
	info.Memory = &memoryCompared{Held: out.Held, Predicted: p, PeakRSS: out.PeakRSS}
	if t.modelSteps > 0 && len(t.st.counted) > 0 {
		info.ModelCommSent = map[string]int64{}
		for _, c := range t.st.counted {
			info.ModelCommSent[string(c.axis)] = c.train / t.modelSteps
		}
	}
	ev := t.log.Info().Int64("held_bytes", out.Held.Total).Int64("predicted_bytes", p.Total).Int64("peak_rss_bytes", out.PeakRSS)
	if out.FinalValLoss != nil {
		ev = ev.Float64("final_val_loss", round4(*out.FinalValLoss))
	}
	ev.Float64("unigram_entropy", round4(out.UnigramBits)).Float64("tokens_per_s", round4(out.TokensPerS)).
		Float64("step_s", sig4(info.Result.StepS)).Float64("step_s_plan", sig4(info.Result.PlannedStepS)).
		Float64("mfu", sig4(perf.MFU)).Float64("mfu_plan", sig4(perf.MFUPlan)).Msg("done")
	return writeJSON(filepath.Join(t.dir, "run.json"), info)
}

// firstNonFinite is the index of the first NaN or infinity in w, or -1.
func firstNonFinite(w []float32) int {
	for j, x := range w {
		if x-x != 0 { // NaN and ±Inf give NaN
			return j
		}
	}
	return -1
}

// goodAtEnd is the last finite step of the curve rank 0 recorded.
func (t *run) goodAtEnd() Metrics {
	for i := len(t.curve) - 1; i >= 0; i-- {
		if !t.curve[i].Skipped {
			return t.curve[i]
		}
	}
	return Metrics{}
}

// held is what this rank holds, by the plan's memory components.
func (t *run) held() Memory {
	w, main, g, o := t.st.bytes()
	act, logits := t.m.ActivationBytes()
	h := Memory{Weights: w, MainWeights: main, Grads: g, OptimizerState: o, Activations: act, MoEDispatch: t.m.DispatchBytes(), Logits: logits,
		Scratch: t.m.ScratchBytes()}
	h.GradReduceBuffers = t.st.stageBytes()
	if t.rt != nil {
		gathered, grads := t.rt.memory()
		h.GatheredUnits, h.GradReduceBuffers = gathered, h.GradReduceBuffers+grads
	}
	h.Total = w + main + g + o + act + h.MoEDispatch + logits + h.Scratch + h.GatheredUnits + h.GradReduceBuffers
	return h
}

// hostAvailable is the memory this process can still get: the host's
// MemAvailable, capped by the room left under a cgroup memory limit (a
// container's); 0 where neither can be read.
func hostAvailable() int64 { return memoryAvailable("/proc/meminfo", "/sys/fs/cgroup") }

// memoryAvailable is hostAvailable over the given /proc/meminfo and cgroup
// mount (cgroup v2's memory.max and memory.current at its root, or v1's
// memory/memory.limit_in_bytes and memory.usage_in_bytes; a limit of "max",
// or v1's near 2^63, is none).
func memoryAvailable(meminfo, cgroup string) int64 {
	avail := procBytes(meminfo, "MemAvailable:")
	read := func(name string) (int64, bool) {
		b, err := os.ReadFile(filepath.Join(cgroup, name))
		if err != nil {
			return 0, false
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return v, err == nil // "max" does not parse: no limit
	}
	for _, files := range [][2]string{{"memory.max", "memory.current"}, {"memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"}} {
		limit, ok := read(files[0])
		if !ok || limit >= 1<<62 {
			continue
		}
		used, _ := read(files[1])
		if room := max(limit-used, 0); avail == 0 || room < avail {
			avail = room
		}
		break
	}
	return avail
}

// peakRSS reads the process's peak resident set (VmHWM) from /proc; 0 elsewhere.
func peakRSS() int64 { return procBytes("/proc/self/status", "VmHWM:") }

// procBytes reads a "key value kB" line of a /proc file as bytes; 0 where
// there is none.
func procBytes(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == key {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// sample writes logging.sample_tokens tokens sampled from the trained weights
// to sample.txt and out.Sample (nothing when it is 0): the text every rank
// sampled together (sampleWithModel), or rank 0's own sample, on the device
// engine, with the training model (sampleModel) or from the whole model on
// its host (finalTable, finalViews).
func (t *run) sample(out *Result) error {
	n := t.r.Logging.SampleTokens
	if n == 0 {
		return nil
	}
	prompt := t.prompt()
	var sample string
	var err error
	switch {
	case t.sampled != nil:
		sample = *t.sampled
	case t.sampler == sampleModel:
		sample, err = t.sampleWithModel(nil, prompt, n)
	default:
		sample, err = Generate(t.r, t.opts.Backend, t.finalTable, t.finalViews, t.ds.Tok, prompt, n, sampleTemperature, t.r.Run.Seed)
	}
	if err != nil {
		return err
	}
	out.Sample = prompt + sample
	return fileio.WriteAtomic(filepath.Join(t.dir, "sample.txt"), []byte(out.Sample+"\n"))
}

// sampleTemperature is the temperature of the sample at the end of a run,
// however it is drawn.
const sampleTemperature = 0.8

// prompt is what the sample follows: the validation text's first token (the
// training text's without one), always in the vocabulary.
func (t *run) prompt() string {
	if t.ds.Val.Len() > 0 {
		return t.ds.Tok.Decode(t.ds.Val.Slice(0, 1))
	}
	return t.ds.Tok.Decode(t.ds.Train.Slice(0, 1))
}

// Generate samples n tokens after prompt, one forward pass per token over the last
// seq_len tokens, at the given temperature (0 is greedy), from a generator seeded
// by seed. The model is built for min(seq_len, prompt + n) positions: attention is
// causal, so the logits at the last real token do not depend on the padding after
// it, and a long-context model samples without a seq_len forward per token.
func Generate(r *config.Recipe, be tensor.Backend, table []parallel.Param, weights [][]float32, tok data.Tokenizer, prompt string, n int, temperature float64, seed int64) (string, error) {
	enc, err := tok.Encode([]byte(prompt))
	if err != nil {
		return "", fmt.Errorf("prompt: %w", err)
	}
	T := min(r.Model.SeqLen, max(len(enc), 1)+n)
	// The sampler never runs backward: the gradient buffers are the weights'.
	mem := be.NewMemory()
	w := tensor.Upload(mem, tensor.Float32, weights)
	// A model trained on documents apart samples within the prompt's last
	// document too (no loss is computed: only the attention mask applies).
	docs := model.DocumentMasks{EOS: tok.Specials().EOS, ResetAttention: r.Data.ResetAttentionMask && tok.Specials().EOS >= 0}
	m, err := model.New[float32](r.Model, table, w, w, be, 1, T, model.WithMemory(mem), model.WithDocumentMasks(docs))
	if err != nil {
		return "", err
	}
	V := r.Model.VocabSize
	logits := make([]float32, V)
	return generate(T, tok, prompt, n, temperature, seed, func(window []int32, k int) ([]float32, error) {
		m.ForwardLogits(window, k-1, k)
		m.ReadLogits(logits, 0) // one read-back per sampled token
		return logits, nil
	}, nil)
}

// generate is Generate's loop over a function that returns the logits (V) of
// position k−1 of a window of T tokens (the first k real, zeros after). agree,
// when not nil, turns each token drawn into the one every rank goes on with.
func generate(T int, tok data.Tokenizer, prompt string, n int, temperature float64, seed int64, next func(window []int32, k int) ([]float32, error),
	agree func(int32) (int32, error)) (string, error) {
	ctx, err := tok.Encode([]byte(prompt))
	if err != nil {
		return "", fmt.Errorf("prompt: %w", err)
	}
	if len(ctx) == 0 {
		ctx = []int32{0}
	}
	rng := rand.New(rand.NewSource(seed))
	window := make([]int32, T)
	vocab := tok.VocabSize()
	start := len(ctx)
	for i := 0; i < n; i++ {
		k := min(len(ctx), T)
		clear(window)
		copy(window, ctx[len(ctx)-k:])
		logits, err := next(window, k)
		if err != nil {
			return "", err
		}
		id := sampleToken(logits[:vocab], temperature, rng)
		if agree != nil {
			if id, err = agree(id); err != nil {
				return "", err
			}
		}
		ctx = append(ctx, id)
	}
	return tok.Decode(ctx[start:]), nil
}

// sampleToken draws from softmax(logits / temperature); temperature 0 takes the
// most likely token.
func sampleToken(logits []float32, temperature float64, rng *rand.Rand) int32 {
	best := 0
	for i, l := range logits {
		if l > logits[best] {
			best = i
		}
	}
	if temperature <= 0 {
		return int32(best)
	}
	probs := make([]float64, len(logits))
	var sum float64
	for i, l := range logits {
		probs[i] = math.Exp((float64(l) - float64(logits[best])) / temperature)
		sum += probs[i]
	}
	u := rng.Float64() * sum
	for i, p := range probs {
		if u -= p; u <= 0 {
			return int32(i)
		}
	}
	return int32(len(probs) - 1)
}

// SampleRun loads a run directory (resolved.toml, tokenizer.json, weights.bin) and
// generates tokens after prompt.
func SampleRun(be tensor.Backend, dir, prompt string, n int, temperature float64, seed int64) (string, error) {
	fr, err := loadRun(dir)
	if err != nil {
		return "", err
	}
	return Generate(fr.recipe, be, fr.table, fr.weights, fr.tok, prompt, n, temperature, seed)
}

// finishedRun is a run directory's model: its recipe, tokenizer, parameter table
// and final weights.
type finishedRun struct {
	recipe  *config.Recipe
	tok     data.Tokenizer
	table   []parallel.Param
	weights [][]float32
}

// NotRunDir is the error for dir, which is not a run directory because of
// why, with the fix: the directory shardline run printed.
func NotRunDir(dir string, why error) error {
	return fmt.Errorf("%s is not a run directory: %w; give the directory shardline run printed (run.output_dir/run.name, e.g. runs/tiny), which holds resolved.toml, run.json and weights.bin", dir, why)
}

// loadRun reads a run directory (resolved.toml, checked against run.json's
// fingerprint; tokenizer.json; weights.bin).
func loadRun(dir string) (*finishedRun, error) {
	res, diags := config.Load(filepath.Join(dir, "resolved.toml"), config.Options{})
	if diags.HasErrors() || res == nil {
		return nil, NotRunDir(dir, diags.Err())
	}
	r := &res.Recipe
	// run.json holds the resolved recipe's fingerprint: a resolved.toml that changed
	// after the run (a flipped byte, an edit) would describe another model.
	if err := checkRecipeFingerprint(dir, r); err != nil {
		return nil, err
	}
	tok, err := data.LoadTokenizer(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	table, err := parallel.ParamTable(r.Model, 1, 1)
	if err != nil {
		return nil, err
	}
	// The file's size first: the recipe sets what is allocated for the values.
	if err := checkWeightsSize(filepath.Join(dir, "weights.bin"), table); err != nil {
		return nil, err
	}
	views := make([][]float32, len(table))
	for i := range table {
		views[i] = make([]float32, table[i].LocalNumel())
	}
	if err := loadWeights(filepath.Join(dir, "weights.bin"), table, views); err != nil {
		return nil, err
	}
	return &finishedRun{recipe: r, tok: tok, table: table, weights: views}, nil
}

// RunLogits runs a finished run's model over tokens (at most model.seq_len) and
// returns the logits, (len(tokens), vocab_size) row-major.
func RunLogits(be tensor.Backend, dir string, tokens []int32) ([]float32, error) {
	fr, err := loadRun(dir)
	if err != nil {
		return nil, err
	}
	T, V := fr.recipe.Model.SeqLen, fr.recipe.Model.VocabSize
	if len(tokens) == 0 || len(tokens) > T {
		return nil, fmt.Errorf("%d tokens: give 1 to model.seq_len (%d)", len(tokens), T)
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= V {
			return nil, fmt.Errorf("token %d outside the vocabulary of %d", t, V)
		}
	}
	mem := be.NewMemory() // no backward: the gradient buffers are the weights'
	w := tensor.Upload(mem, tensor.Float32, fr.weights)
	m, err := model.New[float32](fr.recipe.Model, fr.table, w, w, be, 1, T, model.WithMemory(mem))
	if err != nil {
		return nil, err
	}
	window := make([]int32, T)
	copy(window, tokens)
	logits := make([]float32, len(tokens)*V)
	for lo := 0; lo < len(tokens); lo += m.LogitRows() { // the head makes a chunk of rows at a time
		hi := min(lo+m.LogitRows(), len(tokens))
		m.ForwardLogits(window, lo, hi)
		m.ReadLogits(logits[lo*V:hi*V], 0)
	}
	if err := m.Err(); err != nil {
		return nil, err
	}
	return logits, mem.Err()
}

// ExportHF writes a finished run's final weights (dir holds weights.bin) as a
// Hugging Face model directory out: config.json (with the tokenizer's BOS and
// EOS ids) and model.safetensors, split with an index above shardBytes, and the
// tokenizer's files with tokenizer_config.json and generation_config.json
// (exportTokenizer). out must be new, empty or an earlier export's
// (hf.WriteModel), unless overwrite. tokNote says what was written for the
// tokenizer.
func ExportHF(dir, out string, shardBytes int64, overwrite bool) (tokNote string, err error) {
	fr, err := loadRun(dir)
	if err != nil {
		return "", err
	}
	params := make([]hf.Param, len(fr.table))
	for i := range fr.table {
		params[i] = hf.Param{Name: fr.table[i].Name, Shape: fr.table[i].Shape, Data: fr.weights[i]}
	}
	ts, err := hf.ToHF(fr.recipe.Model, params)
	if err != nil {
		return "", err
	}
	fp, _ := config.Fingerprint(fr.recipe)
	te, err := exportTokenizer(fr.tok, fr.recipe.Model)
	if err != nil {
		return "", err
	}
	c := hf.Config(fr.recipe.Model)
	c["bos_token_id"], c["eos_token_id"] = te.bos, te.eos
	cfg, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return "", err
	}
	return te.note, hf.WriteModel(out, append(cfg, '\n'), ts, map[string]string{"format": "pt", "shardline_recipe": fp}, te.files, shardBytes, overwrite)
}

// readHF reads a Hugging Face model directory into the plan's parameters (by
// global name): its config.json must describe the recipe's model (every
// mismatch named by key), its weights files hold no more than that model
// needs, and any tensor that does not fit is refused, named.
func readHF(dir string, m config.Model, table []parallel.Param) ([][]float32, error) {
	if err := hf.CheckConfig(dir, m); err != nil {
		return nil, err
	}
	var elements int64
	for i := range table {
		elements += table[i].Numel()
	}
	ts, err := hf.ReadModel(dir, hf.ReadLimit(m, elements, len(table)))
	if err != nil {
		return nil, err
	}
	params := make([]hf.Param, len(table))
	vals := make([][]float32, len(table))
	for i := range table {
		vals[i] = make([]float32, table[i].Numel())
		params[i] = hf.Param{Name: table[i].Name, Shape: table[i].Shape, Data: vals[i]}
	}
	if err := hf.FromHF(m, ts, params); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	for i, v := range vals {
		if j := firstNonFinite(v); j >= 0 {
			return nil, fmt.Errorf("%s: %s[%d] is %v: weights must be finite", dir, table[i].Name, j, v[j])
		}
	}
	return vals, nil
}

// maxRunJSON caps run.json as read back: a few kilobytes when written.
const maxRunJSON = 1 << 20

// maxResolved caps resolved.toml as read back for its fingerprint.
const maxResolved = 16 << 20

// checkRecipeFingerprint compares the fingerprint of a run directory's resolved
// recipe with the one its run.json recorded when the run started: the
// fingerprint of resolved.toml's canonical text as written (after its
// header), so that a run written by an earlier shardline, whose canonical
// recipe lacks keys added since (each added with a default that keeps the
// earlier behaviour), still loads; an edit of the file changes that text.
// A file without the header is checked by its recipe's fingerprint.
func checkRecipeFingerprint(dir string, r *config.Recipe) error {
	path := filepath.Join(dir, "run.json")
	b, err := fileio.ReadRegular(path, maxRunJSON)
	if err != nil {
		return NotRunDir(dir, err)
	}
	var info runInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if text, err := fileio.ReadRegular(filepath.Join(dir, "resolved.toml"), maxResolved); err == nil {
		if fp, ok := config.WrittenFingerprint(text); ok && fp == info.RecipeFingerprint {
			return nil
		}
	}
	fp, err := config.Fingerprint(r)
	if err != nil {
		return err
	}
	if info.RecipeFingerprint != fp {
		return fmt.Errorf("%s: %w: resolved.toml has fingerprint %s, the run recorded %s (the recipe changed after the run)", dir, fileio.ErrCorrupt, fp, info.RecipeFingerprint)
	}
	return nil
}
