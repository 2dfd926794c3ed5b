package config

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"
)

// applyEnv applies SHARDLINE_<SECTION>_<KEY> variables. A SHARDLINE_ variable that
// starts like a section but names no key is a warning (it is probably a typo).
func (l *loader) applyEnv() {
	env := map[string]string{}
	for _, kv := range l.opts.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "SHARDLINE_") {
			env[k] = v
		}
	}
	known := map[string]bool{}
	var names []string
	for _, f := range recipeSchema.Fields {
		name := f.EnvVar()
		known[name] = true
		names = append(names, name)
		raw, ok := env[name]
		if !ok {
			continue
		}
		o := Origin{Kind: FromEnv, Name: name, Raw: raw, Pos: Pos{File: l.res.Path}}
		l.applyString(f, raw, o)
	}
	for _, name := range l.opts.SettingVars {
		known[name] = true // the CLI's own setting (SHARDLINE_DATA_ROOT), not a typo
		names = append(names, name)
	}
	var unknown []string
	for k := range env {
		if known[k] {
			continue
		}
		for _, sec := range topSections() {
			if strings.HasPrefix(k, EnvVarFor(sec)+"_") {
				unknown = append(unknown, k)
				break
			}
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		d := Diagnostic{Severity: SevWarning, Code: "SL007", Origin: Origin{Kind: FromEnv, Name: k, Raw: env[k]},
			Message: fmt.Sprintf("environment variable %s names no recipe key and is ignored", k),
			Help:    "recipe keys map to SHARDLINE_<SECTION>_<KEY>, e.g. SHARDLINE_MODEL_LAYERS; unset it or fix the name"}
		if m := Suggest(k, names); m != "" {
			d.Message += fmt.Sprintf("; did you mean %s?", m)
			d.Help = "rename it to " + m
		}
		l.add(d)
	}
}

// applySets applies --set section.key=value in order.
func (l *loader) applySets() {
	for _, arg := range l.opts.Sets {
		key, raw, ok := strings.Cut(arg, "=")
		key = strings.TrimSpace(key)
		o := Origin{Kind: FromSet, Name: "--set " + key, Raw: raw, Pos: Pos{File: l.res.Path}}
		if !ok || key == "" {
			o.Name = "--set " + arg
			l.add(Diagnostic{Severity: SevError, Code: "SL007", Origin: o,
				Message: fmt.Sprintf("--set %q is not of the form section.key=value", arg),
				Help:    "write --set model.layers=8"})
			continue
		}
		f, found := recipeSchema.Lookup(key)
		if !found && recipeSchema.IsSection(key) {
			var keys []string
			for _, k := range recipeSchema.Fields {
				if strings.HasPrefix(k.Key, key+".") {
					keys = append(keys, strings.TrimPrefix(k.Key, key+"."))
				}
			}
			l.add(Diagnostic{Severity: SevError, Code: "SL007", Key: key, Origin: o,
				Message: fmt.Sprintf("--set %s=%s: %s is a section, not a value", key, raw, key),
				Help:    fmt.Sprintf("set one of its keys, e.g. --set %s.%s=...; [%s] takes: %s", key, keys[0], key, strings.Join(keys, ", "))})
			continue
		}
		if !found {
			d := unknownKey(key, o, map[string]bool{})
			d.Message = "--set: " + d.Message
			l.add(d)
			continue
		}
		l.applyString(f, raw, o)
	}
}

// applyImported applies values translated from another trainer's job file.
func (l *loader) applyImported() {
	for _, v := range l.opts.Imported {
		o := v.Origin
		o.Kind, o.Raw = FromImport, v.Value
		f, found := recipeSchema.Lookup(v.Key)
		if !found {
			l.add(Diagnostic{Severity: SevError, Code: "SL007", Key: v.Key, Origin: o,
				Message: fmt.Sprintf("the import set %s, which is no recipe key", v.Key), Help: "a shardline bug: imports map to recipe keys"})
			continue
		}
		l.applyString(f, v.Value, o)
	}
}

// applyFlags applies Megatron-style dashed flags.
func (l *loader) applyFlags() {
	// Megatron arguments computed from the recipe once every flag is in: steps and
	// warmup first, then the decay (counted after warmup).
	var later [2][]func()
	defer func() {
		for _, pass := range later {
			for _, f := range pass {
				f()
			}
		}
	}()
	for _, fv := range l.opts.Flags {
		name := strings.TrimLeft(fv.Name, "-")
		o := Origin{Kind: FromFlag, Name: "--" + name, Raw: fv.Value, Pos: Pos{File: l.res.Path}}
		if fv.Env {
			o.Kind, o.Name = FromEnv, fv.Name
		}
		if fv.Key != "" {
			if f, ok := recipeSchema.Lookup(fv.Key); ok {
				l.applyString(f, fv.Value, o)
				continue
			}
		}
		f, positive, ok := recipeSchema.FlagField(name)
		if !ok && l.applyMegatronArg(name, fv, o, &later) {
			continue
		}
		if !ok {
			d := Diagnostic{Severity: SevError, Code: "SL007", Origin: o,
				Message: fmt.Sprintf("unknown flag --%s", name),
				Help:    "see `shardline lint --help` for the Megatron flags shardline accepts, or use --set section.key=value"}
			if m := Suggest(name, append(recipeSchema.Flags(), megatronNames()...)); m != "" {
				d.Message += fmt.Sprintf("; did you mean --%s?", m)
			}
			l.add(d)
			continue
		}
		raw := fv.Value
		if f.Kind == KindBool && !positive {
			// --no-x means x = false; --no-x=false means x = true.
			v, d := convertString(f, raw)
			if d != nil {
				d.Origin = o
				l.add(*d)
				continue
			}
			l.set(f, !v.(bool), o)
			continue
		}
		l.applyString(f, raw, o)
	}
}

func (l *loader) applyString(f *Field, raw string, o Origin) {
	v, d := convertString(f, raw)
	if d != nil {
		d.Origin = o
		if d.Code == "SL003" {
			d.Code = "SL007"
		}
		l.add(*d)
		return
	}
	l.set(f, v, o)
}

// applyImplied fills values that follow from others, unless the user set them.
func (l *loader) applyImplied() {
	r := &l.res.Recipe
	if r.FSDP.UseNCCLUB && !l.res.Explicit("fsdp.fsdp_double_buffer") {
		f, _ := recipeSchema.Lookup("fsdp.fsdp_double_buffer")
		l.set(f, true, Origin{Kind: FromImplied, Because: "fsdp.use_nccl_ub (" + l.res.Origin("fsdp.use_nccl_ub").Location() + ")",
			Pos: l.res.Origin("fsdp.use_nccl_ub").Pos})
	}
	if r.Run.Name == "" {
		f, _ := recipeSchema.Lookup("run.name")
		base := filepath.Base(strings.TrimPrefix(l.res.Path, ShippedPrefix))
		// A file name need not be UTF-8; the name written into the resolved recipe must.
		name := strings.ToValidUTF8(strings.TrimSuffix(base, filepath.Ext(base)), "_")
		l.set(f, name, Origin{Kind: FromImplied, Because: "the recipe's file name", Pos: Pos{File: l.res.Path}})
	}
}

func megatronNames() []string {
	var out []string
	for name := range megatronArgs {
		out = append(out, name)
	}
	return out
}
