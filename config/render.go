package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// RenderText writes diagnostics like a compiler: the location, severity, code and
// message; then, for file positions, the source line with a caret; then the help.
// sources maps file paths to their bytes (Resolved.Sources); a missing file just
// omits the source line.
func RenderText(w io.Writer, ds Diagnostics, sources map[string][]byte) error {
	var b strings.Builder
	starts := map[string][]int{} // each file's line starts, found once
	for _, d := range ds {
		fmt.Fprintf(&b, "%s: %s[%s]: %s\n", visible(d.Location()), d.Severity, d.Code, visible(d.Message))
		if p := d.Origin.Pos; p.IsValid() && (d.Origin.Kind == FromFile || d.Origin.Kind == FromImplied || d.Origin.Kind == FromImport) {
			src := sources[p.File]
			if _, ok := starts[p.File]; !ok && src != nil {
				starts[p.File] = lineStarts(src)
			}
			if line, col, ok := sourceLine(src, starts[p.File], p.Line, p.Col); ok {
				gutter := fmt.Sprintf("%d", p.Line)
				pad := strings.Repeat(" ", len(gutter))
				before := visible(line[:max(0, min(col-1, len(line)))])
				fmt.Fprintf(&b, " %s |\n %s | %s\n %s | %s^\n", pad, gutter, visible(line), pad, caretPad(before, len(before)+1))
			}
		}
		if d.Help != "" {
			fmt.Fprintf(&b, "  = help: %s\n", visible(d.Help))
		}
	}
	if len(ds) > 0 {
		fmt.Fprintf(&b, "%s\n", Summary(ds))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Summary is a one-line count: "2 errors, 1 warning".
func Summary(ds Diagnostics) string {
	plural := func(n int, s string) string {
		if n == 1 {
			return fmt.Sprintf("%d %s", n, s)
		}
		return fmt.Sprintf("%d %ss", n, s)
	}
	parts := []string{plural(ds.Count(SevError), "error"), plural(ds.Count(SevWarning), "warning")}
	if n := ds.Count(SevNote); n > 0 {
		parts = append(parts, plural(n, "note"))
	}
	return strings.Join(parts, ", ")
}

// visible returns s with what a terminal or a CI log would act on instead of
// showing written as Go escapes: control characters other than tab (ESC, BEL,
// CR, DEL, the C1 range), the bidirectional controls (IsBidiControl) and bytes
// that are not UTF-8. A recipe, a path or a value quoted from a file cannot
// then retitle a window, recolour the output, hide a line of it or reorder it.
func visible(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || (r != '\t' && unicode.IsControl(r)) || IsBidiControl(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r != '\t' && unicode.IsControl(r) && r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		case (r != '\t' && unicode.IsControl(r)) || IsBidiControl(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// sourceLine returns line (1-based) of src, whose line starts are starts, cut
// to what a finding at byte column col quotes (quotedWindow), and col in it.
func sourceLine(src []byte, starts []int, line, col int) (string, int, bool) {
	if src == nil || line < 1 || line > len(starts) {
		return "", 0, false
	}
	end := len(src)
	if line < len(starts) {
		end = starts[line] - 1 // before the newline
	}
	text, col := quotedWindow(bytes.TrimRight(src[starts[line-1]:end], "\r"), col)
	return text, col, true
}

// maxQuoted is the most bytes of a source line a finding quotes: a line of a
// megabyte (one long array) is shown around the column, so that printing a
// thousand findings on it stays linear in their number.
const maxQuoted = 160

// quotedWindow returns the part of line a finding quotes, at most maxQuoted
// bytes around the byte column col (cut at character boundaries, "…" where
// cut), and col within it.
func quotedWindow(line []byte, col int) (string, int) {
	if len(line) <= maxQuoted {
		return string(line), col
	}
	start := max(0, min(col-1-maxQuoted/4, len(line)-maxQuoted))
	for start > 0 && !utf8.RuneStart(line[start]) {
		start--
	}
	end := min(len(line), start+maxQuoted)
	for end < len(line) && !utf8.RuneStart(line[end]) {
		end++
	}
	out, col := string(line[start:end]), col-start
	if start > 0 {
		out, col = "…"+out, col+len("…")
	}
	if end < len(line) {
		out += "…"
	}
	return out, col
}

// caretPad returns the whitespace before a caret at byte column col, keeping tabs so
// the caret lines up under the source.
func caretPad(line string, col int) string {
	var b strings.Builder
	for i := 0; i < col-1 && i < len(line); i++ {
		if line[i] == '\t' {
			b.WriteByte('\t')
		} else if line[i]&0xC0 != 0x80 { // one space per character, not per UTF-8 byte
			b.WriteByte(' ')
		}
	}
	return b.String()
}

// jsonDiagnostic is the --format json shape of a diagnostic (one object per line).
type jsonDiagnostic struct {
	Severity string `json:"severity"`
	Code     string `json:"code"`
	Key      string `json:"key,omitempty"`
	Message  string `json:"message"`
	Help     string `json:"help,omitempty"`
	Location string `json:"location"`
	File     string `json:"file,omitempty"`
	Line     int    `json:"line,omitempty"`
	Column   int    `json:"column,omitempty"`
	Source   string `json:"source"` // file, env, set, flag, default, implied
}

// RenderJSON writes one JSON object per diagnostic, one per line.
func RenderJSON(w io.Writer, ds Diagnostics) error {
	enc := json.NewEncoder(w)
	for _, d := range ds {
		j := jsonDiagnostic{Severity: d.Severity.String(), Code: d.Code, Key: d.Key, Message: d.Message, Help: d.Help,
			Location: d.Location(), File: d.Origin.Pos.File, Source: d.Origin.Kind.String()}
		if d.Origin.Pos.IsValid() {
			j.Line, j.Column = d.Origin.Pos.Line, d.Origin.Pos.Col
		}
		if err := enc.Encode(j); err != nil {
			return err
		}
	}
	return nil
}

// RenderSARIF writes a SARIF 2.1.0 log for code scanning. version is shardline's.
func RenderSARIF(w io.Writer, ds Diagnostics, version string) error {
	type msg struct {
		Text string `json:"text"`
	}
	type region struct {
		StartLine   int `json:"startLine"`
		StartColumn int `json:"startColumn,omitempty"`
	}
	type artifact struct {
		URI string `json:"uri"`
	}
	type physical struct {
		ArtifactLocation artifact `json:"artifactLocation"`
		Region           *region  `json:"region,omitempty"`
	}
	type location struct {
		PhysicalLocation physical `json:"physicalLocation"`
	}
	type result struct {
		RuleID    string     `json:"ruleId"`
		RuleIndex int        `json:"ruleIndex"`
		Level     string     `json:"level"`
		Message   msg        `json:"message"`
		Locations []location `json:"locations,omitempty"`
	}
	type rule struct {
		ID               string `json:"id"`
		ShortDescription msg    `json:"shortDescription"`
		DefaultConfig    struct {
			Level string `json:"level"`
		} `json:"defaultConfiguration"`
	}
	level := map[Severity]string{SevError: "error", SevWarning: "warning", SevNote: "note"}
	rules := make([]rule, len(Rules))
	index := map[string]int{}
	for i, r := range Rules {
		rules[i].ID, rules[i].ShortDescription.Text = r.Code, r.Title
		rules[i].DefaultConfig.Level = level[r.Severity]
		index[r.Code] = i
	}
	results := []result{}
	for _, d := range ds {
		text := d.Message
		if d.Help != "" {
			text += "\nhelp: " + d.Help
		}
		res := result{RuleID: d.Code, RuleIndex: index[d.Code], Level: level[d.Severity], Message: msg{text}}
		// Code scanning needs a file and a line for every result: a value from the
		// recipe points at its position; one from a flag or environment variable,
		// or a default, points at the top of the recipe it concerns, and the message
		// names the flag or variable.
		fromFile := (d.Origin.Kind == FromFile || d.Origin.Kind == FromImplied || d.Origin.Kind == FromDefault || d.Origin.Kind == FromImport) && !d.Origin.settingVar()
		file, reg := d.Origin.Pos.File, &region{StartLine: 1, StartColumn: 1}
		if fromFile && d.Origin.Pos.IsValid() {
			reg = &region{StartLine: d.Origin.Pos.Line, StartColumn: d.Origin.Pos.Col}
		}
		if !fromFile || file == "" {
			file = d.Recipe
		}
		if !fromFile {
			res.Message.Text = d.Location() + ": " + res.Message.Text
		}
		if file != "" {
			res.Locations = []location{{PhysicalLocation: physical{ArtifactLocation: artifact{URI: strings.TrimPrefix(file, "./")}, Region: reg}}}
		}
		results = append(results, res)
	}
	log := map[string]any{
		"$schema": "https://json.schemastore.org/sarif-2.1.0.json",
		"version": "2.1.0",
		"runs": []any{map[string]any{
			"tool": map[string]any{"driver": map[string]any{
				"name": "shardline", "version": version,
				"informationUri": "https://github.com/shardline/shardline",
				"rules":          rules,
			}},
			"results": results,
		}},
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(log)
}

// IsBidiControl reports whether r is a Unicode bidirectional control: the
// embeddings, overrides and isolates (U+202A to U+202E, U+2066 to U+2069) and
// the marks (U+200E, U+200F, U+061C). Printed, they reorder the text around
// them, so that what a terminal or a review shows is not what the bytes say
// ("Trojan Source"): U+202E makes "run-\u202egpj.exe" read as "run-exe.jpg".
func IsBidiControl(r rune) bool {
	switch {
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return r == 0x200e || r == 0x200f || r == 0x061c
}
