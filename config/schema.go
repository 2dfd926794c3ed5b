package config

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// Kind is the type of a recipe value as the user writes it.
type Kind int

// The kinds of recipe values.
const (
	KindBool Kind = iota
	KindInt
	KindFloat
	KindString
	KindStrings
)

func (k Kind) String() string {
	switch k {
	case KindBool:
		return "boolean"
	case KindInt:
		return "integer"
	case KindFloat:
		return "float"
	case KindString:
		return "string"
	case KindStrings:
		return "array of strings"
	}
	return "unknown"
}

// Field is one key of the recipe schema, derived from the struct tags in recipe.go.
type Field struct {
	Key     string // full dotted key, e.g. "model.moe.num_experts"
	Section string // dotted section, e.g. "model.moe"
	Name    string // key inside its section, e.g. "num_experts"
	Kind    Kind
	Enum    []string // allowed values; nil when free
	OrFile  bool     // a file path is accepted besides Enum (IsFilePath)
	Min     *float64 // inclusive lower bound
	Max     *float64 // inclusive upper bound
	GT      *float64 // exclusive lower bound
	Flag    string   // dashed flag setting the key ("" if none), without "--"
	NegFlag string   // dashed flag setting the boolean key to false

	goType  string // Go struct type holding the field, for doc lookup
	goField string
	goInt   bool // Go type int (else int64) for KindInt
	index   []int
}

// EnvVar is the environment variable that overrides the field.
func (f *Field) EnvVar() string { return EnvVarFor(f.Key) }

// EnvVarFor maps a dotted key to its SHARDLINE_ environment variable.
func EnvVarFor(key string) string {
	return "SHARDLINE_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// Get returns the field's value in r.
func (f *Field) Get(r *Recipe) any {
	return reflect.ValueOf(r).Elem().FieldByIndex(f.index).Interface()
}

// set stores v, already of the field's Go type, in r.
func (f *Field) set(r *Recipe, v any) {
	reflect.ValueOf(r).Elem().FieldByIndex(f.index).Set(reflect.ValueOf(v))
}

// FormatValue renders a recipe value as TOML writes it.
func FormatValue(v any) string {
	switch x := v.(type) {
	case string:
		return strconv.Quote(x)
	case []string:
		q := make([]string, len(x))
		for i, s := range x {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	case float64:
		switch { // TOML's spellings
		case math.IsNaN(x):
			return "nan"
		case math.IsInf(x, 1):
			return "inf"
		case math.IsInf(x, -1):
			return "-inf"
		}
		s := strconv.FormatFloat(x, 'g', -1, 64)
		if !strings.ContainsAny(s, ".eEn") { // keep it a float in TOML: 3 -> 3.0
			s += ".0"
		}
		return s
	default:
		return fmt.Sprint(v)
	}
}

// Schema is the set of recipe keys and sections.
type Schema struct {
	Fields   []*Field
	Sections []string // dotted section names in declaration order
	byKey    map[string]*Field
	sections map[string]string // section -> Go type name
	// sectionDecl: section -> {Go type declaring it, Go field name}, for its docs.
	sectionDecl map[string][2]string
	flags       map[string]*Field // dashed flag (both polarities) -> field
}

var recipeSchema = mustBuildSchema()

// RecipeSchema returns the schema of Recipe. It is built once and shared; callers
// must not modify it.
func RecipeSchema() *Schema { return recipeSchema }

// Lookup returns the field for a full dotted key.
func (s *Schema) Lookup(key string) (*Field, bool) {
	f, ok := s.byKey[key]
	return f, ok
}

// IsSection reports whether the dotted name is a section (a TOML table).
func (s *Schema) IsSection(name string) bool {
	_, ok := s.sections[name]
	return ok
}

// FlagField returns the field a dashed flag (without "--") sets, and the value a
// bare boolean flag means.
func (s *Schema) FlagField(flag string) (*Field, bool, bool) {
	f, ok := s.flags[flag]
	if !ok {
		return nil, false, false
	}
	return f, flag != f.NegFlag, true
}

// Flags lists every dashed flag, sorted.
func (s *Schema) Flags() []string {
	out := make([]string, 0, len(s.flags))
	for k := range s.flags {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// SectionKeys returns the fields directly inside section.
func (s *Schema) SectionKeys(section string) []*Field {
	var out []*Field
	for _, f := range s.Fields {
		if f.Section == section {
			out = append(out, f)
		}
	}
	return out
}

func mustBuildSchema() *Schema {
	s := &Schema{byKey: map[string]*Field{}, sections: map[string]string{}, sectionDecl: map[string][2]string{}, flags: map[string]*Field{}}
	if err := s.walk(reflect.TypeOf(Recipe{}), "", nil); err != nil {
		// The schema is a compile-time constant of this package: a bad tag is a
		// programming error caught by every test, never a user input.
		panic(err)
	}
	return s
}

func (s *Schema) walk(t reflect.Type, section string, index []int) error {
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		name := sf.Tag.Get("toml")
		if name == "" {
			return fmt.Errorf("config: %s.%s has no toml tag", t.Name(), sf.Name)
		}
		key := name
		if section != "" {
			key = section + "." + name
		}
		idx := append(append([]int(nil), index...), i)
		if sf.Type.Kind() == reflect.Struct {
			s.Sections = append(s.Sections, key)
			s.sections[key] = sf.Type.Name()
			s.sectionDecl[key] = [2]string{t.Name(), sf.Name}
			if err := s.walk(sf.Type, key, idx); err != nil {
				return err
			}
			continue
		}
		f := &Field{Key: key, Section: section, Name: name, goType: t.Name(), goField: sf.Name, index: idx}
		switch sf.Type.Kind() {
		case reflect.Bool:
			f.Kind = KindBool
		case reflect.Int, reflect.Int64:
			f.Kind, f.goInt = KindInt, sf.Type.Kind() == reflect.Int
		case reflect.Float64:
			f.Kind = KindFloat
		case reflect.String:
			f.Kind = KindString
		case reflect.Slice:
			f.Kind = KindStrings
		default:
			return fmt.Errorf("config: %s has unsupported type %s", key, sf.Type)
		}
		if e := sf.Tag.Get("enum"); e != "" {
			f.Enum = strings.Split(e, ",")
		}
		f.OrFile = sf.Tag.Get("orfile") == "true"

		for tag, dst := range map[string]**float64{"min": &f.Min, "max": &f.Max, "gt": &f.GT} {
			if v := sf.Tag.Get(tag); v != "" {
				x, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return fmt.Errorf("config: %s: bad %s tag %q", key, tag, v)
				}
				*dst = &x
			}
		}
		f.Flag, f.NegFlag = sf.Tag.Get("flag"), sf.Tag.Get("negflag")
		for _, fl := range []string{f.Flag, f.NegFlag} {
			if fl == "" {
				continue
			}
			if other, dup := s.flags[fl]; dup {
				return fmt.Errorf("config: flag --%s on both %s and %s", fl, other.Key, key)
			}
			s.flags[fl] = f
		}
		s.Fields = append(s.Fields, f)
		s.byKey[key] = f
	}
	return nil
}
