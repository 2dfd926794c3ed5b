package trainer

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"

	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/parallel"
)

// weights.bin: a little-endian uint32 header length, a JSON header listing the
// parameters (name, shape) in table order, then each parameter's float32 values in
// that order, sealed by fileio (a CRC-32C trailer over everything before it). It
// is the final-weights file `shardline sample` reads; distributed checkpoints are
// a later issue's.
type weightsHeader struct {
	Format string        `json:"format"`
	Params []weightEntry `json:"params"`
}

type weightEntry struct {
	Name  string `json:"name"`
	Shape []int  `json:"shape"`
}

const weightsFormat = "shardline-weights-v2"

// createSealed starts weights.bin (tests stand in a failing one).
var createSealed = fileio.CreateSealed

// maxWeightsHeader caps the JSON header (a parameter table of 2^20 tensors fits).
const maxWeightsHeader = 1 << 26

// saveWeights writes weights.bin from the whole model's values (table order).
func saveWeights(path string, table []parallel.Param, views [][]float32) error {
	w, err := writeWeights(path, table, views)
	if err != nil {
		return err
	}
	return w.commit()
}

// writeWeights puts the whole model's values (table order) into a new
// weightsWriter, not yet committed (aborted on an error).
func writeWeights(path string, table []parallel.Param, views [][]float32) (*weightsWriter, error) {
	w, err := newWeightsWriter(path, table)
	if err != nil {
		return nil, err
	}
	for i, v := range views {
		if err := w.put(i, v); err != nil {
			w.abort()
			return nil, err
		}
	}
	return w, nil
}

// weightsWriter writes weights.bin a parameter at a time, in any order, at
// the places the header gives them, so that the whole model is never held
// for it: the end of a sharded run hands it each parameter as it arrives on
// rank 0. It notes the first value that is not finite (nonFinite); commit
// refuses a file with one, or with a parameter missing.
type weightsWriter struct {
	f     *fileio.SealedWriter
	table []parallel.Param
	offs  []int64 // per parameter: its first byte in the file
	done  []bool
	buf   []byte
	// bad is the first parameter found holding a NaN or infinity (−1: none),
	// with the element and its value.
	bad, badAt int
	badValue   float32
}

func newWeightsWriter(path string, table []parallel.Param) (*weightsWriter, error) {
	h := weightsHeader{Format: weightsFormat}
	for i := range table {
		h.Params = append(h.Params, weightEntry{table[i].Name, table[i].LocalShape})
	}
	hb, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	offs := make([]int64, len(table))
	n := 4 + int64(len(hb))
	for i := range table {
		offs[i] = n
		n += 4 * table[i].LocalNumel()
	}
	f, err := createSealed(path, n)
	if err != nil {
		return nil, err
	}
	head := binary.LittleEndian.AppendUint32(make([]byte, 0, 4+len(hb)), uint32(len(hb)))
	if err := f.WriteAt(append(head, hb...), 0); err != nil {
		f.Abort()
		return nil, err
	}
	return &weightsWriter{f: f, table: table, offs: offs, done: make([]bool, len(table)), bad: -1}, nil
}

// put writes parameter i's values (its whole LocalNumel, in table order).
func (w *weightsWriter) put(i int, v []float32) error {
	if i < 0 || i >= len(w.table) || int64(len(v)) != w.table[i].LocalNumel() {
		return fmt.Errorf("weights.bin: %d values for parameter %d of a table of %d", len(v), i, len(w.table))
	}
	if j := firstNonFinite(v); j >= 0 && w.bad < 0 {
		w.bad, w.badAt, w.badValue = i, j, v[j]
	}
	const chunk = 1 << 18 // values encoded at a time
	for lo := 0; lo < len(v); lo += chunk {
		part := v[lo:min(lo+chunk, len(v))]
		w.buf = fileio.AppendFloat32s(w.buf[:0], part)
		if err := w.f.WriteAt(w.buf, w.offs[i]+4*int64(lo)); err != nil {
			return err
		}
	}
	w.done[i] = true
	return nil
}

// nonFinite describes the first NaN or infinity put saw ("" when none).
func (w *weightsWriter) nonFinite() string {
	if w.bad < 0 {
		return ""
	}
	return fmt.Sprintf("parameter %s holds %v at element %d", w.table[w.bad].Name, w.badValue, w.badAt)
}

// commit seals the file and renames it into place; it refuses (and removes
// the temporary file) when a parameter was never put. Values that are not
// finite are written as they are: the caller decides (nonFinite).
func (w *weightsWriter) commit() error {
	for i, ok := range w.done {
		if !ok {
			w.abort()
			return fmt.Errorf("weights.bin: parameter %s was never written", w.table[i].Name)
		}
	}
	err := w.f.Commit()
	w.f = nil
	return err
}

// abort removes the temporary file, unless committed; weights.bin is left as
// it was.
func (w *weightsWriter) abort() {
	if w.f != nil {
		w.f.Abort()
		w.f = nil
	}
}

// weightsBytes is the size of table's values in weights.bin.
func weightsBytes(table []parallel.Param) int64 {
	var want int64
	for i := range table {
		want += 4 * table[i].LocalNumel()
	}
	return want
}

// checkWeightsSize compares weights.bin's size with what table's values need
// (with the header length, a header of at most maxWeightsHeader and the
// trailer) before anything is read or allocated for them: a recipe that
// claims a larger model than the file holds is refused from the file's size.
func checkWeightsSize(path string, table []parallel.Param) error {
	f, size, err := fileio.OpenRegular(path)
	if err != nil {
		return err
	}
	f.Close()
	want := weightsBytes(table)
	if lo, hi := 4+want+fileio.TrailerSize, 4+maxWeightsHeader+want+fileio.TrailerSize; size < lo || size > hi {
		return fmt.Errorf("%s: %w: %d bytes, where the recipe's model (%d parameters, resolved.toml) needs %d to %d; the file and the recipe are not of one run", path, fileio.ErrCorrupt, size, want/4, lo, hi)
	}
	return nil
}

// loadWeights reads weights.bin into views, checking its size first
// (checkWeightsSize), then its checksum, the names and shapes against table,
// and that every value is finite.
func loadWeights(path string, table []parallel.Param, views [][]float32) error {
	if err := checkWeightsSize(path, table); err != nil {
		return err
	}
	want := weightsBytes(table)
	b, err := fileio.ReadSealed(path, 4+maxWeightsHeader+want+fileio.TrailerSize)
	if err != nil {
		return err
	}
	if len(b) < 4 || binary.LittleEndian.Uint32(b) > maxWeightsHeader || int(binary.LittleEndian.Uint32(b)) > len(b)-4 {
		return fmt.Errorf("%s: not a shardline weights file", path)
	}
	n := int(binary.LittleEndian.Uint32(b))
	var h weightsHeader
	if err := json.Unmarshal(b[4:4+n], &h); err != nil || h.Format != weightsFormat {
		return fmt.Errorf("%s: not a %s file (a run of an older shardline? train it again)", path, weightsFormat)
	}
	if len(h.Params) != len(table) {
		return fmt.Errorf("%s holds %d parameters, the recipe's model has %d", path, len(h.Params), len(table))
	}
	body := b[4+n:]
	if int64(len(body)) != want {
		return fmt.Errorf("%s: %d bytes of values, the recipe's model needs %d", path, len(body), want)
	}
	off := 0
	for i := range table {
		if h.Params[i].Name != table[i].Name || fmt.Sprint(h.Params[i].Shape) != fmt.Sprint(table[i].LocalShape) {
			return fmt.Errorf("%s: parameter %d is %s %v, the recipe's model has %s %v", path, i, h.Params[i].Name, h.Params[i].Shape, table[i].Name, table[i].LocalShape)
		}
		v := views[i]
		for j := range v {
			x := math.Float32frombits(binary.LittleEndian.Uint32(body[off:]))
			if x-x != 0 {
				return fmt.Errorf("%s: %s[%d] (byte offset %d) is %v: weights must be finite", path, table[i].Name, j, 4+n+off, x)
			}
			v[j] = x
			off += 4
		}
	}
	return nil
}
