package config

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/shardline/shardline/trainer/tokenizer"
)

// convertRaw checks a TOML value against a field and returns it as the field's Go
// type. A problem comes back as a Diagnostic without origin (the caller knows it).
func convertRaw(f *Field, v rawValue) (any, *Diagnostic) {
	bad := func() (any, *Diagnostic) {
		return nil, &Diagnostic{Severity: SevError, Code: "SL003", Key: f.Key,
			Message: fmt.Sprintf("%s must be %s, got %s %s", f.Key, article(f.Kind), v.kind, v.text),
			Help:    typeHelp(f)}
	}
	var out any
	switch f.Kind {
	case KindBool:
		if v.kind != vBool {
			return bad()
		}
		out = v.b
	case KindInt:
		switch {
		case v.kind == vInt:
			out = v.i
		case v.overflow:
			return nil, intOutOfRange(f, v.s, "SL008")
		case v.kind == vFloat && v.f == math.Trunc(v.f) && math.Abs(v.f) < 1<<53:
			return nil, &Diagnostic{Severity: SevError, Code: "SL003", Key: f.Key,
				Message: fmt.Sprintf("%s must be an integer, got float %s", f.Key, v.text),
				Help:    fmt.Sprintf("write %s = %d", f.Name, int64(v.f))}
		default:
			return bad()
		}
	case KindFloat:
		switch v.kind {
		case vFloat:
			out = v.f
		case vInt:
			out = float64(v.i)
		default:
			return bad()
		}
	case KindString:
		if v.kind != vString {
			return bad()
		}
		out = v.s
	case KindStrings:
		if v.kind != vArray {
			return bad()
		}
		ss := make([]string, 0, len(v.elems))
		for _, e := range v.elems {
			if e.kind != vString {
				return bad()
			}
			ss = append(ss, e.s)
		}
		out = ss
	}
	return checkValue(f, out)
}

// convertString parses an environment or flag value for a field. Strings may be
// bare or TOML-quoted; arrays may be comma-separated or a TOML array.
func convertString(f *Field, s string) (any, *Diagnostic) {
	bad := func(err error) (any, *Diagnostic) {
		return nil, &Diagnostic{Severity: SevError, Code: "SL007", Key: f.Key,
			Message: fmt.Sprintf("%s must be %s, got %q (%v)", f.Key, article(f.Kind), s, err),
			Help:    typeHelp(f)}
	}
	if !utf8.ValidString(s) {
		// A recipe is TOML, which holds only UTF-8: the resolved recipe a run
		// writes would not load back (nor resume).
		return nil, &Diagnostic{Severity: SevError, Code: "SL007", Key: f.Key,
			Message: fmt.Sprintf("%s: the value %q is not UTF-8 text, and a recipe (TOML) holds only UTF-8", f.Key, s),
			Help:    "give the value in UTF-8 (a path in another encoding: rename the file, or convert the script with iconv -t UTF-8)"}
	}
	t := strings.TrimSpace(s)
	var out any
	switch f.Kind {
	case KindBool:
		b, err := strconv.ParseBool(t)
		if err != nil {
			return bad(fmt.Errorf("not true or false"))
		}
		out = b
	case KindInt:
		i, err := parseTOMLInt(t)
		if errors.Is(err, strconv.ErrRange) {
			return nil, intOutOfRange(f, t, "SL008")
		}
		if err != nil {
			return bad(fmt.Errorf("not an integer"))
		}
		out = i
	case KindFloat:
		x, err := strconv.ParseFloat(strings.ReplaceAll(t, "_", ""), 64)
		if err != nil {
			return bad(fmt.Errorf("not a number"))
		}
		out = x
	case KindString:
		if strings.HasPrefix(t, `"`) || strings.HasPrefix(t, `'`) {
			v, ok := parseTOMLValue(t)
			if !ok || v.kind != vString {
				return bad(fmt.Errorf("not a valid TOML string"))
			}
			out = v.s
		} else {
			out = s
		}
	case KindStrings:
		if strings.HasPrefix(t, "[") {
			v, ok := parseTOMLValue(t)
			if !ok || v.kind != vArray {
				return bad(fmt.Errorf("not a valid TOML array"))
			}
			return convertRaw(f, v)
		}
		ss := []string{}
		for _, p := range strings.Split(t, ",") {
			if p = strings.TrimSpace(p); p != "" {
				ss = append(ss, p)
			}
		}
		out = ss
	}
	return checkValue(f, out)
}

// parseTOMLValue parses one TOML value written on its own.
func parseTOMLValue(s string) (rawValue, bool) {
	doc, diags := parseTOML("", []byte("v = "+s))
	if diags.HasErrors() || len(doc.entries) != 1 {
		return rawValue{}, false
	}
	return doc.entries[0].val, true
}

// intOutOfRange is the finding for a whole number beyond int64: it is an
// integer, only too large (or too small) for the key.
func intOutOfRange(f *Field, text, code string) *Diagnostic {
	rule := "a 64-bit integer"
	switch {
	case strings.HasPrefix(text, "-") && f.Min != nil:
		rule = "≥ " + formatBound(*f.Min)
	case strings.HasPrefix(text, "-") && f.GT != nil:
		rule = "> " + formatBound(*f.GT)
	case !strings.HasPrefix(text, "-") && f.Max != nil:
		rule = "≤ " + formatBound(*f.Max)
	}
	return &Diagnostic{Severity: SevError, Code: code, Key: f.Key,
		Message: fmt.Sprintf("%s (%s) is out of range: it must be %s", f.Key, text, rule),
		Help:    fmt.Sprintf("set %s to a value %s", f.Key, rule)}
}

// minPositiveFloat32 is the smallest normal float32. The model computes in
// float32 (or bf16, whose exponent range is the same); a positive setting below
// it is held as a subnormal or as zero, and kernels that flush subnormals (GPU
// fast math) compute with zero: norm_eps = 5e-324 divides by zero.
const minPositiveFloat32 = 0x1p-126

// checkValue applies the enum and range constraints and converts to the Go type.
func checkValue(f *Field, v any) (any, *Diagnostic) {
	outOfRange := func(rule string) (any, *Diagnostic) {
		return nil, &Diagnostic{Severity: SevError, Code: "SL008", Key: f.Key,
			Message: fmt.Sprintf("%s (%s) must be %s", f.Key, FormatValue(v), rule),
			Help:    fmt.Sprintf("set %s to a value %s", f.Key, rule)}
	}
	if f.Enum != nil {
		vals := []string{}
		switch x := v.(type) {
		case string:
			vals = append(vals, x)
		case []string:
			vals = x
		}
		for _, s := range vals {
			if f.OrFile && tokenizer.IsFileSpec(s) {
				continue
			}
			if !contains(f.Enum, s) {
				d := &Diagnostic{Severity: SevError, Code: "SL004", Key: f.Key,
					Message: fmt.Sprintf("%s (%q) must be one of %s", f.Key, s, quoteAll(f.Enum)),
					Help:    fmt.Sprintf("set %s to one of %s", f.Key, quoteAll(f.Enum))}
				if f.OrFile {
					d.Message += " or a file's path (holding a / or ending in .json, .model or .tiktoken)"
					d.Help += ", or to a file's path such as ./tokenizer.json"
				}
				if m := Suggest(s, f.Enum); m != "" {
					d.Message += fmt.Sprintf("; did you mean %q?", m)
					d.Help = fmt.Sprintf("write %s = %q", f.Name, m)
				}
				return nil, d
			}
		}
	}
	var num float64
	switch x := v.(type) {
	case int64:
		num = float64(x)
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, &Diagnostic{Severity: SevError, Code: "SL008", Key: f.Key,
				Message: fmt.Sprintf("%s (%s) must be a finite number", f.Key, FormatValue(v)),
				Help:    fmt.Sprintf("set %s to a finite number (nan and inf are TOML floats, but no recipe key takes them)", f.Key)}
		}
		num = x
	default:
		return v, nil
	}
	if f.GT != nil && !(num > *f.GT) {
		return outOfRange("> " + formatBound(*f.GT))
	}
	if _, isFloat := v.(float64); isFloat && f.GT != nil && *f.GT == 0 && num < minPositiveFloat32 {
		d := &Diagnostic{Severity: SevError, Code: "SL008", Key: f.Key,
			Message: fmt.Sprintf("%s (%s) must be > 0 in float32, where it is used: below %s float32 holds it as a subnormal or zero (%s rounds to %g)", f.Key, FormatValue(v), formatBound(minPositiveFloat32), FormatValue(v), float32(num)),
			Help:    fmt.Sprintf("set %s to %s or more", f.Key, formatBound(minPositiveFloat32))}
		return nil, d
	}
	if f.Min != nil && num < *f.Min {
		return outOfRange("≥ " + formatBound(*f.Min))
	}
	if f.Max != nil && num > *f.Max {
		return outOfRange("≤ " + formatBound(*f.Max))
	}
	if x, ok := v.(int64); ok && f.goInt {
		return int(x), nil // int is 64-bit on every platform shardline supports
	}
	return v, nil
}

// formatBound writes a bound as a person would: whole numbers in full (1048576,
// not 1.048576e+06).
func formatBound(x float64) string {
	if x == math.Trunc(x) && math.Abs(x) < 1e15 {
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	return strconv.FormatFloat(x, 'g', -1, 64)
}

func article(k Kind) string {
	switch k {
	case KindInt:
		return "an integer"
	case KindStrings:
		return "an array of strings"
	default:
		return "a " + k.String()
	}
}

func typeHelp(f *Field) string {
	switch f.Kind {
	case KindBool:
		return fmt.Sprintf("write %s = true or %s = false", f.Name, f.Name)
	case KindInt:
		return fmt.Sprintf("write a whole number without quotes, e.g. %s = %v", f.Name, f.Get(ptrDefault()))
	case KindFloat:
		return fmt.Sprintf("write a number without quotes, e.g. %s = %s", f.Name, FormatValue(f.Get(ptrDefault())))
	case KindString:
		if f.Enum != nil {
			return fmt.Sprintf("write a quoted string, one of %s", quoteAll(f.Enum))
		}
		if ex := f.Get(ptrDefault()).(string); ex != "" {
			return fmt.Sprintf("write a quoted string, e.g. %s = %q", f.Name, ex)
		}
		return fmt.Sprintf("write a quoted string, e.g. %s = \"...\"", f.Name)
	default:
		return fmt.Sprintf("write an array of quoted strings, e.g. %s = %s", f.Name, FormatValue(f.Get(ptrDefault())))
	}
}

func ptrDefault() *Recipe { d := Default(); return &d }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func quoteAll(list []string) string {
	q := make([]string, len(list))
	for i, s := range list {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, ", ")
}
