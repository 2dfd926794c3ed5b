package config

import (
	"bytes"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/pelletier/go-toml/v2/unstable"
)

// Positions come from go-toml/v2's unstable parser (the one viper already brings
// in): it exposes the byte range of every key and value, which BurntSushi/toml keeps
// private. This file is the only place that reads TOML for loading, so it is the one
// source of truth for positions. BurntSushi/toml writes the canonical form
// (canonical.go).

type valueKind int

const (
	vBool valueKind = iota
	vInt
	vFloat
	vString
	vArray
	vTable    // an inline table that is not a section (a type error later)
	vDateTime // TOML dates and times: no recipe key takes them
)

func (k valueKind) String() string {
	return [...]string{"boolean", "integer", "float", "string", "array", "table", "date-time"}[k]
}

// rawValue is a TOML value before it is checked against the schema.
type rawValue struct {
	kind  valueKind
	b     bool
	i     int64
	f     float64
	s     string
	elems []rawValue
	pos   Pos
	text  string // the value as written
	// overflow: an integer beyond int64 (kept as its text, kind vString).
	overflow bool
}

// entry is one key = value of a file, with its full dotted key.
type entry struct {
	key    string
	keyPos Pos
	val    rawValue
}

// header is a [table] line.
type header struct {
	name  string
	pos   Pos
	array bool // [[name]]
}

// tomlDoc is a parsed recipe file.
type tomlDoc struct {
	path    string
	src     []byte
	entries []entry
	headers []header
	lines   []int // byte offset of each line start
	diags   Diagnostics
}

// Recipe keys are at most three parts deep (model.moe.top_k) and arrays one level
// deep. Deeper keys and arrays are refused where they start, and nothing under them
// is expanded, so the work and memory of loading stay linear in the file's size
// (each level of an inline table or nested array would otherwise copy the text of
// everything inside it).
const (
	maxKeyParts   = 8
	maxArrayDepth = 4
)

// parseTOML parses src generically; schema checks happen in decode.go. A syntax
// error is returned as one SL001 diagnostic and no entries.
func parseTOML(path string, src []byte) (doc *tomlDoc, diags Diagnostics) {
	doc = &tomlDoc{path: path, src: src, lines: lineStarts(src)}
	if bytes.HasPrefix(src, utf8BOM) {
		return nil, Diagnostics{{Severity: SevError, Code: "SL001",
			Message: "the file starts with a UTF-8 byte-order mark (bytes EF BB BF), which the recipe loader does not accept",
			Help:    "save the file as UTF-8 without a BOM (in most editors: encoding \"UTF-8\", not \"UTF-8 with BOM\"); or strip it: sed -i '1s/^\\xEF\\xBB\\xBF//' " + path,
			Origin:  Origin{Kind: FromFile, Pos: doc.pos(0)}}}
	}
	defer func() {
		// The unstable parser is fuzzed through this function; should it ever panic on
		// some input, report a positioned syntax error rather than crash.
		if r := recover(); r != nil {
			doc.entries, doc.headers = nil, nil
			diags = Diagnostics{{Severity: SevError, Code: "SL001", Message: fmt.Sprintf("cannot parse TOML: %v", r),
				Help:   "check the file's syntax against https://toml.io/en/v1.0.0",
				Origin: Origin{Kind: FromFile, Pos: doc.pos(0)}}}
		}
	}()
	var p unstable.Parser
	p.Reset(src)
	var prefix []string
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			parts, first := doc.keyParts(&p, e.Key())
			if len(parts) > maxKeyParts {
				doc.tooDeep(first, fmt.Sprintf("table [%s…] is %d parts deep", strings.Join(parts[:3], "."), len(parts)))
				parts = parts[:maxKeyParts]
			}
			prefix = parts
			doc.headers = append(doc.headers, header{name: strings.Join(parts, "."), pos: first, array: e.Kind == unstable.ArrayTable})
		case unstable.KeyValue:
			doc.keyValue(&p, e, prefix)
		}
	}
	if p.Error() == nil && len(doc.diags) > 0 {
		return nil, doc.diags
	}
	if err := p.Error(); err != nil {
		off := len(src)
		var msg string
		if pe, ok := err.(*unstable.ParserError); ok {
			msg = withoutQuotedChar(pe.Message)
			if o, ok := subsliceOffset(&p, pe.Highlight); ok {
				off = o
			}
		} else {
			msg = err.Error()
		}
		return nil, Diagnostics{{Severity: SevError, Code: "SL001", Message: "TOML syntax error: " + msg,
			Help:   "fix the syntax here; strings need quotes, arrays brackets, tables [section] headers (https://toml.io/en/v1.0.0)",
			Origin: Origin{Kind: FromFile, Pos: doc.pos(off)}}}
	}
	return doc, nil
}

func (d *tomlDoc) keyValue(p *unstable.Parser, e *unstable.Node, prefix []string) {
	parts, kpos := d.keyParts(p, e.Key())
	full := append(append([]string(nil), prefix...), parts...)
	if len(full) > maxKeyParts {
		d.tooDeep(kpos, fmt.Sprintf("key %s… is %d parts deep", strings.Join(full[:3], "."), len(full)))
		return
	}
	v := d.value(p, e.Value(), kpos, 0)
	if v.kind == vTable {
		// An inline table { a = 1, b = 2 }: its own entry marks the table (decode
		// accepts it for a section), then its keys become entries under it.
		d.entries = append(d.entries, entry{key: strings.Join(full, "."), keyPos: kpos, val: v})
		for it := e.Value().Children(); it.Next(); {
			if c := it.Node(); c.Kind == unstable.KeyValue {
				d.keyValue(p, c, full)
			}
		}
		return
	}
	d.entries = append(d.entries, entry{key: strings.Join(full, "."), keyPos: kpos, val: v})
}

func (d *tomlDoc) keyParts(p *unstable.Parser, it unstable.Iterator) ([]string, Pos) {
	var parts []string
	var first Pos
	for i := 0; it.Next(); i++ {
		n := it.Node()
		if i == 0 {
			first = d.rangePos(p, n)
		}
		parts = append(parts, string(n.Data))
	}
	return parts, first
}

// tooDeep reports a key or array nested past what any recipe key takes.
func (d *tomlDoc) tooDeep(at Pos, what string) {
	d.diags = append(d.diags, Diagnostic{Severity: SevError, Code: "SL001",
		Message: fmt.Sprintf("%s; recipe keys are at most three parts deep (section.subsection.key) and arrays hold plain values", what),
		Help:    "flatten it: write [section] headers and key = value lines (see `shardline recipe docs`)",
		Origin:  Origin{Kind: FromFile, Pos: at}})
}

var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// value converts a value node at array depth depth; fallback positions values the
// parser leaves unranged.
func (d *tomlDoc) value(p *unstable.Parser, n *unstable.Node, fallback Pos, depth int) rawValue {
	v := rawValue{pos: d.rangePos(p, n)}
	if !v.pos.IsValid() {
		v.pos = fallback
	}
	v.text = d.rawText(p, n)
	data := string(n.Data)
	switch n.Kind {
	case unstable.String:
		v.kind, v.s = vString, data
	case unstable.Bool:
		v.kind, v.b = vBool, data == "true"
	case unstable.Integer:
		v.kind = vInt
		i, err := parseTOMLInt(data)
		if err != nil {
			// Out of int64 range: keep the text; decode reports a positioned type error.
			v.kind, v.s, v.overflow = vString, data, true
			v.text = data + " (out of 64-bit range)"
		}
		v.i = i
	case unstable.Float:
		f, err := strconv.ParseFloat(strings.ReplaceAll(data, "_", ""), 64)
		v.kind, v.f = vFloat, f
		if err != nil {
			v.kind, v.s = vString, data
		}
	case unstable.Array:
		v.kind = vArray
		v.elems = []rawValue{}
		if depth >= maxArrayDepth {
			d.tooDeep(v.pos, fmt.Sprintf("an array nested %d levels deep", depth+1))
			break
		}
		for it := n.Children(); it.Next(); {
			v.elems = append(v.elems, d.value(p, it.Node(), v.pos, depth+1))
		}
	case unstable.InlineTable:
		v.kind = vTable
	default:
		v.kind, v.s = vDateTime, data
	}
	if v.text == "" {
		v.text = data
	}
	return v
}

func parseTOMLInt(s string) (int64, error) {
	s = strings.ReplaceAll(s, "_", "")
	base := 10
	switch {
	case strings.HasPrefix(s, "0x"):
		base, s = 16, s[2:]
	case strings.HasPrefix(s, "0o"):
		base, s = 8, s[2:]
	case strings.HasPrefix(s, "0b"):
		base, s = 2, s[2:]
	}
	return strconv.ParseInt(s, base, 64)
}

// rangePos is the start of a node: its Raw range when the parser set one, else the
// location of its Data inside the input.
func (d *tomlDoc) rangePos(p *unstable.Parser, n *unstable.Node) Pos {
	if n.Raw.Length > 0 {
		return d.pos(int(n.Raw.Offset))
	}
	if off, ok := subsliceOffset(p, n.Data); ok {
		return d.pos(off)
	}
	return Pos{}
}

// rawText is a value as written, for messages: long values (a table or an array
// spanning many lines) are cut after maxRawText bytes.
func (d *tomlDoc) rawText(p *unstable.Parser, n *unstable.Node) string {
	if n.Raw.Length == 0 {
		return ""
	}
	b := p.Raw(n.Raw)
	if len(b) <= maxRawText {
		return string(b)
	}
	cut := maxRawText
	for cut > 0 && !utf8.RuneStart(b[cut]) {
		cut--
	}
	return string(b[:cut]) + "…"
}

const maxRawText = 120

// subsliceOffset finds b inside the parser's input. Data of unescaped values
// references the input; allocated data does not, and then ok is false.
func subsliceOffset(p *unstable.Parser, b []byte) (off int, ok bool) {
	if len(b) == 0 {
		return 0, false
	}
	defer func() {
		if recover() != nil {
			off, ok = 0, false
		}
	}()
	return int(p.Range(b).Offset), true
}

func lineStarts(src []byte) []int {
	starts := []int{0}
	for i, c := range src {
		if c == '\n' {
			starts = append(starts, i+1)
		}
	}
	return starts
}

// pos converts a byte offset to file:line:col (columns count bytes, as go/token).
func (d *tomlDoc) pos(off int) Pos {
	if off > len(d.src) {
		off = len(d.src)
	}
	line := sort.Search(len(d.lines), func(i int) bool { return d.lines[i] > off }) - 1
	return Pos{File: d.path, Line: line + 1, Col: off - d.lines[line] + 1, Offset: off}
}

// quotedChar is the character the TOML parser quotes at the end of some messages
// ("invalid character U+0041 'A'", "invalid character at start of key: r").
var quotedChar = regexp.MustCompile(`(?s)(:\s*.|\s+(but got\s+)?U\+[0-9A-F]{4,6}( '.*')?)$`)

// withoutQuotedChar drops the character a parser message quotes: the position
// says where, and a file that does not parse may be no recipe at all (a key
// file named by mistake), whose contents diagnostics never show.
func withoutQuotedChar(msg string) string {
	if out := quotedChar.ReplaceAllString(msg, ""); out != "" {
		return out
	}
	return msg
}

// KeyPositions parses a TOML file that is not a recipe (the CLI's settings
// file) for where each of its keys stands: the full dotted key (a table's keys
// under its name) to its position. A syntax error or a key defined twice comes
// back as a positioned finding instead.
func KeyPositions(path string, src []byte) (map[string]Pos, *Diagnostic) {
	doc, diags := parseTOML(path, src)
	if doc == nil {
		if len(diags) > 0 {
			return nil, &diags[0]
		}
		return nil, &Diagnostic{Severity: SevError, Code: "SL001", Message: "cannot parse TOML", Origin: Origin{Kind: FromFile, Pos: Pos{File: path}}}
	}
	out := map[string]Pos{}
	for _, h := range doc.headers {
		if _, ok := out[h.name]; !ok {
			out[h.name] = h.pos
		}
	}
	for _, e := range doc.entries {
		if first, dup := out[e.key]; dup {
			return nil, &Diagnostic{Severity: SevError, Code: "SL006", Key: e.key,
				Message: fmt.Sprintf("%s is defined twice (first at %s)", e.key, first),
				Help:    "keep one of the two definitions", Origin: Origin{Kind: FromFile, Pos: e.keyPos}}
		}
		out[e.key] = e.keyPos
	}
	return out, nil
}
