package trainer

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/shardline/shardline/parallel"
)

// weights.bin: a little-endian uint32 header length, a JSON header listing the
// parameters (name, shape) in table order, then each parameter's float32 values in
// that order. It is the final-weights file `shardline sample` reads; distributed
// checkpoints are a later issue's.
type weightsHeader struct {
	Format string `json:"format"`
	Params []struct {
		Name  string `json:"name"`
		Shape []int  `json:"shape"`
	} `json:"params"`
}

func saveWeights(path string, table []parallel.Param, views [][]float32) error {
	var h weightsHeader
	h.Format = "shardline-weights-v1"
	for i := range table {
		h.Params = append(h.Params, struct {
			Name  string `json:"name"`
			Shape []int  `json:"shape"`
		}{table[i].Name, table[i].LocalShape})
	}
	hb, err := json.Marshal(h)
	if err != nil {
		return err
	}
	f, err := os.Create(path + ".tmp")
	if err != nil {
		return err
	}
	buf := binary.LittleEndian.AppendUint32(nil, uint32(len(hb)))
	buf = append(buf, hb...)
	for _, v := range views {
		for _, x := range v {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(x))
		}
	}
	if _, err := f.Write(buf); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// loadWeights reads weights.bin into views, checking names and shapes against table.
func loadWeights(path string, table []parallel.Param, views [][]float32) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var n uint32
	if err := binary.Read(f, binary.LittleEndian, &n); err != nil || n > 1<<26 {
		return fmt.Errorf("%s: not a shardline weights file", path)
	}
	hb := make([]byte, n)
	if _, err := io.ReadFull(f, hb); err != nil {
		return fmt.Errorf("%s: truncated header", path)
	}
	var h weightsHeader
	if err := json.Unmarshal(hb, &h); err != nil || h.Format != "shardline-weights-v1" {
		return fmt.Errorf("%s: not a shardline-weights-v1 file", path)
	}
	if len(h.Params) != len(table) {
		return fmt.Errorf("%s holds %d parameters, the recipe's model has %d", path, len(h.Params), len(table))
	}
	raw := make([]byte, 4*1024)
	for i := range table {
		if h.Params[i].Name != table[i].Name || fmt.Sprint(h.Params[i].Shape) != fmt.Sprint(table[i].LocalShape) {
			return fmt.Errorf("%s: parameter %d is %s %v, the recipe's model has %s %v", path, i, h.Params[i].Name, h.Params[i].Shape, table[i].Name, table[i].LocalShape)
		}
		v := views[i]
		for off := 0; off < len(v); off += len(raw) / 4 {
			k := min(len(raw)/4, len(v)-off)
			if _, err := io.ReadFull(f, raw[:4*k]); err != nil {
				return fmt.Errorf("%s: truncated at %s", path, table[i].Name)
			}
			for j := 0; j < k; j++ {
				v[off+j] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:]))
			}
		}
	}
	return nil
}
