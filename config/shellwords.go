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
			if name, ok := arraySpread(ref); ok && !inWord {
				words = append(words, v.spread(name)...)
			} else {
				cur.WriteString(v.expand(ref))
				inWord = true
			}
			i = end - 1
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
			val = v.expand(def)
		}
		if !v.spend(len(val)) {
			return ""
		}
		b.WriteString(val)
		i = end - 1
	}
	return b.String()
}

// logicalLines joins continuation lines and splits the script into lines;
// an array assignment spanning lines (NAME=( ... )) becomes one line.
func logicalLines(src string) []string {
	var out []string
	var cur strings.Builder
	depth := 0
	for _, raw := range strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n") {
		line := raw
		if t := strings.TrimSpace(line); strings.HasPrefix(t, "#") && cur.Len() == 0 {
			out = append(out, t) // whole-line comments are kept for the export's key list
			continue
		}
		if t := strings.TrimRight(line, " \t"); strings.HasSuffix(t, "\\") {
			cur.WriteString(strings.TrimSuffix(t, "\\") + " ")
			continue
		}
		code := stripComment(line)
		depth += strings.Count(code, "(") - strings.Count(code, ")")
		cur.WriteString(code)
		if depth > 0 {
			cur.WriteString(" ")
			continue
		}
		depth = 0
		out = append(out, cur.String())
		cur.Reset()
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
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
