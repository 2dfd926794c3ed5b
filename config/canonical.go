package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/BurntSushi/toml"
)

// Canonical returns the recipe as canonical TOML: every key, in schema order, one
// section per table, written by BurntSushi/toml. Equal recipes give equal bytes, and
// loading the output gives the same recipe back.
func Canonical(r *Recipe) ([]byte, error) {
	var b bytes.Buffer
	enc := toml.NewEncoder(&b)
	enc.Indent = ""
	if err := enc.Encode(r); err != nil {
		return nil, fmt.Errorf("config: encoding the resolved recipe: %w", err)
	}
	return b.Bytes(), nil
}

// Fingerprint is "sha256:" and the hex SHA-256 of the canonical TOML.
func Fingerprint(r *Recipe) (string, error) {
	c, err := Canonical(r)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// resolvedHeader starts ResolvedTOML's header; its fingerprint line and a blank
// line follow, then the canonical TOML.
const resolvedHeader = "# Resolved by shardline; every key is explicit.\n# fingerprint: "

// WrittenFingerprint is the fingerprint of the canonical TOML a ResolvedTOML
// text holds after its header, as written (not as this version would
// canonicalise the recipe): false when text does not start with the header.
func WrittenFingerprint(text []byte) (string, bool) {
	rest, ok := bytes.CutPrefix(text, []byte(resolvedHeader))
	if !ok {
		return "", false
	}
	_, body, ok := bytes.Cut(rest, []byte("\n\n"))
	if !ok {
		return "", false
	}
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:]), true
}

// ResolvedTOML is what `shardline recipe resolve` prints and what a run writes next
// to its outputs: a header naming the fingerprint, then the canonical TOML. The
// header is a comment, so the file loads back to the same recipe and fingerprint.
func ResolvedTOML(r *Recipe) ([]byte, string, error) {
	c, err := Canonical(r)
	if err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(c)
	fp := "sha256:" + hex.EncodeToString(sum[:])
	out := fmt.Appendf(nil, resolvedHeader+"%s\n\n", fp)
	return append(out, c...), fp, nil
}
