package trainer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/tensor"
	"github.com/shardline/shardline/trainer/ckpt"
)

// Checkpoints (the format is package ckpt's). Every rank writes the pieces of the
// state it owns: for each plan group it shards, its shard; for a group held whole,
// only the group's rank of index 0 (its replicas hold the same values). Which
// pieces a rank owns is a pure function of the plan (rankPieces), so rank 0 can
// write the metadata of every rank's file, and a run on another world size,
// strategy, expert-, tensor- or context-parallel degree can read exactly the
// ranges it now owns.
//
// A save is asynchronous: the rank copies its pieces into one buffer (the
// snapshot, the only time training waits) and a goroutine writes the file. At the
// start of every later step the ranks' "written" flags travel in the all-reduce
// the step already makes; once every rank's file is written, the ranks exchange
// their checksums and rank 0 commits metadata.json, then prunes to keep_last.

// rankPiece is one piece a rank owns: elements [lo, hi) of its shard of group gi,
// which are elements start … of global parameter param, at byte offset off of the
// rank's file.
type rankPiece struct {
	gi     int
	lo, hi int64
	param  int
	start  int64
	off    int64
}

// rankPieces lists the pieces rank writes, in file order. Under tensor
// parallelism a rank's slice of a parameter is put at its places in the whole
// tensor: one piece per row of a row-parallel slice; a parameter every tp rank
// holds whole is written by tp rank 0 only.
func rankPieces(p *parallel.Plan, rank int) []rankPiece {
	var out []rankPiece
	var off int64
	tpRank, epRank := p.Mesh.Coords(rank).TP, p.Mesh.Coords(rank).EP
	for gi := range p.Groups {
		if p.Groups[gi].Shards == 1 && shardIndex(p, rank, gi) != 0 {
			continue // a replica of what the group's rank of index 0 writes
		}
		lo, hi := shardOf(p, rank, gi)
		for _, sg := range segmentsOf(p, gi, lo, hi, false) {
			par := &p.Params[sg.param]
			if tpRank > 0 && par.TPSplit < 0 {
				continue // replicated over tp: tp rank 0 writes it
			}
			for _, r := range tpRuns(par, sg.start, sg.hi-sg.lo, tpRank) {
				out = append(out, rankPiece{gi: gi, lo: sg.lo + r.local, hi: sg.lo + r.local + r.n, param: p.ExpertParam(sg.param, epRank), start: r.global, off: off})
				off += int64(len(ckpt.States)) * 4 * r.n
			}
		}
	}
	return out
}

// tpRun is n elements that are consecutive both in a rank's slice of a parameter
// (from local, relative to the range asked for) and in the whole parameter (from
// global).
type tpRun struct{ local, global, n int64 }

// tpRuns splits elements [start, start+n) of tensor-parallel rank r's slice of p
// into runs consecutive in the whole parameter: one run unless p is split by
// columns (row-parallel), which gives one per row.
func tpRuns(p *parallel.Param, start, n int64, r int) []tpRun {
	if p.TPSplit != 1 || p.LocalNumel() == p.Numel() {
		return []tpRun{{0, p.GlobalIndex(start, r), n}}
	}
	cols := int64(p.LocalShape[1])
	var out []tpRun
	for i := int64(0); i < n; {
		k := min(cols-(start+i)%cols, n-i)
		out = append(out, tpRun{i, p.GlobalIndex(start+i, r), k})
		i += k
	}
	return out
}

// checkpointer saves one rank's state.
type checkpointer struct {
	root     string // checkpoint.dir, or <run dir>/checkpoints
	interval int
	keep     int
	pending  *pendingSave
	saved    int // the step of the last save started
	// every is checkpoint.interval_minutes (0: none). Rank 0 alone reads its
	// clock (lead): at each step boundary it says whether every has passed
	// since the last save began (since, the time of the boundary before it)
	// or the run started, and the boundary's all-reduce carries that to every
	// rank (timeDue), so that all save after the same step.
	every   time.Duration
	clock   func() time.Time
	lead    bool
	since   time.Time // rank 0: when the last save's step began, or the run did
	checked time.Time // rank 0: the time read at the last boundary
	timeDue bool      // every rank: a save is due after the step now running
}

// timeUp reads rank 0's clock at a step boundary and says whether a
// checkpoint is due by time (false on the other ranks, and without
// interval_minutes).
func (c *checkpointer) timeUp() bool {
	if c == nil || c.every <= 0 || !c.lead {
		return false
	}
	c.checked = c.clock()
	return c.checked.Sub(c.since) >= c.every
}

// pendingSave is a save whose file is being written or waits for the commit.
type pendingSave struct {
	step, optSteps int
	dir            string
	crcs           []uint32         // this rank's checksums, per piece and state kind
	fp8            *ckpt.FP8Scaling // rank 0's: delayed FP8 scaling's state (nil without)
	done           chan error
	finished       bool
	err            error
	blocked        time.Duration
}

// poll reports whether the pending save's file is written, without waiting.
func (p *pendingSave) poll() {
	if p.finished {
		return
	}
	select {
	case p.err = <-p.done:
		p.finished = true
	default:
	}
}

// wait blocks until the pending save's file is written.
func (p *pendingSave) wait() {
	if !p.finished {
		p.err = <-p.done
		p.finished = true
	}
}

// waitSave waits for the background write of a pending save, if any (its
// error is the commit's to report; a run ending without the commit leaves an
// incomplete checkpoint, which a resume never takes).
func (t *run) waitSave() {
	if t.ckpt != nil && t.ckpt.pending != nil {
		t.ckpt.pending.wait()
	}
}

// startSave snapshots this rank's pieces and writes them in the background.
func (t *run) startSave(step, optSteps int) {
	c := t.ckpt
	t0 := time.Now()
	pieces := rankPieces(t.plan, t.rank)
	var n int64
	for _, rp := range pieces {
		n += int64(len(ckpt.States)) * 4 * (rp.hi - rp.lo)
	}
	data := make([]byte, 0, n)
	crcs := make([]uint32, 0, len(pieces)*len(ckpt.States))
	var host []float32 // each piece, read back from the backend (a checkpoint's read-backs)
	st := t.st
	for _, rp := range pieces {
		lo, hi := int(rp.lo), int(rp.hi)
		host = slices.Grow(host[:0], hi-lo)[:hi-lo]
		for _, buf := range []tensor.Buffer{st.mainB[rp.gi], st.mB[rp.gi], st.vB[rp.gi]} {
			st.mem.Read(host, buf.Slice(lo, hi))
			at := len(data)
			data = fileio.AppendFloat32s(data, host)
			crcs = append(crcs, ckpt.Checksum(data[at:]))
		}
	}
	var fp8 *ckpt.FP8Scaling
	if t.rank == 0 {
		fp8 = t.fp8Snapshot() // every rank holds the same: rank 0's goes in the metadata
	}
	if err := st.mem.Err(); err != nil {
		p := &pendingSave{step: step, optSteps: optSteps, dir: ckpt.StepDir(c.root, step), finished: true, err: err}
		c.pending, c.saved = p, step
		c.restartClock()
		return
	}
	p := &pendingSave{step: step, optSteps: optSteps, dir: ckpt.StepDir(c.root, step), crcs: crcs, fp8: fp8, done: make(chan error, 1)}
	own := t.opts.own // rank 0's
	if len(pieces) == 0 && own == nil {
		p.finished = true
	} else {
		go func() {
			if own != nil {
				// The save is this run's: Prune may remove it if it never completes.
				if err := ckpt.Claim(p.dir, own.runID); err != nil {
					p.done <- err
					return
				}
			}
			if len(pieces) == 0 {
				p.done <- nil
				return
			}
			p.done <- t.opts.faults.writeRankFile(p.dir, t.rank, data)
		}()
	}
	p.blocked = time.Since(t0)
	c.pending, c.saved = p, step
	c.restartClock()
}

// restartClock starts the time to the next save by time from the boundary
// before the step just saved.
func (c *checkpointer) restartClock() {
	c.timeDue = false
	if c.lead && c.every > 0 {
		c.since = c.checked
	}
}

// commitSave finishes the pending save: every rank's checksums go to rank 0,
// which writes metadata.json and prunes old checkpoints. Every rank calls it, once
// every rank's file is written.
func (t *run) commitSave(world comm.Communicator) error {
	p := t.ckpt.pending
	t.ckpt.pending = nil
	// Checksums travel as float32 halves (16 bits each, exact), padded to the
	// longest rank's list.
	per := make([][]rankPiece, world.Size())
	longest := 0
	for r := range per {
		per[r] = rankPieces(t.plan, r)
		longest = max(longest, len(per[r])*len(ckpt.States))
	}
	mine := make([]float32, 2*longest)
	for i, v := range p.crcs {
		mine[2*i], mine[2*i+1] = float32(v>>16), float32(v&0xffff)
	}
	all := make([]float32, world.Size()*len(mine))
	if err := world.AllGather(all, mine); err != nil {
		return fmt.Errorf("checkpoint of step %d: exchanging checksums: %w", p.step, err)
	}
	if t.rank != 0 {
		return nil
	}
	runDir, err := filepath.Abs(t.dir) // resumable from any working directory
	if err != nil {
		return err
	}
	meta := &ckpt.Meta{Step: p.step, OptimizerSteps: p.optSteps, PlanFingerprint: t.plan.Fingerprint, WorldSize: t.plan.Mesh.World,
		Strategy: t.plan.Strategy, ExpertParallel: t.plan.Mesh.EP, RunDir: runDir, RunID: t.opts.own.runID, SaveBlockedS: p.blocked.Seconds(), FP8: p.fp8}
	meta.RecipeFingerprint, _ = config.Fingerprint(t.r)
	meta.DataFingerprint = t.ds.Fingerprint()
	resolved, _, err := config.ResolvedTOML(t.r)
	if err != nil {
		return err
	}
	meta.ResolvedRecipe = string(resolved)
	for i := range t.plan.Params {
		meta.Tensors = append(meta.Tensors, ckpt.Tensor{Name: t.plan.Params[i].Name, Shape: t.plan.Params[i].Shape, Dtype: "fp32"})
	}
	for r, pieces := range per {
		theirs := all[r*len(mine) : (r+1)*len(mine)]
		var size int64
		for i, rp := range pieces {
			crc := make([]string, len(ckpt.States))
			for k := range crc {
				j := i*len(ckpt.States) + k
				crc[k] = ckpt.FormatSum(uint32(theirs[2*j])<<16 | uint32(theirs[2*j+1]))
			}
			count := rp.hi - rp.lo
			tn := &meta.Tensors[rp.param]
			tn.Pieces = append(tn.Pieces, ckpt.Piece{Start: rp.start, Count: count, File: ckpt.RankFile(r), Offset: rp.off, CRC: crc})
			size = rp.off + int64(len(ckpt.States))*4*count
		}
		if len(pieces) > 0 {
			meta.Files = append(meta.Files, ckpt.File{Name: ckpt.RankFile(r), Size: size})
		}
	}
	if err := ckpt.Commit(p.dir, meta); err != nil {
		return err
	}
	t.log.Info().Int("step", p.step).Str("dir", p.dir).Float64("blocked_ms", round4(p.blocked.Seconds()*1e3)).Msg("checkpoint saved")
	// An old checkpoint that cannot be removed costs disk space, not the run.
	for _, err := range ckpt.PruneWith(t.ckpt.root, t.ckpt.keep, t.opts.own.runID, t.opts.faults.removeAll()) {
		t.log.Warn().Err(err).Int("keep_last", t.ckpt.keep).Msg("an old checkpoint was not pruned; the run goes on (remove it by hand)")
	}
	return nil
}

// finishSave waits for the pending save's file and commits it (every rank).
func (t *run) finishSave(world comm.Communicator) error {
	if t.ckpt == nil || t.ckpt.pending == nil {
		return nil
	}
	p := t.ckpt.pending
	p.wait()
	failed := []float32{0}
	if p.err != nil {
		failed[0] = 1
	}
	if err := world.AllReduce(failed); err != nil {
		return err
	}
	if failed[0] > 0 {
		t.ckpt.pending = nil
		return saveFailed(p)
	}
	return t.commitSave(world)
}

func saveFailed(p *pendingSave) error {
	if p.err != nil {
		return fmt.Errorf("writing the checkpoint of step %d: %w", p.step, p.err)
	}
	return fmt.Errorf("writing the checkpoint of step %d %w (its log says why)", p.step, ErrOtherRank)
}

// ErrOtherRank is a rank's report that another rank failed (its checkpoint
// write, say): that rank's own error explains the run's end, where there is
// one. A job's rank that ends with it exits as one that lost another rank.
var ErrOtherRank = errors.New("failed on another rank")

// load fills this rank's shards of the main weights and optimizer moments from a
// checkpoint, reading only the pieces that overlap what it owns now, then
// gathers the compute weights.
func (s *state) load(rd *ckpt.Reader) error {
	var host []float32 // each piece, read from the file, then written to the backend
	for gi := range s.plan.Groups {
		for _, sg := range s.segs[gi] {
			name := s.plan.Params[s.global(sg.param)].Name
			for _, r := range tpRuns(&s.plan.Params[sg.param], sg.start, sg.hi-sg.lo, s.tpRank) {
				lo, hi := int(sg.lo+r.local), int(sg.lo+r.local+r.n)
				host = slices.Grow(host[:0], hi-lo)[:hi-lo]
				for k, dst := range []tensor.Buffer{s.mainB[gi], s.mB[gi], s.vB[gi]} {
					if err := rd.Read(name, k, r.global, host); err != nil {
						return err
					}
					s.mem.Write(dst.Slice(lo, hi), host)
				}
			}
		}
	}
	if err := s.mem.Err(); err != nil {
		return err
	}
	return s.gather()
}

// checkResumable refuses a checkpoint whose tensors are not the plan's model, or
// whose run differs from the recipe in what decides the training trajectory
// (the model, the data's tokens, the seed, the global batch and the optimizer).
// The parallel layout may differ: the state is resharded on load. The data is
// compared by its tokens' fingerprint, so it may move to another path.
func checkResumable(dir string, m *ckpt.Meta, p *parallel.Plan, r *config.Recipe, dataFP string) error {
	if m.DataFingerprint != dataFP {
		return config.ValueProblem("data.path", r.Data.Path, fmt.Errorf("its tokens (%s) are not those the checkpoint in %s was trained on (%s)", dataFP, dir, m.DataFingerprint), "point data.path at the data the run was trained on")
	}
	saved, diags := config.LoadBytes(filepath.Join(dir, "metadata.json#resolved_recipe"), []byte(m.ResolvedRecipe), config.Options{})
	if diags.HasErrors() {
		return fmt.Errorf("checkpoint %s: its resolved recipe does not load: %v", dir, diags.Err())
	}
	for _, f := range config.RecipeSchema().Fields {
		if !trajectoryKey(f.Key) {
			continue
		}
		was, _ := saved.Value(f.Key)
		now := f.Get(r)
		if config.FormatValue(was) != config.FormatValue(now) {
			return config.ValueProblem(f.Key, now, fmt.Errorf("the checkpoint in %s was trained with %s", dir, config.FormatValue(was)), "resume with the recipe the checkpoint was saved with (only parallel, fsdp, logging and the number of steps may change)")
		}
	}
	// The recipes agree on every model key, so the tensors should too: a
	// mismatch here is a checkpoint whose table disagrees with its own recipe.
	const fix = "the checkpoint's tensor table does not match the recipe it records; check it with shardline ckpt verify, or resume from another checkpoint"
	if len(m.Tensors) != len(p.Params) {
		return fmt.Errorf("checkpoint %s holds %d tensors, the recipe's model has %d: %s", dir, len(m.Tensors), len(p.Params), fix)
	}
	for i := range p.Params {
		a, b := &m.Tensors[i], &p.Params[i]
		if a.Name != b.Name || fmt.Sprint(a.Shape) != fmt.Sprint(b.Shape) {
			return fmt.Errorf("checkpoint %s: tensor %d is %s %v, the recipe's model has %s %v: %s", dir, i, a.Name, a.Shape, b.Name, b.Shape, fix)
		}
	}
	return nil
}

// trajectoryKey says whether a recipe key decides what a resumed run computes.
func trajectoryKey(key string) bool {
	for _, prefix := range []string{"model.", "data.tokenizer", "data.val_fraction", "run.seed", "train.global_batch_size", "train.optimizer", "train.beta", "train.eps", "train.weight_decay", "train.decay_norms", "train.clip_grad", "train.lr", "train.warmup_steps", "train.min_lr_factor", "precision."} {
		if len(key) >= len(prefix) && key[:len(prefix)] == prefix {
			return true
		}
	}
	return false
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// maxShared bounds what shareString takes from rank 0: a path (Linux's
// PATH_MAX is 4096 bytes).
const maxShared = 1 << 16

// shareString gives every rank rank 0's s (a path, bytes as exact float32s),
// refusing a length above maxShared before anything is allocated for it.
func shareString(world comm.Communicator, s string) (string, error) {
	if len(s) > maxShared {
		return "", fmt.Errorf("sharing %q: %d bytes, at most %d", s[:64], len(s), maxShared)
	}
	n := []float32{float32(len(s))}
	if err := world.Broadcast(n, 0); err != nil {
		return "", err
	}
	if n[0] < 0 || n[0] > maxShared || n[0] != float32(int(n[0])) {
		return "", fmt.Errorf("rank 0 announced a path of %v bytes; at most %d are taken", n[0], maxShared)
	}
	buf := make([]float32, int(n[0]))
	for i := range buf {
		if i < len(s) {
			buf[i] = float32(s[i])
		}
	}
	if err := world.Broadcast(buf, 0); err != nil {
		return "", err
	}
	b := make([]byte, len(buf))
	for i, v := range buf {
		b[i] = byte(v)
	}
	return string(b), nil
}

// openMetrics opens metrics.jsonl for the steps after startStep: a new file, or,
// when resuming, the run's file cut back to the checkpoint's step (its records
// become the start of the loss curve). A branched run (a new run directory)
// starts from the records of the run its checkpoint belongs to, when known;
// that run's file is only read.
func (t *run) openMetrics(startStep int) (*os.File, error) {
	path := filepath.Join(t.dir, "metrics.jsonl")
	if startStep == 0 {
		if err := fileio.WriteAtomic(path, nil); err != nil {
			return nil, err
		}
		return t.openEventsAfter(fileio.OpenAppend(path))
	}
	from := path
	if o := t.opts.own; o != nil && !o.inPlace {
		from = o.history
	}
	var kept []byte
	if b, err := fileio.ReadRegular(from, 1<<30); from != "" && err == nil {
		for _, line := range bytes.Split(b, []byte("\n")) {
			var m Metrics
			if len(line) == 0 || json.Unmarshal(line, &m) != nil || m.Step > startStep {
				continue
			}
			t.curve = append(t.curve, m)
			kept = append(append(kept, line...), '\n')
		}
	}
	if err := fileio.WriteAtomic(path, kept); err != nil {
		return nil, err
	}
	return t.openEventsAfter(fileio.OpenAppend(path)) // never through a link
}

// openEventsAfter opens the event file (openEvents) once metrics.jsonl is
// open (f, err), closing f again if the events cannot be written.
func (t *run) openEventsAfter(f *os.File, err error) (*os.File, error) {
	if err != nil {
		return nil, err
	}
	if err := t.openEvents(); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
