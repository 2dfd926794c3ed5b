package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/recipes"
	"github.com/shardline/shardline/tensor/cpu"
	"github.com/shardline/shardline/trainer"
	"github.com/shardline/shardline/trainer/ckpt"
	"github.com/spf13/cobra"
)

// isTerminal reports whether w is a terminal (progress bars and colours).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

func (a *app) runCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run [flags] [RECIPE | shipped:NAME | RUN_DIR]",
		Short: "Train a recipe (default shipped:tiny, built in) on the CPU, on one rank or --nproc N",
		Long: `Run lints the recipe, compiles its plan and trains it, writing a run directory
under run.output_dir: the resolved recipe and its fingerprint, the plan, metrics.jsonl
(one object per step: loss, learning rate, gradient norm, tokens/s, the measured
step time, TFLOP/s and MFU beside the plan's, memory), TensorBoard events of the
same (logging.tensorboard, on by default: tensorboard --logdir runs follows the
run), run.log, the final weights, loss.png (redrawn at each evaluation) and a
text sample (docs/monitoring.md).

RECIPE is a TOML file. shipped:NAME is a recipe shipped inside shardline (tiny,
moe-tiny, dense-125m, llama-1b, llama4-3bx128e: the files of recipes/ in the
source tree it was built from), which works from any directory; with no
argument run trains shipped:tiny. run.json's recipe_files says which it was.

With --nproc N (or parallel.world_size = N) the run is data parallel over N ranks,
goroutines of this process, executing the plan's sharding strategy: no_shard
all-reduces gradients; optim, optim_grads and optim_grads_params reduce-scatter
them, update each rank's shard of the fp32 main weights and all-gather. The
result equals one rank training the same global batch (up to float rounding).

On a terminal the log is readable and a progress bar shows the loss and the ETA;
otherwise the log is JSON lines. Ctrl-C (SIGINT or SIGTERM) stops at the end of
the current step and still writes the outputs (exit status 130); before training
starts it stops at once and writes nothing. In a job of processes (launch,
torchrun, SLURM, mpirun) a signal to any rank, in any phase, stops every rank at
the same step boundary (the first one, when it came during start-up), and every
rank exits 130. Before that first step the ranks prove they run the same resolved
recipe (every key but data.path and run.output_dir) on the same tokens, or all
stop naming the keys that differ. A rank that stops because another rank was
lost or never came, or failed (its checkpoint write), exits 3, so that launch
names the rank that failed first.

With checkpoint.interval (--save-interval) or checkpoint.dir (--save) each rank
saves its shard of the state in the background every interval steps, at the end
and on SIGINT/SIGTERM; --resume continues a run from one, on any world size,
strategy or expert-parallel degree (docs/checkpoints.md). A resume from the
newest checkpoint in its run's own checkpoint directory continues that run
directory; any other (a copied checkpoint, an older step, another checkpoint
directory) starts a new run directory and leaves the old one as it was.
--resume auto continues from the newest checkpoint under the recipe's
checkpoint directory that checks out, and starts a new run where there is
none (taking over run.output_dir/run.name when a run there died before its
first checkpoint), so that one command line both starts and continues a job
(launch --max-restarts relies on it). checkpoint.interval_minutes saves by
wall-clock time too. The log line "resumed from checkpoint" and run.json's
resumed_from and resumed_from_step name the checkpoint a run continued. One
process writes a run directory at a time: a second is refused, naming the
first one's pid (docs/robustness.md, "Who owns a run directory").

However a run ends, run.json says how (a result, or a failure) and run.log why.

A run that ends on a non-finite loss or gradient writes no weights, plot or
sample (run.json records why), and a setting the trainer does not carry out yet
(bf16 main weights, expert tensor parallelism; on cuda: recomputation) is
refused at its recipe position instead of ignored.

With parallel.device = "cuda" (--device cuda) the run trains on NVIDIA GPUs
through shardline-cuda, the build with the GPU engine (make cuda; docs/cuda.md),
which this binary hands the run to with the same arguments: one rank on one
GPU; several (--nproc, or a job's ranks: launch, torchrun, SLURM, mpirun) each
on the GPU of its index on the node (LOCAL_RANK), their collectives over NCCL,
or staged through the host where ranks share a GPU.`,
		Example: `  shardline run                                               # shipped:tiny, from any directory
  shardline run shipped:moe-tiny --train-iters 50
  shardline run recipes/tiny.toml --save-interval 100        # checkpoints under the run directory
  shardline run recipes/tiny.toml --save-interval 100 --resume auto   # the same line starts the run and continues it
  shardline run --resume runs/tiny                            # continue from its newest checkpoint
  shardline run runs/tiny                                     # run it again from its resolved recipe (same metrics, bit for bit)
  shardline run --resume runs/tiny --nproc 4 --data-parallel-sharding-strategy optim   # resharded
  shardline run recipes/tiny.toml --train-iters 200
  shardline run recipes/tiny.toml --device cuda                # one GPU, through shardline-cuda
  shardline run recipes/tiny.toml --device cuda --nproc 2 --global-batch-size 32   # two ranks: GPUs 0 and 1, NCCL
  shardline run recipes/tiny.toml --nproc 4 --global-batch-size 64 --data-parallel-sharding-strategy optim
  shardline run recipes/tiny.toml --set data.path=notes.txt --set data.tokenizer=char --set model.vocab_size=128`,
		Args: cobra.MaximumNArgs(1),
	}
	rf := addRecipeFlags(cmd)
	var cpuProfile string
	var nproc int
	cmd.Flags().StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof reads it)")
	cmd.Flags().IntVar(&nproc, "nproc", 0, "train on N ranks as goroutines of this process (sets parallel.world_size)")
	var trace, resume string
	var commTimeout time.Duration
	cmd.Flags().StringVar(&resume, "resume", "", "continue a run from a checkpoint: a checkpoint directory, a run directory or checkpoint root (its newest complete checkpoint), latest (the newest under the recipe's checkpoint directory), or auto (as latest, skipping checkpoints that do not check out, and a new run where there is none); with a path RECIPE defaults to the run's resolved.toml. The run's newest checkpoint continues its run directory; any other starts a new one")
	cmd.Flags().StringVar(&resume, "load", "", "Megatron's --load: the same as --resume")
	var initFrom string
	cmd.Flags().StringVar(&initFrom, "init-from", "", "start from a Hugging Face model directory's weights (config.json, safetensors; shardline ckpt export writes one) instead of the initialisation: fine-tuning. Its config.json must describe the recipe's model: every key that differs is refused, named. A recipe that names no data.tokenizer trains with the directory's own tokenizer (its file, or the built-in byte, gpt2 or char tokenizer whose export it holds); one that names another is refused. With --resume auto it starts a run that has no checkpoint yet, and a found checkpoint continues instead")
	var device string
	cmd.Flags().StringVar(&device, "device", "", "cpu or cuda: sets parallel.device (cuda trains through shardline-cuda, a GPU per rank; docs/cuda.md)")
	var stopAfter int
	cmd.Flags().IntVar(&stopAfter, "stop-after", 0, "end the run after N steps as Ctrl-C would (checkpoint and outputs written, exit status 130): a preemption drill for --resume")
	cmd.Flags().StringVar(&trace, "trace", "", "write a Chrome trace of every rank's compute and communication to this file (open it in Perfetto)")
	cmd.Flags().DurationVar(&commTimeout, "comm-timeout", 5*time.Minute, "multi-process jobs: the most one collective (or joining the job) may take as a whole before the rank fails, naming who is missing")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		// SIGINT and SIGTERM are caught from the start, in every phase: one
		// arriving before training stops a single process at once; a rank of a
		// job keeps it until the first step boundary, where every rank stops
		// together (as on a signal mid-run), so that no rank leaves the others
		// waiting for it.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if cpuProfile != "" && a.preflight == nil {
			f, err := fileio.Create(cpuProfile) // never through a link
			if err != nil {
				return usageErr("--cpuprofile %s: %v", cpuProfile, unwrap(err))
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				return usageErr("--cpuprofile: %v", err)
			}
			defer pprof.StopCPUProfile()
		}
		if cmd.Flags().Changed("nproc") && (nproc < 1 || cmd.Flags().Changed("world-size")) {
			return usageErr("--nproc %d: give a positive rank count, and not together with --world-size", nproc)
		}
		if p := a.preflight; p != nil && p.restarts > 0 && resume != "auto" {
			why := ""
			if resume != "" {
				why = fmt.Sprintf("; --resume %s names one checkpoint, which every restart would go back to", resume)
			}
			return usageErr("launch --max-restarts %d restarts the ranks from the newest checkpoint, which they find with run's --resume auto: give --resume auto after the recipe (the first start then also continues a checkpoint it finds, and starts afresh where there is none)%s", p.restarts, why)
		}
		if initFrom != "" && resume != "" && resume != "auto" {
			return usageErr("--init-from and --resume %s both say where to start: give one (--resume auto with --init-from starts from the weights where no checkpoint is found, and continues the checkpoint otherwise)", resume)
		}
		if stopAfter < 0 {
			return usageErr("--stop-after %d must not be negative", stopAfter)
		}
		if !cmd.Flags().Changed("comm-timeout") && a.settings.CommTimeout > 0 {
			commTimeout = a.settings.CommTimeout
		}
		if commTimeout <= 0 {
			return usageErr("--comm-timeout %v must be positive", commTimeout)
		}
		if trace != "" {
			if err := checkWritable(trace); err != nil {
				return usageErr("--trace %s: %v; give a file path in a writable directory", trace, err)
			}
		}
		var job *jobEnv
		var err error
		if p := a.preflight; p != nil {
			// As the ranks launch starts will see it (launch's own environment
			// may hold another launcher's variables: srun shardline launch).
			job = &jobEnv{rank: 0, world: p.world, from: "shardline launch", worldFlag: p.flag, localRank: 0}
		} else if job, err = detectJob(config.EnvMap(a.env)); err != nil {
			return err
		} else if job != nil && config.EnvMap(a.env)[launchLintedEnv] == "1" {
			a.quietLint = true // launch printed the recipe's warnings once, before starting the ranks
		}
		if job != nil && nproc > 0 {
			return usageErr("--nproc runs ranks in this process, but %s started it as rank %d of %d; drop --nproc", job.from, job.rank, job.world)
		}
		if nproc > 0 {
			rf.extra = append(rf.extra, config.FlagValue{Name: "nproc", Value: fmt.Sprint(nproc), Key: "parallel.world_size"})
		}
		if cmd.Flags().Changed("device") {
			rf.extra = append(rf.extra, config.FlagValue{Name: "device", Value: device, Key: "parallel.device"})
		}
		if job != nil {
			// Named for what set it: launch's --nproc (and --nnodes), else the
			// launcher's variable (torchrun's WORLD_SIZE, SLURM_NTASKS, ...),
			// never a --world-size the user did not type.
			v := config.FlagValue{Name: job.worldFlag, Value: fmt.Sprint(job.world), Key: "parallel.world_size"}
			if v.Name == "" {
				v.Name, v.Env = cmp.Or(job.worldVar, "WORLD_SIZE"), true
			}
			rf.extra = append(rf.extra, v)
		}
		path := config.ShippedPrefix + recipes.Default // the binary's own copy: any working directory
		var ckptDir string
		if resume != "" && resume != "latest" && resume != "auto" {
			if ckptDir, err = findCheckpoint(resume); err != nil {
				return usageErr("--resume %s: %v", resume, err)
			}
			if len(args) == 0 {
				// The run's own resolved recipe: what the checkpoint was trained with,
				// from the run directory above its checkpoints/, or else the one its
				// metadata records (only read: where the run writes is the trainer's
				// decision, never the metadata's).
				m, err := ckpt.Open(ckptDir)
				if err != nil {
					return &exitError{code: exitFindings, err: err}
				}
				runDir := m.RunDir
				if p := filepath.Dir(ckptDir); filepath.Base(p) == "checkpoints" && fileExists(filepath.Join(filepath.Dir(p), "resolved.toml")) {
					runDir = filepath.Dir(p)
				}
				path = filepath.Join(runDir, "resolved.toml")
				if !fileExists(path) {
					return usageErr("--resume %s: the run directory %s has no resolved.toml; give the recipe as an argument", resume, runDir)
				}
			}
		}
		if len(args) == 1 {
			path = args[0]
			if isDirectory(path) && fileExists(filepath.Join(path, "resolved.toml")) {
				path = filepath.Join(path, "resolved.toml") // re-run a finished run from its resolved recipe
			}
		}
		res, err := a.loadClean(path, rf)
		if err != nil {
			return err
		}
		if o := res.Origin("data.tokenizer"); initFrom != "" && o.Kind == config.FromDefault && o.Name == "" {
			// A recipe that names no tokenizer trains with the model's own: the
			// built-in one whose export the directory holds, or its file.
			tok, err := trainer.InitTokenizer(initFrom)
			if err != nil {
				return usageErr("--init-from %s: %v", initFrom, err)
			}
			if tok != "" {
				rf.extra = append(rf.extra, config.FlagValue{Name: "init-from", Value: tok, Key: "data.tokenizer"})
				if res, err = a.loadClean(path, rf); err != nil {
					return err
				}
			}
		}
		r := &res.Recipe
		var auto *trainer.AutoResume
		switch resume {
		case "latest":
			if ckptDir, err = ckpt.Latest(checkpointRoot(r)); err != nil {
				return usageErr("--resume latest: %v (run.output_dir/run.name, or checkpoint.dir, say where to look; --resume auto starts a new run where there is none)", err)
			}
		case "auto":
			// The newest checkpoint that checks out, or none: a new run. The
			// same command line starts a job and continues it.
			if !r.Checkpoint.Saves() {
				return usageErr("--resume auto: the recipe writes no checkpoints (checkpoint.interval is 0 and checkpoint.dir empty), so a second run would find nothing to continue; set --save-interval N or checkpoint.interval_minutes")
			}
			root := checkpointRoot(r)
			dir, skipped, err := ckpt.Newest(root)
			if err != nil {
				return usageErr("--resume auto: reading the checkpoint root %s: %v; make it readable, or point checkpoint.dir (--save) elsewhere", root, unwrap(err))
			}
			ckptDir, auto = dir, &trainer.AutoResume{Root: root, Skipped: skipped}
			if dir != "" && initFrom != "" {
				// The checkpoint holds the fine-tuned state: --init-from only
				// starts a run that has none.
				auto.InitFrom, initFrom = initFrom, ""
			}
		}
		if r.Parallel.Device == "cpu" {
			// Measured now, under the load the run will see (well under a
			// second), unless launch measured it for this rank a moment ago
			// (ranks probing together would slow each other's probes), or the
			// run resumes a checkpoint chosen above: the run directory is
			// locked only when training starts, and another process's newer
			// checkpoint, saved while this one probed, would make the resume
			// a branch. Those read the cache (and probe only without one).
			a.probeCPU((job == nil && resume == "") || a.preflight != nil)
			if a.cpu.err != nil && (job == nil || job.rank == 0) {
				fmt.Fprintf(a.stderr, "note: the plan's step time is timed from a calibration measured on %s, not on this machine: probing this machine failed: %v\n", a.cpu.table.Host, a.cpu.err)
			}
		}
		if p := a.preflight; p != nil {
			// launch: the command line and recipe are good; the ranks train
			p.resume, p.checkpointRoot = resume, checkpointRoot(r)
			return nil
		}
		// A rank that shardline launch started writes to the launcher through a
		// pipe; the launcher says whether its own stderr is a terminal.
		tty := isTerminal(a.stderr) || (job != nil && config.EnvMap(a.env)[launchTTYEnv] == "1")
		logOut, level, err := a.logOutput(r.Logging, tty)
		if err != nil {
			return err
		}
		opts := trainer.Options{Backend: cpu.Backend{}, Calibrations: a.cals, Env: config.EnvMap(a.env), LogOut: logOut, LogLevel: level, Version: version, CacheDir: a.cacheDir(), TracePath: trace, DataRoot: a.settings.DataRoot, Resume: ckptDir, AutoResume: auto, StopAfter: stopAfter, InitFrom: initFrom}
		if tty && r.Logging.Progress && (job == nil || job.rank == 0) {
			opts.Progress = a.stderr
		}
		// A cuda recipe the GPU runner can carry out goes to the engine over each
		// rank's GPU (handed to shardline-cuda by a build without it), whatever
		// the world size; one it cannot is refused by trainer.Run at the key's
		// position.
		if r.Parallel.Device == "cuda" && len(config.NotExecuted(r)) == 0 {
			if rankGPUs == nil {
				return a.execGPURunner(res)
			}
			// No GPU is an error at the key, before any data is read or a run
			// directory made.
			if n, err := gpuCount(); err != nil || n == 0 {
				why := "no GPU is visible (check CUDA_VISIBLE_DEVICES)"
				if err != nil {
					why = err.Error()
				}
				return &exitError{code: exitFindings, err: fmt.Errorf(`%s: parallel.device = "cuda": %s; or set device = "cpu"`, res.Origin("parallel.device").Location(), why)}
			}
			local := -1
			if job != nil {
				local = job.localRank
			}
			opts.RankBackend = rankGPUs(local)
		}
		if job != nil {
			log := zerolog.New(logOut).Level(level).With().Timestamp().Int("rank", job.rank).Logger()
			log.Info().Str("master", job.master).Int("world", job.world).Str("launcher", job.from).Msg("joining the job")
			proc, closeJob, err := joinJob(job, commTimeout)
			if err != nil {
				return &exitError{code: jobExitCode(err), err: err}
			}
			defer closeJob()
			opts.Process = proc
		}
		if job == nil && ctx.Err() != nil {
			return &exitError{code: 130, err: trainer.ErrInterrupted}
		}
		result, err := trainer.Run(ctx, res, opts)
		if errors.Is(err, trainer.ErrInterrupted) {
			return &exitError{code: 130, err: err}
		}
		if err != nil {
			var d *config.Diagnostic
			if errors.As(err, &d) {
				return &exitError{code: exitFindings, err: d.At(res)}
			}
			return &exitError{code: jobExitCode(err), err: err}
		}
		if result.Dir == "" { // a rank other than 0 of a multi-process job: rank 0 reports
			if result.Interrupted { // every rank of an interrupted job exits 130
				return &exitError{code: 130, err: errors.New("interrupted")}
			}
			return nil
		}
		val := "no validation split"
		if result.FinalValLoss != nil {
			val = fmt.Sprintf("validation loss %.4f", *result.FinalValLoss)
		}
		fmt.Fprintf(a.stdout, "run directory: %s\nfinal loss %.4f, %s (unigram entropy %.4f); %.0f tokens/s\n",
			result.Dir, result.FinalLoss, val, result.UnigramBits, result.TokensPerS)
		if result.Sample != "" {
			fmt.Fprintf(a.stdout, "--- sample ---\n%s\n", result.Sample)
		}
		if result.Interrupted {
			return &exitError{code: 130, err: errors.New("interrupted")}
		}
		return nil
	}
	return cmd
}

// jobExitCode is the exit status of a run that failed with err: exitLostRank
// when err names ranks that were lost or never came, or reports that another
// rank failed (trainer.ErrOtherRank: its checkpoint write) — another rank's
// failure, which launch does not report as the cause while a rank failed
// otherwise — else exitFindings.
func jobExitCode(err error) int {
	var re *comm.RankError
	if errors.As(err, &re) && len(re.Missing) > 0 || errors.Is(err, trainer.ErrOtherRank) {
		return exitLostRank
	}
	return exitFindings
}

// preflight is what launch tells run to check before it starts the ranks: a
// job of world ranks, whose size the launch flag flag set (for messages).
type preflight struct {
	world int
	flag  string
	// restarts is launch's --max-restarts: above 0, run must be given
	// --resume auto.
	restarts int
	// What run found, for launch: the --resume value given, and the
	// recipe's checkpoint root (where --resume auto looks).
	resume, checkpointRoot string
}

// preflightRun checks "shardline run ARGS" as each rank of a job of world ranks
// will run it (its flags, its recipe linted, --resume found) and stops before
// training: launch calls it once, so that a bad command line or recipe is
// reported once and no rank starts. flag names the launch flag that set the
// world size, in messages; restarts is launch's --max-restarts.
func (a *app) preflightRun(args []string, world int, flag string, restarts int) (*preflight, error) {
	p := &preflight{world: world, flag: flag, restarts: restarts}
	b := &app{stdout: a.stdout, stderr: a.stderr, args: append([]string{"run"}, args...), env: a.env, preflight: p}
	root := b.rootCmd()
	root.SetArgs(b.args)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	return p, root.Execute()
}

// checkpointRoot is where the recipe's run saves its checkpoints, and where
// --resume latest and auto look: checkpoint.dir, or the checkpoints/ of the
// run directory run.output_dir/run.name.
func checkpointRoot(r *config.Recipe) string {
	if r.Checkpoint.Dir != "" {
		return r.Checkpoint.Dir
	}
	return filepath.Join(r.Run.OutputDir, r.Run.Name, "checkpoints")
}

// findCheckpoint resolves --resume PATH: a checkpoint directory itself, or a
// checkpoint root or run directory, whose newest complete checkpoint it takes.
func findCheckpoint(path string) (string, error) {
	if fileExists(filepath.Join(path, ckpt.MetadataFile)) {
		return path, nil
	}
	if isDirectory(filepath.Join(path, "checkpoints")) {
		path = filepath.Join(path, "checkpoints")
	}
	return ckpt.Latest(path)
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

func isDirectory(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

// checkWritable says whether a file can be written at path, before a long run
// finds out at its end: path must not be a directory, and its directory must take
// a new file (tried with a temporary one, removed again).
func checkWritable(path string) error {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return errors.New("is a directory")
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".shardline-check-*")
	if err != nil {
		return unwrap(err)
	}
	f.Close()
	return os.Remove(f.Name())
}

// logOutput is the console side of the run's log: readable on a terminal (or when
// logging.format asks), JSON lines otherwise.
func (a *app) logOutput(l config.Logging, tty bool) (io.Writer, zerolog.Level, error) {
	level, err := zerolog.ParseLevel(l.Level)
	if err != nil {
		return nil, 0, usageErr("logging.level %q: %v", l.Level, err)
	}
	if l.Format == "console" || (l.Format == "auto" && tty) {
		return zerolog.ConsoleWriter{Out: a.stderr, TimeFormat: time.TimeOnly, NoColor: !tty}, level, nil
	}
	return a.stderr, level, nil
}

// cacheDir is where tokenized text is cached: the cache_dir setting, or the
// user cache directory ("" disables the cache).
func (a *app) cacheDir() string {
	if a.settings != nil && a.settings.CacheDir != "" {
		return a.settings.CacheDir
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "shardline", "tokens")
}
