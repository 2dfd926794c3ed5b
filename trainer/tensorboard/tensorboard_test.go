package tensorboard

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// CRC-32C and its mask against values computed elsewhere: 0xe3069283 is
// CRC-32C's check value (the CRC of "123456789" in the catalogue of
// parametrised CRCs), and the masked values and the framed record of "abc"
// were computed by a bitwise CRC-32C in Python (polynomial 0x82f63b78,
// reflected), independent of hash/crc32.
func TestRecordFramingKnownValues(t *testing.T) {
	c := []byte("123456789")
	require.Equal(t, uint32(0xe3069283), crcOf(c), "CRC-32C check value")
	assert.Equal(t, uint32(0xc78ab0e5), MaskedCRC(c))
	assert.Equal(t, uint32(0xa282ead8), MaskedCRC(nil), "the mask of CRC 0 is the mask's constant")
	assert.Equal(t, "0300000000000000b099490e6162636e57f121", hex.EncodeToString(AppendRecord(nil, []byte("abc"))))
}

func crcOf(b []byte) uint32 {
	m := MaskedCRC(b) - 0xa282ead8
	return m<<15 | m>>17 // unmask
}

// What Writer writes reads back record by record, CRCs checked: the version
// event first, then each step's scalars with their tags, values (float32),
// step and wall time; a flipped byte anywhere is caught by a CRC.
func TestWriterRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	t0 := time.Unix(1_800_000_000, 250_000_000)
	w := NewWriter(&buf)
	require.NoError(t, w.Version(t0))
	steps := [][]Scalar{
		{{"train/loss", 5.25}, {"perf/mfu", 0.125}},
		{{"train/loss", float32(math.NaN())}, {"memory/mem_held", 1 << 30}},
	}
	for i, s := range steps {
		require.NoError(t, w.Scalars(t0.Add(time.Duration(i+1)*time.Second), int64(i+1), s))
	}
	evs, err := ReadEvents(buf.Bytes())
	require.NoError(t, err)
	require.Len(t, evs, 3)
	assert.Equal(t, FileVersion, evs[0].FileVersion)
	assert.Equal(t, 1_800_000_000.25, evs[0].WallTime)
	for i, s := range steps {
		ev := evs[i+1]
		assert.Equal(t, int64(i+1), ev.Step)
		assert.Equal(t, 1_800_000_000.25+float64(i+1), ev.WallTime)
		require.Len(t, ev.Values, len(s))
		for j := range s {
			assert.Equal(t, s[j].Tag, ev.Values[j].Tag)
			assert.Equal(t, math.Float32bits(s[j].Value), math.Float32bits(ev.Values[j].Value), "bit for bit, NaN included")
		}
	}
	raw := buf.Bytes()
	for _, at := range []int{3, 9, 20, len(raw) - 2} {
		bad := bytes.Clone(raw)
		bad[at] ^= 0x10
		_, err := ReadEvents(bad)
		assert.ErrorIs(t, err, ErrCorrupt, "byte %d flipped", at)
	}
	for _, n := range []int{1, 15, len(raw) - 1} {
		_, err := ReadEvents(raw[:n])
		assert.ErrorIs(t, err, ErrCorrupt, "cut to %d bytes", n)
	}
}

// A write that fails is returned, and every write after it returns the
// same error without writing.
func TestWriterKeepsFirstError(t *testing.T) {
	fw := &failing{after: 1}
	w := NewWriter(fw)
	require.NoError(t, w.Version(time.Now()))
	err := w.Scalars(time.Now(), 1, []Scalar{{"a", 1}})
	require.ErrorIs(t, err, errDiskFull)
	require.ErrorIs(t, w.Scalars(time.Now(), 2, []Scalar{{"a", 1}}), errDiskFull)
	assert.Equal(t, 2, fw.calls, "nothing written after the failure")
}

func TestFileName(t *testing.T) {
	at := time.Unix(1_800_000_123, 0)
	assert.Equal(t, "events.out.tfevents.1800000123.node-7", FileName(at, "node-7"))
	for _, bad := range []string{"", "a/b", `a\b`, ".", ".."} {
		assert.Equal(t, "events.out.tfevents.1800000123.localhost", FileName(at, bad), "%q", bad)
	}
}

var errDiskFull = errors.New("no space left on device")

type failing struct{ after, calls int }

func (f *failing) Write(p []byte) (int, error) {
	f.calls++
	if f.calls > f.after {
		return 0, errDiskFull
	}
	return len(p), nil
}
