// Package config owns shardline's recipe: the schema (one documented struct per TOML
// section, recipe.go), loading with extends and overrides, the provenance of every
// value, the lint rules, and the diagnostics they produce.
//
// # Data flow
//
//	Load(path, Options) -> *Resolved (Recipe + Origin of every key), Diagnostics
//	Lint(*Resolved, env) -> Diagnostics
//	Canonical / Fingerprint / ResolvedTOML -> the resolved recipe as bytes
//
// # Layers
//
// Values are resolved from lowest to highest precedence: built-in defaults
// (Default), the base recipes named by extends (bases first), the recipe file,
// SHARDLINE_<SECTION>_<KEY> environment variables, --set section.key=value, and
// Megatron-style dashed flags (--num-layers, --use-megatron-fsdp, ...). Every value
// remembers its Origin: a file position, a variable or a flag.
//
// # Positions
//
// TOML is read with go-toml/v2's unstable parser, which exposes the byte range of
// every key and value; Pos prints file:line:col as go/token does. BurntSushi/toml
// writes the canonical form.
//
// # Diagnostics
//
// Every problem is a Diagnostic with a stable code (Rules), a severity, a message
// naming the key, its value and the rule, a help line with the fix, and the Origin
// of the value at fault. Library code returns them; only cmd/ prints and exits.
//
// This package imports nothing else from shardline.
package config
