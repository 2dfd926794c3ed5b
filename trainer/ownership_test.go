package trainer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/trainer/ckpt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Tests of who owns a run directory (docs/robustness.md): each is an attack
// from issue #46, class 1, and uses only what a user can do (Run, Options,
// the files on disk), so that it also runs against the code before the fix.

// ownSets is a short run that checkpoints at steps 4 and 8.
var ownSets = []string{"train.steps=8", "train.eval_interval=0", "checkpoint.interval=4", "logging.sample_tokens=0"}

// snapshot is every regular file under dir, by relative path, with its bytes.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		out[rel] = string(must(os.ReadFile(path)))
		return nil
	}))
	return out
}

// copyTree copies the regular files and directories under src to dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		return os.WriteFile(filepath.Join(dst, rel), must(os.ReadFile(path)), 0o644)
	}))
}

// runJSON is a run directory's run.json.
func runJSON(t *testing.T, dir string) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(must(os.ReadFile(filepath.Join(dir, "run.json"))), &m))
	return m
}

// The example: resuming from a copy of a checkpoint rewrote the
// original run's directory (weights.bin replaced, metrics.jsonl cut,
// resolved.toml rewritten), because the resumed run wrote where the
// checkpoint's metadata said its run lived. So did resuming from an older
// checkpoint of a run. Both are now new runs in new directories (with the
// original's curve up to the checkpoint), and the original is byte for byte
// as it was, checkpoints included.
func TestResumeNeverRewritesAnotherRun(t *testing.T) {
	res, _ := tinyRun(t, ownSets...)
	a, err := Run(context.Background(), res, opts())
	require.NoError(t, err)
	before := snapshot(t, a.Dir)
	step4 := filepath.Join(a.Dir, "checkpoints", "step-00000004")
	copied := filepath.Join(t.TempDir(), "copy", "step-00000004")
	copyTree(t, step4, copied)
	for _, c := range []struct{ name, from string }{{"a copied checkpoint", copied}, {"an older checkpoint of the run", step4}} {
		t.Run(c.name, func(t *testing.T) {
			// The same output directory and name; fewer steps (a key a resume may change).
			again, _ := tinyRun(t, append(append([]string(nil), ownSets...), "train.steps=6", "run.output_dir="+res.Recipe.Run.OutputDir)...)
			o := opts()
			o.Resume = c.from
			out, err := Run(context.Background(), again, o)
			require.NoError(t, err)
			assert.NotEqual(t, a.Dir, out.Dir, "a resume that is not the run going on writes a directory of its own")
			assert.Equal(t, before, snapshot(t, a.Dir), "the original run directory is untouched")
			info := runJSON(t, out.Dir)
			from, _ := filepath.Abs(c.from)
			assert.Equal(t, from, info["resumed_from"])
			assert.NotEqual(t, runJSON(t, a.Dir)["run_id"], info["run_id"], "a branch is a run of its own")
			got, want := curveOf(t, out.Dir), curveOf(t, a.Dir)
			require.Len(t, got, 6)
			assert.Equal(t, want[:4], got[:4], "the branch's curve starts with the original's steps up to its checkpoint")
		})
	}
}

// A copy of a whole run directory is a run directory of its own: resuming
// from its newest checkpoint continues the copy, not the run it was copied
// from, whatever the checkpoint's metadata records.
func TestCopiedRunDirectoryContinuesItself(t *testing.T) {
	res, _ := tinyRun(t, ownSets...)
	o := opts()
	o.StopAfter = 4
	a, err := Run(context.Background(), res, o)
	require.NoError(t, err)
	before := snapshot(t, a.Dir)
	b := a.Dir + "-copy"
	copyTree(t, a.Dir, b)
	o = opts()
	o.Resume = filepath.Join(b, "checkpoints", "step-00000004")
	out, err := Run(context.Background(), res, o)
	require.NoError(t, err)
	assert.Equal(t, b, out.Dir, "the copy goes on in itself")
	assert.Len(t, curveOf(t, b), 8)
	assert.Equal(t, before, snapshot(t, a.Dir), "the run it was copied from is untouched")
}

// lockAs holds dir's lock file as another process would, recording pid as
// the holder; the returned function releases it.
func lockAs(t *testing.T, dir string, pid int) func() {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))
	_, err = fmt.Fprintf(f, `{"pid":%d,"host":"elsewhere","since":"2026-11-27T13:00:00Z"}`, pid)
	require.NoError(t, err)
	return func() { f.Close() }
}

// Two processes resuming the same run directory at once both ran, and left
// "complete" checkpoints that fail verification. A run directory another
// process writes (its lock held) is now refused before anything is written,
// naming the holder's pid and the fix; once the holder is gone the resume
// goes on, and a lock file left by a process that died (no lock held, a pid
// in it) blocks nothing.
func TestSecondWriterOfARunDirectoryIsRefused(t *testing.T) {
	res, _ := tinyRun(t, ownSets...)
	o := opts()
	o.StopAfter = 4
	a, err := Run(context.Background(), res, o)
	require.NoError(t, err)
	before := snapshot(t, a.Dir)
	release := lockAs(t, a.Dir, 4242)
	o = opts()
	o.Resume = filepath.Join(a.Dir, "checkpoints", "step-00000004")
	_, err = Run(context.Background(), res, o)
	require.Error(t, err, "a second writer of the run directory")
	assert.Contains(t, err.Error(), a.Dir)
	assert.Contains(t, err.Error(), "process 4242 on elsewhere")
	assert.Contains(t, err.Error(), "kill 4242")
	after := snapshot(t, a.Dir)
	delete(before, lockName)
	delete(after, lockName)
	assert.Equal(t, before, after, "nothing was written by the refused run")

	release() // the holder died: its lock file stays, naming it, but unlocked
	require.FileExists(t, filepath.Join(a.Dir, lockName))
	out, err := Run(context.Background(), res, o)
	require.NoError(t, err, "a stale lock file blocks nothing")
	assert.Equal(t, a.Dir, out.Dir)
	es, err := ckpt.List(filepath.Join(a.Dir, "checkpoints"))
	require.NoError(t, err)
	for _, e := range es {
		_, err := ckpt.Verify(e.Dir)
		assert.NoError(t, err, e.Dir)
	}
}

// checkpoint.dir shared by two runs mixed their checkpoints (a resume took
// whichever was newest, and pruning deleted the other run's). A new run into
// a checkpoint directory that holds another run's checkpoints is refused,
// naming the key and a fix.
func TestNewRunRefusesAnotherRunsCheckpointDir(t *testing.T) {
	shared := filepath.Join(t.TempDir(), "ckpts")
	res, _ := tinyRun(t, append(append([]string(nil), ownSets...), "checkpoint.dir="+shared)...)
	_, err := Run(context.Background(), res, opts())
	require.NoError(t, err)
	before := snapshot(t, shared)
	other, _ := tinyRun(t, append(append([]string(nil), ownSets...), "checkpoint.dir="+shared, "run.seed=9")...)
	_, err = Run(context.Background(), other, opts())
	var ke *config.Diagnostic
	require.ErrorAs(t, err, &ke)
	assert.Equal(t, "checkpoint.dir", ke.Key)
	assert.Contains(t, err.Error(), "another run")
	assert.Equal(t, before, snapshot(t, shared))
}

// keep_last deleted checkpoints the run had not written: pruning now removes
// only checkpoints bearing the run's id. A checkpoint of another run placed
// in the run's checkpoint directory survives a resumed run's pruning.
func TestPruneKeepsOtherRunsCheckpoints(t *testing.T) {
	other, _ := tinyRun(t, "train.steps=2", "train.eval_interval=0", "checkpoint.interval=1", "logging.sample_tokens=0")
	o, err := Run(context.Background(), other, opts())
	require.NoError(t, err)

	res, _ := tinyRun(t, append(append([]string(nil), ownSets...), "checkpoint.keep_last=1")...)
	stop := opts()
	stop.StopAfter = 4
	a, err := Run(context.Background(), res, stop)
	require.NoError(t, err)
	foreign := filepath.Join(a.Dir, "checkpoints", "step-00000001")
	copyTree(t, filepath.Join(o.Dir, "checkpoints", "step-00000001"), foreign)
	before := snapshot(t, foreign)
	resume := opts()
	resume.Resume = filepath.Join(a.Dir, "checkpoints", "step-00000004")
	_, err = Run(context.Background(), res, resume)
	require.NoError(t, err)
	assert.Equal(t, before, snapshot(t, foreign), "another run's checkpoint is not this run's to prune")
	_, err = os.Stat(filepath.Join(a.Dir, "checkpoints", "step-00000004"))
	assert.ErrorIs(t, err, os.ErrNotExist, "the run's own older checkpoint is pruned (keep_last = 1)")
}

// Every field of metadata.json steers a resume (the step, the fingerprints,
// the recipe, the run), and an edit of any was taken as it stood: the step
// changed by hand resumed at the wrong step. The metadata's checksum now
// covers them all.
func TestCheckpointMetadataIsChecksummed(t *testing.T) {
	res, _ := tinyRun(t, ownSets...)
	a, err := Run(context.Background(), res, opts())
	require.NoError(t, err)
	dir := filepath.Join(a.Dir, "checkpoints", "step-00000008")
	path := filepath.Join(dir, ckpt.MetadataFile)
	orig := must(os.ReadFile(path))
	for _, edit := range [][2]string{
		{`"step": 8`, `"step": 6`},
		{`"optimizer_steps": 8`, `"optimizer_steps": 7`},
		{`"run_dir": "`, `"run_dir": "/elsewhere`},
		{`seed = 1234`, `seed = 1235`},
	} {
		t.Run(edit[1], func(t *testing.T) {
			require.True(t, bytes.Contains(orig, []byte(edit[0])), "%s in %s", edit[0], orig)
			require.NoError(t, os.WriteFile(path, bytes.Replace(orig, []byte(edit[0]), []byte(edit[1]), 1), 0o644))
			_, err := ckpt.Open(dir)
			require.ErrorIs(t, err, fileio.ErrCorrupt)
			assert.Contains(t, err.Error(), path)
			assert.True(t, strings.Contains(err.Error(), "checksum"), err.Error())
		})
	}
}

// A run whose checkpoints go to its own checkpoints/ locked only its run
// directory: a second, fresh run given that checkpoints/ as checkpoint.dir
// (--save runs/t/checkpoints) while the first had no complete checkpoint yet
// wrote and committed the same step directories. The second run is now
// refused (the first holds its checkpoint root's lock), and every checkpoint
// there is the first run's and verifies.
func TestSecondRunIntoARunsCheckpointsIsRefused(t *testing.T) {
	res, dir := tinyRun(t, ownSets...)
	root := filepath.Join(dir, "runs", "t", "checkpoints")
	var second error
	started := false
	o := opts()
	o.faults = &faults{rankFile: func(d string, rank int, data []byte) error {
		if !started { // the first run's first save, before its commit: the second run starts now
			started = true
			other, _ := tinyRun(t, append(append([]string(nil), ownSets...), "checkpoint.dir="+root, "run.seed=9")...)
			_, second = Run(context.Background(), other, opts())
		}
		return ckpt.WriteRankFile(d, rank, data)
	}}
	a, err := Run(context.Background(), res, o)
	require.NoError(t, err)
	require.True(t, started)
	require.ErrorIs(t, second, ErrInUse, "the second run into the first run's checkpoint root")
	assert.Contains(t, second.Error(), "checkpoint directory "+root)
	assert.Contains(t, second.Error(), "--save DIR")
	id := runJSON(t, a.Dir)["run_id"]
	es, err := ckpt.List(root)
	require.NoError(t, err)
	require.NotEmpty(t, es)
	for _, e := range es {
		_, err := ckpt.Verify(e.Dir)
		require.NoError(t, err, e.Dir)
		assert.Equal(t, id, ckpt.RunOf(e.Dir), "%s is the first run's", e.Dir)
	}
}

// Taking a lock emptied whatever lock file was there: a hard link to a
// victim file (O_NOFOLLOW stops only symbolic links) was emptied, and so was
// the .lock another tool keeps in a directory given as --save. The lock file
// now has a name of shardline's own, and one with other hard links, or
// holding what shardline did not write, is refused and left as it is.
func TestLockLeavesOtherFilesAlone(t *testing.T) {
	t.Run("another tool's .lock", func(t *testing.T) {
		root := filepath.Join(t.TempDir(), "ckpts")
		require.NoError(t, os.MkdirAll(root, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, ".lock"), []byte("precious 123\n"), 0o644))
		res, _ := tinyRun(t, append(append([]string(nil), ownSets...), "checkpoint.dir="+root)...)
		_, err := Run(context.Background(), res, opts())
		require.NoError(t, err)
		assert.Equal(t, "precious 123\n", string(must(os.ReadFile(filepath.Join(root, ".lock")))))
	})
	t.Run("a hard link to a victim", func(t *testing.T) {
		root := filepath.Join(t.TempDir(), "ckpts")
		require.NoError(t, os.MkdirAll(root, 0o755))
		victim := filepath.Join(t.TempDir(), "victim")
		require.NoError(t, os.WriteFile(victim, []byte(`{"pid":1}`), 0o644))
		require.NoError(t, os.Link(victim, filepath.Join(root, lockName)))
		res, _ := tinyRun(t, append(append([]string(nil), ownSets...), "checkpoint.dir="+root)...)
		_, err := Run(context.Background(), res, opts())
		require.Error(t, err)
		assert.Contains(t, err.Error(), filepath.Join(root, lockName)+" has 2 hard links")
		assert.Equal(t, `{"pid":1}`, string(must(os.ReadFile(victim))), "the file it is linked to is untouched")
	})
	t.Run("a file shardline did not write", func(t *testing.T) {
		root := filepath.Join(t.TempDir(), "ckpts")
		require.NoError(t, os.MkdirAll(root, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, lockName), []byte("precious"), 0o644))
		res, _ := tinyRun(t, append(append([]string(nil), ownSets...), "checkpoint.dir="+root)...)
		_, err := Run(context.Background(), res, opts())
		require.Error(t, err)
		assert.Contains(t, err.Error(), "not a shardline lock record")
		assert.Equal(t, "precious", string(must(os.ReadFile(filepath.Join(root, lockName)))))
	})
}

// TestAutoRetakesOnlyUnfinishedRuns: a new run started by --resume auto
// (AutoResume set, no checkpoint found) takes over run.output_dir/run.name
// only when that is a shardline run that never finished and never
// completed a checkpoint; a finished run, a directory that is not a run, and
// a run another process holds are left as they are (the last refused).
func TestAutoRetakesOnlyUnfinishedRuns(t *testing.T) {
	auto := func(res *config.Resolved) (*Result, error) {
		o := opts()
		o.AutoResume = &AutoResume{Root: filepath.Join(res.Recipe.Run.OutputDir, res.Recipe.Run.Name, "checkpoints")}
		return Run(context.Background(), res, o)
	}
	sets := []string{"train.steps=2", "train.eval_interval=0", "checkpoint.interval=4", "logging.sample_tokens=0"}

	// Unfinished: a run.json without a result, a run.log, no checkpoint.
	res, _ := tinyRun(t, sets...)
	dir := filepath.Join(res.Recipe.Run.OutputDir, res.Recipe.Run.Name)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "checkpoints"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "run.json"), []byte(`{"name":"t","run_id":"dead"}`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "run.log"), []byte("{\"message\":\"the old run's line\"}\n"), 0o644))
	out, err := auto(res)
	require.NoError(t, err)
	assert.Equal(t, dir, out.Dir, "retaken")
	assert.Contains(t, string(must(os.ReadFile(filepath.Join(dir, "run.log")))), "the old run's line", "run.log keeps the old run's lines")
	assert.NotEqual(t, "dead", runJSON(t, dir)["run_id"])

	// Finished (the run above: a result): kept; the new run starts beside it.
	before := snapshot(t, dir)
	again, err := auto(res)
	require.NoError(t, err)
	assert.NotEqual(t, dir, again.Dir)
	assert.Equal(t, before, snapshot(t, dir), "a finished run is left as it was")

	// Not a shardline run directory: kept.
	res, _ = tinyRun(t, sets...)
	dir = filepath.Join(res.Recipe.Run.OutputDir, res.Recipe.Run.Name)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644))
	out, err = auto(res)
	require.NoError(t, err)
	assert.Equal(t, dir+"-2", out.Dir)
	assert.Equal(t, map[string]string{"notes.txt": "mine"}, snapshot(t, dir))

	// Held by another process (its lock): refused, naming it.
	res, _ = tinyRun(t, sets...)
	dir = filepath.Join(res.Recipe.Run.OutputDir, res.Recipe.Run.Name)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "run.json"), []byte(`{"name":"t","run_id":"live"}`), 0o644))
	l, err := lockDir(dir, "run directory")
	require.NoError(t, err)
	defer l.release()
	_, err = auto(res)
	assert.ErrorIs(t, err, ErrInUse)
}
