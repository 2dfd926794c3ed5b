package tensorboard

import (
	"encoding/binary"
	"errors"
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

// ErrCorrupt is a record whose length or data does not match its CRC, one
// that ends before its length says, or an event that is not a well-formed
// Event message.
var ErrCorrupt = errors.New("corrupt TensorBoard event file")

// Event is an event as ReadEvents reads it: the fields this package writes.
type Event struct {
	WallTime    float64
	Step        int64
	FileVersion string
	Values      []Scalar
}

// ReadEvents reads an event file's records (both CRCs of each checked) and
// decodes each Event by its field numbers: wall time, step, file version and
// the summary's scalars. Other fields, and values that are not simple
// scalars, are skipped as protobuf readers skip unknown fields. A damaged or
// truncated record is ErrCorrupt, naming its offset.
func ReadEvents(b []byte) ([]Event, error) {
	var out []Event
	for off := 0; off < len(b); {
		rest := b[off:]
		if len(rest) < 16 {
			return nil, fmt.Errorf("%w: a record at byte %d ends after %d bytes", ErrCorrupt, off, len(rest))
		}
		n := binary.LittleEndian.Uint64(rest)
		if MaskedCRC(rest[:8]) != binary.LittleEndian.Uint32(rest[8:]) {
			return nil, fmt.Errorf("%w: the length of the record at byte %d fails its CRC", ErrCorrupt, off)
		}
		if n > uint64(len(rest)-16) {
			return nil, fmt.Errorf("%w: the record at byte %d holds %d bytes, the file %d more", ErrCorrupt, off, n, len(rest)-16)
		}
		data := rest[12 : 12+n]
		if MaskedCRC(data) != binary.LittleEndian.Uint32(rest[12+n:]) {
			return nil, fmt.Errorf("%w: the data of the record at byte %d fails its CRC", ErrCorrupt, off)
		}
		ev, err := decodeEvent(data)
		if err != nil {
			return nil, fmt.Errorf("%w: the event at byte %d: %v", ErrCorrupt, off, err)
		}
		out = append(out, ev)
		off += 16 + int(n)
	}
	return out, nil
}

// decodeEvent reads one Event message.
func decodeEvent(b []byte) (Event, error) {
	var ev Event
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch {
		case num == eventWallTime && typ == protowire.Fixed64Type:
			x, _ := protowire.ConsumeFixed64(v)
			ev.WallTime = math.Float64frombits(x)
		case num == eventStep && typ == protowire.VarintType:
			x, _ := protowire.ConsumeVarint(v)
			ev.Step = int64(x)
		case num == eventFileVersion && typ == protowire.BytesType:
			ev.FileVersion, _ = protowire.ConsumeString(v)
		case num == eventSummary && typ == protowire.BytesType:
			summary, _ := protowire.ConsumeBytes(v)
			return eachField(summary, func(num protowire.Number, typ protowire.Type, v []byte) error {
				if num != summaryValue || typ != protowire.BytesType {
					return nil
				}
				val, _ := protowire.ConsumeBytes(v)
				var s Scalar
				simple := false
				err := eachField(val, func(num protowire.Number, typ protowire.Type, v []byte) error {
					switch {
					case num == valueTag && typ == protowire.BytesType:
						s.Tag, _ = protowire.ConsumeString(v)
					case num == valueSimple && typ == protowire.Fixed32Type:
						x, _ := protowire.ConsumeFixed32(v)
						s.Value, simple = math.Float32frombits(x), true
					}
					return nil
				})
				if err == nil && simple {
					ev.Values = append(ev.Values, s)
				}
				return err
			})
		}
		return nil
	})
	return ev, err
}

// eachField calls each with every field of a message: its number, wire type
// and the bytes of its value (as protowire's Consume functions take them).
func eachField(b []byte, each func(protowire.Number, protowire.Type, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return fmt.Errorf("field %d: %w", num, protowire.ParseError(m))
		}
		if err := each(num, typ, b[:m]); err != nil {
			return err
		}
		b = b[m:]
	}
	return nil
}
