package main

import (
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/shardline/shardline/config"
)

// terminalWriter is standard output when it is a terminal. What shardline
// prints there can hold bytes it did not write itself: a byte-level model's
// sample, names read from a checkpoint or a recipe. A terminal acts on some of
// them instead of showing them (ESC starts sequences that retitle the window,
// recolour or move the cursor; BEL rings; CR returns over what was written), so
// terminalWriter shows them: control characters other than newline and tab as
// their Unicode control pictures (ESC as ␛, DEL as ␡), a CR not followed by a
// newline as ␍, the C1 controls and bytes that are not UTF-8 as U+FFFD, and
// the bidirectional controls, which would reorder what is shown (U+202E),
// named: <U+202E>.
// Everything else passes unchanged, and output that goes to a pipe or a file is
// never wrapped, so `shardline sample RUN > text` keeps the model's bytes.
//
// A character split over two writes is held back until the next write, or
// Flush at exit.
type terminalWriter struct {
	w     io.Writer
	carry []byte // the start of a character (or a CR) the last write ended in
	out   []byte // reused output buffer
}

func (t *terminalWriter) Write(p []byte) (int, error) {
	in := p
	if len(t.carry) > 0 {
		in = append(t.carry, p...)
		t.carry = nil
	}
	out, rest := showControls(t.out[:0], in, false)
	t.carry = append(t.carry[:0:0], rest...)
	t.out = out[:0]
	if _, err := t.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes what the last write left undecided: an unfinished character as
// U+FFFD, a trailing CR as ␍.
func (t *terminalWriter) Flush() error {
	if len(t.carry) == 0 {
		return nil
	}
	out, _ := showControls(nil, t.carry, true)
	t.carry = nil
	_, err := t.w.Write(out)
	return err
}

// showControls appends in to out as terminalWriter shows it. Unless final, it
// stops before a trailing CR or an unfinished UTF-8 sequence, and returns those
// bytes as rest.
func showControls(out, in []byte, final bool) (_, rest []byte) {
	for i := 0; i < len(in); {
		c := in[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7f):
				out = append(out, c)
			case c == '\r' && i+1 == len(in) && !final:
				return out, in[i:]
			case c == '\r' && i+1 < len(in) && in[i+1] == '\n':
				out = append(out, c)
			case c == 0x7f:
				out = utf8.AppendRune(out, '␡')
			default: // C0 controls, lone CR
				out = utf8.AppendRune(out, 0x2400+rune(c))
			}
			i++
			continue
		}
		if !final && !utf8.FullRune(in[i:]) {
			return out, in[i:]
		}
		r, n := utf8.DecodeRune(in[i:])
		switch {
		case (r == utf8.RuneError && n == 1) || (r >= 0x80 && r <= 0x9f):
			out = utf8.AppendRune(out, utf8.RuneError)
		case config.IsBidiControl(r):
			out = fmt.Appendf(out, "<U+%04X>", r)
		default:
			out = append(out, in[i:i+n]...)
		}
		i += n
	}
	return out, nil
}
