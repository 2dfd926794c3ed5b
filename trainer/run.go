package trainer

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/trainer/ckpt"
	"github.com/shardline/shardline/trainer/data"
	"github.com/shardline/shardline/trainer/model"
	"github.com/shardline/shardline/trainer/optim"
	"github.com/shardline/shardline/trainer/tensorboard"
)

// Options are what a run needs besides the recipe.
type Options struct {
	Backend tensor.Backend
	Env     map[string]string // for ${VAR} in data paths
	// LogOut receives the console log (formatted by the caller); run.log in the run
	// directory receives the same events as JSON lines.
	LogOut   io.Writer
	LogLevel zerolog.Level
	// Progress, when non-nil, receives a one-line progress bar (a terminal).
	Progress io.Writer
	// Process, when set, makes this process one rank of a multi-process job (ranks
	// joined by Comm, e.g. over TCP) instead of running every rank as a goroutine.
	Process *Process
	// TracePath, when set, receives a Chrome trace of every rank's compute and
	// communication (optim_grads_params), viewable in Perfetto.
	TracePath string
	// Calibrations time the plan of a CPU run (parallel.TopologyOf): the CLI's
	// tables for this machine and the user's setting; nil, the shipped ones.
	Calibrations parallel.Calibrations
	// DataRoot, when set, is the directory a relative data.path is read from
	// (the data_root CLI setting); otherwise the working directory.
	DataRoot string
	// CacheDir caches tokenized text; empty disables the cache.
	CacheDir string
	Version  string
	// Resume, when set, is a checkpoint directory (step-N, with metadata.json) to
	// continue from: its state is loaded, resharded to this run's plan, and the run
	// continues from its step: in the checkpoint's run directory when that is
	// the same run going on (takeRunDir), in a new run directory otherwise.
	Resume string
	// AutoResume, when set, says that Resume was chosen by --resume auto: the
	// checkpoint root searched, and the newer checkpoints passed over because
	// they do not check out. An empty Resume then starts a new run. Rank 0's
	// log says which.
	AutoResume *AutoResume
	// InitFrom, when set, is a Hugging Face model directory (config.json,
	// safetensors) whose weights replace the initialisation: fine-tuning starts from
	// it, with fresh optimizer state.
	InitFrom string
	// StopAfter, when positive, ends the run as an interrupt would once this many
	// steps are done (a preemption drill: tests resume from where it stopped).
	StopAfter int
	// RankBackend, when set, gives each rank the backend it trains on (the
	// shardline-cuda build: the kernel set of a GPU, picked by the rank's index
	// among this process's ranks, or by this process's local rank in a job),
	// and release, called when the rank is done; the run executes the engine
	// (the FSDP runtime and trainer/model) on it. Backend serves the rest.
	RankBackend func(rank int) (be tensor.Backend, release func(), err error)

	resume *ckpt.Meta // Resume's metadata, read by Run
	own    *ownership // rank 0's hold on its run directory, taken by Run
	faults *faults    // tests' stand-ins for a failing disk or rank
	// clock is what checkpoint.interval_minutes reads on rank 0: time.Now,
	// or a test's clock.
	clock func() time.Time
}

// AutoResume is what --resume auto found under the recipe's checkpoint root.
type AutoResume struct {
	Root    string
	Skipped []ckpt.Skipped
	// InitFrom is the --init-from a found checkpoint made moot: the run
	// continues the checkpoint, whose weights started from it.
	InitFrom string
}

// Process is this process's place in a multi-process job.
type Process struct {
	Rank, World int
	Comm        comm.Communicator // the world
}

// Metrics is one line of metrics.jsonl.
type Metrics struct {
	Step       int      `json:"step"`
	Loss       float64  `json:"loss"`
	LR         float64  `json:"lr"`
	GradNorm   float64  `json:"grad_norm"`
	TokensPerS float64  `json:"tokens_per_s"`
	ValLoss    *float64 `json:"val_loss,omitempty"`
	// MemHeld is what this rank holds (bytes: weights, main weights, gradients,
	// optimizer state, peak gathered units and unit gradient buffers, activations,
	// logits); MemPlan is the plan's prediction of the same.
	MemHeld int64 `json:"mem_held"`
	MemPlan int64 `json:"mem_plan"`
	// StepS is the step's measured time (seconds, wall clock, forward to
	// update); TFLOPS is the model's FLOPs per device over it (TFLOP/s), and
	// MFU that over the device's peak: parallel.Plan.ModelFLOPs / ranks /
	// StepS / PeakFLOPS (measure). StepSPlan, TFLOPSPlan and MFUPlan are the
	// plan's predictions of the same. Lines written before 2026-11-27 lack
	// them.
	StepS      float64  `json:"step_s,omitempty"`
	StepSPlan  float64  `json:"step_s_plan,omitempty"`
	TFLOPS     float64  `json:"tflops,omitempty"`
	TFLOPSPlan float64  `json:"tflops_plan,omitempty"`
	MFU        float64  `json:"mfu,omitempty"`
	MFUPlan    float64  `json:"mfu_plan,omitempty"`
	AuxLoss    *float64 `json:"aux_loss,omitempty"`       // MoE load-balancing loss (weighted)
	Dropped    *int     `json:"tokens_dropped,omitempty"` // MoE copies dropped past capacity, all ranks
	Skipped    bool     `json:"skipped,omitempty"`
	// Data is what the training samples drew from each data source up to and
	// including this step: samples, their tokens and the epochs they make.
	Data []SourceConsumed `json:"data,omitempty"`
}

// SourceConsumed is what a run's steps drew from one data source (its path
// as the recipe names it; "" for data.path).
type SourceConsumed struct {
	Source string `json:"source"`
	data.Consumed
}

// MarshalJSON writes a metrics line that is valid JSON whatever the values: a NaN
// or infinite loss, gradient norm, validation or auxiliary loss is written as null
// and its name listed under "nonfinite" (JSON has no NaN).
func (m Metrics) MarshalJSON() ([]byte, error) {
	type plain Metrics // without this method
	out := struct {
		plain
		Loss      *float64 `json:"loss"`
		GradNorm  *float64 `json:"grad_norm"`
		ValLoss   *float64 `json:"val_loss,omitempty"`
		AuxLoss   *float64 `json:"aux_loss,omitempty"`
		NonFinite []string `json:"nonfinite,omitempty"`
	}{plain: plain(m)}
	finite := func(name string, v float64) *float64 {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			out.NonFinite = append(out.NonFinite, name)
			return nil
		}
		return &v
	}
	out.Loss, out.GradNorm = finite("loss", m.Loss), finite("grad_norm", m.GradNorm)
	if m.ValLoss != nil {
		out.ValLoss = finite("val_loss", *m.ValLoss)
	}
	if m.AuxLoss != nil {
		out.AuxLoss = finite("aux_loss", *m.AuxLoss)
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads a metrics line as MarshalJSON writes it: a null loss,
// gradient norm, validation or auxiliary loss (non-finite when written) reads
// as NaN.
func (m *Metrics) UnmarshalJSON(b []byte) error {
	type plain Metrics
	in := struct {
		*plain
		Loss      *float64 `json:"loss"`
		GradNorm  *float64 `json:"grad_norm"`
		ValLoss   *float64 `json:"val_loss"`
		AuxLoss   *float64 `json:"aux_loss"`
		NonFinite []string `json:"nonfinite"`
	}{plain: (*plain)(m)}
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	nan := math.NaN()
	m.Loss, m.GradNorm = *cmp.Or(in.Loss, &nan), *cmp.Or(in.GradNorm, &nan)
	m.ValLoss, m.AuxLoss = in.ValLoss, in.AuxLoss
	for _, name := range in.NonFinite {
		switch name {
		case "val_loss":
			m.ValLoss = &nan
		case "aux_loss":
			m.AuxLoss = &nan
		}
	}
	return nil
}

// Result summarises a finished run.
type Result struct {
	Dir           string
	Steps         int
	FinalLoss     float64
	FinalValLoss  *float64 // nil when the run has no validation split
	TokensPerS    float64  // median over the run's steps, excluding the first
	PlannedStepS  float64  // the plan's step time (run.json records it beside the measured one)
	PeakRSS       int64    // the process's peak resident memory
	Held          Memory   // what the run allocated, by plan component
	Predicted     parallel.Memory
	Sample        string // the prompt and logging.sample_tokens sampled tokens; empty when that is 0
	Interrupted   bool
	PlanPrint     string
	UnigramBits   float64 // entropy of the training tokens' unigram distribution, in nats
	Fingerprint   string
	PlanPrintHash string
}

// Memory is what the run holds, by the plan's components.
type Memory struct {
	Weights           int64 `json:"weights"`
	MainWeights       int64 `json:"main_weights"`
	Grads             int64 `json:"grads"`
	OptimizerState    int64 `json:"optimizer_state"`
	GatheredUnits     int64 `json:"gathered_units"`      // peak of gathered unit weights
	GradReduceBuffers int64 `json:"grad_reduce_buffers"` // peak of unit gradient buffers
	Activations       int64 `json:"activations"`
	MoEDispatch       int64 `json:"moe_dispatch"` // expert parallelism's exchange buffers
	Logits            int64 `json:"logits"`
	Scratch           int64 `json:"scratch"` // backward's work buffers, parallelism's gather and ring buffers
	Total             int64 `json:"total"`
}

// ErrNonFinite reports a NaN or Inf loss or gradient.
var ErrNonFinite = errors.New("non-finite loss or gradient")

// ErrInterrupted is a single process's run whose context was cancelled (Ctrl-C)
// before training started: Run returns it having written nothing (a run
// directory it had made is removed again).
var ErrInterrupted = errors.New("interrupted before training started; nothing was written")

// Run trains the recipe on one rank and writes the run directory.
func Run(ctx context.Context, res *config.Resolved, opts Options) (*Result, error) {
	r := &res.Recipe
	// A setting the trainer would accept and ignore is refused instead.
	if un := config.NotExecuted(r); len(un) > 0 {
		v, _ := res.Value(un[0].Key)
		return nil, config.ValueProblem(un[0].Key, v, errors.New(un[0].Why), un[0].Fix)
	}
	switch gpu := r.Parallel.Device == "cuda"; {
	case gpu && opts.RankBackend == nil:
		return nil, config.ValueProblem("parallel.device", r.Parallel.Device, errors.New("this build has no GPU engine"), "run it with shardline-cuda (make cuda; docs/cuda.md), or set device = \"cpu\"")
	case !gpu && opts.RankBackend != nil:
		return nil, config.ValueProblem("parallel.device", r.Parallel.Device, errors.New("a device backend was given for a CPU recipe"), "set device = \"cuda\"")
	}
	topo, err := parallel.TopologyOf(r.Parallel, opts.Calibrations)
	if err != nil {
		return nil, err
	}
	plan, err := parallel.Compile(r, topo)
	if err != nil {
		return nil, err
	}
	ds, err := openData(r, opts)
	if err != nil {
		return nil, err
	}
	opts.faults.at("data")
	var resume *ckpt.Meta
	if opts.Resume != "" {
		if resume, err = ckpt.Open(opts.Resume); err != nil {
			return nil, err
		}
		if err := checkResumable(opts.Resume, resume, plan, r, ds.Fingerprint()); err != nil {
			return nil, err
		}
	}
	opts.resume = resume
	if p := opts.Process; p != nil {
		if err := agree(p, res, ds, opts); err != nil {
			return nil, err
		}
		if p.World != plan.Mesh.World {
			return nil, config.ValueProblem("parallel.world_size", r.Parallel.WorldSize, fmt.Errorf("the job has %d ranks", p.World), "set it to the job's WORLD_SIZE (shardline launch does)")
		}
		if p.Rank != 0 {
			out := opts.LogOut
			if out == nil {
				out = io.Discard
			}
			log := zerolog.New(out).Level(opts.LogLevel).With().Timestamp().Int("rank", p.Rank).Logger()
			return runProcess(ctx, r, res, opts, plan, ds, "", log)
		}
	}
	// A single process interrupted during start-up (the data, the plan, the
	// resume's checks) stops before it takes a run directory. (A job's ranks
	// stop together at the first step boundary instead: Run.boundary.)
	if opts.Process == nil && ctx.Err() != nil {
		return nil, ErrInterrupted
	}
	own, err := takeRunDir(r, opts.Resume, resume, opts.AutoResume != nil && opts.Resume == "")
	if err != nil {
		return nil, err
	}
	defer own.release()
	host, _ := os.Hostname()
	own.events = eventsName(r.Logging.Tensorboard, own.started, host)
	opts.own = own
	dir := own.dir
	logFile, err := fileio.OpenAppend(filepath.Join(dir, "run.log")) // never through a link
	if err != nil {
		return nil, fmt.Errorf("run directory %s: opening run.log: %w", dir, err)
	}
	defer logFile.Close()
	out := opts.LogOut
	if out == nil {
		out = io.Discard
	}
	if opts.Progress != nil {
		out = clearsProgress{out: out, progress: opts.Progress}
	}
	// In-process ranks log concurrently: one lock serialises whole events.
	log := zerolog.New(zerolog.SyncWriter(zerolog.MultiLevelWriter(out, logFile))).Level(opts.LogLevel).With().Timestamp().Logger()
	var result *Result
	if opts.Process != nil {
		log = log.With().Int("rank", 0).Logger()
		result, err = func() (out *Result, err error) {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("rank 0: %w", panicked(p))
				}
			}()
			return runProcess(ctx, r, res, opts, plan, ds, dir, log)
		}()
	} else {
		result, err = runRanks(ctx, r, res, opts, plan, ds, dir, log)
	}
	if errors.Is(err, ErrInterrupted) && !own.header {
		// Interrupted before rank 0 wrote its header: nothing of this run is
		// kept. A directory it made is removed (it holds only the lock file,
		// an empty run.log and checkpoints/); a resumed one is as it was.
		if own.fresh {
			logFile.Close()
			own.release()
			os.RemoveAll(dir)
		}
		return nil, ErrInterrupted
	}
	if err != nil {
		// Every way a run ends is written down: run.log says why, run.json how.
		rec := &run{r: r, res: res, opts: opts, plan: plan, ds: ds, dir: dir, rank: 0}
		return nil, rec.recordFailure(err, logFile)
	}
	return result, nil
}

// sameDir says whether two paths name the same directory.
func sameDir(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// openPath opens one data path of the recipe (key names it in errors:
// data.path, data.sources or data.val_path) with the given validation fraction.
func openPath(r *config.Recipe, opts Options, key string, value any, raw string, valFraction float64) (*data.Dataset, error) {
	path, err := config.ExpandPath(raw, opts.Env)
	if err != nil {
		return nil, config.ValueProblem(key, value, err, "set the variable, or give a literal path")
	}
	if opts.DataRoot != "" && !filepath.IsAbs(path) {
		path = filepath.Join(opts.DataRoot, path)
	}
	tok, err := config.TokenizerPath(r.Data.Tokenizer, opts.Env, opts.DataRoot)
	if err == nil && data.IsTokenizerFile(tok) {
		_, err = os.Stat(tok)
	}
	if err != nil {
		if len(config.PathVars(r.Data.Tokenizer)) > 0 {
			err = errors.New(config.RedactVars(err.Error(), r.Data.Tokenizer, opts.Env))
		}
		return nil, config.ValueProblem("data.tokenizer", r.Data.Tokenizer, err, "give the path of a tokenizer.json, tokenizer.model or a directory holding one (docs/tokenizers.md)")
	}
	ds, err := data.Open(path, data.OpenOptions{Tokenizer: tok, Field: r.Data.Field, ValFraction: valFraction, CacheDir: opts.CacheDir})
	if err != nil && len(config.PathVars(raw)) > 0 {
		// The expanded path is not printed: ${VAR} may hold a secret (docs/robustness.md).
		err = errors.New(config.RedactVars(err.Error(), raw, opts.Env))
	}
	if err != nil && len(config.PathVars(r.Data.Tokenizer)) > 0 {
		err = errors.New(config.RedactVars(err.Error(), r.Data.Tokenizer, opts.Env)) // the tokenizer's path too
	}
	if err != nil {
		return nil, config.ValueProblem(key, value, err, "point it at a document source, a `shardline data prepare` directory or a Megatron dataset (docs/data.md)")
	}
	return ds, nil
}

// parseSource reads a data.sources entry, "WEIGHT PATH".
func parseSource(entry string) (float64, string, error) {
	w, path, ok := strings.Cut(strings.TrimSpace(entry), " ")
	weight, err := strconv.ParseFloat(w, 64)
	if !ok || err != nil || !(weight > 0) || math.IsInf(weight, 1) || strings.TrimSpace(path) == "" {
		return 0, "", fmt.Errorf("entry %q is not \"WEIGHT PATH\" with a positive weight", entry)
	}
	return weight, strings.TrimSpace(path), nil
}

func openData(r *config.Recipe, opts Options) (*data.Dataset, error) {
	valFraction := r.Data.ValFraction
	if r.Data.ValPath != "" && valFraction != 0 {
		return nil, config.ValueProblem("data.val_fraction", valFraction, fmt.Errorf("data.val_path (%q) gives the validation data, so nothing need be held out of the training data", r.Data.ValPath), "set data.val_fraction = 0")
	}
	var ds *data.Dataset
	var err error
	if len(r.Data.Sources) == 0 {
		if ds, err = openPath(r, opts, "data.path", r.Data.Path, r.Data.Path, valFraction); err != nil {
			return nil, err
		}
	} else {
		if r.Data.Path != "" {
			return nil, config.ValueProblem("data.path", r.Data.Path, fmt.Errorf("data.sources names the training data (%d sources)", len(r.Data.Sources)), `set data.path = "" when data.sources lists the data`)
		}
		var names []string
		var weights []float64
		var parts []*data.Dataset
		for _, e := range r.Data.Sources {
			w, p, err := parseSource(e)
			if err != nil {
				return nil, config.ValueProblem("data.sources", r.Data.Sources, err, `write each source as "0.3 path/to/data"`)
			}
			part, err := openPath(r, opts, "data.sources", r.Data.Sources, p, valFraction)
			if err != nil {
				return nil, err
			}
			names, weights, parts = append(names, p), append(weights, w), append(parts, part)
		}
		if ds, err = data.Blend(names, weights, parts); err != nil {
			return nil, config.ValueProblem("data.sources", r.Data.Sources, err, "prepare every source with data.tokenizer")
		}
	}
	if r.Data.ValPath != "" {
		v, err := openPath(r, opts, "data.val_path", r.Data.ValPath, r.Data.ValPath, 0)
		if err != nil {
			return nil, err
		}
		if v.Tok.Name() != ds.Tok.Name() || v.Tok.VocabSize() != ds.Tok.VocabSize() {
			return nil, config.ValueProblem("data.val_path", r.Data.ValPath, fmt.Errorf("its %s tokenizer (vocabulary %d) is not the training data's %s (vocabulary %d)", v.Tok.Name(), v.Tok.VocabSize(), ds.Tok.Name(), ds.Tok.VocabSize()), "prepare it with the training data's tokenizer")
		}
		ds.Val = data.Join(v.Train, v.Val)
	}
	if opts.InitFrom != "" {
		if err := checkInitTokenizer(opts.InitFrom, ds.Tok, r.Data.Tokenizer); err != nil {
			return nil, err
		}
	}
	T := r.Model.SeqLen
	if v := ds.Tok.VocabSize(); v > r.Model.VocabSize {
		return nil, config.ValueProblem("model.vocab_size", r.Model.VocabSize, fmt.Errorf("the %s tokenizer of %s has %d tokens", ds.Tok.Name(), r.Data.Path, v), fmt.Sprintf("set model.vocab_size to at least %d", v))
	}
	if ds.Train.Len() < T+1 {
		return nil, config.ValueProblem("data.path", r.Data.Path, fmt.Errorf("the training split has %d tokens, fewer than one sequence of model.seq_len + 1 = %d", ds.Train.Len(), T+1), "use a longer text or a shorter model.seq_len")
	}
	if r.Train.EvalInterval > 0 && ds.Val.Len() < T+1 {
		return nil, config.ValueProblem("data.val_fraction", r.Data.ValFraction, fmt.Errorf("the validation split has %d tokens, fewer than one sequence (%d)", ds.Val.Len(), T+1), "raise val_fraction, or set train.eval_interval = 0")
	}
	if err := ds.Sample(r.Run.Seed, T); err != nil {
		return nil, config.ValueProblem("data.path", r.Data.Path, err, "use longer sources or a shorter model.seq_len")
	}
	return ds, nil
}

// makeRunDir creates <output_dir>/<name>, or <name>-2, -3, ... if it is taken.
func makeRunDir(r *config.Recipe) (string, error) {
	if err := config.CheckRunName(r.Run.Name); err != nil {
		return "", config.ValueProblem("run.name", r.Run.Name, err, "give one directory name; choose where runs go with run.output_dir")
	}
	base := filepath.Join(r.Run.OutputDir, r.Run.Name)
	for i := 1; ; i++ {
		dir := base
		if i > 1 {
			dir = fmt.Sprintf("%s-%d", base, i)
		}
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return "", config.ValueProblem("run.output_dir", r.Run.OutputDir, err, "choose a writable directory with --set run.output_dir=DIR")
		}
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			return dir, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return "", config.ValueProblem("run.output_dir", r.Run.OutputDir, err, "choose a writable directory with --set run.output_dir=DIR")
		}
	}
}

type run struct {
	r       *config.Recipe
	res     *config.Resolved
	opts    Options
	release func() // releases the backend Options.RankBackend gave this rank
	plan    *parallel.Plan
	ds      *data.Dataset
	dir     string
	log     zerolog.Logger
	rank    int
	st      *state
	rt      *unitRuntime // optim_grads_params only
	trace   *tracer
	m       *model.Model[float32]
	docs    model.DocumentMasks // the data's document masks (data.eod_mask_loss, data.reset_attention_mask)
	evalErr error               // a collective of the last evaluation failed; flush returns it
	// weightsOut is rank 0's weights.bin as the end of the run writes it;
	// sampler is who samples at the end. finalTable and finalViews are the
	// whole model (tensor-parallel slices assembled) where rank 0 samples from
	// its host's copy (sampleHost), and sampled the text when every rank
	// sampled together.
	weightsOut *weightsWriter
	weightsErr error // rank 0's own error opening or writing weights.bin
	sampler    sampler
	finalTable []parallel.Param
	finalViews [][]float32
	sampled    *string
	// modelSteps is how many training steps the model-parallel groups' counts
	// (state.counted) cover.
	modelSteps int64
	bufs       *stepBufs // openModel makes them
	metrics    *os.File
	// events writes the TensorBoard event file eventsFile (rank 0, with
	// logging.tensorboard; nil otherwise).
	events     *tensorboard.Writer
	eventsFile *os.File
	curve      []Metrics
	ckpt       *checkpointer // nil when the recipe asks for no checkpoints
	started    time.Time     // when run.json was first written
	// ckptRunDir is the run directory for checkpoints on a rank other than 0 of a
	// multi-process job (which writes no other output, so its dir is empty).
	ckptRunDir string
}

// worldTimeout bounds every collective of an in-process run: ample for rank 0's
// evaluation and outputs while the others wait, short enough that a lost rank ends
// the run.
const worldTimeout = 10 * time.Minute

// runRanks trains on parallel.world_size ranks, goroutines of this process joined
// by in-process communicators. Rank 0 writes the outputs; a failing rank aborts the
// world so that no other rank waits for it.
func runRanks(ctx context.Context, r *config.Recipe, res *config.Resolved, opts Options, plan *parallel.Plan, ds *data.Dataset, dir string, log zerolog.Logger) (*Result, error) {
	n := plan.Mesh.World
	world := comm.NewWorld(n, worldTimeout)
	groups := inProcessGroups(world, plan)
	if s, ok := opts.Backend.(tensor.CoreSharer); ok && opts.RankBackend == nil {
		// The n ranks run kernels at once: each gets its share of the cores.
		defer s.ShareCores(n)()
	}
	var tr *tracer
	if opts.TracePath != "" {
		tr = &tracer{origin: time.Now()}
	}
	results := make([]*Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for rank := 0; rank < n; rank++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if p := recover(); p != nil { // a bug: the run still says how it ended
					errs[rank] = panicked(p)
					world.Abort(errs[rank])
				}
			}()
			t := &run{r: r, res: res, opts: opts, plan: plan, ds: ds, dir: dir, log: log, rank: rank, trace: tr}
			if rank != 0 { // other ranks report warnings and errors, each line with its rank
				t.log = log.With().Int("rank", rank).Logger().Level(max(zerolog.WarnLevel, opts.LogLevel))
				t.opts.Progress = nil
			} else if n > 1 {
				t.log = log.With().Int("rank", 0).Logger()
			}
			if errs[rank] = t.rankBackend(); errs[rank] == nil {
				defer t.releaseBackend()
				results[rank], errs[rank] = t.train(ctx, world.Rank(rank), groups)
			}
			if errs[rank] != nil && t.st != nil && t.st.lostWorld.Load() {
				// The device's collectives were given up because another rank
				// failed: that rank's error explains the run, not this one.
				errs[rank] = &comm.RankError{Op: "the device's collectives", Err: fmt.Errorf("world aborted: %w", errs[rank])}
			}
			if errs[rank] != nil {
				world.Abort(fmt.Errorf("rank %d: %w", rank, errs[rank]))
			}
		}()
	}
	wg.Wait()
	if tr != nil {
		if err := writeJSON(opts.TracePath, map[string]any{"traceEvents": tr.events, "displayTimeUnit": "ms"}); err != nil {
			return nil, fmt.Errorf("writing the trace: %w", err)
		}
	}
	// The first error that is neither another rank's abort nor a report that
	// another rank failed explains the failure; it names its rank.
	for _, explains := range []func(error) bool{
		func(err error) bool { return !aborted(err) && !errors.Is(err, ErrOtherRank) },
		func(err error) bool { return !aborted(err) },
		func(error) bool { return true },
	} {
		for rank, err := range errs {
			if err != nil && explains(err) {
				if n > 1 {
					err = fmt.Errorf("rank %d: %w", rank, err)
				}
				return nil, err
			}
		}
	}
	return results[0], nil
}

// aborted says whether err is a rank's collective given up because another
// rank failed.
func aborted(err error) bool {
	var re *comm.RankError
	return errors.As(err, &re) && strings.Contains(re.Error(), "world aborted")
}

// panicked is the error of a rank that panicked (a bug in shardline), with
// the stack, so that run.log and run.json record it.
func panicked(p any) error {
	return fmt.Errorf("internal error (please report it): %v\n%s", p, debug.Stack())
}

// rankBackend binds the rank to the backend Options.RankBackend gives it, if
// set; releaseBackend releases it when the rank is done.
func (t *run) rankBackend() error {
	if t.opts.RankBackend == nil {
		return nil
	}
	be, release, err := t.opts.RankBackend(t.rank)
	if err != nil {
		return fmt.Errorf("rank %d: %w", t.rank, err)
	}
	t.opts.Backend, t.release = be, release
	return nil
}

func (t *run) releaseBackend() {
	if t.release != nil {
		t.release()
	}
}

// inProcessGroups makes the plan's groups of a world of in-process ranks.
func inProcessGroups(world *comm.World, plan *parallel.Plan) groupsFor {
	return func(rank int, axis parallel.Axis) (comm.Communicator, error) {
		if tag := modelTag(axis); tag != "" {
			// The model's token exchanges and K/V ring run while the FSDP stream
			// gathers and reduces: they need communicators of their own.
			return world.Tagged(rank, plan.Mesh.Group(axis, rank), tag)
		}
		return world.Group(rank, plan.Mesh.Group(axis, rank))
	}
}

// modelTag names the communicators the model uses inside a pass (expert
// parallelism's all-to-alls, context parallelism's ring, tensor parallelism's
// gathers and reductions): tagged apart from the
// FSDP runtime's groups over the same ranks. Other axes have no tag.
func modelTag(axis parallel.Axis) string {
	switch axis {
	case parallel.AxisEP:
		return "ep"
	case parallel.AxisCP:
		return "cp"
	case parallel.AxisTP:
		return "tp"
	}
	return ""
}

// processGroups makes the plan's groups from the world communicator of a
// multi-process job (over TCP: meshes of their own).
func processGroups(plan *parallel.Plan, world comm.Communicator) groupsFor {
	return func(rank int, axis parallel.Axis) (comm.Communicator, error) {
		g, tag := plan.Mesh.Group(axis, rank), modelTag(axis) // the model's exchanges run beside the FSDP stream
		if len(g) == world.Size() && tag == "" {
			return world, nil
		}
		gr, ok := world.(comm.Grouper)
		if !ok {
			return nil, fmt.Errorf("group %s %v: this job's communicator cannot make groups", axis, g)
		}
		return gr.Group(g, tag)
	}
}

// runProcess trains this process's rank of a multi-process job. Groups other than
// the world are made from the world communicator (over TCP: meshes of their own).
func runProcess(ctx context.Context, r *config.Recipe, res *config.Resolved, opts Options, plan *parallel.Plan, ds *data.Dataset, dir string, log zerolog.Logger) (*Result, error) {
	p := opts.Process
	var tr *tracer
	if opts.TracePath != "" && p.Rank == 0 {
		tr = &tracer{origin: time.Now()}
	}
	groups := processGroups(plan, p.Comm)
	if p.Rank != 0 {
		opts.Progress = nil
	}
	t := &run{r: r, res: res, opts: opts, plan: plan, ds: ds, dir: dir, log: log, rank: p.Rank, trace: tr}
	if err := t.rankBackend(); err != nil {
		return nil, err
	}
	defer t.releaseBackend()
	if r.Checkpoint.Saves() && r.Checkpoint.Dir == "" && p.World > 1 {
		// Checkpoints go under the run directory, which rank 0 named.
		shared, err := shareString(p.Comm, dir)
		if err != nil {
			return nil, err
		}
		t.ckptRunDir = shared
	}
	out, err := t.train(ctx, p.Comm, groups)
	if err == nil && tr != nil {
		err = writeJSON(opts.TracePath, map[string]any{"traceEvents": tr.events, "displayTimeUnit": "ms"})
	}
	return out, err
}

// openState builds this rank's FSDP state: initialised, resumed from a checkpoint,
// or loaded from a Hugging Face directory. It returns the step and optimizer step
// to continue from.
func (t *run) openState(world comm.Communicator, groups groupsFor) (startStep, optSteps int, err error) {
	r := t.r
	if t.st, err = newState(t.plan, r, t.opts.Backend, t.rank, world, groups); err != nil {
		return 0, 0, err
	}
	if m := t.opts.resume; m != nil {
		rd := ckpt.NewReader(t.opts.Resume, m)
		err := t.st.load(rd)
		rd.Close()
		if err != nil {
			return 0, 0, fmt.Errorf("resuming from %s: %w", t.opts.Resume, err)
		}
		return m.Step, m.OptimizerSteps, nil
	}
	if err := t.st.init(r); err != nil {
		return 0, 0, err
	}
	if t.opts.InitFrom != "" {
		vals, err := readHF(t.opts.InitFrom, r.Model, t.plan.Params)
		if err != nil {
			return 0, 0, err
		}
		if err := t.st.initFrom(vals); err != nil {
			return 0, 0, err
		}
	}
	return 0, 0, nil
}

// logResume says where the run starts: the checkpoint it resumed from (its
// path and step), or, under --resume auto, that the checkpoint root held
// none and the run is new; and each newer checkpoint --resume auto passed
// over, with why.
func (t *run) logResume(startStep int) {
	if a := t.opts.AutoResume; a != nil {
		for _, s := range a.Skipped {
			t.log.Warn().Str("checkpoint", s.Dir).Err(s.Err).Msg("--resume auto passed over this checkpoint: it does not check out (shardline ckpt verify says more); resuming from an older one")
		}
		if t.opts.Resume == "" {
			t.log.Info().Str("checkpoint_root", a.Root).Msg("--resume auto: no complete checkpoint under the checkpoint root; starting a new run")
		}
		if a.InitFrom != "" {
			t.log.Info().Str("init_from", a.InitFrom).Msg("--resume auto found a checkpoint, which continues the run: --init-from applies only to a run that starts")
		}
	}
	if t.opts.Resume == "" {
		return
	}
	path := t.opts.Resume
	if o := t.opts.own; o != nil && o.resumedFrom != "" {
		path = o.resumedFrom
	}
	how := "a new run directory (a branch: the checkpoint is not its run's newest, or lies elsewhere)"
	if o := t.opts.own; o != nil && o.inPlace {
		how = "its run directory, in place"
	}
	t.log.Info().Str("checkpoint", path).Int("step", startStep).Str("continues", how).Msg("resumed from checkpoint")
}

// openCheckpointer sets up the run's checkpoints, when the recipe asks for them:
// under checkpoint.dir, or the run directory's checkpoints/.
func (t *run) openCheckpointer(startStep int) {
	r := t.r
	if !r.Checkpoint.Saves() {
		return
	}
	root := r.Checkpoint.Dir
	if root == "" {
		root = filepath.Join(cmp.Or(t.dir, t.ckptRunDir), "checkpoints")
	}
	t.ckpt = &checkpointer{root: root, interval: r.Checkpoint.Interval, keep: r.Checkpoint.KeepLast, saved: -1,
		every: time.Duration(r.Checkpoint.IntervalMinutes * float64(time.Minute)), clock: t.opts.clock, lead: t.rank == 0}
	if t.ckpt.clock == nil {
		t.ckpt.clock = time.Now
	}
	if t.ckpt.lead && t.ckpt.every > 0 {
		t.ckpt.since = t.ckpt.clock()
		t.ckpt.checked = t.ckpt.since
	}
	if t.opts.Resume != "" && sameDir(filepath.Dir(t.opts.Resume), root) {
		t.ckpt.saved = startStep // the checkpoint resumed from is this root's
	}
}

// openModel builds what the CPU engine steps with: the checkpointer, the model
// over the state's views, the FSDP unit runtime (sharded gradients), this rank's
// step buffers, and rank 0's metrics file. closeModel releases them.
func (t *run) openModel(startStep int) error {
	r := t.r
	t.openCheckpointer(startStep)
	B, T := r.Train.MicroBatchSize, r.Model.SeqLen
	mopts := []model.Option{model.WithRecompute(r.ActivationCheckpoint.Mode), model.WithMemory(t.st.mem)}
	if r.Precision.BF16 {
		mopts = append(mopts, model.WithBF16Activations())
	}
	if f, ok := fp8Of(r, t.st.world.Size(), t.st.worldG); ok {
		mopts = append(mopts, model.WithFP8(f))
	}
	if t.st.epComm != nil {
		mopts = append(mopts, model.WithExpertParallel(model.ExpertParallel{Comm: t.st.epG, Rank: t.st.epRank, Size: t.st.epComm.Size()}))
	}
	if t.st.cpComm != nil {
		cp := model.ContextParallel{Comm: t.st.cpG, Rank: t.st.cpRank, Size: t.st.cpComm.Size()}
		if t.trace != nil {
			cp.Trace = func(name string, comm bool, start, end time.Time) {
				cat, tid := "compute", 0
				if comm {
					cat, tid = "comm", 2 // a row of its own beside the FSDP stream's (1)
				}
				t.trace.span(name, cat, t.rank, tid, start, end)
			}
		}
		mopts = append(mopts, model.WithContextParallel(cp))
	}
	if t.st.tpComm != nil {
		mopts = append(mopts, model.WithTensorParallel(model.TensorParallel{Comm: t.st.tpG, Rank: t.st.tpRank, Size: t.st.tpComm.Size()}))
	}
	var err error
	if t.docs, err = documentMasks(r, t.ds); err != nil {
		return err
	}
	mopts = append(mopts, model.WithDocumentMasks(t.docs))
	t.m, err = model.New[float32](r.Model, t.plan.Params, t.st.wviews, t.st.gviews, t.opts.Backend, B, T, mopts...)
	if err != nil {
		return fmt.Errorf("building the model: %w", err)
	}
	if err := t.st.bindFP8(t.m); err != nil {
		return fmt.Errorf("building the model: %w", err)
	}
	if m := t.opts.resume; m != nil {
		if err := t.restoreFP8(t.opts.Resume, m); err != nil {
			return err
		}
	}
	if t.st.unitGrads {
		if t.rt, err = newUnitRuntime(t.st, t.m, r.FSDP.OverlapParamGather, r.FSDP.OverlapGradReduce, r.FSDP.SuggestedCommunicationUnitSize, t.trace); err != nil {
			return err
		}
		t.m.SetHooks(t.rt)
	}
	t.bufs = newStepBufs(B, T, t.plan.Mesh.CP, t.st.mem, historyRows(r))
	if t.rank == 0 {
		if t.metrics, err = t.openMetrics(startStep); err != nil {
			return err
		}
	}
	return nil
}

// closeModel releases what openModel built.
func (t *run) closeModel() {
	t.closeMetrics()
	if t.rt != nil {
		t.rt.close()
	}
	if t.m != nil {
		t.m.Close()
	}
}

func (t *run) train(ctx context.Context, world comm.Communicator, groups groupsFor) (*Result, error) {
	r := t.r
	out := &Result{Dir: t.dir, Predicted: t.plan.Memory, Fingerprint: t.plan.Fingerprint}
	lead := t.rank == 0
	// A checkpoint still being written in the background is waited for on
	// every return, an error's included: Run releases the run directory's
	// locks only after train returns, and no write may outlive them.
	defer t.waitSave()
	// The state is loaded before rank 0 writes anything: a resume that cannot
	// load its checkpoint leaves the run directory as it was.
	startStep, optSteps, err := t.openState(world, groups)
	if t.st != nil {
		defer t.st.close()
	}
	if err != nil {
		return nil, err
	}
	t.opts.faults.at("state")
	if lead && t.opts.Process == nil && ctx.Err() != nil {
		// Interrupted while the state was built: Run removes what it made.
		return nil, ErrInterrupted
	}
	if lead {
		if err := t.writeHeader(); err != nil {
			return nil, err
		}
	}
	if lead {
		t.logResume(startStep)
	}
	if lead && len(t.st.collectives) > 0 {
		t.log.Info().Strs("groups", t.st.collectives).Msg("collectives")
	}
	if err := t.openModel(startStep); err != nil {
		return nil, err
	}
	defer t.closeModel()
	if f := r.FSDP; lead && !t.st.unitGrads && world.Size() > 1 && (f.OverlapGradReduce || f.OverlapParamGather) {
		t.log.Warn().Bool("overlap_grad_reduce", f.OverlapGradReduce).Bool("overlap_param_gather", f.OverlapParamGather).
			Msg("no_shard and optim reduce gradients after the last micro-batch, so there is nothing to overlap; optim_grads and optim_grads_params overlap")
	}
	out.UnigramBits = unigramEntropy(t.ds.Train, t.ds.Tok.VocabSize())
	sched := optim.Schedule{Peak: r.Train.LR, Warmup: r.Train.WarmupSteps, Steps: r.Train.Steps, MinFactor: r.Train.MinLRFactor, Decay: r.Train.LRSchedule,
		DecaySteps: r.Train.LRDecaySteps}
	B, T := r.Train.MicroBatchSize, r.Model.SeqLen
	global := t.plan.MicroBatches * t.plan.Mesh.DP * B // sequences per step
	eval := evalPolicy{interval: r.Train.EvalInterval, steps: r.Train.Steps, lead: lead, collective: t.collectiveEval(), hasVal: t.ds.Val.Len() > T}
	stats := t.newStatsDrain(world)
	stats.optSteps = optSteps // a resumed run's, until its first read-back
	var rates []float64       // tokens/s of every step of this run
	ev := t.log.Info()
	if t.dir != "" { // rank 0 writes the run directory; a job's other ranks have none
		ev = ev.Str("dir", t.dir)
	}
	ev.Str("backend", t.opts.Backend.Name()).Int("ranks", t.plan.Mesh.World).Str("strategy", t.plan.Strategy).
		Int64("parameters", t.plan.ParamsTotal).Int("train_tokens", t.ds.Train.Len()).Int("val_tokens", t.ds.Val.Len()).Str("plan", t.plan.Fingerprint).Msg("training")
	start := time.Now()
	lastEvaluated := false // every rank tracks it: the final evaluation is collective
	done := startStep      // steps completed
	t.st.mem.Write(t.st.stats.At(tensor.StatOptSteps), []float64{float64(optSteps)})
	for step := startStep; step < r.Train.Steps; step++ {
		if err := t.opts.faults.lost(t.rank, step); err != nil {
			return nil, err
		}
		// Every rank stops at the same step, and commits a checkpoint together.
		interrupted, err := t.boundary(ctx, world, step)
		if err != nil {
			return nil, err
		}
		if interrupted > 0 {
			out.Interrupted = true
			t.log.Warn().Int("step", step).Int("ranks_interrupted", interrupted).Msg("interrupted: writing what the run has so far")
			break
		}
		t0 := time.Now()
		lr := sched.LR(step)
		if err := t.gradStep(step); err != nil {
			return nil, err
		}
		if err := t.update(lr); err != nil {
			return nil, err
		}
		dt := time.Since(t0).Seconds()
		met := Metrics{Step: step + 1, LR: lr, MemHeld: t.held().Total, MemPlan: t.plan.Memory.Total, TokensPerS: float64(global*T) / dt}
		measure(&met, t.plan, dt)
		rates = append(rates, met.TokensPerS)
		if lead && (len(rates) == planCheckSteps || (len(rates) < planCheckSteps && step+1 == r.Train.Steps)) {
			t.checkPlan(float64(global*T), rates)
		}
		t.keepStats(met)
		done = step + 1
		// Evaluation gathers units under optim_grads_params and exchanges tokens under
		// expert parallelism, so then every rank runs it.
		var val *float64
		if lastEvaluated = eval.due(done); lastEvaluated {
			v := t.evaluate()
			if err := t.flush(); err != nil {
				return nil, err
			}
			val = &v
		}
		save := t.ckpt.due(done)
		if stats.due(done, len(t.bufs.pending) == cap(t.bufs.pending), val != nil, save) {
			if err := stats.drain(val); err != nil {
				return nil, err
			}
		}
		if save && !stats.lastSkipped {
			if err := t.saveAt(world, done, stats.optSteps); err != nil {
				return nil, err
			}
		}
		if lead && t.opts.Progress != nil {
			t.showProgress(done, stats.last.Loss, start)
		}
	}
	if len(t.bufs.pending) > 0 { // interrupted, or stopped early
		if err := stats.drain(nil); err != nil {
			return nil, err
		}
	}
	if stats.lastSkipped {
		// Every rank saw the same all-reduced loss and norm, so every rank stops here
		// (after finishing the save of an earlier, finite step).
		if err := t.finishSave(world); err != nil {
			return nil, err
		}
		return nil, t.nonFinite(fmt.Errorf("the run ended on non-finite steps (skipped by train.skip_nonfinite): %w; %s; lower train.lr", ErrNonFinite, describeGood(stats.good)))
	}
	if err := t.saveAtEnd(world, done, stats.optSteps); err != nil {
		return nil, err
	}
	finalVal := math.NaN()
	if eval.finalTogether(lastEvaluated) {
		finalVal = t.evaluate() // every rank takes part
		if err := t.flush(); err != nil {
			return nil, err
		}
	}
	if lead && t.opts.Progress != nil {
		fmt.Fprintln(t.opts.Progress)
	}
	// The final weights go to rank 0 a parameter at a time, which writes
	// weights.bin as they come (every rank takes part).
	defer t.abortWeights()
	if t.sampler, err = t.samplerFor(world); err != nil {
		return nil, err
	}
	if err := t.finalWeights(t.sampler == sampleHost); err != nil {
		return nil, err
	}
	var problem error // rank 0's reason to stop before the sample
	if lead {
		last := stats.last
		out.Steps, out.FinalLoss = last.Step, last.Loss
		switch {
		case last.ValLoss != nil:
			out.FinalValLoss = last.ValLoss
		case !math.IsNaN(finalVal):
			out.FinalValLoss = &finalVal
		case eval.hasVal && !eval.collective: // rank 0 evaluates alone
			v := t.evaluate()
			out.FinalValLoss = &v
		}
		if t.weightsErr != nil {
			problem = fmt.Errorf("saving weights: %w", t.weightsErr)
		} else if v := out.FinalValLoss; v != nil && (math.IsNaN(*v) || math.IsInf(*v, 0)) {
			problem = t.nonFinite(fmt.Errorf("the final validation loss is %v: %w; %s; lower train.lr", *v, ErrNonFinite, describeGood(stats.good)))
		} else if s := t.weightsOut.nonFinite(); s != "" {
			problem = t.nonFinite(fmt.Errorf("%s: %w; %s; lower train.lr", s, ErrNonFinite, describeGood(stats.good)))
		}
	}
	if n := r.Logging.SampleTokens; t.sampler == sampleAll {
		// Every rank samples with the training model; rank 0 says first whether
		// there is anything to sample from.
		go1 := []float32{1}
		if problem != nil {
			go1[0] = 0
		}
		if err := world.Broadcast(go1, 0); err != nil {
			return nil, fmt.Errorf("agreeing on the final sample: %w", err)
		}
		if go1[0] == 1 {
			if lead {
				t.log.Info().Int("tokens", n).Msg("sampling with every rank (the model is split over them)")
			}
			text, err := t.sampleWithModel(world, t.prompt(), n)
			if err != nil {
				return nil, fmt.Errorf("sampling: %w", err)
			}
			t.sampled = &text
		}
	}
	if !lead {
		return out, nil
	}
	if problem != nil {
		return nil, problem
	}
	out.TokensPerS = median(rates[min(1, max(len(rates)-1, 0)):]) // the first step warms caches up: left out unless alone
	out.PlannedStepS = t.plan.StepTimeS
	return out, t.finish(out)
}

// stepBufs are one rank's token buffers and statistics scratch, made once and
// reused by every step.
type stepBufs struct {
	tokens, targets     []int32 // a micro-batch's whole sequences
	local, localTargets []int32 // the tokens this rank holds (T/cp of each sequence)
	// count is the tokens a step counted, from the host's targets, and
	// countHost the same slice as Memory.Write takes it, boxed once (boxing a
	// slice on every step would allocate).
	count     []float64
	countHost any
	// discard takes the loss sum of a tensor-parallel rank other than the
	// first (its group's first rank counts the group's tokens); eval sums an
	// evaluation's losses.
	discard, eval tensor.Buffer
	// flag is what the ranks all-reduce at a step boundary (run.boundary).
	flag []float32
	// history holds the statistics of the steps since the last read-back
	// (historyRows rows of tensor.NumStats), hostHistory their copy on the host.
	history     tensor.Buffer
	hostHistory []float64
	pending     []Metrics // those steps' host-side metrics, completed at the read-back
}

func newStepBufs(B, T, cp int, mem tensor.Memory, rows int) *stepBufs {
	count := make([]float64, 1)
	return &stepBufs{tokens: make([]int32, B*T), targets: make([]int32, B*T), count: count, countHost: count,
		local: make([]int32, B*T/cp), localTargets: make([]int32, B*T/cp),
		discard: mem.Alloc(tensor.Float64, 1), eval: mem.Alloc(tensor.Float64, 1), flag: make([]float32, 4),
		history: mem.Alloc(tensor.Float64, rows*tensor.NumStats), hostHistory: make([]float64, rows*tensor.NumStats),
		pending: make([]Metrics, 0, rows)}
}

// historyRows is how many steps' statistics wait on the backend for their
// read-back: a logging interval's, at most maxHistory.
func historyRows(r *config.Recipe) int {
	return max(1, min(r.Logging.Interval, r.Train.Steps, maxHistory))
}

// maxHistory bounds the steps between two read-backs of the statistics.
const maxHistory = 1000

// gradStep runs step's micro-batches forward and backward, reduces the gradients
// and leaves the step's statistics in the backend's buffer (state.stats): the
// global batch's loss and token sums, aux loss and dropped copies, the gradient
// norm and clip factor, and whether the update applies. Nothing is read back.
// Every rank of the world calls it together.
func (t *run) gradStep(step int) error {
	r, b, st := t.r, t.bufs, t.st
	B, T := r.Train.MicroBatchSize, r.Model.SeqLen
	micro, dp, cp := t.plan.MicroBatches, t.plan.Mesh.DP, t.plan.Mesh.CP
	dpRank := t.plan.Mesh.Coords(t.rank).DP
	st.zeroGrads()
	st.mem.Zero(st.stats.Slice(0, tensor.StatOptSteps))
	count := 0
	auxScale := r.Model.MoE.AuxLossCoeff / float64(micro*dp*cp*t.plan.Mesh.TP)
	scale := 1 / float64(micro*dp*B*T) // per-token mean over the global batch
	if !r.FSDP.CalculatePerTokenLoss {
		scale = 1 / float64(B*T) / float64(micro*dp) // mean of micro-batch means
	}
	// eod_mask_loss leaves positions out of the loss: its mean is then over the
	// positions counted, as Megatron's loss mask divides (the micro-batch's
	// count, or the global batch's with calculate_per_token_loss).
	perMicro := t.docs.MaskLoss && !r.FSDP.CalculatePerTokenLoss
	if t.docs.MaskLoss && r.FSDP.CalculatePerTokenLoss {
		scale = 1 / float64(max(1, t.globalLossTokens(step, t.docs)))
	}
	loss := st.stats.At(tensor.StatLoss)
	if st.tpRank > 0 {
		loss = b.discard // the tp group's first rank counts the group's tokens
	}
	st.stepStarts()
	for mb := 0; mb < micro; mb++ {
		t.ds.TrainSampler.Fill(b.tokens, b.targets, step*micro*dp*B+(mb*dp+dpRank)*B, B)
		model.LocalTokens(b.local, b.tokens, B, T, st.cpRank, cp)
		model.LocalTokens(b.localTargets, b.targets, B, T, st.cpRank, cp)
		if perMicro {
			scale = 1 / float64(max(1, lossTokens(b.tokens, b.targets, t.docs))) / float64(micro*dp)
		}
		n := t.m.ForwardBackward(b.local, b.localTargets, loss, mb > 0, scale)
		if err := t.flush(); err != nil {
			return err
		}
		if st.tpRank == 0 {
			count += n
		}
		// Every context- and tensor-parallel rank has its sequences' whole aux
		// loss: the world's sum, scaled, is the mean. Dropped copies are each
		// rank's own.
		if sums := t.m.MoESums(); sums.Len() == 2 {
			t.opts.Backend.Axpy(st.stats.At(tensor.StatAux), sums.At(0), auxScale)
			t.opts.Backend.Axpy(st.stats.At(tensor.StatDropped), sums.At(1), 1)
		}
	}
	st.stepEnds()
	t.modelSteps++
	b.count[0] = float64(count)
	st.mem.Write(st.stats.At(tensor.StatTokens), b.countHost)
	// One rank keeps its float64 sums; several add them in float32.
	if st.world.Size() > 1 {
		if err := st.allReduceStats(st.worldG, tensor.StatLoss, tensor.StatSumSq); err != nil {
			return err
		}
	}
	if err := st.reduce(r.FSDP.GradReduceInBF16); err != nil {
		return err
	}
	if err := st.sumSquares(); err != nil {
		return err
	}
	t.opts.Backend.CloseStep(st.stats, r.Train.ClipGrad)
	return st.mem.Err()
}

// update takes an optimizer step at learning rate lr from the gradients
// clipped by their norm; the kernels skip it when the step's loss or norm is
// not finite (state.stats).
func (t *run) update(lr float64) error {
	if err := t.balanceExperts(); err != nil {
		return err
	}
	if err := t.st.step(t.r.Train, lr); err != nil {
		return err
	}
	if err := t.m.FP8Step(); err != nil { // delayed scaling's scales for the next step
		return err
	}
	return t.st.mem.Err()
}

// balanceExperts moves the expert biases (model.moe.expert_bias) from the
// step's expert loads, summed over the world (every rank routes its own
// tokens to every expert; a context- or tensor-parallel group's ranks each
// hold their group's sum, which the sign of the update does not mind): each
// rank updates its shard of the biases' main weights, before the optimizer
// step, which leaves them as they are (no gradient, no decay) and makes
// their compute copies. Every rank so holds the same biases.
func (t *run) balanceExperts() error {
	loads, st := t.m.ExpertLoads(), t.st
	if loads.Len() == 0 {
		return nil
	}
	if st.world.Size() > 1 {
		if err := st.worldG.AllReduce(loads); err != nil {
			return fmt.Errorf("summing the expert loads: %w", err)
		}
	}
	moe := t.r.Model.MoE
	for gi := range st.segs {
		for _, sg := range st.segs[gi] {
			if p := &t.plan.Params[sg.param]; p.Balance {
				t.opts.Backend.ExpertBiasUpdate(st.mainB[gi].Slice(int(sg.lo), int(sg.hi)), t.m.ExpertLoad(p.Layer), moe.NumExperts, int(sg.start), moe.BiasUpdateRate)
			}
		}
	}
	t.m.ResetExpertLoads()
	return st.mem.Err()
}

// keepStats copies the step's statistics into the next row of the history, to be
// read back with the others of the logging interval; met is the step's host-side
// metrics, which the read-back completes.
func (t *run) keepStats(met Metrics) {
	b, st := t.bufs, t.st
	row := len(b.pending)
	st.mem.Copy(b.history.Slice(row*tensor.NumStats, (row+1)*tensor.NumStats), st.stats)
	b.pending = append(b.pending, met)
}

// readStats reads the pending steps' statistics back (one read-back) and
// completes their metrics: loss, gradient norm, MoE aux loss and dropped copies,
// and whether the step was skipped (its update not applied); optSteps is the
// optimizer steps applied by the end of the last of them.
func (t *run) readStats() (steps []Metrics, optSteps int, err error) {
	b, st := t.bufs, t.st
	rows := len(b.pending)
	host := b.hostHistory[:rows*tensor.NumStats]
	st.mem.Read(host, b.history.Slice(0, rows*tensor.NumStats))
	if err := st.mem.Err(); err != nil {
		return nil, 0, err
	}
	moe := t.r.Model.MoE.NumExperts > 0
	for i := range b.pending {
		s, met := host[i*tensor.NumStats:(i+1)*tensor.NumStats], &b.pending[i]
		met.Loss, met.GradNorm = s[tensor.StatLoss]/s[tensor.StatTokens], s[tensor.StatNorm]
		met.Skipped = s[tensor.StatApplied] == 0
		optSteps = int(s[tensor.StatOptSteps])
		if moe {
			aux, dropped := s[tensor.StatAux], int(s[tensor.StatDropped])
			met.AuxLoss, met.Dropped = &aux, &dropped
		}
	}
	steps = b.pending
	b.pending = b.pending[:0:cap(b.pending)]
	return steps, optSteps, nil
}

// describeGood names the last step whose loss and gradient were finite.
func describeGood(good Metrics) string {
	if good.Step == 0 {
		return "no step had a finite loss and gradient"
	}
	return fmt.Sprintf("the last good step was %d (loss %.4f, grad_norm %.4f)", good.Step, good.Loss, good.GradNorm)
}

// nonFinite ends a run that met a non-finite loss or gradient: rank 0 records the
// failure in run.json, writes no weights, plot or sample, and removes the plot an
// earlier evaluation drew, so nothing in the run directory looks like a result.
func (t *run) nonFinite(err error) error {
	if t.rank != 0 {
		return err
	}
	info := t.info()
	info.Failure = err.Error()
	if werr := writeJSON(filepath.Join(t.dir, "run.json"), info); werr != nil {
		return fmt.Errorf("%w (and writing run.json: %v)", err, werr)
	}
	// The plot drawn at an earlier evaluation goes too: a curve that ends
	// before the failure would look like the run's result.
	if werr := removeFile(filepath.Join(t.dir, "loss.png")); werr != nil {
		return fmt.Errorf("%w (and removing loss.png: %v)", err, werr)
	}
	last := ""
	if t.ckpt != nil {
		if dir, lerr := ckpt.Latest(t.ckpt.root); lerr == nil {
			last = "; the last checkpoint is " + dir
		}
	}
	return fmt.Errorf("%w; run directory %s holds the metrics up to here, and no weights, loss.png or sample%s", err, t.dir, last)
}

// collectiveEval says whether evaluation needs every rank: under
// optim_grads_params (units are gathered), expert parallelism (tokens are
// exchanged), context parallelism (K/V blocks travel the ring) and tensor
// parallelism (activations are gathered and reduced).
func (t *run) collectiveEval() bool {
	return t.st.perUnit || t.st.epComm != nil || t.st.cpComm != nil || t.st.tpComm != nil
}

// flush ends a pass: it waits for the runtime's collectives in flight and returns
// the first error of the pass (from the model's hooks or the flush).
func (t *run) flush() error {
	err := t.m.Err()
	if t.evalErr != nil {
		if err == nil {
			err = t.evalErr
		}
		t.evalErr = nil
	}
	if t.rt != nil {
		if ferr := t.rt.flush(); err == nil {
			err = ferr
		}
	}
	return err
}

// evaluate is the mean token loss over eval_steps fixed validation batches: the
// losses are summed in the backend's buffer (bufs.eval) and read back once.
// Under context parallelism each rank forwards its chunks of every sequence and
// the sums and counts are added over the group.
func (t *run) evaluate() float64 {
	cp, st, buf := t.plan.Mesh.CP, t.st, t.bufs.eval
	B, T := t.r.Train.MicroBatchSize, t.r.Model.SeqLen
	local, localTargets := make([]int32, B*T/cp), make([]int32, B*T/cp)
	count := 0
	t.evalBatches(func(i int, tokens, targets []int32) {
		model.LocalTokens(local, tokens, B, T, st.cpRank, cp)
		model.LocalTokens(localTargets, targets, B, T, st.cpRank, cp)
		count += t.m.Forward(local, localTargets, buf, i > 0)
	})
	var sum [2]float64
	if st.cpComm != nil {
		// Through the statistics' f32 wire: the sum, then the count.
		st.mem.Copy(st.wire.At(0), buf)
		st.mem.Write(st.wire.At(1), []float64{float64(count)})
		err := st.mem.Err()
		if err == nil {
			err = st.cpG.AllReduce(st.wire.Slice(0, 2))
		}
		if err != nil && t.evalErr == nil {
			// Surfaced by the flush that follows every evaluation (after the model's
			// own error, if it has one).
			t.evalErr = err
		}
		st.mem.Read(sum[:], st.wire.Slice(0, 2))
	} else {
		st.mem.Read(sum[:1], buf)
		sum[1] = float64(count)
	}
	return sum[0] / sum[1]
}

// evalBatches calls each with the eval_steps fixed validation batches, in order
// (the validation sampler's first samples: the same batches every time).
func (t *run) evalBatches(each func(i int, tokens, targets []int32)) {
	r := t.r
	B, T := r.Train.MicroBatchSize, r.Model.SeqLen
	tokens, targets := make([]int32, B*T), make([]int32, B*T)
	for i := 0; i < r.Train.EvalSteps; i++ {
		t.ds.ValSampler.Fill(tokens, targets, i*B, B)
		each(i, tokens, targets)
	}
}

// record writes a step's metrics line and logs it at the logging interval, at
// the last step and with a validation loss (rank 0).
func (t *run) record(met Metrics) error {
	if s := t.ds.TrainSampler; s != nil {
		names := t.ds.SourceNames()
		for k, c := range s.Consumed(met.Step * t.r.Train.GlobalBatchSize) {
			met.Data = append(met.Data, SourceConsumed{Source: names[k], Consumed: c})
		}
	}
	b, err := json.Marshal(met)
	if err != nil {
		return fmt.Errorf("encoding metrics of step %d: %w", met.Step, err)
	}
	if _, err := t.metrics.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("writing metrics.jsonl: %w", err)
	}
	if err := t.writeEvents(met.Step, b); err != nil {
		return err
	}
	t.curve = append(t.curve, met)
	r := t.r
	if met.ValLoss != nil {
		// The plot follows the run: redrawn at each evaluation, replaced whole.
		if err := writeLossPNG(filepath.Join(t.dir, "loss.png"), r.Run.Name, t.curve); err != nil {
			return fmt.Errorf("writing loss.png: %w", err)
		}
	}
	done := met.Step
	if done%r.Logging.Interval == 0 || done == r.Train.Steps || met.ValLoss != nil {
		ev := t.log.Info().Int("step", done).Float64("loss", round4(met.Loss)).Float64("lr", met.LR).
			Float64("grad_norm", round4(met.GradNorm)).Float64("tokens_per_s", math.Round(met.TokensPerS)).
			Float64("step_s", sig4(met.StepS)).Float64("tflops", sig4(met.TFLOPS)).Float64("mfu", sig4(met.MFU)).Float64("mfu_plan", sig4(met.MFUPlan))
		if met.ValLoss != nil {
			ev = ev.Float64("val_loss", round4(*met.ValLoss))
		}
		ev.Msg("step")
	}
	return nil
}

// clearsProgress is the console log while a progress bar is drawn: each
// event first clears the bar's line, so that no event is written after the
// bar on its line; the next step draws the bar again below the event.
type clearsProgress struct{ out, progress io.Writer }

func (c clearsProgress) Write(p []byte) (int, error) {
	if _, err := io.WriteString(c.progress, "\r\033[K"); err != nil {
		return 0, err
	}
	return c.out.Write(p)
}

// showProgress draws the progress bar after step done, with the last loss read
// back (the statistics come back once per logging interval).
func (t *run) showProgress(done int, loss float64, start time.Time) {
	r := t.r
	elapsed := time.Since(start)
	eta := time.Duration(float64(elapsed) / float64(done) * float64(r.Train.Steps-done))
	const width = 30
	filled := width * done / r.Train.Steps
	fmt.Fprintf(t.opts.Progress, "\r\033[K[%s%s] %d/%d  loss %.4f  %s elapsed, ETA %s",
		strings.Repeat("=", filled), strings.Repeat(" ", width-filled), done, r.Train.Steps, loss,
		elapsed.Round(time.Second), eta.Round(time.Second))
}

func round4(x float64) float64 { return math.Round(x*1e4) / 1e4 }

// sig4 rounds x to four significant digits (0 stays 0): a step time, TFLOP/s
// or MFU, whose magnitude differs between a CPU and a GPU by thousands.
func sig4(x float64) float64 {
	if x == 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return x
	}
	scale := math.Pow(10, 3-math.Floor(math.Log10(math.Abs(x))))
	return math.Round(x*scale) / scale
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s[len(s)/2]
}

// unigramEntropy is the entropy, in nats, of the tokens' frequency distribution: the
// loss of a model that ignores context.
func unigramEntropy(tokens *data.Tokens, vocab int) float64 {
	counts := make([]float64, vocab)
	// Scan reads the files, not the mapping: the pass adds nothing to the
	// resident memory. Open checked every token, so a read error here is a
	// file changed since; the statistic is then of the tokens read.
	_ = tokens.Scan(func(ts []int32) error {
		for _, t := range ts {
			counts[t]++
		}
		return nil
	})
	var h float64
	n := float64(tokens.Len())
	for _, c := range counts {
		if c > 0 {
			h -= c / n * math.Log(c/n)
		}
	}
	return h
}
