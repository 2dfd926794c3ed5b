package tokenizer

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// preStep is one pre-tokenizer: it splits each word of words, appending the
// pieces to out.
type preStep interface {
	split(words, out []string) ([]string, error)
}

// behavior is how a split treats what its pattern matches (Hugging Face's
// SplitDelimiterBehavior).
type behavior int

const (
	isolated behavior = iota
	removed
	mergedWithPrevious
	mergedWithNext
	contiguous
)

var behaviors = map[string]behavior{
	"Isolated": isolated, "Removed": removed, "MergedWithPrevious": mergedWithPrevious,
	"MergedWithNext": mergedWithNext, "Contiguous": contiguous,
}

// splitStep is Hugging Face's Split pre-tokenizer: a regular expression (or a
// literal string) and what becomes of its matches.
type splitStep struct {
	re       *regexp2.Regexp // nil for a literal
	fast     fastSplit       // the pattern's hand-written matcher, where it has one
	literal  string
	behavior behavior
	invert   bool
}

// gpt2Pattern is GPT-2's pre-tokenizer, which Hugging Face's ByteLevel
// pre-tokenizer applies when use_regex is true.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// compilePattern compiles a pre-tokenizer's regular expression as Oniguruma
// and fancy-regex read it (the .NET syntax regexp2 takes agrees on what these
// patterns use: classes, \p{..}, look-ahead, (?i:..)); possessive quantifiers
// (?+ ++ *+) become atomic groups.
func compilePattern(p string) (*regexp2.Regexp, error) {
	p, err := possessiveToAtomic(p)
	if err != nil {
		return nil, err
	}
	re, err := regexp2.Compile(p, regexp2.None)
	if err != nil {
		return nil, err
	}
	re.MatchTimeout = matchTimeout
	return re, nil
}

// matchTimeout bounds one regular-expression search: a pattern a tokenizer
// file brings may backtrack exponentially on some text ((a+)+b), and then
// Encode fails naming it instead of running for ever. The patterns tokenizers
// ship take microseconds a match.
var matchTimeout = 10 * time.Second

type segment struct {
	start, end int
	match      bool
}

func (s *splitStep) segments(w string) ([]segment, error) {
	var segs []segment
	at := 0
	add := func(lo, hi int) {
		if lo > at {
			segs = append(segs, segment{at, lo, false})
		}
		if hi > lo {
			segs = append(segs, segment{lo, hi, true})
		}
		at = hi
	}
	if s.fast != nil {
		for at < len(w) {
			segs = append(segs, segment{at, s.fast(w, at), true})
			at = segs[len(segs)-1].end
		}
	} else if s.re != nil {
		idx, err := s.re.FindAllStringIndex(w, -1)
		if err != nil {
			return nil, fmt.Errorf("pre-tokenizer pattern %q: %w", s.re.String(), err)
		}
		for _, m := range idx {
			add(m[0], m[1])
		}
	} else if s.literal != "" {
		for {
			i := strings.Index(w[at:], s.literal)
			if i < 0 {
				break
			}
			add(at+i, at+i+len(s.literal))
		}
	}
	if at < len(w) {
		segs = append(segs, segment{at, len(w), false})
	}
	if s.invert {
		for i := range segs {
			segs[i].match = !segs[i].match
		}
	}
	return segs, nil
}

func (s *splitStep) split(words, out []string) ([]string, error) {
	for _, w := range words {
		segs, err := s.segments(w)
		if err != nil {
			return nil, err
		}
		switch s.behavior {
		case isolated:
			for _, g := range segs {
				out = append(out, w[g.start:g.end])
			}
		case removed:
			for _, g := range segs {
				if !g.match {
					out = append(out, w[g.start:g.end])
				}
			}
		case mergedWithPrevious, contiguous:
			var acc []segment
			prev := false
			for _, g := range segs {
				join := g.match && !prev
				if s.behavior == contiguous {
					join = g.match == prev
				}
				if join && len(acc) > 0 {
					acc[len(acc)-1].end = g.end
				} else {
					acc = append(acc, g)
				}
				prev = g.match
			}
			for _, g := range acc {
				out = append(out, w[g.start:g.end])
			}
		case mergedWithNext:
			var acc []segment // built backwards
			prev := false
			for i := len(segs) - 1; i >= 0; i-- {
				g := segs[i]
				if g.match && !prev && len(acc) > 0 {
					acc[len(acc)-1].start = g.start
				} else {
					acc = append(acc, g)
				}
				prev = g.match
			}
			for i := len(acc) - 1; i >= 0; i-- {
				out = append(out, w[acc[i].start:acc[i].end])
			}
		}
	}
	return out, nil
}

// byteLevelStep is Hugging Face's ByteLevel pre-tokenizer: a space before a
// word that does not start with one (add_prefix_space), then GPT-2's pattern
// (use_regex). Its mapping of bytes to characters is the model's business here:
// the byte-level BPE works on the bytes themselves.
type byteLevelStep struct {
	addPrefixSpace bool
	re             *splitStep // nil unless use_regex
}

func (b *byteLevelStep) split(words, out []string) ([]string, error) {
	if b.addPrefixSpace {
		words = append([]string(nil), words...)
		for i, w := range words {
			if !strings.HasPrefix(w, " ") {
				words[i] = " " + w
			}
		}
	}
	if b.re == nil {
		return append(out, words...), nil
	}
	return b.re.split(words, out)
}

// digitsStep is Hugging Face's Digits pre-tokenizer: runs of digits (or each
// digit, individual_digits) apart from the rest.
type digitsStep struct {
	individual bool
}

func (d *digitsStep) split(words, out []string) ([]string, error) {
	isDigit := func(c byte) bool { return c >= '0' && c <= '9' }
	for _, w := range words {
		start := 0
		for i := 0; i < len(w); i++ {
			if !isDigit(w[i]) {
				continue
			}
			if i > start && !isDigit(w[i-1]) {
				out = append(out, w[start:i])
				start = i
			}
			if d.individual {
				if i > start {
					out = append(out, w[start:i])
				}
				out = append(out, w[i:i+1])
				start = i + 1
			} else if i+1 == len(w) || !isDigit(w[i+1]) {
				out = append(out, w[start:i+1])
				start = i + 1
			}
		}
		if start < len(w) {
			out = append(out, w[start:])
		}
	}
	return out, nil
}

// possessiveToAtomic rewrites the possessive quantifiers ?+, *+ and ++ (which
// fancy-regex and Oniguruma take and .NET does not) as atomic groups around
// the quantified atom: [^\r\n]?+ becomes (?>[^\r\n]?).
func possessiveToAtomic(p string) (string, error) {
	var out []byte
	type frame struct{ open int }
	var stack []frame
	lastAtom := -1
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '\\' && i+1 < len(p):
			start := len(out)
			j := i + 2
			if (p[i+1] == 'p' || p[i+1] == 'P') && j < len(p) && p[j] == '{' {
				k := strings.IndexByte(p[j:], '}')
				if k < 0 {
					return "", fmt.Errorf("pattern %q: \\%c{ without }", p, p[i+1])
				}
				j += k + 1
			}
			out = append(out, p[i:j]...)
			i = j - 1
			lastAtom = start
		case c == '[':
			start := len(out)
			j := i + 1
			if j < len(p) && p[j] == '^' {
				j++
			}
			if j < len(p) && p[j] == ']' {
				j++
			}
			for j < len(p) && p[j] != ']' {
				if p[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(p) {
				return "", fmt.Errorf("pattern %q: [ without ]", p)
			}
			out = append(out, p[i:j+1]...)
			i = j
			lastAtom = start
		case c == '(':
			stack = append(stack, frame{len(out)})
			out = append(out, c)
			lastAtom = -1
		case c == ')':
			if len(stack) == 0 {
				return "", fmt.Errorf("pattern %q: ) without (", p)
			}
			lastAtom = stack[len(stack)-1].open
			stack = stack[:len(stack)-1]
			out = append(out, c)
		case (c == '?' || c == '*' || c == '+') && i+1 < len(p) && p[i+1] == '+' && lastAtom >= 0:
			atom := string(out[lastAtom:])
			out = append(out[:lastAtom], "(?>"+atom+string(c)+")"...)
			i++
			lastAtom = -1
		case c == '?' || c == '*' || c == '+' || c == '|':
			out = append(out, c)
			lastAtom = -1
		case c == '{':
			k := strings.IndexByte(p[i:], '}')
			if k < 0 {
				out = append(out, c)
				lastAtom = -1
				continue
			}
			q := p[i : i+k+1]
			if i+k+1 < len(p) && p[i+k+1] == '+' && lastAtom >= 0 {
				atom := string(out[lastAtom:])
				out = append(out[:lastAtom], "(?>"+atom+q+")"...)
				i += k + 1
			} else {
				out = append(out, q...)
				i += k
			}
			lastAtom = -1
		default:
			lastAtom = len(out)
			_, n := utf8.DecodeRuneInString(p[i:])
			out = append(out, p[i:i+n]...)
			i += n - 1
		}
	}
	return string(out), nil
}
