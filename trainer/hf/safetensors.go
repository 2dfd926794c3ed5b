package hf

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/fileio"
)

// Tensor is a named float32 tensor, row-major.
type Tensor struct {
	Name  string
	Shape []int
	Data  []float32
}

type headerEntry struct {
	Dtype   string   `json:"dtype"`
	Shape   []int    `json:"shape"`
	Offsets [2]int64 `json:"data_offsets"`
}

// maxHeader caps a safetensors header (the format's reference reader takes 100 MB).
const maxHeader = 100 << 20

// WriteSafetensors writes tensors (F32) to path with the given metadata.
func WriteSafetensors(path string, tensors []Tensor, metadata map[string]string) error {
	header := map[string]any{}
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	var off int64
	for _, t := range tensors {
		n := int64(4 * len(t.Data))
		if numel(t.Shape) != int64(len(t.Data)) {
			return fmt.Errorf("tensor %s: shape %v holds %d values, not %d", t.Name, t.Shape, numel(t.Shape), len(t.Data))
		}
		header[t.Name] = headerEntry{Dtype: "F32", Shape: append([]int{}, t.Shape...), Offsets: [2]int64{off, off + n}}
		off += n
	}
	hb, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for len(hb)%8 != 0 { // the data starts 8-byte aligned
		hb = append(hb, ' ')
	}
	buf := make([]byte, 0, 8+int64(len(hb))+off)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(len(hb)))
	buf = append(buf, hb...)
	for _, t := range tensors {
		buf = fileio.AppendFloat32s(buf, t.Data)
	}
	return fileio.WriteAtomic(path, buf)
}

// ReadSafetensors reads every tensor of a safetensors file (F32, BF16 or F16,
// returned as float32), checking the header against the file: known dtypes,
// shapes that match their byte ranges, ranges inside the data, in order and
// without overlap. Every entry is checked before any is decoded, so what is
// allocated for the tensors is bounded by the file's data (disjoint ranges
// inside it): a header whose entries all name the same bytes is refused
// before a tensor is made.
func ReadSafetensors(path string, limit int64) (map[string]Tensor, map[string]string, error) {
	b, err := fileio.ReadRegular(path, limit)
	if err != nil {
		return nil, nil, err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%s: not a valid safetensors file: %s", path, fmt.Sprintf(format, args...))
	}
	if len(b) < 8 {
		return nil, nil, bad("%d bytes, shorter than the header length", len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > maxHeader || n > uint64(len(b)-8) {
		return nil, nil, bad("header length %d past the file's %d bytes or the %d-byte cap", n, len(b), maxHeader)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &raw); err != nil {
		return nil, nil, bad("header: %v", err)
	}
	data := b[8+n:]
	var meta map[string]string
	type entry struct {
		name string
		headerEntry
		count int64
	}
	var entries []entry
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &meta); err != nil {
				return nil, nil, bad("__metadata__ must map strings to strings: %v", err)
			}
			continue
		}
		var e headerEntry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, nil, bad("tensor %s: %v", name, err)
		}
		size := dtypeSize[e.Dtype]
		if size == 0 {
			return nil, nil, bad("tensor %s has dtype %q; shardline reads F32, BF16 and F16", name, e.Dtype)
		}
		count := numel(e.Shape)
		if count < 0 || e.Offsets[0] < 0 || e.Offsets[1] > int64(len(data)) || e.Offsets[1]-e.Offsets[0] != count*size {
			return nil, nil, bad("tensor %s: shape %v of %s does not fit bytes [%d, %d) of %d", name, e.Shape, e.Dtype, e.Offsets[0], e.Offsets[1], len(data))
		}
		entries = append(entries, entry{name, e, count})
	}
	// Disjoint ranges inside the data: together they hold at most len(data)
	// bytes, which bounds the tensors decoded below. At one offset an empty
	// tensor (a zero-width shared expert) sorts before the one that starts
	// there, which it does not overlap.
	sort.Slice(entries, func(i, j int) bool {
		if entries[i].Offsets[0] != entries[j].Offsets[0] {
			return entries[i].Offsets[0] < entries[j].Offsets[0]
		}
		if entries[i].Offsets[1] != entries[j].Offsets[1] {
			return entries[i].Offsets[1] < entries[j].Offsets[1]
		}
		return entries[i].name < entries[j].name
	})
	for i := 1; i < len(entries); i++ {
		if entries[i].Offsets[0] < entries[i-1].Offsets[1] {
			return nil, nil, bad("tensors %s and %s overlap", entries[i-1].name, entries[i].name)
		}
	}
	out := make(map[string]Tensor, len(entries))
	for _, e := range entries {
		vals := make([]float32, e.count)
		src := data[e.Offsets[0]:e.Offsets[1]]
		for i := range vals {
			switch e.Dtype {
			case "F32":
				vals[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
			case "BF16":
				vals[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
			case "F16":
				vals[i] = halfToFloat(binary.LittleEndian.Uint16(src[2*i:]))
			}
		}
		out[e.name] = Tensor{Name: e.name, Shape: e.Shape, Data: vals}
	}
	return out, meta, nil
}

// dtypeSize is the bytes per element of each dtype ReadSafetensors reads.
var dtypeSize = map[string]int64{"F32": 4, "BF16": 2, "F16": 2}

func numel(shape []int) int64 {
	n := int64(1)
	for _, d := range shape {
		if d < 0 || (d > 0 && n > (1<<40)/int64(d)) {
			return -1
		}
		n *= int64(d)
	}
	return n
}

// halfToFloat converts an IEEE 754 binary16 value.
func halfToFloat(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := int32(h>>10) & 0x1f
	frac := uint32(h & 0x3ff)
	switch {
	case exp == 0 && frac == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal
		return float32(math.Copysign(float64(frac)*math.Pow(2, -24), float64(int32(sign)>>31|1)))
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | frac<<13)
	}
	return math.Float32frombits(sign | uint32(exp-15+127)<<23 | frac<<13)
}

// index is model.safetensors.index.json.
type index struct {
	Metadata  map[string]any    `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

// The files of a model directory that a loader reads: the config, the single
// weights file, or the index and the files it names.
const (
	ConfigFile = "config.json"
	singleFile = "model.safetensors"
	indexFile  = "model.safetensors.index.json"
)

// shardName is the name of weights file i (from 1) of n.
func shardName(i, n int) string { return fmt.Sprintf("model-%05d-of-%05d.safetensors", i, n) }

// isWeightsFile says whether a file of a model directory is one a loader may
// read weights from (the single file, the index, or a shard of any count).
func isWeightsFile(name string) bool {
	var i, n int
	if name == singleFile || name == indexFile {
		return true
	}
	k, err := fmt.Sscanf(name, "model-%05d-of-%05d.safetensors", &i, &n)
	return err == nil && k == 2 && name == shardName(i, n)
}

// ExportCommand names the command that writes model directories in their
// manifest (fileio.ClaimDir).
const ExportCommand = "shardline ckpt export"

// WriteModel writes a model directory: config (config.json) and tensors as
// model.safetensors, or, when they exceed shardBytes, as several
// model-0000i-of-0000n.safetensors with an index; and the extra files
// (tokenizer files, tokenizer_config.json, generation_config.json) by name. The directory is claimed
// first (fileio.ClaimDir): a non-empty directory that an export did not make
// is refused unless overwrite; and a weights file there that this export
// does not write (an older export's index or shards, which a loader would
// read) is removed if an export wrote it or overwrite is set, refused
// otherwise.
func WriteModel(dir string, config []byte, tensors []Tensor, metadata map[string]string, extra map[string][]byte, shardBytes int64, overwrite bool) error {
	var shards [][]Tensor
	var size, total int64
	for _, t := range tensors {
		n := int64(4 * len(t.Data))
		if len(shards) == 0 || (size > 0 && size+n > shardBytes) {
			shards, size = append(shards, nil), 0
		}
		shards[len(shards)-1] = append(shards[len(shards)-1], t)
		size += n
		total += n
	}
	names := []string{ConfigFile}
	if len(shards) == 1 {
		names = append(names, singleFile)
	} else {
		for i := range shards {
			names = append(names, shardName(i+1, len(shards)))
		}
		names = append(names, indexFile)
	}
	extraNames := slices.Sorted(maps.Keys(extra))
	for _, n := range extraNames {
		if n == ConfigFile || isWeightsFile(n) {
			return fmt.Errorf("%s: an extra file of the model directory may not be named %s", dir, n)
		}
	}
	names = append(names, extraNames...)
	out, err := fileio.ClaimDir(dir, ExportCommand, names, overwrite, "give -o a new or empty directory")
	if err != nil {
		return err
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, de := range des {
		if isWeightsFile(de.Name()) && !slices.Contains(names, de.Name()) {
			if err := out.Remove(de.Name()); err != nil {
				return err
			}
		}
	}
	if len(shards) == 1 {
		if err := WriteSafetensors(out.Path(singleFile), tensors, metadata); err != nil {
			return err
		}
	} else {
		idx := index{Metadata: map[string]any{"total_size": total}, WeightMap: map[string]string{}}
		for i, sh := range shards {
			name := shardName(i+1, len(shards))
			if err := WriteSafetensors(out.Path(name), sh, metadata); err != nil {
				return err
			}
			for _, t := range sh {
				idx.WeightMap[t.Name] = name
			}
		}
		b, err := json.MarshalIndent(idx, "", "  ")
		if err != nil {
			return err
		}
		if err := out.WriteFile(indexFile, append(b, '\n')); err != nil {
			return err
		}
	}
	for _, n := range extraNames {
		if err := out.WriteFile(n, extra[n]); err != nil {
			return err
		}
	}
	if err := out.WriteFile(ConfigFile, config); err != nil {
		return err
	}
	return out.Commit()
}

// ReadModel reads every tensor of a model directory (model.safetensors, or the
// files its index names). The files may hold at most limit bytes together,
// checked from their sizes before any is read. A directory holding both the
// single file and an index is refused: loaders differ on which they take.
func ReadModel(dir string, limit int64) (map[string]Tensor, error) {
	_, errSingle := os.Stat(filepath.Join(dir, singleFile))
	b, err := fileio.ReadRegular(filepath.Join(dir, indexFile), 64<<20)
	hasIndex := err == nil || !errors.Is(err, fs.ErrNotExist)
	switch {
	case hasIndex && errSingle == nil:
		return nil, fmt.Errorf("%s holds both %s and %s: a loader may take either (transformers takes %[2]s, shardline refuses); remove the one that is not the model's, or export again into a new directory", dir, singleFile, indexFile)
	case err != nil && hasIndex:
		return nil, err
	case !hasIndex && errors.Is(errSingle, fs.ErrNotExist):
		return nil, fmt.Errorf("%s holds neither %s nor %s: not a Hugging Face model directory (shardline ckpt export writes one)", dir, singleFile, indexFile)
	}
	files := []string{singleFile}
	if hasIndex {
		var idx index
		if err := json.Unmarshal(b, &idx); err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, indexFile), err)
		}
		seen := map[string]bool{}
		files = files[:0]
		for _, f := range idx.WeightMap {
			if f != filepath.Base(f) {
				return nil, fmt.Errorf("%s: weight file %q is not in the directory", dir, f)
			}
			if !seen[f] {
				seen[f] = true
				files = append(files, f)
			}
		}
		sort.Strings(files)
	}
	var total int64
	for _, f := range files {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			return nil, err
		}
		if total += st.Size(); total > limit {
			return nil, fmt.Errorf("%s: %w: its weights files hold more than %d bytes by %s, more than the recipe's model needs (its parameters as F32, and headers); it is not this model's", dir, fileio.ErrTooLarge, limit, f)
		}
	}
	out := map[string]Tensor{}
	for _, f := range files {
		ts, _, err := ReadSafetensors(filepath.Join(dir, f), limit)
		if err != nil {
			return nil, err
		}
		for name, t := range ts {
			if _, dup := out[name]; dup {
				return nil, fmt.Errorf("%s: tensor %s appears in two files", dir, name)
			}
			out[name] = t
		}
	}
	return out, nil
}

// ReadLimit is the most bytes the weights files of a model directory for m may
// hold together, given its parameters (shardline's table: elements, and
// tensors): every tensor an export writes, the zero biases and shared-expert
// gates Qwen2-MoE adds, the zero shared expert Llama 4 adds to a model
// without one, and Glm4Moe's zero expert biases and empty shared experts
// included, as F32, and 4 KiB of header per tensor.
func ReadLimit(m config.Model, elements int64, tensors int) int64 {
	if Architecture(m) == "Qwen2MoeForCausalLM" {
		biases := int64(m.Hidden + 2*m.EffectiveKVHeads()*m.HeadSize())
		for l := 0; l < m.Layers; l++ {
			elements, tensors = elements+biases, tensors+3
			if m.IsMoELayer(l) {
				elements, tensors = elements+int64(m.Hidden), tensors+1
			}
		}
	}
	if Architecture(m) == "Llama4ForCausalLM" && m.MoE.SharedExperts == 0 { // a zero shared expert per MoE layer
		for l := 0; l < m.Layers; l++ {
			if m.IsMoELayer(l) {
				elements, tensors = elements+3*int64(m.Hidden*m.MoE.ExpertFFNHidden), tensors+3
			}
		}
	}
	if Architecture(m) == glm4Moe {
		e, n := glm4MoeReadExtra(m)
		elements, tensors = elements+e, tensors+n
	}
	return 4*elements + 4<<10*int64(tensors+1)
}
