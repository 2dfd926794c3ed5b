package main

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTerminalWriterShowsControls: what a terminal would act on is shown, and
// the rest (text, newlines, tabs, CRLF, any printable UTF-8) passes unchanged,
// however the bytes are split into writes.
func TestTerminalWriterShowsControls(t *testing.T) {
	in := "ok\tline\r\nx\x1b]0;title\x07y\x7fz\rw é✓\u009b\xff\xc3"
	want := "ok\tline\r\nx␛]0;title␇y␡z␍w é✓\uFFFD\uFFFD\uFFFD"
	for split := 0; split <= len(in); split++ {
		var b bytes.Buffer
		w := &terminalWriter{w: &b}
		for _, part := range []string{in[:split], in[split:]} {
			n, err := w.Write([]byte(part))
			require.NoError(t, err)
			assert.Equal(t, len(part), n, "a write reports every byte taken")
		}
		require.NoError(t, w.Flush())
		assert.Equal(t, want, b.String(), "split at byte %d", split)
	}
	var b bytes.Buffer
	w := &terminalWriter{w: &b}
	_, _ = w.Write([]byte("text\r"))
	assert.Equal(t, "text", b.String(), "a CR at the end of a write waits to see whether a newline follows")
	_, _ = w.Write([]byte("\n"))
	assert.Equal(t, "text\r\n", b.String())
}

// TestErrorTextShown: an error quoting a file name or an argument cannot act on
// the terminal its line goes to.
func TestErrorTextShown(t *testing.T) {
	assert.Equal(t, "open ␛[2J.toml: no such file\nsecond line", shown(errors.New("open \x1b[2J.toml: no such file\nsecond line")))
}
