package config

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// megatronAbsent are Megatron-LM defaults shardline does not train, which a
// launch script gets by leaving an argument out: each is refused unless the
// script gives one of the arguments named.
var megatronAbsent = []struct {
	needs []string
	why   string
	fix   string
}{
	{[]string{"swiglu"}, "without --swiglu Megatron's MLP is GeLU; shardline's is SwiGLU", "add --swiglu"},
	{[]string{"normalization"}, "without --normalization Megatron normalises with LayerNorm; shardline with RMSNorm", "add --normalization RMSNorm"},
	{[]string{"position-embedding-type", "use-rotary-position-embeddings"}, "without --position-embedding-type Megatron learns absolute positions; shardline's are rotary", "add --position-embedding-type rope"},
	{[]string{"disable-bias-linear"}, "without --disable-bias-linear Megatron's linear layers have biases; shardline's have none", "add --disable-bias-linear"},
	{[]string{"attention-dropout"}, "without --attention-dropout Megatron drops 10% of attention probabilities; shardline trains without dropout", "add --attention-dropout 0.0"},
	{[]string{"hidden-dropout"}, "without --hidden-dropout Megatron drops 10% of hidden activations; shardline trains without dropout", "add --hidden-dropout 0.0"},
}

// exportedKey is a key = value line of recipe export megatron's comment list.
var exportedKey = regexp.MustCompile(`^#\s+([a-z0-9_]+(?:\.[a-z0-9_]+)+) = (.+)$`)

// ImportMegatron reads a Megatron-LM launch script (bash: the arguments given to
// pretrain_gpt.py, through variables, arrays and continuations) or a plain argument
// file, and resolves them onto shardline's defaults with Megatron's own defaults
// where an argument is absent (tied embeddings; and the GeLU MLP, LayerNorm,
// learned positions, biases and dropout, each refused with the argument that
// would say otherwise). Keys listed by recipe export megatron's comments are set
// too. Every value remembers the argument it came from.
func ImportMegatron(path string, src []byte) (*Resolved, Diagnostics) {
	args, sets, err := megatronArgv(string(src))
	if err != nil {
		return nil, Diagnostics{{Severity: SevError, Code: "SL001", Origin: Origin{Kind: FromFile, Pos: Pos{File: path}},
			Message: fmt.Sprintf("reading the launch script: %v", err), Help: "give the script pretrain_gpt.py runs from, or a file of its arguments"}}
	}
	var flags []FlagValue
	given := map[string]bool{}
	var stray []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") {
			stray = append(stray, a)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !hasValue {
			value = "true"
			if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
				i++
				value = args[i]
			}
		}
		given[name] = true
		flags = append(flags, FlagValue{Name: name, Value: value})
	}
	if !given["untie-embeddings-and-output-weights"] {
		sets = append([]string{"model.tie_embeddings=true"}, sets...) // Megatron's default: tied
	}
	res, diags := LoadBytes(path, nil, Options{Flags: flags, Sets: sets})
	for _, a := range megatronAbsent {
		found := false
		for _, n := range a.needs {
			found = found || given[n]
		}
		if !found {
			diags = append(diags, Diagnostic{Severity: SevError, Code: "SL010", Origin: Origin{Kind: FromFile, Pos: Pos{File: path}},
				Message: a.why, Help: a.fix})
		}
	}
	if len(stray) > 0 {
		diags = append(diags, Diagnostic{Severity: SevError, Code: "SL007", Origin: Origin{Kind: FromFile, Pos: Pos{File: path}},
			Message: fmt.Sprintf("words that are no --argument: %q", stray), Help: "check the script's quoting; arguments start with --"})
	}
	return res, diags
}

// megatronArgv finds the arguments of pretrain_*.py in a launch script (all the
// words, for a plain argument file), and the keys recipe export megatron listed.
func megatronArgv(src string) (args, sets []string, err error) {
	v := &shellVars{scalar: map[string]string{}, array: map[string][]string{}}
	var all []string
	found := false
	for _, line := range logicalLines(src) {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "#") {
			if m := exportedKey.FindStringSubmatch(t); m != nil {
				sets = append(sets, m[1]+"="+tomlToSet(m[2]))
			}
			continue
		}
		t = strings.TrimPrefix(strings.TrimPrefix(t, "export "), "declare -a ")
		if name, rest, ok := assignment(t); ok {
			if inner, isArray := strings.CutPrefix(rest, "("); isArray {
				words, err := v.lexWords(strings.TrimSuffix(strings.TrimSpace(inner), ")"))
				if err != nil {
					return nil, nil, err
				}
				v.array[name] = words
				continue
			}
			words, err := v.lexWords(rest)
			if err != nil {
				return nil, nil, err
			}
			v.scalar[name] = strings.Join(words, " ")
			continue
		}
		words, err := v.lexWords(t)
		if err != nil {
			return nil, nil, err
		}
		for i, w := range words {
			if base := filepath.Base(w); strings.HasPrefix(base, "pretrain_") && strings.HasSuffix(base, ".py") && !found {
				args, found = append(args, words[i+1:]...), true
				break
			}
		}
		all = append(all, words...)
	}
	if !found {
		args = all // a file of arguments
	}
	return args, sets, nil
}

// assignment recognises NAME=value (one word) and NAME=( ... ).
func assignment(s string) (name, rest string, ok bool) {
	n, r, ok := strings.Cut(s, "=")
	if !ok || n == "" || strings.ContainsAny(n, " \t$\"'") {
		return "", "", false
	}
	for _, c := range n {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return "", "", false
		}
	}
	if !strings.HasPrefix(r, "(") && strings.ContainsAny(strings.TrimSpace(unquotedSpan(r)), " \t") {
		return "", "", false // FOO=1 cmd ...: an environment prefix, not an assignment line
	}
	return n, r, true
}

// unquotedSpan blanks quoted parts of s so spaces inside quotes do not count.
func unquotedSpan(s string) string {
	var b strings.Builder
	var q byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case q != 0:
			if c == q {
				q = 0
			}
			b.WriteByte('x')
		case c == '\'' || c == '"':
			q = c
			b.WriteByte('x')
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// tomlToSet turns a TOML value of the export's comment list into --set syntax.
func tomlToSet(v string) string {
	v = strings.TrimSpace(v)
	if s, err := strconv.Unquote(v); err == nil {
		return s
	}
	return v
}

// AnnotatedTOML is the resolved recipe as canonical TOML with each key that an
// argument, a job-file setting (or, for a key Megatron has no argument for, the
// import) set commented with where it came from; keys at shardline's defaults stay
// bare.
func AnnotatedTOML(r *Resolved) ([]byte, error) {
	body, _, err := ResolvedTOML(&r.Recipe)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	section := ""
	for _, line := range strings.Split(strings.TrimSuffix(string(body), "\n"), "\n") {
		b.WriteString(line)
		t := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(t, "[") && strings.HasSuffix(t, "]"):
			section = strings.Trim(t, "[]")
		case t != "" && !strings.HasPrefix(t, "#"):
			if k, _, ok := strings.Cut(t, " = "); ok {
				switch o := r.Origin(section + "." + k); o.Kind {
				case FromFlag:
					b.WriteString("  # " + strings.TrimPrefix(o.Describe(), "flag "))
				case FromSet:
					b.WriteString("  # set by the import (" + strings.TrimPrefix(o.Name, "--set ") + ")")
				case FromImport:
					b.WriteString("  # " + o.Name)
					if o.Pos.Line > 0 {
						b.WriteString(fmt.Sprintf(" (line %d)", o.Pos.Line))
					}
				}
			}
		}
		b.WriteString("\n")
	}
	return []byte(b.String()), nil
}
