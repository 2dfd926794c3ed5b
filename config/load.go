package config

import (
	"errors"
	"fmt"
	"io/fs"
	pathpkg "path"
	"path/filepath"
	"strings"

	"github.com/shardline/shardline/fileio"
)

// Options are the layers above the recipe file, lowest precedence first:
// environment, then --set, then Megatron-style flags.
type Options struct {
	// Env is the environment as os.Environ() returns it; SHARDLINE_<SECTION>_<KEY>
	// variables override the file. Nil means none.
	Env []string
	// Sets are --set arguments, "section.key=value", applied in order.
	Sets []string
	// Flags are Megatron-style dashed flags, applied in order.
	Flags []FlagValue
	// Imported are values translated from another trainer's job file (recipe
	// import torchtitan), applied last, each with its own origin.
	Imported []ImportedValue
	// SettingVars are the SHARDLINE_ variables the CLI reads as its own settings
	// (SHARDLINE_DATA_ROOT): not recipe keys, and not typos of one.
	SettingVars []string
	// ReadFile reads recipe files; nil means ReadRecipeFile.
	ReadFile func(string) ([]byte, error)
	// Shipped holds the recipes shipped inside the binary (package recipes),
	// which a path beginning with ShippedPrefix names (shipped:tiny.toml);
	// their extends resolve among them. Nil: such a path names nothing.
	Shipped fs.FS
	// Defaults are the CLI settings that stand in for built-in defaults (the
	// runs directory, the device profile): below every recipe file, so a recipe
	// that sets the key wins.
	Defaults []SettingDefault
}

// SettingDefault is a CLI setting giving a recipe key's default: the key, the value as
// text, where the setting came from (e.g. "runs_dir in shardline.toml") and its
// position, if in a file.
type SettingDefault struct {
	Key, Value, From string
	Pos              Pos
}

// ImportedValue sets Key to Value (--set syntax) with Origin as its provenance
// (Kind FromImport, Name the source's setting, Pos its place in the source file).
type ImportedValue struct {
	Key, Value string
	Origin     Origin
}

// FlagValue is one dashed flag as given: Name without "--" ("num-layers"), and its
// value ("4"; "true" for a bare boolean flag).
type FlagValue struct {
	Name  string
	Value string
	// Key, when set, is the recipe key the flag sets: a command's own flag (run's
	// --device) rather than a Megatron flag of the schema.
	Key string
	// Env says that Name is an environment variable that set Key (a
	// launcher's WORLD_SIZE), not a flag: messages name the variable.
	Env bool
}

// Resolved is a recipe with the origin of every value.
type Resolved struct {
	Recipe Recipe
	// Path is the recipe file given to Load.
	Path string
	// Files lists the files read, bases first.
	Files []string
	// Sources holds each file's bytes, for rendering source lines.
	Sources map[string][]byte

	history map[string][]Origin // key -> every origin that set it, in order
}

// Origin returns where the key's resolved value came from.
func (r *Resolved) Origin(key string) Origin {
	if h := r.history[key]; len(h) > 0 {
		return h[len(h)-1]
	}
	return Origin{Kind: FromDefault, Pos: Pos{File: r.Path}}
}

// History returns every origin that set the key, oldest first; the last one won.
func (r *Resolved) History(key string) []Origin { return r.history[key] }

// Explicit reports whether the user set the key (file, environment or flag).
func (r *Resolved) Explicit(key string) bool {
	k := r.Origin(key).Kind
	return k != FromDefault && k != FromImplied
}

// Value returns the resolved value of a key.
func (r *Resolved) Value(key string) (any, bool) {
	f, ok := recipeSchema.Lookup(key)
	if !ok {
		return nil, false
	}
	return f.Get(&r.Recipe), true
}

// Load reads the recipe at path (and the bases it extends), applies the overrides
// in opts, and returns the resolved recipe with every problem found. The recipe is
// nil only when a file could not be read or parsed; on other errors it holds the
// defaults in place of the bad values, so every problem is reported at once.
func Load(path string, opts Options) (*Resolved, Diagnostics) {
	if opts.ReadFile == nil {
		opts.ReadFile = ReadRecipeFile
	}
	l := &loader{opts: opts, res: &Resolved{Recipe: Default(), Path: path, Sources: map[string][]byte{}, history: map[string][]Origin{}}}
	src, err := l.read(path)
	if err != nil {
		return nil, Diagnostics{readError(path, err, Origin{Kind: FromFile, Pos: Pos{File: path}}, "SL005")}
	}
	docs := l.chain(path, src, nil)
	if l.diags.HasErrors() && len(docs) == 0 {
		l.diags.InRecipe(path)
		return nil, l.diags
	}
	for _, d := range opts.Defaults {
		f, ok := recipeSchema.Lookup(d.Key)
		if !ok {
			l.add(Diagnostic{Severity: SevError, Code: "SL007", Key: d.Key, Message: fmt.Sprintf("setting %s names no recipe key %s", d.From, d.Key),
				Help: "a shardline bug: settings map to recipe keys", Origin: Origin{Kind: FromDefault, Name: d.From, Pos: d.Pos}})
			continue
		}
		l.applyString(f, d.Value, Origin{Kind: FromDefault, Name: d.From, Raw: d.Value, Pos: d.Pos})
	}
	for _, d := range docs {
		l.res.Files = append(l.res.Files, d.path)
		l.res.Sources[d.path] = d.src
		l.decodeDoc(d)
	}
	l.applyEnv()
	l.applySets()
	l.applyFlags()
	l.applyImported()
	l.applyImplied()
	l.diags.InRecipe(path)
	l.diags.Sort()
	return l.res, l.diags
}

// LoadBytes loads a recipe held in memory (its extends are read from disk relative
// to path). Fuzzing and tests use it.
func LoadBytes(path string, src []byte, opts Options) (*Resolved, Diagnostics) {
	read := opts.ReadFile
	if read == nil {
		read = ReadRecipeFile
	}
	opts.ReadFile = func(p string) ([]byte, error) {
		if p == path {
			return src, nil
		}
		return read(p)
	}
	return Load(path, opts)
}

// ShippedPrefix begins the name of a recipe shipped inside the binary
// (Options.Shipped): shipped:tiny.toml is recipes/tiny.toml of the source
// tree this shardline was built from. Any other path is a file.
const ShippedPrefix = "shipped:"

// IsShipped says whether path names a shipped recipe.
func IsShipped(path string) bool { return strings.HasPrefix(path, ShippedPrefix) }

// read reads a recipe: a shipped one from Options.Shipped, else through
// Options.ReadFile.
func (l *loader) read(p string) ([]byte, error) {
	name, ok := strings.CutPrefix(p, ShippedPrefix)
	if !ok {
		return l.opts.ReadFile(p)
	}
	if l.opts.Shipped == nil || !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	}
	f, err := l.opts.Shipped.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, &fs.PathError{Op: "read", Path: p, Err: fileio.ErrNotRegular}
	}
	return fs.ReadFile(l.opts.Shipped, name)
}

// extendsPath is where extends = rel, in the recipe at path, points: rel
// itself when absolute, else rel beside path; among the shipped recipes when
// path is one.
func extendsPath(path, rel string) string {
	if filepath.IsAbs(rel) {
		return rel
	}
	if name, ok := strings.CutPrefix(path, ShippedPrefix); ok {
		return ShippedPrefix + pathpkg.Join(pathpkg.Dir(name), filepath.ToSlash(rel))
	}
	return filepath.Join(filepath.Dir(path), rel)
}

// MaxRecipeBytes is the largest recipe file read: recipes are a few kilobytes, and
// the cap keeps a mistaken path (a device, a data file) from being read whole.
const MaxRecipeBytes = 1 << 20

// ReadRecipeFile reads a recipe: a regular file of at most MaxRecipeBytes.
func ReadRecipeFile(path string) ([]byte, error) {
	return fileio.ReadRegular(path, MaxRecipeBytes)
}

type loader struct {
	opts  Options
	res   *Resolved
	diags Diagnostics
}

func (l *loader) add(d Diagnostic) { l.diags = append(l.diags, d) }

func readError(path string, err error, at Origin, code string) Diagnostic {
	help := "check the path; relative paths are relative to the working directory"
	if code == "SL005" && at.Pos.IsValid() {
		help = "extends paths are relative to the file that names them; fix the path or create the base recipe"
	}
	msg := fmt.Sprintf("cannot read recipe %s: %v", path, unwrapPathError(err))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		msg = fmt.Sprintf("recipe %s does not exist", path)
	case errors.Is(err, fileio.ErrNotRegular):
		help = "a recipe is a regular .toml file; check the path"
	case errors.Is(err, fileio.ErrTooLarge):
		help = fmt.Sprintf("recipes are small TOML files (at most %d bytes); check that the path names a recipe, not data", MaxRecipeBytes)
	}
	return Diagnostic{Severity: SevError, Code: code, Message: msg, Help: help, Origin: at}
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// chain parses path and, first, the bases it extends. stack holds the files being
// loaded, to refuse cycles.
func (l *loader) chain(path string, src []byte, stack []string) []*tomlDoc {
	doc, diags := parseTOML(path, src)
	l.diags = append(l.diags, diags...)
	if doc == nil {
		return nil
	}
	if d := notARecipe(doc); d != nil {
		l.add(*d)
		return nil
	}
	var base []*tomlDoc
	for _, e := range doc.entries {
		if e.key != "extends" {
			continue
		}
		at := Origin{Kind: FromFile, Pos: e.val.pos}
		if e.val.kind != vString {
			l.add(Diagnostic{Severity: SevError, Code: "SL003", Key: "extends",
				Message: fmt.Sprintf("extends must be a string (a path), not %s %s", e.val.kind, e.val.text),
				Help:    `write extends = "base.toml"`, Origin: at})
			continue
		}
		bpath := e.val.s
		if filepath.Ext(bpath) != ".toml" {
			// Only recipes are read: a base that is any other file (a key, a
			// password file, a .env) would have its lines quoted in diagnostics.
			l.add(Diagnostic{Severity: SevError, Code: "SL005", Key: "extends",
				Message: fmt.Sprintf("extends %q names no recipe: a base recipe is a .toml file", e.val.s),
				Help:    `point extends at a recipe, e.g. extends = "base/llama.toml"`, Origin: at})
			continue
		}
		if len(stack) >= maxExtendsDepth {
			l.add(Diagnostic{Severity: SevError, Code: "SL005", Key: "extends",
				Message: fmt.Sprintf("extends %q goes %d recipes deep: %s -> ...", e.val.s, len(stack)+1, strings.Join(stack[:3], " -> ")),
				Help:    fmt.Sprintf("a recipe extends at most %d bases in a chain; merge some of them", maxExtendsDepth), Origin: at})
			continue
		}
		bpath = extendsPath(path, bpath)
		if slicesContains(append(stack, path), filepath.Clean(bpath)) {
			l.add(Diagnostic{Severity: SevError, Code: "SL005", Key: "extends",
				Message: fmt.Sprintf("extends %q makes a cycle: %s -> %s", e.val.s, strings.Join(append(stack, path), " -> "), filepath.Clean(bpath)),
				Help:    "remove the extends that points back to a recipe already in the chain", Origin: at})
			continue
		}
		bsrc, err := l.read(bpath)
		if err != nil {
			l.add(readError(bpath, err, at, "SL005"))
			continue
		}
		base = append(base, l.chain(filepath.Clean(bpath), bsrc, append(stack, filepath.Clean(path)))...)
	}
	return append(base, doc)
}

// maxExtendsDepth bounds a chain of extends: a few bases are normal, and the
// bound keeps a chain through a symbolic link to its own directory (base.toml
// extends "loop/base.toml", loop -> .) from reading the same file until the path
// is too long.
const maxExtendsDepth = 16

// notARecipe refuses a file that holds tables or keys but none a recipe has: not
// a section of the recipe, nor extends. Such a file (a .env, a credentials
// file) is not decoded, so no diagnostic quotes its lines or values; the one
// finding names its first key, which is structure, not a secret.
func notARecipe(doc *tomlDoc) *Diagnostic {
	var first string
	var at Pos
	firstHeader := false
	consider := func(name string, pos Pos, header bool) bool {
		top, _, _ := strings.Cut(name, ".")
		if top == "extends" || recipeSchema.IsSection(top) {
			return true
		}
		if first == "" || pos.Offset < at.Offset {
			first, at, firstHeader = name, pos, header
		}
		return false
	}
	for _, h := range doc.headers {
		if consider(h.name, h.pos, true) {
			return nil
		}
	}
	for _, e := range doc.entries {
		if consider(e.key, e.keyPos, false) {
			return nil
		}
	}
	if first == "" {
		return nil // an empty recipe: every value at its default
	}
	d := &Diagnostic{Severity: SevError, Code: "SL002",
		Message: fmt.Sprintf("%s is not a shardline recipe: it has no recipe section and no extends (its first key is %s); its lines are not shown", doc.path, first),
		Help:    "recipes hold sections such as [model] and [train] (see `shardline recipe docs`); check the path",
		Origin:  Origin{Kind: FromFile, Pos: at}}
	// A recipe whose every key is misplaced or misspelt ("layers = 4" with no
	// [model]) gets the same hint an unknown key would.
	hint := unknownKey(first, d.Origin, map[string]bool{})
	if firstHeader {
		hint = unknownSection(first, d.Origin)
	}
	if i := strings.Index(hint.Message, "; did you mean"); i >= 0 {
		d.Message += hint.Message[i:]
		d.Help = hint.Help
	}
	return d
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if filepath.Clean(x) == v {
			return true
		}
	}
	return false
}

// decodeDoc checks a file's keys against the schema and applies its values.
func (l *loader) decodeDoc(d *tomlDoc) {
	s := recipeSchema
	badSections := map[string]bool{}
	seenHeader := map[string]Pos{}
	for _, h := range d.headers {
		at := Origin{Kind: FromFile, Pos: h.pos}
		if first, dup := seenHeader[h.name]; dup {
			l.add(Diagnostic{Severity: SevError, Code: "SL006", Key: h.name,
				Message: fmt.Sprintf("section [%s] is defined twice (first at %s)", h.name, first),
				Help:    "merge the two sections into one", Origin: at})
			continue
		}
		seenHeader[h.name] = h.pos
		switch {
		case h.array:
			badSections[h.name] = true
			l.add(Diagnostic{Severity: SevError, Code: "SL002", Key: h.name,
				Message: fmt.Sprintf("[[%s]] (an array of tables) is not part of the recipe", h.name),
				Help:    fmt.Sprintf("write [%s] with single brackets if %s is a section", h.name, h.name), Origin: at})
		case s.IsSection(h.name):
		case isField(h.name):
			badSections[h.name] = true
			l.add(Diagnostic{Severity: SevError, Code: "SL003", Key: h.name,
				Message: fmt.Sprintf("%s is a value, not a section", h.name),
				Help:    fmt.Sprintf("write %s = <value> under [%s]", lastPart(h.name), sectionOf(h.name)), Origin: at})
		default:
			badSections[h.name] = true
			l.add(unknownSection(h.name, at))
		}
	}
	seen := map[string]Pos{}
	for _, e := range d.entries {
		if e.key == "extends" || underBad(e.key, badSections) {
			continue
		}
		at := Origin{Kind: FromFile, Pos: e.keyPos}
		if first, dup := seen[e.key]; dup {
			l.add(Diagnostic{Severity: SevError, Code: "SL006", Key: e.key,
				Message: fmt.Sprintf("%s is defined twice (first at %s)", e.key, first),
				Help:    "keep one of the two definitions", Origin: at})
			continue
		}
		seen[e.key] = e.keyPos
		f, ok := s.Lookup(e.key)
		if !ok {
			switch {
			case s.IsSection(e.key) && e.val.kind == vTable:
			case s.IsSection(e.key):
				l.add(Diagnostic{Severity: SevError, Code: "SL003", Key: e.key,
					Message: fmt.Sprintf("%s is a section, not a value (got %s %s)", e.key, e.val.kind, e.val.text),
					Help:    fmt.Sprintf("write its keys under a [%s] header", e.key), Origin: at})
			case underField(e.key):
				// Keys inside an inline table given to a plain value: that value's type
				// error already covers them.
			default:
				l.add(unknownKey(e.key, at, badSections))
			}
			continue
		}
		val, diag := convertRaw(f, e.val)
		if diag != nil {
			diag.Origin = Origin{Kind: FromFile, Pos: e.val.pos}
			l.add(*diag)
			continue
		}
		l.set(f, val, Origin{Kind: FromFile, Pos: e.keyPos, ValuePos: e.val.pos, Raw: e.val.text})
	}
}

func (l *loader) set(f *Field, v any, o Origin) {
	f.set(&l.res.Recipe, v)
	l.res.history[f.Key] = append(l.res.history[f.Key], o)
}

func isField(key string) bool { _, ok := recipeSchema.Lookup(key); return ok }

func underField(key string) bool {
	for i := len(key) - 1; i > 0; i-- {
		if key[i] == '.' && isField(key[:i]) {
			return true
		}
	}
	return false
}

func underBad(key string, bad map[string]bool) bool {
	for b := range bad {
		if key == b || strings.HasPrefix(key, b+".") {
			return true
		}
	}
	return false
}

func lastPart(key string) string { return key[strings.LastIndexByte(key, '.')+1:] }

func sectionOf(key string) string {
	if i := strings.LastIndexByte(key, '.'); i >= 0 {
		return key[:i]
	}
	return ""
}

func unknownSection(name string, at Origin) Diagnostic {
	d := Diagnostic{Severity: SevError, Code: "SL002", Key: name,
		Message: fmt.Sprintf("unknown section [%s]", name),
		Help:    "sections are " + strings.Join(topSections(), ", "), Origin: at}
	if s := Suggest(name, recipeSchema.Sections); s != "" {
		d.Message += fmt.Sprintf("; did you mean [%s]?", s)
		d.Help = fmt.Sprintf("rename the section to [%s]", s)
	}
	return d
}

func topSections() []string {
	var out []string
	for _, s := range recipeSchema.Sections {
		if !strings.Contains(s, ".") {
			out = append(out, s)
		}
	}
	return out
}

// unknownKey explains a key the schema lacks, with the closest key of its section,
// or the same key in another section.
func unknownKey(key string, at Origin, badSections map[string]bool) Diagnostic {
	s := recipeSchema
	sec, name := sectionOf(key), lastPart(key)
	if sec == "" || !s.IsSection(sec) {
		// A key outside any section, or under an unknown dotted section.
		top := key
		if i := strings.IndexByte(key, '.'); i >= 0 {
			top = key[:i]
		}
		if sec == "" {
			var all []string
			for _, f := range s.Fields {
				if f.Name == key {
					all = append(all, f.Key)
				}
			}
			d := Diagnostic{Severity: SevError, Code: "SL002", Key: key, Origin: at,
				Message: fmt.Sprintf("unknown key %s at the top level", key),
				Help:    "every key belongs to a section such as [model] or [train]; only extends is top-level"}
			if len(all) > 0 {
				d.Message += fmt.Sprintf("; did you mean %s?", all[0])
				d.Help = fmt.Sprintf("move it under [%s]", sectionOf(all[0]))
			}
			return d
		}
		if !s.IsSection(top) {
			badSections[top] = true
			return unknownSection(top, at)
		}
		return unknownSection(sec, at)
	}
	var names []string
	for _, f := range s.SectionKeys(sec) {
		names = append(names, f.Name)
	}
	for _, sub := range s.Sections {
		if sectionOf(sub) == sec {
			names = append(names, lastPart(sub))
		}
	}
	d := Diagnostic{Severity: SevError, Code: "SL002", Key: key, Origin: at,
		Message: fmt.Sprintf("unknown key %s in [%s]", name, sec),
		Help:    fmt.Sprintf("[%s] takes: %s (see `shardline recipe docs`)", sec, strings.Join(names, ", "))}
	if m := Suggest(name, names); m != "" {
		d.Message += fmt.Sprintf("; did you mean %s?", m)
		d.Help = fmt.Sprintf("rename it to %s", m)
		return d
	}
	for _, f := range s.Fields {
		if f.Name == name {
			d.Message += fmt.Sprintf("; did you mean %s?", f.Key)
			d.Help = fmt.Sprintf("move it under [%s]", f.Section)
			break
		}
	}
	return d
}
