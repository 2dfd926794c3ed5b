package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// decodeStep is one of Hugging Face's decoders, on the tokens' strings.
type decodeStep func(toks []string) []string

// parseDecoder builds the decoder: ByteLevel, Replace, ByteFallback, Fuse,
// Strip, Metaspace and Sequence of them; with none the tokens are joined with
// spaces, as Hugging Face does.
func parseDecoder(raw json.RawMessage) (func([]string) string, error) {
	if isNull(raw) {
		return func(toks []string) string { return strings.Join(toks, " ") }, nil
	}
	step, err := decoderStep(raw)
	if err != nil {
		return nil, err
	}
	return func(toks []string) string { return strings.Join(step(toks), "") }, nil
}

func decoderStep(raw json.RawMessage) (decodeStep, error) {
	var p hfPart
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, err
	}
	switch p.Type {
	case "ByteLevel":
		return func(toks []string) []string {
			var b []byte
			for _, t := range toks {
				if bs, ok := fromByteLevel(t); ok {
					b = append(b, bs...)
				} else {
					b = append(b, t...)
				}
			}
			return []string{string(b)}
		}, nil
	case "Replace":
		from, content, err := p.replacement()
		if err != nil {
			return nil, err
		}
		return func(toks []string) []string {
			for i, t := range toks {
				toks[i] = strings.ReplaceAll(t, from, content)
			}
			return toks
		}, nil
	case "ByteFallback":
		return byteFallbackDecode, nil
	case "Fuse":
		return func(toks []string) []string { return []string{strings.Join(toks, "")} }, nil
	case "Strip":
		var content string
		if err := json.Unmarshal(p.Content, &content); err != nil || utf8.RuneCountInString(content) != 1 {
			return nil, fmt.Errorf("Strip content %s: one character", p.Content)
		}
		start, stop := p.Start, p.Stop
		return func(toks []string) []string {
			for i, t := range toks {
				for n := 0; n < start && strings.HasPrefix(t, content); n++ {
					t = t[len(content):]
				}
				for n := 0; n < stop && strings.HasSuffix(t, content); n++ {
					t = t[:len(t)-len(content)]
				}
				toks[i] = t
			}
			return toks
		}, nil
	case "Metaspace":
		rep := p.Replacement
		if rep == "" {
			rep = "▁"
		}
		prepend := p.PrependScheme != "never"
		if p.AddPrefixSpace != nil && p.PrependScheme == "" {
			prepend = *p.AddPrefixSpace
		}
		return func(toks []string) []string {
			for i, t := range toks {
				t = strings.ReplaceAll(t, rep, " ")
				if i == 0 && prepend {
					t = strings.TrimPrefix(t, " ")
				}
				toks[i] = t
			}
			return toks
		}, nil
	case "Sequence":
		var steps []decodeStep
		for _, q := range p.Decoders {
			s, err := decoderStep(q)
			if err != nil {
				return nil, err
			}
			steps = append(steps, s)
		}
		return func(toks []string) []string {
			for _, s := range steps {
				toks = s(toks)
			}
			return toks
		}, nil
	}
	return nil, fmt.Errorf("decoder type %q is not supported (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace and Sequence are)", p.Type)
}

// byteFallbackDecode joins runs of <0xXX> tokens into their bytes: text where
// they form UTF-8, else one U+FFFD per byte (as Hugging Face's ByteFallback).
func byteFallbackDecode(toks []string) []string {
	var out []string
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if utf8.Valid(pending) {
			out = append(out, string(pending))
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, t := range toks {
		if b, ok := fallbackByte(t); ok {
			pending = append(pending, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

// fallbackByte reads a byte-fallback token, <0xXX>.
func fallbackByte(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	var v byte
	for _, c := range t[3:5] {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | byte(c-'0')
		case c >= 'A' && c <= 'F':
			v = v<<4 | byte(c-'A'+10)
		default:
			return 0, false
		}
	}
	return v, true
}
