package ckpt

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/shardline/shardline/fileio"
)

// Format names this layout in metadata.json. Version 2 added the run id and
// the metadata's own checksum; a version 1 checkpoint is refused (formatV1).
const Format = "shardline-checkpoint-v2"

// formatV1 is the layout before metadata.json had a run id and a checksum.
const formatV1 = "shardline-checkpoint-v1"

// OwnerFile, in a checkpoint directory, holds the id of the run that started
// the save (rank 0 writes it before its rank file): an unfinished save is
// pruned only by its own run.
const OwnerFile = "owner"

// MetadataFile is the file whose presence makes a checkpoint complete.
const MetadataFile = "metadata.json"

// States are the state kinds every piece holds, in order: the fp32 main weights
// and the optimizer's two moment buffers (for SGD, the momentum buffer and zeros).
var States = []string{"main", "exp_avg", "exp_avg_sq"}

// Meta is metadata.json.
type Meta struct {
	Format            string `json:"format"`
	Step              int    `json:"step"`            // optimizer steps the run had taken
	OptimizerSteps    int    `json:"optimizer_steps"` // steps that updated the weights (skipped ones excluded)
	RecipeFingerprint string `json:"recipe_fingerprint"`
	PlanFingerprint   string `json:"plan_fingerprint"`
	DataFingerprint   string `json:"data_fingerprint"` // the training and validation tokens
	WorldSize         int    `json:"world_size"`
	Strategy          string `json:"strategy"`
	ExpertParallel    int    `json:"expert_parallel"`
	RunDir            string `json:"run_dir"` // the run directory that wrote it (a record, never where a resume writes)
	// RunID is the id of the run that wrote it (run.json's run_id): a run prunes
	// only checkpoints bearing its own.
	RunID          string   `json:"run_id"`
	ResolvedRecipe string   `json:"resolved_recipe"`
	States         []string `json:"states"`
	Tensors        []Tensor `json:"tensors"`
	Files          []File   `json:"files"`
	// FP8 is the run's delayed FP8 scaling (precision.fp8.recipe =
	// "delayed"): every FP8 tensor's scale and amax history, which every
	// rank holds alike, so that a resume on any world size continues them;
	// absent without delayed scaling.
	FP8 *FP8Scaling `json:"fp8_scaling,omitempty"`
	// SaveBlockedS is how long the save held training up (the snapshot); the rest
	// of the writing ran beside the steps that followed.
	SaveBlockedS float64 `json:"save_blocked_s"`
	// Checksum is the CRC-32C (hex) of metadata.json as Commit marshals it with
	// this field empty: every field above, each of which steers a resume, is
	// covered.
	Checksum string `json:"checksum"`
}

// checksum is m's Checksum: the CRC-32C of m marshalled with Checksum empty.
func (m *Meta) checksum() (string, error) {
	c := *m
	c.Checksum = ""
	b, err := json.Marshal(&c)
	if err != nil {
		return "", err
	}
	return Sum(b), nil
}

// FP8Scaling is delayed FP8 scaling's state between steps (trainer/model's
// FP8Scaling): Tensors scales and History rows of Tensors amaxes (row j the
// amaxes of j steps ago), float32 values as their little-endian bits (a
// history may hold a NaN amax, which JSON numbers cannot).
type FP8Scaling struct {
	Tensors int    `json:"tensors"`
	History int    `json:"history"`
	Scales  []byte `json:"scales"`
	Amaxes  []byte `json:"amax_history"`
}

// NewFP8Scaling is the state of n tensors' scales and their amax history
// (len(history)/n rows).
func NewFP8Scaling(scales, history []float32) *FP8Scaling {
	f := &FP8Scaling{Tensors: len(scales), Scales: fileio.AppendFloat32s(nil, scales), Amaxes: fileio.AppendFloat32s(nil, history)}
	if len(scales) > 0 {
		f.History = len(history) / len(scales)
	}
	return f
}

// Values decodes the scales and the history.
func (f *FP8Scaling) Values() (scales, history []float32) {
	scales, history = make([]float32, len(f.Scales)/4), make([]float32, len(f.Amaxes)/4)
	for i := range scales {
		scales[i] = math.Float32frombits(binary.LittleEndian.Uint32(f.Scales[4*i:]))
	}
	for i := range history {
		history[i] = math.Float32frombits(binary.LittleEndian.Uint32(f.Amaxes[4*i:]))
	}
	return scales, history
}

// check says whether the state's lengths agree with its counts.
func (f *FP8Scaling) check() error {
	if f.Tensors < 1 || f.History < 1 || len(f.Scales) != 4*f.Tensors || int64(len(f.Amaxes)) != 4*int64(f.Tensors)*int64(f.History) {
		return fmt.Errorf("%w: fp8_scaling holds %d bytes of scales and %d of amax history for %d tensors of %d steps (want %d and %d)",
			fileio.ErrCorrupt, len(f.Scales), len(f.Amaxes), f.Tensors, f.History, 4*f.Tensors, 4*int64(f.Tensors)*int64(f.History))
	}
	return nil
}

// Tensor is one parameter: its global shape and the pieces that hold it.
type Tensor struct {
	Name   string  `json:"name"`
	Shape  []int   `json:"shape"`
	Dtype  string  `json:"dtype"`
	Pieces []Piece `json:"pieces"`
}

// Numel is the tensor's element count.
func (t *Tensor) Numel() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= int64(d)
	}
	return n
}

// numel is the element count of shape, false when more elements than a file
// can hold (a float32 per state kind each, in at most math.MaxInt64 bytes): such
// a table is corrupt.
func numel(shape []int) (int64, bool) {
	most := int64(math.MaxInt64) / int64(4*len(States))
	n := int64(1)
	for _, d := range shape {
		if d == 0 {
			return 0, true
		}
	}
	for _, d := range shape {
		if int64(d) > most/n {
			return 0, false
		}
		n *= int64(d)
	}
	return n, true
}

// Piece is elements [Start, Start+Count) of a tensor, stored in File at byte
// Offset: Count float32 values per state kind, kinds in States order, each with
// the CRC-32C in CRC (hex, one per kind).
type Piece struct {
	Start  int64    `json:"start"`
	Count  int64    `json:"count"`
	File   string   `json:"file"`
	Offset int64    `json:"offset"`
	CRC    []string `json:"crc32c"`
}

// File is one rank file and its size in bytes.
type File struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

// RankFile names rank r's file.
func RankFile(rank int) string { return fmt.Sprintf("rank-%05d.bin", rank) }

// StepDir names the checkpoint of a step under root.
func StepDir(root string, step int) string {
	return filepath.Join(root, fmt.Sprintf("step-%08d", step))
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the CRC-32C of one kind of one piece.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// Sum is Checksum as metadata.json writes it (8 hex digits).
func Sum(b []byte) string { return FormatSum(Checksum(b)) }

// FormatSum writes a checksum as metadata.json does.
func FormatSum(c uint32) string { return fmt.Sprintf("%08x", c) }

// ErrCommitted is a save into a checkpoint directory that is already
// complete: a save never replaces a checkpoint.
var ErrCommitted = errors.New("a complete checkpoint is already there (a save never replaces one)")

// WriteRankFile writes one rank's pieces, atomically, into the checkpoint
// directory dir, making it if missing, when it is not complete (ErrCommitted
// otherwise). A dir that is a symbolic link is refused (fileio.ErrLink): a
// checkpoint is written into no directory elsewhere.
func WriteRankFile(dir string, rank int, data []byte) error {
	if err := makeStepDir(dir); err != nil {
		return err
	}
	if _, err := os.Lstat(filepath.Join(dir, MetadataFile)); err == nil {
		return fmt.Errorf("%s: %w", dir, ErrCommitted)
	}
	return fileio.WriteAtomic(filepath.Join(dir, RankFile(rank)), data)
}

// makeStepDir makes a checkpoint directory if missing, refusing one that is
// a symbolic link (fileio.ErrLink).
func makeStepDir(dir string) error {
	if st, err := os.Lstat(dir); err == nil && st.Mode()&fs.ModeSymlink != 0 {
		target, _ := os.Readlink(dir)
		return &fs.PathError{Op: "write", Path: dir, Err: fmt.Errorf("%w: a symbolic link to %q, where a checkpoint directory goes (remove the link)", fileio.ErrLink, target)}
	}
	return os.MkdirAll(dir, 0o755)
}

// Claim marks dir as a save the run runID started (OwnerFile), creating it
// (never through a link: makeStepDir).
func Claim(dir, runID string) error {
	if err := makeStepDir(dir); err != nil {
		return err
	}
	if _, err := os.Lstat(filepath.Join(dir, MetadataFile)); err == nil {
		return fmt.Errorf("%s: %w", dir, ErrCommitted)
	}
	return fileio.WriteAtomic(filepath.Join(dir, OwnerFile), []byte(runID+"\n"))
}

// Commit checks m and writes metadata.json into dir, last: from then on the
// checkpoint exists. A dir that already holds a metadata.json is refused
// (ErrCommitted), atomically (fileio.WriteNew): of two runs committing one
// directory, one fails, and a complete checkpoint is never replaced.
func Commit(dir string, m *Meta) error {
	m.Format = Format
	if m.States == nil {
		m.States = States
	}
	if m.RunID == "" {
		return fmt.Errorf("checkpoint %s not committed: no run id", dir)
	}
	if err := m.check(dir); err != nil {
		return fmt.Errorf("checkpoint %s not committed: %w", dir, err)
	}
	sum, err := m.checksum()
	if err != nil {
		return err
	}
	m.Checksum = sum
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := fileio.WriteNew(filepath.Join(dir, MetadataFile), append(b, '\n')); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("checkpoint %s not committed: %w; another run wrote this step directory (give each run a checkpoint directory of its own)", dir, ErrCommitted)
		}
		return err
	}
	return nil
}

// maxMetadata caps metadata.json as read: a table of 2^20 tensors and their
// pieces fits.
const maxMetadata = 1 << 30

// Open reads and checks a checkpoint's metadata: the format, every file's
// presence and size, that the pieces of every tensor cover it exactly once,
// and the metadata's checksum.
func Open(dir string) (*Meta, error) {
	b, err := fileio.ReadRegular(filepath.Join(dir, MetadataFile), maxMetadata)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s is not a complete checkpoint: no %s (a save that did not finish, or not a checkpoint directory)", dir, MetadataFile)
		}
		return nil, err
	}
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, MetadataFile), err)
	}
	path := filepath.Join(dir, MetadataFile)
	switch {
	case m.Format == formatV1:
		return nil, fmt.Errorf("%s: format %q has no checksum of its metadata or run id, this shardline reads %q; resume it with the shardline that wrote it, or train afresh", path, m.Format, Format)
	case m.Format != Format:
		return nil, fmt.Errorf("%s: format %q, this shardline reads %q", path, m.Format, Format)
	}
	if err := m.check(dir); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	// The table is checked first (it bounds what is read); then the checksum,
	// which covers every field a resume acts on: the step, the fingerprints,
	// the recipe, the run, the tensor table.
	sum, err := m.checksum()
	if err != nil {
		return nil, err
	}
	if m.RunID == "" || sum != m.Checksum {
		return nil, fmt.Errorf("%s: %w: its checksum is %s, the file records %q (edited or damaged after the save); resume from another checkpoint (shardline ckpt ls lists them)", path, fileio.ErrCorrupt, sum, m.Checksum)
	}
	return &m, nil
}

// check validates the table: known files of the recorded sizes, each listed
// once, pieces inside their files, every tensor named once and covered
// exactly once.
func (m *Meta) check(dir string) error {
	if len(m.States) != len(States) {
		return fmt.Errorf("%d state kinds, want %d (%s)", len(m.States), len(States), strings.Join(States, ", "))
	}
	size := map[string]int64{}
	for _, f := range m.Files {
		if f.Name != filepath.Base(f.Name) || !strings.HasPrefix(f.Name, "rank-") {
			return fmt.Errorf("file %q is not a rank file", f.Name)
		}
		if _, dup := size[f.Name]; dup {
			return fmt.Errorf("%w: file %s is listed twice", fileio.ErrCorrupt, f.Name)
		}
		st, err := os.Stat(filepath.Join(dir, f.Name))
		if err != nil {
			return fmt.Errorf("rank file missing: %w", err)
		}
		if st.Size() != f.Size {
			return fmt.Errorf("%s: %w: %d bytes, metadata says %d (truncated or replaced)", filepath.Join(dir, f.Name), fileio.ErrCorrupt, st.Size(), f.Size)
		}
		size[f.Name] = f.Size
	}
	if m.FP8 != nil {
		if err := m.FP8.check(); err != nil {
			return err
		}
	}
	kinds := int64(len(States))
	seen := make(map[string]bool, len(m.Tensors))
	for i := range m.Tensors {
		t := &m.Tensors[i]
		if seen[t.Name] {
			return fmt.Errorf("%w: tensor %s is listed twice (a reader would take one and never check the other)", fileio.ErrCorrupt, t.Name)
		}
		seen[t.Name] = true
		for _, d := range t.Shape {
			if d < 0 {
				return fmt.Errorf("tensor %s: shape %v has a negative dimension", t.Name, t.Shape)
			}
		}
		n, ok := numel(t.Shape)
		if !ok {
			return fmt.Errorf("tensor %s: shape %v has more elements than a file can hold", t.Name, t.Shape)
		}
		ps := append([]Piece(nil), t.Pieces...)
		sort.Slice(ps, func(a, b int) bool { return ps[a].Start < ps[b].Start })
		var next int64
		for _, p := range ps {
			fsz, ok := size[p.File]
			switch {
			case !ok:
				return fmt.Errorf("tensor %s: piece in unknown file %q", t.Name, p.File)
			case p.Start != next || p.Count <= 0:
				return fmt.Errorf("tensor %s: pieces do not cover it exactly once (a piece starts at element %d, expected %d)", t.Name, p.Start, next)
			case p.Offset < 0 || p.Offset > fsz || p.Count > (fsz-p.Offset)/(4*kinds):
				return fmt.Errorf("tensor %s: piece at byte %d of %s runs past the file's %d bytes", t.Name, p.Offset, p.File, fsz)
			case len(p.CRC) != len(States):
				return fmt.Errorf("tensor %s: piece at byte %d of %s has %d checksums, want %d", t.Name, p.Offset, p.File, len(p.CRC), len(States))
			}
			next = p.Start + p.Count
		}
		if next != n {
			return fmt.Errorf("tensor %s: pieces cover %d of its %d elements", t.Name, next, n)
		}
	}
	return nil
}

// Reader reads ranges of tensors from a checkpoint, opening each rank file once
// and reading only the pieces a range overlaps.
type Reader struct {
	dir     string
	meta    *Meta
	tensors map[string]*Tensor
	files   map[string]*os.File
	buf     []byte
}

// NewReader reads from the checkpoint m describes in dir.
func NewReader(dir string, m *Meta) *Reader {
	r := &Reader{dir: dir, meta: m, tensors: map[string]*Tensor{}, files: map[string]*os.File{}}
	for i := range m.Tensors {
		r.tensors[m.Tensors[i].Name] = &m.Tensors[i]
	}
	return r
}

// Tensor returns the named tensor's entry, or nil.
func (r *Reader) Tensor(name string) *Tensor { return r.tensors[name] }

// Close closes the rank files.
func (r *Reader) Close() error {
	var first error
	for _, f := range r.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Read fills dst with elements [start, start+len(dst)) of state kind k (an index
// into States) of the named tensor, checking each piece it reads.
func (r *Reader) Read(name string, k int, start int64, dst []float32) error {
	t := r.tensors[name]
	if t == nil {
		return fmt.Errorf("checkpoint %s has no tensor %s", r.dir, name)
	}
	end := start + int64(len(dst))
	if start < 0 || end > t.Numel() {
		return fmt.Errorf("tensor %s: elements [%d, %d) outside its %d", name, start, end, t.Numel())
	}
	for _, p := range t.Pieces {
		a, b := max(start, p.Start), min(end, p.Start+p.Count)
		if a >= b {
			continue
		}
		// The chunk at element e of the piece: copy what falls inside [a, b).
		err := r.piece(t, &p, k, func(e int64, vals []byte) {
			lo, hi := max(a, p.Start+e), min(b, p.Start+e+int64(len(vals)/4))
			for i := lo; i < hi; i++ {
				dst[i-start] = math.Float32frombits(binary.LittleEndian.Uint32(vals[4*(i-p.Start-e):]))
			}
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// chunkBytes is the most of a piece read at a time: a piece's size, which a
// checkpoint's metadata gives, never sets what is allocated.
const chunkBytes = 4 << 20

// piece reads kind k of a piece a chunk at a time, handing each chunk and
// its first element (from the piece's start) to visit (when not nil), and
// checks the checksum of the whole.
func (r *Reader) piece(t *Tensor, p *Piece, k int, visit func(e int64, vals []byte)) error {
	f := r.files[p.File]
	if f == nil {
		var err error
		if f, _, err = fileio.OpenRegular(filepath.Join(r.dir, p.File)); err != nil {
			return err
		}
		r.files[p.File] = f
	}
	n := 4 * p.Count
	if r.buf == nil {
		r.buf = make([]byte, chunkBytes)
	}
	off := p.Offset + int64(k)*n
	h := crc32.New(castagnoli)
	for done := int64(0); done < n; {
		b := r.buf[:min(n-done, chunkBytes)]
		if _, err := f.ReadAt(b, off+done); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("%s: tensor %s (%s, elements %d..%d) at byte offset %d: %w", filepath.Join(r.dir, p.File), t.Name, States[k], p.Start, p.Start+p.Count, off+done, err)
		}
		h.Write(b)
		if visit != nil {
			visit(done/4, b)
		}
		done += int64(len(b))
	}
	if got := FormatSum(h.Sum32()); got != p.CRC[k] {
		return fmt.Errorf("%s: %w: tensor %s (%s, elements %d..%d) at byte offset %d has checksum %s, metadata says %s", filepath.Join(r.dir, p.File), fileio.ErrCorrupt, t.Name, States[k], p.Start, p.Start+p.Count, off, got, p.CRC[k])
	}
	return nil
}

// Verify reads every piece of every tensor and checks its checksum, and returns
// the number of bytes checked.
func Verify(dir string) (int64, error) {
	m, err := Open(dir)
	if err != nil {
		return 0, err
	}
	r := NewReader(dir, m)
	defer r.Close()
	var n int64
	for i := range m.Tensors {
		t := &m.Tensors[i]
		for j := range t.Pieces {
			for k := range States {
				if err := r.piece(t, &t.Pieces[j], k, nil); err != nil {
					return n, err
				}
				n += 4 * t.Pieces[j].Count
			}
		}
	}
	return n, nil
}

// Entry is one checkpoint directory found under a root.
type Entry struct {
	Dir      string
	Step     int
	Complete bool // metadata.json is there
}

// List returns the step-* directories under root, oldest step first.
func List(root string) ([]Entry, error) {
	des, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, de := range des {
		s, ok := strings.CutPrefix(de.Name(), "step-")
		if !de.IsDir() || !ok {
			continue
		}
		step, err := strconv.Atoi(s)
		if err != nil {
			continue
		}
		dir := filepath.Join(root, de.Name())
		_, err = os.Stat(filepath.Join(dir, MetadataFile))
		out = append(out, Entry{Dir: dir, Step: step, Complete: err == nil})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Step < out[j].Step })
	return out, nil
}

// Latest returns the newest complete checkpoint under root.
func Latest(root string) (string, error) {
	es, err := List(root)
	if err != nil {
		return "", fmt.Errorf("no checkpoints: %w", err)
	}
	for i := len(es) - 1; i >= 0; i-- {
		if es[i].Complete {
			return es[i].Dir, nil
		}
	}
	return "", fmt.Errorf("no complete checkpoint under %s", root)
}

// Skipped is a complete checkpoint Newest passed over: its metadata or files
// do not check out (Open's error).
type Skipped struct {
	Dir string
	Err error
}

// Newest returns the newest complete checkpoint under root whose metadata and
// files check out (Open: the table, the files' sizes, the metadata's checksum;
// the data's checksums are checked as a resume reads it), and the newer ones
// it passed over, with why. It returns "" and no error when root does not
// exist or holds no complete checkpoint (nothing to resume: a run starts
// afresh), and an error only when root cannot be read.
func Newest(root string) (string, []Skipped, error) {
	es, err := List(root)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil, nil
	}
	if err != nil {
		return "", nil, err
	}
	var skipped []Skipped
	for i := len(es) - 1; i >= 0; i-- {
		if !es[i].Complete {
			continue
		}
		if _, err := Open(es[i].Dir); err != nil {
			skipped = append(skipped, Skipped{Dir: es[i].Dir, Err: err})
			continue
		}
		return es[i].Dir, skipped, nil
	}
	return "", skipped, nil
}

// Prune removes the checkpoints of run runID under root beyond its newest keep
// complete ones (0 keeps all), and its unfinished saves (OwnerFile) older than
// its newest complete one. It removes nothing else: not a checkpoint of another
// run, not one whose metadata or owner cannot be read, not a symbolic link
// (List skips them; RemoveAll removes a link inside, never what it points to).
// It returns an error for each checkpoint it could not remove, and goes on.
func Prune(root string, keep int, runID string) []error {
	return PruneWith(root, keep, runID, os.RemoveAll)
}

// PruneWith is Prune with remove in place of os.RemoveAll (a test's failing
// disk).
func PruneWith(root string, keep int, runID string, remove func(string) error) []error {
	es, err := List(root)
	if err != nil {
		return []error{err}
	}
	var errs []error
	complete := 0
	newest := -1
	for i := len(es) - 1; i >= 0; i-- {
		e := es[i]
		var drop bool
		if e.Complete {
			if RunOf(e.Dir) != runID {
				continue
			}
			complete++
			if newest < 0 {
				newest = e.Step
			}
			drop = keep > 0 && complete > keep
		} else {
			drop = newest >= 0 && e.Step < newest && ownerOf(e.Dir) == runID
		}
		if drop {
			if err := remove(e.Dir); err != nil {
				errs = append(errs, fmt.Errorf("removing checkpoint %s: %w", e.Dir, err))
			}
		}
	}
	return errs
}

// RunOf is the run id a complete checkpoint's metadata.json records, "" when it
// cannot be read.
func RunOf(dir string) string {
	b, err := fileio.ReadRegular(filepath.Join(dir, MetadataFile), maxMetadata)
	if err != nil {
		return ""
	}
	var m struct {
		RunID string `json:"run_id"`
	}
	if json.Unmarshal(b, &m) != nil {
		return ""
	}
	return m.RunID
}

// ownerOf is the run id an unfinished save's OwnerFile holds, "" when none.
func ownerOf(dir string) string {
	b, err := fileio.ReadRegular(filepath.Join(dir, OwnerFile), 256)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
