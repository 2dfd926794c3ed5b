package config

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Reading a Megatron-LM launch script: enough of bash to find the arguments given to
// pretrain_gpt.py. Comments, line continuations, single and double quotes,
// assignments (NAME=value, NAME=(array ...), export NAME=value), and expansions
// ($NAME, ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:=default},
// ${NAME:+word}, ${ARR[@]}, "${ARR[@]}") are understood. What the import cannot know is opaque: a command substitution
// ($(...) or backticks), arithmetic ($((...))), a variable the script never
// sets (its value would come from the environment, or from a file the script
// sources) and a positional argument without a default. An opaque part of a
// word is kept as a marker that names it, so an argument whose value depends on
// one is refused naming the expression and its line, never read as empty.

// shellVars are the variables and arrays a script has assigned so far.
type shellVars struct {
	scalar map[string]string
	array  map[string][]string
	// spent counts the bytes expansions have produced; past maxExpansion the
	// script is refused (NAME="$NAME$NAME" repeated doubles it each line).
	spent int
	// opaque holds what each opaque marker stands for, by its index.
	opaque []opaqueRef
	// sourced describes the first `source FILE` (or `. FILE`) the script runs:
	// from there on, a variable the script has not set may be set by that file.
	sourced string
	// line is the script line being read, for opaque references.
	line int
	// unsetIsEmpty reads a variable the script never sets as empty (bash's view
	// with nothing exported): if-tests do, so that `if [ -n "$WANDB_API_KEY" ]`
	// takes the branch an unset variable takes.
	unsetIsEmpty bool
}

// opaqueRef is a part of the script the import cannot evaluate: the text as
// written, why, and its line.
type opaqueRef struct {
	text, why string
	line      int
	// env: a variable the script never sets (and sources no file that might),
	// which bash would take from the environment.
	env bool
}

// markOpaque returns a marker for an opaque part of a word: NUL, its index, NUL.
// bash strings cannot hold NUL, so no script's own text is taken for one.
func (v *shellVars) markOpaque(text, why string) string {
	v.spend(len(text) + len(why) + 32)
	v.opaque = append(v.opaque, opaqueRef{text: text, why: why, line: v.line})
	return "\x00" + strconv.Itoa(len(v.opaque)-1) + "\x00"
}

// opaqueIn returns the first opaque part of word, if any.
func (v *shellVars) opaqueIn(word string) (opaqueRef, bool) {
	for _, m := range opaqueMarker.FindAllStringSubmatch(word, -1) {
		if i, err := strconv.Atoi(m[1]); err == nil && i < len(v.opaque) {
			return v.opaque[i], true
		}
	}
	return opaqueRef{}, false
}

// written returns word with each opaque marker replaced by the text it stands
// for, as the script wrote it.
func (v *shellVars) written(word string) string {
	return opaqueMarker.ReplaceAllStringFunc(word, func(m string) string {
		if i, err := strconv.Atoi(strings.Trim(m, "\x00")); err == nil && i < len(v.opaque) {
			return v.opaque[i].text
		}
		return m
	})
}

var opaqueMarker = regexp.MustCompile("\x00([0-9]+)\x00")

// unsetVar is what a reference to a variable the script never set expands to.
func (v *shellVars) unsetVar(ref, name string) string {
	switch {
	case v.sourced != "":
		return v.markOpaque(ref, fmt.Sprintf("%s is not set by the script itself; %s may set it, and the import does not read other files", name, v.sourced))
	case v.unsetIsEmpty:
		return ""
	case name != "" && name[0] >= '0' && name[0] <= '9':
		return v.markOpaque(ref, fmt.Sprintf("$%s is an argument the script is run with, which the import does not have", name))
	}
	m := v.markOpaque(ref, fmt.Sprintf("%s is not set by the script, so its value would come from the environment, which the import does not read", name))
	v.opaque[len(v.opaque)-1].env = true
	return m
}

// substitutionEnd is the index after the command substitution or arithmetic
// starting with "$(" at i (the end of s when it is not closed on the line).
func substitutionEnd(s string, i int) int {
	depth := 0
	var q byte
	for j := i + 1; j < len(s); j++ {
		c := s[j]
		switch {
		case q != 0:
			if c == q {
				q = 0
			}
		case c == '\'' || c == '"' || c == '`':
			q = c
		case c == '(':
			depth++
		case c == ')':
			depth--
			if depth == 0 {
				return j + 1
			}
		}
	}
	return len(s)
}

// backtickEnd is the index after the `...` command substitution at i.
func backtickEnd(s string, i int) int {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case '`':
			return j + 1
		}
	}
	return len(s)
}

// substitution marks the $(...), $((...)) or `...` at i of s as opaque and
// returns the marker and the index after it.
func (v *shellVars) substitution(s string, i int) (string, int) {
	if s[i] == '`' {
		end := backtickEnd(s, i)
		return v.markOpaque(s[i:end], fmt.Sprintf("%s runs a command, which the import does not", s[i:end])), end
	}
	end := substitutionEnd(s, i)
	text := s[i:end]
	if strings.HasPrefix(text, "$((") {
		return v.markOpaque(text, fmt.Sprintf("%s is shell arithmetic, which the import does not evaluate", text)), end
	}
	return v.markOpaque(text, fmt.Sprintf("%s runs a command, which the import does not", text)), end
}

// maxExpansion bounds what a script's expansions produce in all: far above any
// launch script (whose text is capped at 1 MiB), far below what exhausts memory.
const maxExpansion = 16 << 20

// spend counts n bytes of expansion and reports whether the budget still holds.
func (v *shellVars) spend(n int) bool {
	v.spent += n
	return v.spent <= maxExpansion
}

func (v *shellVars) overBudget() error {
	if v.spent > maxExpansion {
		return fmt.Errorf("its variable expansions produce over %d MiB (a variable doubling itself, or growing line by line?)", maxExpansion>>20)
	}
	return nil
}

// spread returns the elements of array name, counting them against the budget.
func (v *shellVars) spread(name string) []string {
	for _, w := range v.array[name] {
		if !v.spend(len(w) + 16) { // the bytes and the word itself
			return nil
		}
	}
	return v.array[name]
}

// spreadOrOpaque spreads an array; one the script never set is empty (the
// environment cannot hold arrays), unless a sourced file may have set it.
func (v *shellVars) spreadOrOpaque(ref, name string) []string {
	_, isArray := v.array[name]
	_, isScalar := v.scalar[name]
	if !isArray && !isScalar && v.sourced != "" {
		return []string{v.unsetVar(ref, name)}
	}
	if !isArray && isScalar { // ${S[@]} of a scalar is the scalar, as one word
		v.spend(len(v.scalar[name]) + 16)
		return []string{v.scalar[name]}
	}
	return v.spread(name)
}

// lexWords splits one logical line (continuations joined) into words, expanding
// variables; quoted "${ARR[@]}" and bare ${ARR[@]} spread into several words.
func (v *shellVars) lexWords(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, cur.String())
			cur.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case ch == '#' && !inWord:
			return words, nil // a comment to the end of the line
		case ch == ' ' || ch == '\t':
			flush()
		case ch == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated single quote")
			}
			cur.WriteString(line[i+1 : i+1+j])
			inWord, i = true, i+1+j
		case ch == '"':
			j := i + 1
			for j < len(line) && line[j] != '"' {
				if line[j] == '\\' && j+1 < len(line) {
					j++
				}
				j++
			}
			if j >= len(line) {
				return nil, fmt.Errorf("unterminated double quote")
			}
			inner := line[i+1 : j]
			if name, ok := arraySpread(inner); ok { // "${ARR[@]}": one word per element
				flush()
				words = append(words, v.spreadOrOpaque(inner, name)...)
			} else {
				cur.WriteString(v.expand(strings.NewReplacer(`\"`, `"`, `\\`, `\`, `\$`, `$`).Replace(inner)))
				inWord = true
			}
			i = j
		case ch == '`' || (ch == '$' && i+1 < len(line) && line[i+1] == '('):
			mark, end := v.substitution(line, i)
			cur.WriteString(mark)
			inWord, i = true, end-1
		case ch == '$':
			end := expansionEnd(line, i)
			ref := line[i:end]
			i = end - 1
			var val string
			if name, ok := arraySpread(ref); ok {
				val = strings.Join(v.spreadOrOpaque(ref, name), " ")
			} else {
				val = v.expand(ref)
			}
			// Unquoted, an expansion is split into words at blanks, as bash does:
			// ARGS=( "--fp8-format hybrid" ) spread as ${ARGS[@]} is two words.
			fields := strings.Fields(val)
			if len(fields) == 0 {
				continue
			}
			if strings.TrimLeft(val, " \t\n") != val {
				flush()
			}
			for k, f := range fields {
				if k > 0 {
					flush()
				}
				cur.WriteString(f)
				inWord = true
			}
			if strings.TrimRight(val, " \t\n") != val {
				flush()
			}
		case ch == '\\' && i+1 < len(line):
			cur.WriteByte(line[i+1])
			inWord, i = true, i+1
		default:
			cur.WriteByte(ch)
			inWord = true
		}
	}
	flush()
	if err := v.overBudget(); err != nil {
		return nil, err
	}
	return words, nil
}

// expansionEnd is the index after the $-expansion starting at i.
func expansionEnd(s string, i int) int {
	if i+1 < len(s) && s[i+1] == '{' {
		if j := strings.IndexByte(s[i:], '}'); j >= 0 {
			return i + j + 1
		}
		return len(s)
	}
	j := i + 1
	for j < len(s) && (s[j] == '_' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z' || s[j] >= '0' && s[j] <= '9') {
		j++
	}
	return j
}

// arraySpread recognises ${NAME[@]} (or [*]) and returns NAME.
func arraySpread(s string) (string, bool) {
	if !strings.HasPrefix(s, "${") || !strings.HasSuffix(s, "}") {
		return "", false
	}
	inner := s[2 : len(s)-1]
	for _, suf := range []string{"[@]", "[*]"} {
		if name, ok := strings.CutSuffix(inner, suf); ok {
			return name, true
		}
	}
	return "", false
}

// expand replaces the $NAME, ${NAME}, ${NAME:-default} and ${NAME-default}
// references in s.
func (v *shellVars) expand(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '`' || (s[i] == '$' && i+1 < len(s) && s[i+1] == '(') {
			mark, end := v.substitution(s, i)
			b.WriteString(mark)
			i = end - 1
			continue
		}
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		end := expansionEnd(s, i)
		ref := s[i:end]
		if end == i+1 { // a lone $
			b.WriteByte('$')
			continue
		}
		name, op, word := ref[1:], "", ""
		if strings.HasPrefix(ref, "${") {
			inner := strings.TrimSuffix(ref[2:], "}")
			n := 0
			for n < len(inner) && (inner[n] == '_' || inner[n] >= 'a' && inner[n] <= 'z' || inner[n] >= 'A' && inner[n] <= 'Z' || inner[n] >= '0' && inner[n] <= '9') {
				n++
			}
			name, op = inner[:n], inner[n:]
			known := op == ""
			for _, o := range []string{":-", ":=", ":+", "-", "=", "+"} {
				if w, ok := strings.CutPrefix(op, o); ok && !known {
					op, word, known = o, w, true
				}
			}
			if !known || name == "" {
				// ${ARR[0]}, ${#NAME}, ${NAME%suffix}, ...: not evaluated.
				b.WriteString(v.markOpaque(ref, fmt.Sprintf("%s is an expansion the import does not evaluate", ref)))
				i = end - 1
				continue
			}
		}
		val, set := v.scalar[name]
		if arr, ok := v.array[name]; ok && !set {
			val, set = strings.Join(arr, " "), true
		}
		empty := !set || (val == "" && strings.HasPrefix(op, ":"))
		switch {
		case !set && v.sourced != "":
			val = v.unsetVar(ref, name) // the sourced file may set it
		case op == ":+" || op == "+":
			// ${NAME:+word}: word when NAME is set, else nothing; an unset variable
			// reads as empty here, the optional-argument idiom.
			val = ""
			if !empty {
				val = v.expand(unquote(word))
			}
		case op != "" && empty:
			val = v.expand(unquote(word))
			if op == ":=" || op == "=" {
				v.scalar[name] = val
			}
		case !set:
			val = v.unsetVar(ref, name)
		}
		if !v.spend(len(val)) {
			return ""
		}
		b.WriteString(val)
		i = end - 1
	}
	return b.String()
}

// logicalLine is one line of a script with continuations joined (and an array
// assignment spanning lines, NAME=( ... ), as one line), and the line it starts on.
type logicalLine struct {
	text string
	line int
}

// logicalLines joins continuation lines and splits the script into lines. A
// comment ends its physical line (a backslash inside it continues nothing); whole-
// line comments outside a continuation are kept, for the export's key list.
func logicalLines(src string) []logicalLine {
	var out []logicalLine
	var cur strings.Builder
	depth, start := 0, 0
	for n, raw := range strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n") {
		if cur.Len() == 0 {
			start = n + 1
		}
		if t := strings.TrimSpace(raw); strings.HasPrefix(t, "#") && cur.Len() == 0 {
			out = append(out, logicalLine{t, n + 1})
			continue
		}
		code := stripComment(raw)
		if t := strings.TrimRight(code, " \t"); strings.HasSuffix(t, "\\") && !strings.HasSuffix(t, "\\\\") {
			cur.WriteString(strings.TrimSuffix(t, "\\") + " ")
			continue
		}
		span := unquotedSpan(code)
		depth += strings.Count(span, "(") - strings.Count(span, ")")
		cur.WriteString(code)
		if depth > 0 {
			cur.WriteString(" ")
			continue
		}
		depth = 0
		out = append(out, logicalLine{cur.String(), start})
		cur.Reset()
	}
	if cur.Len() > 0 {
		out = append(out, logicalLine{cur.String(), start})
	}
	return out
}

// stripComment removes a # comment outside quotes from line.
func stripComment(line string) string {
	inS, inD := false, false
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case c == '\'' && !inD:
			inS = !inS
		case c == '"' && !inS:
			inD = !inD
		case c == '#' && !inS && !inD && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return line[:i]
		}
	}
	return line
}

// unquote removes one pair of matching quotes around s (a default such as
// ${NAME:-"localhost"} means localhost).
func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '"' || s[0] == '\'') && s[len(s)-1] == s[0] {
		return s[1 : len(s)-1]
	}
	return s
}

// evalCond evaluates an if condition made of [ ] and [[ ]] string tests (-n, -z,
// ==, =, !=, a bare word), !, && and ||, with the script's variables; known is
// false for anything else (file tests, commands, regular expressions).
func (v *shellVars) evalCond(cond string) (val, known bool) {
	v.unsetIsEmpty = true
	words, err := v.lexWords(cond)
	v.unsetIsEmpty = false
	if err != nil || len(words) == 0 {
		return false, false
	}
	for _, w := range words {
		if _, ok := v.opaqueIn(w); ok {
			return false, false // a command, or what a sourced file may set
		}
	}
	p := &condParser{words: words, known: true}
	val = p.or()
	if p.pos != len(p.words) {
		return false, false
	}
	return val, p.known
}

type condParser struct {
	words []string
	pos   int
	known bool
}

func (p *condParser) peek() string {
	if p.pos < len(p.words) {
		return p.words[p.pos]
	}
	return ""
}

func (p *condParser) or() bool {
	v := p.and()
	for p.peek() == "||" || p.peek() == "-o" {
		p.pos++
		r := p.and()
		v = v || r
	}
	return v
}

func (p *condParser) and() bool {
	v := p.not()
	for p.peek() == "&&" || p.peek() == "-a" {
		p.pos++
		r := p.not()
		v = v && r
	}
	return v
}

func (p *condParser) not() bool {
	if p.peek() == "!" {
		p.pos++
		return !p.not()
	}
	return p.primary()
}

// primary is a bracketed test, or a test inside brackets.
func (p *condParser) primary() bool {
	switch w := p.peek(); w {
	case "[[", "[":
		closing := map[string]string{"[[": "]]", "[": "]"}[w]
		p.pos++
		v := p.or()
		if p.peek() != closing {
			p.known = false
			p.pos = len(p.words)
			return false
		}
		p.pos++
		return v
	}
	if p.pos >= len(p.words) {
		p.known = false
		return false
	}
	// A test: -n X, -z X, X op Y, or X.
	switch w := p.words[p.pos]; {
	case w == "-n" || w == "-z":
		p.pos++
		x := p.operand()
		return (x != "") == (w == "-n")
	case strings.HasPrefix(w, "-") && len(w) == 2:
		p.known = false // -f, -d, -e, ...: the file system, not the script
		p.pos = len(p.words)
		return false
	}
	x := p.operand()
	switch op := p.peek(); op {
	case "==", "=", "!=":
		p.pos++
		y := p.operand()
		return (x == y) == (op != "!=")
	case "=~", "<", ">", "-eq", "-ne", "-lt", "-le", "-gt", "-ge":
		p.known = false
		p.pos = len(p.words)
		return false
	}
	return x != ""
}

func (p *condParser) operand() string {
	if p.pos >= len(p.words) {
		return ""
	}
	switch w := p.words[p.pos]; w {
	case "]]", "]", "&&", "||":
		return "" // an unquoted empty expansion left no word
	default:
		p.pos++
		return w
	}
}
