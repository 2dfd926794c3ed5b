package trainer

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/trainer/ckpt"
)

// Who owns a run directory (docs/robustness.md has the rules):
//
//   - One process writes a run directory at a time: rank 0 holds an exclusive
//     flock on its lock file (lockName) from before its first write to its end,
//     and on the lock file of the run's checkpoint root (its checkpoints/, or
//     checkpoint.dir), so that a run given another run's checkpoints/ as its
//     checkpoint.dir is refused too. A second writer is refused naming the
//     holder's pid. The kernel drops the lock when its process dies, so a lock
//     left by a dead process blocks nothing.
//   - A resume continues a run directory in place only when the checkpoint lies
//     in that run's own checkpoint root, that run's run.json (a regular file,
//     not a link) bears the checkpoint's run id, the recipe saves into the same
//     root, and the checkpoint is the run's newest complete one there
//     (continuesInPlace). Any other resume (a copied checkpoint, an older step,
//     another checkpoint root) is a new run in a new directory (a branch), with
//     a new run id.
//   - Where outputs go is decided by where the checkpoint lies and what the
//     recipe says, never by a path a file records (metadata.json's run_dir).
//   - A new run (fresh or branched) needs a checkpoint root that holds no
//     complete checkpoint; a run prunes only checkpoints bearing its run id.

// lockName is the lock file of a run directory or checkpoint root: a name of
// shardline's own, so that a directory where another tool keeps a ".lock" is
// not touched. It is never removed: a process that opened it just before a
// removal would hold a lock on a file no one else sees.
const lockName = ".shardline.lock"

// ErrInUse is a run directory or checkpoint root another process is writing.
var ErrInUse = errors.New("another process is writing it")

// lockHolder is what a lock file says of the process holding it.
type lockHolder struct {
	PID   int    `json:"pid"`
	Host  string `json:"host"`
	Since string `json:"since"`
}

// maxLockFile bounds what is read of a lock file: a lockHolder is far shorter.
const maxLockFile = 4096

// dirLock is a held lock on a directory.
type dirLock struct {
	f   *os.File
	dir string
}

// lockDir takes the exclusive lock of dir for this process, or refuses with
// ErrInUse naming the holder; what names dir in messages ("run directory").
// The lock file is opened without following a symbolic link, and refused when
// it is not a regular file, has other hard links (emptying it would empty
// them), or holds something other than a lockHolder record (a file shardline
// did not write is left as it is).
func lockDir(dir, what string) (*dirLock, error) {
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s %s: opening its lock file %s: %w; make the directory writable, and remove %s if it is a link", what, dir, path, err, path)
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s %s: its lock file %s is not a regular file; remove it", what, dir, path)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Nlink > 1 {
		f.Close()
		return nil, fmt.Errorf("%s %s: its lock file %s has %d hard links, and locking empties it (so would every file it is linked to); remove %s", what, dir, path, sys.Nlink, path)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := io.ReadAll(io.LimitReader(f, maxLockFile))
		f.Close()
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s %s: locking %s: %w", what, dir, path, err)
		}
		holder, stop := "another process", "stop it"
		var h lockHolder
		if json.Unmarshal(b, &h) == nil && h.PID > 0 {
			holder = fmt.Sprintf("process %d on %s (since %s)", h.PID, h.Host, h.Since)
			stop = fmt.Sprintf("stop it (kill %d)", h.PID)
		}
		beside := "resume from a copy of its checkpoint (a new run directory)"
		if what == "checkpoint directory" {
			beside = "give this run a checkpoint directory of its own (--save DIR)"
		}
		return nil, fmt.Errorf("%s %s: %w: %s holds its lock %s; two processes writing one directory corrupt each other's checkpoints and metrics. Wait for it to end or %s, then run again; to train beside it, %s",
			what, dir, ErrInUse, holder, path, stop, beside)
	}
	// Under the lock no shardline process writes the file: what it holds now
	// is a record shardline wrote, empty, or someone else's file.
	b, err := io.ReadAll(io.LimitReader(f, maxLockFile+1))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s %s: reading its lock file %s: %w", what, dir, path, err)
	}
	var h lockHolder
	if len(bytes.TrimSpace(b)) > 0 && (len(b) > maxLockFile || json.Unmarshal(b, &h) != nil) {
		f.Close()
		return nil, fmt.Errorf("%s %s: its lock file %s holds %d bytes that are not a shardline lock record, and is left as it is; remove it if no other program uses it, or choose another directory", what, dir, path, len(b))
	}
	host, _ := os.Hostname()
	rec, _ := json.Marshal(lockHolder{PID: os.Getpid(), Host: host, Since: time.Now().UTC().Format(time.RFC3339)})
	// Who holds it, for the message a second writer gets (best effort: the
	// flock is what excludes).
	_ = f.Truncate(0)
	_, _ = f.WriteAt(append(rec, '\n'), 0)
	return &dirLock{f: f, dir: dir}, nil
}

// release empties the lock file (it names no one once free) and drops the lock.
func (l *dirLock) release() {
	l.f.Truncate(0)
	l.f.Close()
}

// ownership is rank 0's hold on the run directory it writes, and who the run
// is as run.json records it.
type ownership struct {
	dir   string
	locks []*dirLock
	// runID names the run: kept by a resume in place, new otherwise.
	runID string
	// resumedFrom is the checkpoint the run started from (absolute), "" if none.
	resumedFrom string
	// history is the metrics.jsonl whose first steps begin a branched run's
	// curve: that of the run the checkpoint belongs to, "" if unknown.
	history string
	// ckptDir is checkpoint.dir as an absolute path ("" for the run
	// directory's checkpoints/), as run.json records it.
	ckptDir string
	// events is the TensorBoard event file this run writes in dir ("" when
	// logging.tensorboard is off), and oldEvents the one dir's run.json named
	// before a resume in place, which the run replaces (run.openEvents).
	events, oldEvents string
	inPlace           bool // a resume continuing its run directory
	fresh             bool // the directory was made by this process
	started           time.Time
	// header is set once rank 0 starts writing run.json and the recipe into the
	// directory: from then on a failure is recorded in run.json.
	header bool
}

// release drops the locks (once: a second call does nothing).
func (o *ownership) release() {
	for _, l := range o.locks {
		l.release()
	}
	o.locks = nil
}

// newRunID is a random 128-bit run id, hex.
func newRunID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// takeRunDir decides which directory rank 0 writes, and locks it (and
// checkpoint.dir when set): the checkpoint's own run directory when the resume
// continues it in place (m, read from resume, is nil without a resume),
// otherwise a new one under run.output_dir.
//
// With retake (--resume auto that found no checkpoint) a new run takes over
// run.output_dir/run.name itself when that is a run that never finished and
// never completed a checkpoint (retakeUnfinished), rather than starting
// beside it: the same command line then keeps naming the same directory, so
// that the next --resume auto finds this run's checkpoints.
func takeRunDir(r *config.Recipe, resume string, m *ckpt.Meta, retake bool) (*ownership, error) {
	o := &ownership{started: time.Now()}
	if r.Checkpoint.Saves() && r.Checkpoint.Dir != "" {
		abs, err := filepath.Abs(r.Checkpoint.Dir)
		if err != nil {
			return nil, err
		}
		o.ckptDir = abs
	}
	if m != nil {
		abs, err := filepath.Abs(resume)
		if err != nil {
			return nil, err
		}
		o.resumedFrom = abs
		if src := sourceRun(abs, m); src != "" {
			o.history = filepath.Join(src, "metrics.jsonl")
			if continuesInPlace(src, abs, m.RunID, o.ckptDir) {
				ok, err := o.lockInPlace(src, abs, m)
				if err != nil || ok {
					return o, err
				}
			}
		}
	}
	// A new run: a new id and directory, and a checkpoint root of its own.
	id, err := newRunID()
	if err != nil {
		return nil, err
	}
	o.runID = id
	if o.ckptDir != "" {
		if err := o.lockRoot(o.ckptDir); err != nil {
			o.release()
			return nil, err
		}
		if es, _ := ckpt.List(o.ckptDir); len(es) > 0 {
			for _, e := range es {
				if e.Complete {
					o.release()
					return nil, config.ValueProblem("checkpoint.dir", r.Checkpoint.Dir, fmt.Errorf("it holds the checkpoint %s of another run, and this run is a new one (a fresh run, or a resume that does not continue that run: a copied or older checkpoint), whose checkpoints would mix with it (a resume takes whichever is newest)", e.Dir), "give this run a checkpoint directory of its own (--save DIR), or continue that run from its newest checkpoint with --resume "+r.Checkpoint.Dir)
				}
			}
		}
	}
	retaken := false
	if retake && o.ckptDir == "" {
		if retaken, err = o.retakeUnfinished(r); err != nil {
			o.release()
			return nil, err
		}
	}
	if !retaken {
		if o.dir, err = makeRunDir(r); err != nil {
			o.release()
			return nil, err
		}
		o.fresh = true
		if err := o.lock(o.dir, "run directory"); err != nil {
			o.release()
			return nil, err
		}
	}
	if r.Checkpoint.Saves() && o.ckptDir == "" {
		// The run's own checkpoints/ is its checkpoint root: locked too, so
		// that no run given it as checkpoint.dir writes into it.
		if err := o.lockRoot(filepath.Join(o.dir, "checkpoints")); err != nil {
			o.release()
			return nil, err
		}
	}
	return o, nil
}

// retakeUnfinished takes run.output_dir/run.name for a new run started by
// --resume auto, and reports whether it did: only a shardline run directory
// (a run.json, or the lock file of a run killed before it wrote one) whose
// run never finished (run.json holds no result) and whose checkpoints/ holds
// no complete checkpoint: a run that died before its first checkpoint, which
// the new run replaces (run.log keeps the old run's lines; metrics.jsonl and
// run.json are rewritten). Anything else is left as it is (false), and the
// run starts beside it. The directory is locked first, and checked under the
// lock: a process writing it is refused (ErrInUse).
func (o *ownership) retakeUnfinished(r *config.Recipe) (bool, error) {
	if err := config.CheckRunName(r.Run.Name); err != nil {
		return false, nil // makeRunDir says why
	}
	dir := filepath.Join(r.Run.OutputDir, r.Run.Name)
	if st, err := os.Lstat(dir); err != nil || !st.IsDir() {
		return false, nil
	}
	info, err := readRunInfo(dir)
	switch {
	case err == nil && info.Result != nil:
		return false, nil // a finished run: kept
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return false, nil // not a run.json shardline reads: kept
	case err != nil:
		if st, err := os.Lstat(filepath.Join(dir, lockName)); err != nil || !st.Mode().IsRegular() {
			return false, nil // not a shardline run directory
		}
	}
	if err := o.lock(dir, "run directory"); err != nil {
		return false, err
	}
	ckpts := filepath.Join(dir, "checkpoints")
	if es, _ := ckpt.List(ckpts); slices.ContainsFunc(es, func(e ckpt.Entry) bool { return e.Complete }) {
		// A checkpoint completed since --resume auto looked (a run that
		// still wrote it then ended): resuming it is what auto means.
		return false, fmt.Errorf("run directory %s: a checkpoint was completed under %s after --resume auto found none there; run the command again to resume it", dir, ckpts)
	}
	if info2, err := readRunInfo(dir); err == nil && info2.Result != nil {
		return false, fmt.Errorf("run directory %s: its run finished while --resume auto looked; run the command again", dir)
	}
	o.dir = dir
	return true, nil
}

// lock takes dir's lock (lockDir) unless o holds it already (a checkpoint
// root that is the run directory itself).
func (o *ownership) lock(dir, what string) error {
	for _, l := range o.locks {
		if sameDir(l.dir, dir) {
			return nil
		}
	}
	l, err := lockDir(dir, what)
	if err != nil {
		return err
	}
	o.locks = append(o.locks, l)
	return nil
}

// lockInPlace locks the run directory src that checkpoint c (m) continues in
// place, and its checkpoint root (c's directory: src's checkpoints/ or
// checkpoint.dir), and checks again, under the locks, that c is still its
// newest checkpoint. It reports false (holding nothing) when it no longer is:
// the resume is then a branch.
func (o *ownership) lockInPlace(src, c string, m *ckpt.Meta) (bool, error) {
	if err := o.lock(src, "run directory"); err != nil {
		return false, err
	}
	if err := o.lockRoot(filepath.Dir(c)); err != nil {
		o.release()
		o.locks = nil
		return false, err
	}
	if !sameDir(newestOf(filepath.Dir(c), m.RunID), c) {
		o.release()
		o.locks = nil
		return false, nil
	}
	o.dir, o.runID, o.inPlace = src, m.RunID, true
	if info, err := readRunInfo(src); err == nil {
		o.oldEvents = info.TensorBoard
	}
	return true, nil
}

// lockRoot locks a checkpoint root (checkpoint.dir, or a run directory's
// checkpoints/), making it first.
func (o *ownership) lockRoot(root string) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return config.ValueProblem("checkpoint.dir", root, err, "choose a writable directory with --save DIR")
	}
	return o.lock(root, "checkpoint directory")
}

// sourceRun is the run directory checkpoint c (absolute, its metadata m)
// belongs to: the directory above c's checkpoints/, or else the run_dir m
// records, whichever holds a run.json bearing m's run id; "" when neither does
// (the run is gone, or it is not c's).
func sourceRun(c string, m *ckpt.Meta) string {
	var candidates []string
	if parent := filepath.Dir(c); filepath.Base(parent) == "checkpoints" {
		candidates = append(candidates, filepath.Dir(parent))
	}
	if m.RunDir != "" {
		candidates = append(candidates, m.RunDir)
	}
	for _, d := range candidates {
		if info, err := readRunInfo(d); err == nil && info.RunID != "" && info.RunID == m.RunID {
			return d
		}
	}
	return ""
}

// continuesInPlace says whether resuming checkpoint c (absolute) of run id
// continues run directory src in place: c lies in the checkpoint root src's
// run.json records (its checkpoints/, or the checkpoint_dir it names), the
// recipe now saves into that same root (ckptDir, absolute; "" for the run
// directory's checkpoints/), and c is the run's newest complete checkpoint
// there.
func continuesInPlace(src, c, id, ckptDir string) bool {
	info, err := readRunInfo(src)
	if err != nil {
		return false
	}
	root := filepath.Dir(c)
	if !sameDir(cmp.Or(info.CheckpointDir, filepath.Join(src, "checkpoints")), root) {
		return false
	}
	if !sameDir(cmp.Or(ckptDir, filepath.Join(src, "checkpoints")), root) {
		return false
	}
	return sameDir(newestOf(root, id), c)
}

// newestOf is the newest complete checkpoint of run id under root, "" if none.
func newestOf(root, id string) string {
	es, _ := ckpt.List(root)
	for i := len(es) - 1; i >= 0; i-- {
		if es[i].Complete && ckpt.RunOf(es[i].Dir) == id {
			return es[i].Dir
		}
	}
	return ""
}

// readRunInfo reads a run directory's run.json. A run.json that is a symbolic
// link is refused (fileio.ErrLink): what it points to is not the directory's
// own record, so it proves nothing about whose the directory is (and the run
// could not write run.json through it).
func readRunInfo(dir string) (*runInfo, error) {
	path := filepath.Join(dir, "run.json")
	if st, err := os.Lstat(path); err != nil {
		return nil, err
	} else if st.Mode()&fs.ModeSymlink != 0 {
		return nil, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w: run.json is a symbolic link, not the run's own record", fileio.ErrLink)}
	}
	b, err := fileio.ReadRegular(path, maxRunJSON)
	if err != nil {
		return nil, err
	}
	var info runInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// recordFailure writes down why the run failed: the error in run.log (to the
// file only: the caller prints it), and run.json's failure, unless this is a
// resume that failed before it changed its run directory (run.json then still
// says how the run last ended). A failure after the run wrote its result (the
// trace's write) keeps run.json as it was, result included, and adds the
// failure beside it. It returns err, with a note when run.json could not be
// written.
func (t *run) recordFailure(err error, logFile io.Writer) error {
	o := t.opts.own
	flog := zerolog.New(logFile).With().Timestamp().Logger()
	if !o.header && !o.fresh {
		flog.Error().Err(err).Msg("the resume failed before the run directory changed; run.json still says how the run last ended")
		return err
	}
	info := t.info()
	// run.json was rewritten by this run's header, so a result in it is this
	// run's own.
	if prev, rerr := readRunInfo(t.dir); rerr == nil && o.header && prev.Result != nil && prev.RunID == info.RunID {
		info = *prev
		flog.Error().Err(err).Msg("run failed after it wrote its result; run.json keeps the result and records the failure beside it")
	} else {
		flog.Error().Err(err).Msg("run failed; run.json records it as the failure")
	}
	info.Failure = err.Error()
	if werr := writeJSON(filepath.Join(t.dir, "run.json"), info); werr != nil {
		flog.Error().Err(werr).Msg("recording the failure in run.json")
		return fmt.Errorf("%w (and recording it in run.json: %v)", err, werr)
	}
	return err
}

// faults stand in, in tests, for failures a test cannot cause on demand: a
// disk that fills up under a checkpoint's write, an old checkpoint the disk
// will not remove, a rank lost in the middle of a run. Nil in every real run.
type faults struct {
	rankFile func(dir string, rank int, data []byte) error // in place of ckpt.WriteRankFile
	remove   func(path string) error                       // in place of os.RemoveAll when pruning
	lose     func(rank, step int) error                    // every rank, before every step
	// phase is called as start-up passes a phase: "data" (opened), "state"
	// (built, rank 0 before it writes its header); a test cancels there.
	phase func(name string)
}

// at calls the test's phase hook, if any.
func (f *faults) at(name string) {
	if f != nil && f.phase != nil {
		f.phase(name)
	}
}

// writeRankFile is ckpt.WriteRankFile, or the test's stand-in.
func (f *faults) writeRankFile(dir string, rank int, data []byte) error {
	if f != nil && f.rankFile != nil {
		return f.rankFile(dir, rank, data)
	}
	return ckpt.WriteRankFile(dir, rank, data)
}

// removeAll is os.RemoveAll, or the test's stand-in.
func (f *faults) removeAll() func(string) error {
	if f != nil && f.remove != nil {
		return f.remove
	}
	return os.RemoveAll
}

// lost is the error of a rank the test loses before step, or nil.
func (f *faults) lost(rank, step int) error {
	if f != nil && f.lose != nil {
		return f.lose(rank, step)
	}
	return nil
}
