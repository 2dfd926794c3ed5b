package config

import (
	"fmt"
	"strconv"
	"strings"
)

// Pos is a position in a recipe file, printed as file:line:col like go/token.
// Line and Col start at 1; Line 0 means "the file, no particular place".
type Pos struct {
	File   string
	Line   int
	Col    int
	Offset int // byte offset in the file
}

// IsValid reports whether the position names a line.
func (p Pos) IsValid() bool { return p.Line > 0 }

func (p Pos) String() string {
	switch {
	case p.File == "" && p.Line == 0:
		return "-"
	case p.Line == 0:
		return p.File
	default:
		return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Col)
	}
}

// OriginKind says which layer set a value.
type OriginKind int

// Layers of a resolved recipe, lowest precedence first.
const (
	FromDefault OriginKind = iota
	FromFile               // a recipe file (or a base it extends)
	FromEnv                // a SHARDLINE_<SECTION>_<KEY> variable
	FromSet                // --set section.key=value
	FromFlag               // a Megatron-style dashed flag
	FromImplied            // derived from another setting (e.g. use_nccl_ub)
	FromImport             // translated from another trainer's job file (recipe import)
)

func (k OriginKind) String() string {
	return [...]string{"default", "file", "env", "set", "flag", "implied", "import"}[k]
}

// Origin records where a resolved value came from.
type Origin struct {
	Kind OriginKind
	// Pos is the key's position for file values; for others it is the recipe file
	// (Line 0), so a diagnostic can still name the file.
	Pos Pos
	// ValuePos is the position of the value in the file (file values only).
	ValuePos Pos
	// Name is the environment variable or the flag ("--num-layers", "--set"), or for
	// an imported value the source's setting ("[training] local_batch_size").
	Name string
	// Raw is the value as written (TOML text, or the env/flag string).
	Raw string
	// Because names the key this value was derived from (FromImplied only).
	Because string
}

// Location is where a diagnostic about this value points: file:line:col for file
// values, the flag or variable otherwise.
func (o Origin) Location() string {
	switch {
	case o.settingVar():
		return "env " + o.Name
	}
	switch o.Kind {
	case FromEnv:
		return "env " + o.Name
	case FromSet, FromFlag:
		return "flag " + o.Name
	default:
		return o.Pos.String()
	}
}

// settingVar reports whether the origin is a CLI setting given by an
// environment variable (SHARDLINE_DEVICE_PROFILE): a default with a name and no
// file position. A setting from the settings file has its position.
func (o Origin) settingVar() bool {
	return o.Kind == FromDefault && strings.HasPrefix(o.Name, "SHARDLINE_") && o.Pos.File == "" && !o.Pos.IsValid()
}

// Describe is a one-line account of the origin, for `lint --explain`.
func (o Origin) Describe() string {
	switch o.Kind {
	case FromDefault:
		if o.Name != "" { // a CLI setting (shardline.toml, SHARDLINE_<SETTING>, ...)
			return "setting " + o.Name
		}
		return "built-in default"
	case FromFile:
		return "recipe " + o.Pos.String()
	case FromEnv:
		return "environment " + o.Name + "=" + strconv.Quote(o.Raw)
	case FromSet:
		return "flag " + o.Name + " " + strconv.Quote(o.Raw)
	case FromFlag:
		return "flag " + o.Name + "=" + o.Raw
	case FromImplied:
		return "implied by " + o.Because
	case FromImport:
		if o.Pos.Line > 0 {
			return "imported from " + o.Name + " at " + o.Pos.String()
		}
		return "imported from " + o.Name
	}
	return o.Kind.String()
}
