package config

import (
	"fmt"
	"strings"
)

// Reading a Megatron-LM launch script: enough of bash to find the arguments given to
// pretrain_gpt.py. Comments, line continuations, single and double quotes,
// assignments (NAME=value, NAME=(array ...), export NAME=value), and expansions
// ($NAME, ${NAME}, ${NAME:-default}, ${NAME-default}, ${ARR[@]}, "${ARR[@]}") are
// understood; command substitution, arithmetic and control flow are not (a word
// holding one is kept as written and lint will name it).

// shellVars are the variables and arrays a script has assigned so far.
type shellVars struct {
	scalar map[string]string
	array  map[string][]string
	// spent counts the bytes expansions have produced; past maxExpansion the
	// script is refused (NAME="$NAME$NAME" repeated doubles it each line).
	spent int
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
		return fmt.Errorf("its variable expansions produce over %d MiB (a variable doubling itself?)", maxExpansion>>20)
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
				words = append(words, v.spread(name)...)
			} else {
				cur.WriteString(v.expand(strings.NewReplacer(`\"`, `"`, `\\`, `\`, `\$`, `$`).Replace(inner)))
				inWord = true
			}
			i = j
		case ch == '$':
			end := expansionEnd(line, i)
			ref := line[i:end]
			i = end - 1
			var val string
			if name, ok := arraySpread(ref); ok {
				val = strings.Join(v.spread(name), " ")
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
		name, def, hasDef := ref[1:], "", false
		if strings.HasPrefix(ref, "${") {
			name = strings.TrimSuffix(ref[2:], "}")
			for _, op := range []string{":-", "-"} {
				if n, d, ok := strings.Cut(name, op); ok {
					name, def, hasDef = n, d, true
					break
				}
			}
		}
		val, set := v.scalar[name]
		if arr, ok := v.array[name]; ok && !set {
			val, set = strings.Join(arr, " "), true
		}
		if (!set || val == "") && hasDef {
			val = v.expand(unquote(def))
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
	words, err := v.lexWords(cond)
	if err != nil || len(words) == 0 {
		return false, false
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
