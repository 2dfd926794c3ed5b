package tensorboard

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// FileVersion is the file_version of the first event of a file: the event
// format TensorBoard reads.
const FileVersion = "brain.Event:2"

// FilePrefix begins every event file's name (FileName).
const FilePrefix = "events.out.tfevents."

// FileName is an event file's name as TensorBoard's own writers make it:
// events.out.tfevents.<unix seconds>.<host>. TensorBoard reads the files of a
// directory in the order of their names, so a file started later sorts after.
// A host name holding a path separator or nothing is written as "localhost".
func FileName(started time.Time, host string) string {
	if host == "" || strings.ContainsAny(host, `/\`) || host == "." || host == ".." {
		host = "localhost"
	}
	return FilePrefix + strconv.FormatInt(started.Unix(), 10) + "." + host
}

// castagnoli is CRC-32C's table.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// MaskedCRC is the masked CRC-32C of b, as a TFRecord stores it.
func MaskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return (c>>15 | c<<17) + 0xa282ead8
}

// AppendRecord appends data framed as one TFRecord to dst.
func AppendRecord(dst, data []byte) []byte {
	var head [8]byte
	binary.LittleEndian.PutUint64(head[:], uint64(len(data)))
	dst = append(dst, head[:]...)
	dst = binary.LittleEndian.AppendUint32(dst, MaskedCRC(head[:]))
	dst = append(dst, data...)
	return binary.LittleEndian.AppendUint32(dst, MaskedCRC(data))
}

// Scalar is one value of a step: its tag (TensorBoard groups tags by what
// precedes their first "/") and its value.
type Scalar struct {
	Tag   string
	Value float32
}

// Event field numbers (event.proto) and Summary's (summary.proto).
const (
	eventWallTime    = 1
	eventStep        = 2
	eventFileVersion = 3
	eventSummary     = 5
	summaryValue     = 1
	valueTag         = 1
	valueSimple      = 2
)

// appendEventHead appends an Event's wall_time and step.
func appendEventHead(b []byte, wall time.Time, step int64) []byte {
	b = protowire.AppendTag(b, eventWallTime, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, math.Float64bits(float64(wall.Unix())+float64(wall.Nanosecond())/1e9))
	if step != 0 {
		b = protowire.AppendTag(b, eventStep, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(step))
	}
	return b
}

// VersionEvent is the Event that begins a file: its wall time and
// FileVersion.
func VersionEvent(wall time.Time) []byte {
	b := appendEventHead(nil, wall, 0)
	b = protowire.AppendTag(b, eventFileVersion, protowire.BytesType)
	return protowire.AppendString(b, FileVersion)
}

// ScalarsEvent is the Event of one step's scalars, in the order given.
func ScalarsEvent(wall time.Time, step int64, values []Scalar) []byte {
	var summary []byte
	for _, v := range values {
		var val []byte
		val = protowire.AppendTag(val, valueTag, protowire.BytesType)
		val = protowire.AppendString(val, v.Tag)
		val = protowire.AppendTag(val, valueSimple, protowire.Fixed32Type)
		val = protowire.AppendFixed32(val, math.Float32bits(v.Value))
		summary = protowire.AppendTag(summary, summaryValue, protowire.BytesType)
		summary = protowire.AppendBytes(summary, val)
	}
	b := appendEventHead(nil, wall, step)
	b = protowire.AppendTag(b, eventSummary, protowire.BytesType)
	return protowire.AppendBytes(b, summary)
}

// Writer writes events to an event file (or any writer), one event per
// write. A new file begins with Version; a file continued (opened for
// appending) does not.
type Writer struct {
	w   io.Writer
	buf []byte
	err error // the first write error: every later call returns it
}

// NewWriter writes events to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Version writes the event that begins a file: FileVersion, stamped wall.
func (tw *Writer) Version(wall time.Time) error {
	tw.write(VersionEvent(wall))
	return tw.err
}

// Scalars writes one step's scalars as one event, in one write.
func (tw *Writer) Scalars(wall time.Time, step int64, values []Scalar) error {
	tw.write(ScalarsEvent(wall, step, values))
	return tw.err
}

func (tw *Writer) write(event []byte) {
	if tw.err != nil {
		return
	}
	tw.buf = AppendRecord(tw.buf[:0], event)
	if _, err := tw.w.Write(tw.buf); err != nil {
		tw.err = fmt.Errorf("writing a TensorBoard event: %w", err)
	}
}
