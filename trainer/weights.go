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

// maxWeightsHeader caps the JSON header (a parameter table of 2^20 tensors fits).
const maxWeightsHeader = 1 << 26

func saveWeights(path string, table []parallel.Param, views [][]float32) error {
	h := weightsHeader{Format: weightsFormat}
	var n int64
	for i := range table {
		h.Params = append(h.Params, weightEntry{table[i].Name, table[i].LocalShape})
		n += int64(len(views[i]))
	}
	hb, err := json.Marshal(h)
	if err != nil {
		return err
	}
	buf := make([]byte, 0, 4+int64(len(hb))+4*n+fileio.TrailerSize)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(hb)))
	buf = append(buf, hb...)
	for _, v := range views {
		buf = fileio.AppendFloat32s(buf, v)
	}
	return fileio.WriteSealed(path, buf)
}

// loadWeights reads weights.bin into views, checking its checksum, the names and
// shapes against table, and that every value is finite.
func loadWeights(path string, table []parallel.Param, views [][]float32) error {
	var want int64
	for i := range table {
		want += 4 * table[i].LocalNumel()
	}
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
