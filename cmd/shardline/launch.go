package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/trainer/ckpt"
	"github.com/spf13/cobra"
)

func (a *app) launchCmd() *cobra.Command {
	var (
		nproc, nnodes, nodeRank, masterPort int
		masterAddr                          string
		grace, interruptGrace, backoff      time.Duration
		maxRestarts                         int
	)
	cmd := &cobra.Command{
		Use:   "launch --nproc N [--nnodes M --node-rank K --master-addr A --master-port P] RECIPE [run flags]",
		Short: "Start N ranks of `shardline run` as processes on this node, as torchrun does",
		Long: `Launch starts N processes of "shardline run RECIPE [run flags]" on this node, each
with RANK, WORLD_SIZE (N × nodes), LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT and SHARDLINE_JOB_TOKEN set; they join over TCP at rank 0's rendezvous.
Rank 0 writes the run directory; every rank logs with its rank. On a terminal
the ranks log in the console format and rank 0 draws the progress bar, as run
does. With --device
cuda each rank trains on the GPU of its LOCAL_RANK (modulo the GPUs visible),
its collectives over NCCL.

Each rank gets GOMAXPROCS = max(1, CPUs ÷ N), its share of this node's cores, so
N ranks' kernel workers do not contend for the same cores (as torchrun sets
OMP_NUM_THREADS); a GOMAXPROCS already in the environment is passed on as it is.

The command line and the recipe are checked once, before any rank starts
(an error is printed once, a world size blamed on --nproc). Before the first step
the ranks prove they run the same recipe and data, or every rank stops naming the
keys that differ.

If a rank fails, the others are stopped (SIGTERM, then SIGKILL after --grace) and
launch exits non-zero naming the failed rank, or the signal that killed it (KILL
is most often the kernel's out-of-memory killer); a rank found stopped (SIGSTOP, a
debugger) is killed at once and named. Ctrl-C is passed on to every rank, which
then get --interrupt-grace (default 1m) to write the interrupt's checkpoint and
outputs before SIGKILL; launch exits 130 as run does, and names a rank it had
to kill ("did not stop within --interrupt-grace"), which is not a failure.
SIGINT or SIGTERM to any one rank stops every rank at the same step too, with
one checkpoint, and launch exits 130.

With --max-restarts N and the ranks' --resume auto, a job whose rank crashed
(killed by a signal launch did not send: the out-of-memory killer, a
segfault, a scheduler), was found stopped, or whose ranks only lost each
other (exit 3) is restarted, every rank, from the newest checkpoint, up to N
times, after a back-off of --restart-backoff (default 1s) doubling with each
restart up to 1m; launch logs each restart, naming the rank that failed, how,
and the checkpoint and step the job continues from. A rank that exits 1 (the
recipe or data refused at run time, ranks that disagree, a non-finite loss,
a failed checkpoint write) or 2 (a usage error, or a Go runtime crash) would
fail the same way again: launch ends the job, saying it did not restart. So
does an interrupt (130). Checkpoints every few steps or minutes
(--save-interval, checkpoint.interval_minutes) bound the work a restart
repeats. On several nodes the launch of each node restarts its own ranks
(those of the other nodes see a lost rank: exit 3), and they meet again at the
rendezvous within --comm-timeout: give every node the same --max-restarts.
On several nodes, run launch on each with the same --master-addr, --master-port
and SHARDLINE_JOB_TOKEN, and --node-rank 0..M-1.`,
		Example: `  shardline launch --nproc 2 recipes/tiny.toml --global-batch-size 32
  shardline launch --nproc 2 --max-restarts 3 recipes/tiny.toml --global-batch-size 32 --save-interval 50 --resume auto
  SHARDLINE_JOB_TOKEN=s3cret shardline launch --nproc 8 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500 recipes/llama-1b.toml`,
		Args: cobra.MinimumNArgs(1),
	}
	fs := cmd.Flags()
	fs.SetInterspersed(false) // flags after RECIPE belong to run
	nproc, nnodes = 1, 1
	fs.Var(countValue{&nproc, "nproc"}, "nproc", "ranks (processes) on this node")
	fs.Var(countValue{&nnodes, "nnodes"}, "nnodes", "nodes in the job")
	fs.Var(countValue{&nodeRank, "node-rank"}, "node-rank", "this node's index, 0..nnodes-1")
	fs.StringVar(&masterAddr, "master-addr", "127.0.0.1", "host of rank 0's rendezvous")
	fs.IntVar(&masterPort, "master-port", 0, "port of rank 0's rendezvous (0: a free port, bound by the launcher and handed to rank 0; one node only)")
	fs.DurationVar(&grace, "grace", 10*time.Second, "how long the other ranks get to exit, once a rank failed, before SIGKILL")
	fs.DurationVar(&interruptGrace, "interrupt-grace", time.Minute, "how long the ranks get to exit after Ctrl-C (writing the interrupt's checkpoint and outputs) before SIGKILL")
	fs.IntVar(&maxRestarts, "max-restarts", 0, "restart every rank from the newest checkpoint (the ranks' --resume auto) up to N times after a rank crashes or is lost; a failure restarting cannot mend (the recipe, the data, a non-finite loss, exit 1 or 2) ends the job")
	fs.DurationVar(&backoff, "restart-backoff", time.Second, "the wait before the first restart; it doubles with each restart, up to "+maxBackoff.String())
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		switch {
		case nproc < 1:
			return usageErr("--nproc %d: give at least 1 rank for this node (a count from $(nvidia-smi -L | wc -l) is 0 where no GPU is listed)", nproc)
		case nnodes < 1:
			return usageErr("--nnodes %d: give at least 1 node", nnodes)
		case nproc*nnodes > maxWorld:
			return usageErr("--nproc %d × --nnodes %d is %d ranks, more than parallel.world_size allows (%d): give fewer", nproc, nnodes, nproc*nnodes, maxWorld)
		case nodeRank < 0 || nodeRank >= nnodes:
			return usageErr("--node-rank %d: give this node's index, 0 to %d (--nnodes %d)", nodeRank, nnodes-1, nnodes)
		}
		if !cmd.Flags().Changed("grace") && a.settings.Grace > 0 {
			grace = a.settings.Grace
		}
		if grace < 0 {
			return usageErr("--grace %v must not be negative (0 kills at once)", grace)
		}
		if interruptGrace < 0 {
			return usageErr("--interrupt-grace %v must not be negative (0 kills at once)", interruptGrace)
		}
		if maxRestarts < 0 {
			return usageErr("--max-restarts %d must not be negative (0 ends the job at the first failure)", maxRestarts)
		}
		if backoff < 0 {
			return usageErr("--restart-backoff %v must not be negative", backoff)
		}
		world := nproc * nnodes
		worldFlag := "nproc" // the flag the user gave the world size with, in messages
		if nnodes > 1 {
			worldFlag = "nproc × --nnodes"
		}
		// The command line and recipe are checked once, here, before any rank
		// starts: N ranks each finding the same error printed it N times.
		pf, err := a.preflightRun(args, world, worldFlag, maxRestarts)
		if err != nil {
			return err
		}
		env := config.EnvMap(a.env)
		token := env["SHARDLINE_JOB_TOKEN"]
		if nnodes > 1 && (token == "" || masterPort == 0) {
			return usageErr("with --nnodes %d every node needs the same SHARDLINE_JOB_TOKEN and --master-port", nnodes)
		}
		if token == "" {
			b := make([]byte, 16)
			if _, err := rand.Read(b); err != nil {
				return err
			}
			token = hex.EncodeToString(b)
		}
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		threads := rankThreads(env, runtime.NumCPU(), nproc)
		// Ctrl-C (SIGINT or SIGTERM to the launcher) is caught from before the
		// first rank starts, and passed on to every rank; during a restart's
		// back-off it ends the job.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		// attempt starts every rank of this node and supervises them until the
		// job ends.
		attempt := func() error {
			// With no --master-port the launcher binds a free port and hands the
			// bound socket to rank 0 (file descriptor 3, named by
			// SHARDLINE_RENDEZVOUS_FD), so no other process can take the port
			// before rank 0 hosts on it: a new one for every start.
			port := masterPort
			var rendezvous *os.File
			if port == 0 {
				l, err := net.Listen("tcp", net.JoinHostPort(masterAddr, "0"))
				if err != nil {
					return usageErr("--master-addr %s: %v", masterAddr, err)
				}
				port = l.Addr().(*net.TCPAddr).Port
				if nodeRank == 0 {
					rendezvous, err = l.(*net.TCPListener).File()
				}
				l.Close()
				if err != nil {
					return fmt.Errorf("passing the rendezvous socket to rank 0: %w", err)
				}
			}
			procs := make([]*exec.Cmd, nproc)
			var mu sync.Mutex // ranks' lines go out whole, one at a time
			var flush []func()
			for i := range procs {
				c := exec.Command(exe, append([]string{"run"}, args...)...)
				c.Env = append(append([]string(nil), a.env...),
					"RANK="+strconv.Itoa(nodeRank*nproc+i), "WORLD_SIZE="+strconv.Itoa(world), "LOCAL_RANK="+strconv.Itoa(i),
					"LOCAL_WORLD_SIZE="+strconv.Itoa(nproc), "MASTER_ADDR="+masterAddr, "MASTER_PORT="+strconv.Itoa(port),
					"SHARDLINE_JOB_TOKEN="+token, worldFlagEnv+"="+worldFlag, launchLintedEnv+"=1")
				if threads != "" {
					c.Env = append(c.Env, "GOMAXPROCS="+threads)
				}
				if isTerminal(a.stderr) {
					c.Env = append(c.Env, launchTTYEnv+"=1")
				}
				if i == 0 && rendezvous != nil {
					c.ExtraFiles = []*os.File{rendezvous}
					c.Env = append(c.Env, "SHARDLINE_RENDEZVOUS_FD=3")
				}
				out, err := &lineWriter{mu: &mu, w: a.stdout}, &lineWriter{mu: &mu, w: a.stderr}
				c.Stdout, c.Stderr = out, err
				flush = append(flush, out.flush, err.flush)
				procs[i] = c
			}
			err := superviseRanks(ctx.Done(), stop, procs, nodeRank*nproc, grace, interruptGrace, func() {
				if rendezvous != nil {
					rendezvous.Close() // rank 0 holds its own copy
				}
			})
			for _, f := range flush {
				f()
			}
			return err
		}
		for restarts := 0; ; restarts++ {
			err := attempt()
			var f *rankFailure
			if !errors.As(err, &f) || maxRestarts == 0 {
				return err // success, an interrupt, or no restarts asked for
			}
			if why := f.notRestarted(restarts, maxRestarts, ctx.Err() != nil); why != "" {
				return &exitError{code: exitFindings, err: fmt.Errorf("%w; not restarted: %s", err, why)}
			}
			wait := restartDelay(backoff, restarts)
			fmt.Fprintf(a.stderr, "shardline launch: restart %d of %d (--max-restarts) in %v: %s; every rank restarts from %s\n",
				restarts+1, maxRestarts, wait, f.cause, restartPoint(pf.checkpointRoot))
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return &exitError{code: 130, err: fmt.Errorf("interrupted during the back-off before restart %d; no rank was running", restarts+1)}
			}
		}
	}
	return cmd
}

// Restarts (--max-restarts). A failed job is restarted when its failure is
// one a new start can mend: a rank killed by a signal launch did not send (the
// out-of-memory killer, a crash, a scheduler), a rank found stopped, or ranks
// that only lost each other (exit 3, exitLostRank: a network failure), with
// no rank failing on its own account. A rank that exits 1 (exitFindings: the
// recipe or data refused at run time, ranks that disagree, a non-finite loss,
// a checkpoint write that failed) or 2 (exitUsage, and Go's own crashes)
// would fail the same way again: the job ends. So does an interrupt (130).
// Every rank restarts, with the same command line, after a back-off that
// doubles from --restart-backoff up to maxBackoff; the ranks' --resume auto
// continues from the newest checkpoint.

// maxBackoff caps the wait before a restart.
const maxBackoff = time.Minute

// restartDelay is the wait before restart n+1 (n from 0): first, doubled n
// times, at most maxBackoff.
func restartDelay(first time.Duration, n int) time.Duration {
	d := first
	for range n {
		if d >= maxBackoff/2 {
			return maxBackoff
		}
		d *= 2
	}
	return min(d, maxBackoff)
}

// restartPoint says where a restart continues from: the newest checkpoint
// under root that checks out (what the ranks' --resume auto finds), or a
// new start.
func restartPoint(root string) string {
	dir, _, err := ckpt.Newest(root)
	switch {
	case err != nil:
		return fmt.Sprintf("the newest checkpoint under %s (reading it: %v)", root, unwrap(err))
	case dir == "":
		return fmt.Sprintf("the start: no complete checkpoint under %s yet", root)
	}
	if m, err := ckpt.Open(dir); err == nil {
		return fmt.Sprintf("checkpoint %s (step %d)", dir, m.Step)
	}
	return "checkpoint " + dir
}

// rankFailure is how a job's attempt failed: cause names the rank and how
// it ended; restartable says whether a restart can mend it.
type rankFailure struct {
	msg, cause  string
	restartable bool
}

func (f *rankFailure) Error() string { return f.msg }

// notRestarted says why launch ends the job after restarts of max restarts
// rather than restart it ("" when it restarts): the failure is not one a
// restart mends, the restarts are used up, or launch was interrupted.
func (f *rankFailure) notRestarted(restarts, max int, interrupted bool) string {
	switch {
	case !f.restartable:
		return "a rank failed on its own account (exit status 1: the recipe or data refused at run time, ranks that disagree, a non-finite loss, a failed checkpoint write; 2: a usage error or a Go runtime crash), and a restart would fail the same way"
	case restarts >= max:
		return fmt.Sprintf("--max-restarts %d: no restart is left", max)
	case interrupted:
		return "launch was interrupted"
	}
	return ""
}

// maxWorld is the most ranks a job may have: parallel.world_size's bound.
var maxWorld = func() int {
	f, ok := config.RecipeSchema().Lookup("parallel.world_size")
	if !ok || f.Max == nil {
		return math.MaxInt32
	}
	return int(*f.Max)
}()

// countValue is launch's --nproc, --nnodes and --node-rank: a whole number. A
// value that is not one says what it likely was: a shell substitution that was
// not expanded, or a missing value (a substitution that printed nothing, so the
// next flag was taken as the value).
type countValue struct {
	n    *int
	name string
}

func (c countValue) String() string {
	if c.n == nil {
		return "0"
	}
	return strconv.Itoa(*c.n)
}

func (c countValue) Type() string { return "int" }

func (c countValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	switch {
	case err == nil && n >= 0 && n <= maxWorld:
		*c.n = n
		return nil
	case err == nil || errors.Is(err, strconv.ErrRange):
		return fmt.Errorf("give a whole number from 0 to %d", maxWorld)
	case strings.Contains(s, "$(") || strings.Contains(s, "`") || strings.Contains(s, "${"):
		return fmt.Errorf("a shell substitution that was not expanded: run it in a shell that expands it (not inside single quotes), or give the number")
	case strings.HasPrefix(s, "-"):
		return fmt.Errorf("--%s has no value, so it took the next argument: give the number (a substitution such as $(nvidia-smi -L | wc -l) that printed nothing leaves it empty)", c.name)
	case strings.TrimSpace(s) == "":
		return fmt.Errorf("empty: give the number (a substitution such as $(nvidia-smi -L | wc -l) that printed nothing leaves it empty)")
	}
	return fmt.Errorf("not a whole number: give the number of %s", map[string]string{"nproc": "ranks on this node", "nnodes": "nodes", "node-rank": "this node, from 0"}[c.name])
}

// rankThreads is the GOMAXPROCS launch gives each of nproc ranks on a node of
// cpus cores: an even share, at least 1, or "" (the environment's own) when
// GOMAXPROCS is set. A rank forks its kernels over GOMAXPROCS threads, whose
// workers poll for work before they sleep; N ranks each with the whole node's
// count oversubscribe it (tiny at 2 ranks on 2 cores: 1.24–1.30× the tokens/s
// with 1 thread each).
func rankThreads(env map[string]string, cpus, nproc int) string {
	if _, set := env["GOMAXPROCS"]; set {
		return ""
	}
	return strconv.Itoa(max(1, cpus/nproc))
}

// superviseRanks starts the processes (then calls started, which releases what
// only the children need) and waits for them. The first to fail stops the rest
// (SIGTERM, then SIGKILL after grace). When interrupt is closed (Ctrl-C to the
// launcher) it calls stopSignals (a second Ctrl-C is no longer caught) and
// passes SIGINT on to every rank, which get interruptGrace to exit before
// SIGKILL; a rank launch kills then is named, but is not a failure: launch
// exits 130.
func superviseRanks(interrupt <-chan struct{}, stopSignals func(), procs []*exec.Cmd, firstRank int, grace, interruptGrace time.Duration, started func()) error {
	for i, c := range procs {
		if err := c.Start(); err != nil {
			for _, p := range procs[:i] {
				p.Process.Kill()
			}
			started()
			return fmt.Errorf("starting rank %d: %w", firstRank+i, err)
		}
	}
	started()
	type exit struct {
		rank int
		err  error
	}
	exits := make(chan exit, len(procs))
	for i, c := range procs {
		go func() { exits <- exit{firstRank + i, c.Wait()} }()
	}
	var once sync.Once
	var failure error
	failureLost := false // failure is a rank that lost another (exitLostRank), not a cause
	interrupted := false
	signalled := false // launch itself was interrupted, and told every rank
	firstStopped := -1 // the first rank to exit 130 (interrupted) on its own
	var frozen []int   // ranks found stopped (SIGSTOP, a debugger) when the job ended
	var killedMu sync.Mutex
	killed := map[int]bool{} // ranks launch sent SIGKILL
	kill := func(i int) {
		killedMu.Lock()
		killed[firstRank+i] = true
		killedMu.Unlock()
		procs[i].Process.Kill() // no-op for ranks that have exited
	}
	stopAll := func(sig os.Signal, grace time.Duration) {
		once.Do(func() {
			for i, c := range procs {
				// A stopped process holds every signal but SIGKILL until it is
				// continued: waiting out the grace period for it helps nobody.
				if processStopped(c.Process.Pid) {
					frozen = append(frozen, firstRank+i)
					kill(i)
					continue
				}
				c.Process.Signal(sig) // an exited rank just reports an error
			}
			time.AfterFunc(grace, func() {
				for i := range procs {
					kill(i)
				}
			})
		})
	}
	// ended says whether a rank's exit is an interrupt or launch's own doing
	// (SIGTERM or SIGINT, which launch sends once a rank failed, or SIGKILL
	// from launch), not a cause of the job's failure.
	ended := func(rank int, err error) bool {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return false
		}
		ws, ok := ee.Sys().(syscall.WaitStatus)
		switch {
		case ee.ExitCode() == 130:
			return true
		case !ok || !ws.Signaled():
			return false
		case ws.Signal() == syscall.SIGKILL:
			killedMu.Lock()
			defer killedMu.Unlock()
			return killed[rank]
		}
		return ws.Signal() == syscall.SIGTERM || ws.Signal() == syscall.SIGINT
	}
	var late []int // ranks launch killed after the interrupt's grace
	// What the failed ranks did, for restarts: crashed is the first rank
	// killed by a signal launch did not send, own a rank that exited on its
	// own account (not 3, not 130).
	crashed, own := -1, false
	crashCause := ""
	for left := len(procs); left > 0; {
		select {
		case e := <-exits:
			left--
			if e.err != nil && failure == nil && signalled && ended(e.rank, e.err) && !slices.Contains(frozen, e.rank) {
				// Launch was interrupted and told every rank: a rank it then
				// had to kill (or one the signal reached before it could catch
				// it) did not fail on its own account.
				if launchKilled(e.err) {
					late = append(late, e.rank)
				}
				continue
			}
			var code *exec.ExitError
			if errors.As(e.err, &code) && code.ExitCode() == 130 && failure == nil {
				// An interrupt (a signal to launch, or to any rank) or --stop-after:
				// every rank stops at the same step. Not a failure.
				if !interrupted {
					firstStopped = e.rank
				}
				interrupted = true
				continue
			}
			lost := errors.As(e.err, &code) && code.ExitCode() == exitLostRank
			if e.err != nil && !ended(e.rank, e.err) {
				var ee *exec.ExitError
				if errors.As(e.err, &ee) {
					if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
						if crashed < 0 {
							crashed, crashCause = e.rank, fmt.Sprintf("rank %d %s", e.rank, exitStatus(ee))
						}
					} else if !lost {
						own = true
					}
				} else {
					own = true
				}
			}
			if e.err != nil && failureLost && !lost && !ended(e.rank, e.err) {
				// The rank whose loss the first one reported failed on its own
				// account: it is the cause, whichever exit was seen first.
				failure, failureLost = nil, false
			}
			if e.err != nil && failure == nil {
				stopAll(syscall.SIGTERM, grace)
				failureLost = lost
				var ee *exec.ExitError
				switch {
				case len(frozen) > 0:
					failure = fmt.Errorf("rank %v was stopped (process state T: SIGSTOP or a debugger) and stopped answering; rank %d gave up on it (%v); every rank was ended", frozen, e.rank, e.err)
				case errors.As(e.err, &ee):
					failure = fmt.Errorf("rank %d %s; the other ranks were stopped", e.rank, exitStatus(ee))
				default:
					failure = fmt.Errorf("rank %d: %w", e.rank, e.err)
				}
			}
		case <-interrupt:
			interrupt = nil // once
			stopSignals()
			interrupted, signalled = true, true
			stopAll(os.Interrupt, interruptGrace)
		}
	}
	switch {
	case failure != nil:
		f := &rankFailure{msg: failure.Error(), cause: failure.Error()}
		switch {
		case len(frozen) > 0:
			f.restartable, f.cause = true, fmt.Sprintf("rank %v was stopped (SIGSTOP or a debugger) and was killed", frozen)
		case crashed >= 0:
			f.restartable, f.cause = true, crashCause
		case !own:
			f.restartable = true // ranks lost each other (exit 3), and none failed on its own
		}
		return &exitError{code: exitFindings, err: f}
	case signalled && len(late) > 0:
		sort.Ints(late)
		return &exitError{code: 130, err: fmt.Errorf("interrupted; every rank was told to stop, and rank %v did not stop within --interrupt-grace %v after the interrupt and was killed (a checkpoint it was writing is left incomplete, and a resume never takes one; give the ranks longer with --interrupt-grace)", late, interruptGrace)}
	case signalled: // as run: 130, the shell's code for a SIGINT
		return &exitError{code: 130, err: errors.New("interrupted; every rank was told to stop")}
	case interrupted:
		return &exitError{code: 130, err: fmt.Errorf("interrupted: a rank was signalled (or --stop-after was reached); every rank stopped at the same step (rank %d exited first)", firstStopped)}
	}
	return nil
}

// launchKilled says whether a rank's exit is a SIGKILL (as launch sends once
// the grace has passed).
func launchKilled(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// exitStatus says how a rank's process ended: its exit status, or the signal
// that killed it, with what that signal usually means.
func exitStatus(ee *exec.ExitError) string {
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		if ee.ExitCode() == exitLostRank {
			return fmt.Sprintf("exited with status %d: it lost another rank, named in its error above", exitLostRank)
		}
		return fmt.Sprintf("exited with status %d", ee.ExitCode())
	}
	sig := ws.Signal()
	name, why := signalNames[sig], ""
	if name == "" {
		name = fmt.Sprintf("%d (%v)", int(sig), sig)
	}
	switch sig {
	case syscall.SIGKILL:
		why = ", which cannot be caught: most often the kernel's out-of-memory killer (see `dmesg` or `journalctl -k` for \"Out of memory\"; give the ranks more memory, or lower train.micro_batch_size or the ranks per node), else a scheduler or a user ending it"
	case syscall.SIGSEGV, syscall.SIGBUS, syscall.SIGILL, syscall.SIGFPE, syscall.SIGABRT:
		why = " (a crash: its output above says where)"
	case syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP:
		why = " before it could catch it (the signal arrived while the process was starting)"
	}
	return fmt.Sprintf("was killed by signal %s%s", name, why)
}

// signalNames are the signals a rank is commonly killed by, as kill -l names them.
var signalNames = map[syscall.Signal]string{syscall.SIGKILL: "KILL", syscall.SIGTERM: "TERM", syscall.SIGINT: "INT", syscall.SIGHUP: "HUP",
	syscall.SIGSEGV: "SEGV", syscall.SIGBUS: "BUS", syscall.SIGILL: "ILL", syscall.SIGFPE: "FPE", syscall.SIGABRT: "ABRT", syscall.SIGPIPE: "PIPE",
	syscall.SIGQUIT: "QUIT"}

// processStopped reports whether the process is stopped (state T or t in
// /proc/PID/stat); false where /proc cannot tell.
func processStopped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may itself
	// hold spaces or parentheses: read after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] == 'T' || b[i+2] == 't'
}

// lineWriter passes a rank's output on a line at a time, under a lock shared by all
// ranks, so lines from different ranks never interleave. A line longer than
// maxHeldLine goes on in parts of that size, so that a rank writing without
// newlines cannot make the launcher hold its output without bound, and a
// line being redrawn after a CR (rank 0's progress bar) goes on as written.
type lineWriter struct {
	mu  *sync.Mutex
	w   io.Writer
	buf []byte
}

// maxHeldLine is the most of one line lineWriter holds before passing it on.
const maxHeldLine = 64 << 10

// launchTTYEnv tells the ranks shardline launch starts that its stderr is a
// terminal: they log as on one (the console format), and rank 0 draws the
// progress bar, which lineWriter passes on as it is drawn.
const launchTTYEnv = "SHARDLINE_LAUNCH_TTY"

func (l *lineWriter) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	i := bytes.LastIndexByte(l.buf, '\n')
	// A progress bar redraws its line after a CR and never ends it: what
	// follows the last newline goes on as soon as it holds a CR.
	if len(l.buf) >= maxHeldLine || bytes.IndexByte(l.buf[i+1:], '\r') >= 0 {
		i = len(l.buf) - 1
	}
	if i >= 0 {
		l.mu.Lock()
		_, err := l.w.Write(l.buf[:i+1])
		l.mu.Unlock()
		l.buf = append(l.buf[:0], l.buf[i+1:]...)
		if err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// flush writes what is left after the last newline.
func (l *lineWriter) flush() {
	if len(l.buf) > 0 {
		l.mu.Lock()
		l.w.Write(l.buf)
		l.mu.Unlock()
		l.buf = nil
	}
}
