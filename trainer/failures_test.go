package trainer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shardline/shardline/trainer/ckpt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Tests that every way a run ends is written down (issue #46, class 2): a
// disk-full error, a lost rank or a failed prune left run.json with neither
// result nor failure, and run.log silent.

// logEvents is a run directory's run.log, one map per JSON line.
func logEvents(t *testing.T, dir string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(must(os.ReadFile(filepath.Join(dir, "run.log")))), []byte("\n")) {
		var m map[string]any
		require.NoError(t, json.Unmarshal(line, &m), "%s", line)
		out = append(out, m)
	}
	return out
}

// assertFailureRecorded checks that the run in dir records err: run.json's
// failure holds it (and there is no result), and run.log's last event is an
// error holding it.
func assertFailureRecorded(t *testing.T, dir string, err error, want string) {
	t.Helper()
	require.Error(t, err)
	assert.Contains(t, err.Error(), want)
	info := runJSON(t, dir)
	assert.Nil(t, info["result"], "a failed run has no result")
	assert.Contains(t, info["failure"], want, "run.json says how the run ended")
	ev := logEvents(t, dir)
	last := ev[len(ev)-1]
	assert.Equal(t, "error", last["level"], "run.log ends with why")
	assert.Contains(t, last["error"], want)
}

// A disk that fills up under a checkpoint's write (ENOSPC from the rank
// file's write, as the kernel reports it) ends the run, recorded.
func TestFullDiskIsRecorded(t *testing.T) {
	res, dir := tinyRun(t, "train.steps=8", "train.eval_interval=0", "checkpoint.interval=2", "parallel.world_size=2")
	o := opts()
	o.faults = &faults{rankFile: func(dir string, rank int, data []byte) error {
		if rank == 1 && filepath.Base(dir) == "step-00000004" {
			return &os.PathError{Op: "write", Path: filepath.Join(dir, ckpt.RankFile(rank)), Err: syscall.ENOSPC}
		}
		return ckpt.WriteRankFile(dir, rank, data)
	}}
	_, err := Run(context.Background(), res, o)
	assert.ErrorIs(t, err, syscall.ENOSPC)
	assertFailureRecorded(t, filepath.Join(dir, "runs", "t"), err, "no space left on device")
}

// A real full disk under the checkpoints: checkpoint.dir on a 128 KiB tmpfs,
// too small for the first checkpoint (about 270 KB), where a test may mount
// one (as root); TestFullDiskIsRecorded injects the same error everywhere.
func TestFullCheckpointDiskIsRecorded(t *testing.T) {
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=128k"); err != nil {
		t.Skipf("cannot mount a small tmpfs here (%v)", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, 0) })
	res, dir := tinyRun(t, "train.steps=8", "train.eval_interval=0", "checkpoint.interval=2", "checkpoint.dir="+filepath.Join(mnt, "ckpts"))
	_, err := Run(context.Background(), res, opts())
	assert.ErrorIs(t, err, syscall.ENOSPC)
	assertFailureRecorded(t, filepath.Join(dir, "runs", "t"), err, "no space left on device")
	es, err := ckpt.List(filepath.Join(mnt, "ckpts"))
	require.NoError(t, err)
	for _, e := range es {
		assert.False(t, e.Complete, "no checkpoint is complete: %s", e.Dir)
	}
}

// A real full disk at the end: the run's trace goes to a small tmpfs that
// is already full, after the run has written its outputs. (Outputs are
// written only over regular files, so /dev/full, whose writes fail with
// ENOSPC, is refused before any write: fileio.ErrLink's sibling check.)
func TestFullDiskAtTheEndIsRecorded(t *testing.T) {
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=64k"); err != nil {
		t.Skipf("cannot mount a small tmpfs here (%v)", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, 0) })
	f, err := os.Create(filepath.Join(mnt, "filler"))
	require.NoError(t, err)
	for err == nil {
		_, err = f.Write(make([]byte, 4096))
	}
	require.ErrorIs(t, err, syscall.ENOSPC, "the tmpfs is full")
	require.NoError(t, f.Close())
	res, dir := tinyRun(t, "train.steps=2", "train.eval_interval=0")
	o := opts()
	o.TracePath = filepath.Join(mnt, "trace.json")
	_, err = Run(context.Background(), res, o)
	assertFailureAfterResult(t, filepath.Join(dir, "runs", "t"), err, "no space left on device")
}

// assertFailureAfterResult checks that the run in dir, which failed with err
// after it wrote its result, records both: run.json's result as the run wrote
// it and the failure beside it; run.log ends with the error.
func assertFailureAfterResult(t *testing.T, dir string, err error, want string) {
	t.Helper()
	require.Error(t, err)
	assert.Contains(t, err.Error(), want)
	info := runJSON(t, dir)
	require.NotNil(t, info["result"], "the result the run wrote is kept")
	assert.EqualValues(t, 2, info["result"].(map[string]any)["steps"])
	assert.NotNil(t, info["memory"])
	assert.Contains(t, info["failure"], want, "and the failure is beside it")
	ev := logEvents(t, dir)
	last := ev[len(ev)-1]
	assert.Equal(t, "error", last["level"])
	assert.Contains(t, last["error"], want)
	assert.Contains(t, last["message"], "keeps the result")
}

// A failure after the run wrote run.json's result (here the trace's write,
// into a path under a regular file) replaced run.json with only the failure:
// the result of a run that trained to its end was lost. Both are kept.
func TestFailureAfterTheResultKeepsIt(t *testing.T) {
	res, dir := tinyRun(t, "train.steps=2", "train.eval_interval=0")
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	o := opts()
	o.TracePath = filepath.Join(file, "trace.json")
	_, err := Run(context.Background(), res, o)
	assertFailureAfterResult(t, filepath.Join(dir, "runs", "t"), err, "writing the trace")
}

// A rank lost in the middle of a run (here rank 1 of 2 in-process ranks,
// failing before step 3) ends the run, recorded with the lost rank's reason
// rather than the others' "world aborted".
func TestLostRankIsRecorded(t *testing.T) {
	res, dir := tinyRun(t, "train.steps=8", "train.eval_interval=0", "parallel.world_size=2")
	o := opts()
	o.faults = &faults{lose: func(rank, step int) error {
		if rank == 1 && step == 3 {
			return errors.New("lost: its machine went away")
		}
		return nil
	}}
	_, err := Run(context.Background(), res, o)
	assertFailureRecorded(t, filepath.Join(dir, "runs", "t"), err, "rank 1: lost: its machine went away")
}

// A checkpoint that keep_last cannot remove is a warning in run.log, and the
// run ends well: run.json has its result, the checkpoint stays.
func TestFailedPruneIsAWarning(t *testing.T) {
	res, _ := tinyRun(t, "train.steps=6", "train.eval_interval=0", "checkpoint.interval=2", "checkpoint.keep_last=1")
	o := opts()
	o.faults = &faults{remove: func(path string) error {
		if filepath.Base(path) == "step-00000002" {
			return &os.PathError{Op: "unlinkat", Path: filepath.Join(path, ckpt.RankFile(0)), Err: syscall.EPERM}
		}
		return os.RemoveAll(path)
	}}
	out, err := Run(context.Background(), res, o)
	require.NoError(t, err)
	info := runJSON(t, out.Dir)
	assert.NotNil(t, info["result"])
	assert.Nil(t, info["failure"])
	es, err := ckpt.List(filepath.Join(out.Dir, "checkpoints"))
	require.NoError(t, err)
	var steps []int
	for _, e := range es {
		steps = append(steps, e.Step)
	}
	assert.Equal(t, []int{2, 6}, steps, "step 2 could not be removed, step 4 was")
	var warned bool
	for _, ev := range logEvents(t, out.Dir) {
		msg, _ := ev["error"].(string) // other warnings carry no error (the step time against the plan)
		if ev["level"] == "warn" && strings.Contains(msg, "step-00000002") {
			warned = true
			assert.Contains(t, ev["message"], "not pruned")
		}
	}
	assert.True(t, warned, "run.log warns of the checkpoint it could not prune")
}

// A resume that fails before it changes its run directory (here: a rank
// file damaged since the save) leaves run.json saying how the run last
// ended, and says why in run.log.
func TestFailedResumeLeavesTheRunAsItWas(t *testing.T) {
	res, _ := tinyRun(t, "train.steps=4", "train.eval_interval=0", "checkpoint.interval=2")
	o := opts()
	o.StopAfter = 2
	a, err := Run(context.Background(), res, o)
	require.NoError(t, err)
	step2 := filepath.Join(a.Dir, "checkpoints", "step-00000002")
	f := filepath.Join(step2, ckpt.RankFile(0))
	b := must(os.ReadFile(f))
	b[len(b)/2] ^= 1
	require.NoError(t, os.WriteFile(f, b, 0o644))
	before := snapshot(t, a.Dir)
	o = opts()
	o.Resume = step2
	_, err = Run(context.Background(), res, o)
	require.Error(t, err)
	after := snapshot(t, a.Dir)
	for _, name := range []string{"run.json", "metrics.jsonl", "weights.bin", "resolved.toml"} {
		assert.Equal(t, before[name], after[name], name)
	}
	ev := logEvents(t, a.Dir)
	assert.Equal(t, "error", ev[len(ev)-1]["level"])
	assert.Contains(t, ev[len(ev)-1]["error"], "checksum")
}

// A run that failed while a checkpoint was still being written in the
// background returned, and Run released the run directory's locks, while the
// write went on. train now waits for a pending save on every return: here
// rank 0 is lost at the step after the save of step 4 started, whose write
// takes half a second, and the write is over when Run returns.
func TestFailureWaitsForThePendingSave(t *testing.T) {
	res, dir := tinyRun(t, "train.steps=8", "train.eval_interval=0", "checkpoint.interval=4")
	var written atomic.Bool
	o := opts()
	o.faults = &faults{
		rankFile: func(d string, rank int, data []byte) error {
			time.Sleep(500 * time.Millisecond)
			err := ckpt.WriteRankFile(d, rank, data)
			written.Store(true)
			return err
		},
		lose: func(rank, step int) error {
			if step == 4 {
				return errors.New("lost: its machine went away")
			}
			return nil
		},
	}
	_, err := Run(context.Background(), res, o)
	assertFailureRecorded(t, filepath.Join(dir, "runs", "t"), err, "lost: its machine went away")
	assert.True(t, written.Load(), "the checkpoint's write ended before Run returned (and released the run directory)")
}

// A single process interrupted during start-up (Ctrl-C while the data was
// opened or the state built) still wrote a whole run directory (a step-0
// checkpoint, weights.bin, loss.png, a sample) and reported an interrupted
// run, though an interrupt before training writes nothing. Run now returns
// ErrInterrupted having written nothing: no run directory for a new run, and a
// resumed run's directory as it was.
func TestInterruptDuringStartUpWritesNothing(t *testing.T) {
	sets := []string{"train.steps=4", "train.eval_interval=0", "checkpoint.interval=2"}
	for _, phase := range []string{"before Run", "data", "state"} {
		t.Run(phase, func(t *testing.T) {
			res, dir := tinyRun(t, sets...)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			o := opts()
			if phase == "before Run" {
				cancel()
			} else {
				o.faults = &faults{phase: func(name string) {
					if name == phase {
						cancel()
					}
				}}
			}
			_, err := Run(ctx, res, o)
			require.ErrorIs(t, err, ErrInterrupted)
			assert.NoDirExists(t, filepath.Join(dir, "runs", "t"), "no run directory")
		})
	}
	t.Run("a resume, in state", func(t *testing.T) {
		res, _ := tinyRun(t, sets...)
		o := opts()
		o.StopAfter = 2
		a, err := Run(context.Background(), res, o)
		require.NoError(t, err)
		before := snapshot(t, a.Dir)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		o = opts()
		o.Resume = filepath.Join(a.Dir, "checkpoints", "step-00000002")
		o.faults = &faults{phase: func(name string) {
			if name == "state" {
				cancel()
			}
		}}
		_, err = Run(ctx, res, o)
		require.ErrorIs(t, err, ErrInterrupted)
		assert.Equal(t, before, snapshot(t, a.Dir), "the resumed run's directory is as it was")
	})
}
