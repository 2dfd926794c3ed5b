package tokenizer

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// smallRanks is a rank file of the 256 bytes and a few merged tokens: "ab"
// then "bc" (so "abc" ends as "ab" "c" when encoded with the ranks below it),
// "xyz" that no pair of ranked tokens makes (only a word that is all of it),
// and runs of spaces, with <s> and </s> as BOS and EOS in a
// tokenizer_config.json.
func smallRanks(t *testing.T) *Tokenizer {
	t.Helper()
	var lines []string
	add := func(tok string) {
		lines = append(lines, base64.StdEncoding.EncodeToString([]byte(tok))+" "+fmt.Sprint(len(lines)))
	}
	for b := range 256 {
		add(string([]byte{byte(b)}))
	}
	for _, tok := range []string{"ab", "bc", "abc", "xyz", "  ", "    ", "abcabc", " a", " ab"} {
		add(tok)
	}
	n := len(lines)
	config := fmt.Sprintf(`{"bos_token": "<s>", "eos_token": "</s>", "added_tokens_decoder": {"%d": {"content": "<s>"}, "%d": {"content": "</s>"}}}`, n, n+1)
	tok, err := FromBytes("tokenizer.model", []byte(strings.Join(lines, "\n")+"\n"), []byte(config))
	require.NoError(t, err)
	require.Equal(t, Tiktoken, tok.Kind())
	return tok
}

// TestRankedBPEHFFiles: a rank file written as tokenizer.json has one merge a
// reachable token, in rank order, in GPT-2's byte alphabet; the unreachable
// token none; BOS in the post-processor's template and the special tokens as
// added tokens; and, read back by this package's tokenizer.json reader, the
// rank file's ids on text that takes every path (an unreachable token as a
// whole word and inside one, specials, spaces, bytes outside ASCII).
func TestRankedBPEHFFiles(t *testing.T) {
	tok := smallRanks(t)
	rb, ok := tok.RankedBPE()
	require.True(t, ok)
	require.Len(t, rb.Ranks, 265)
	assert.Equal(t, []Special{{"<s>", 265}, {"</s>", 266}}, rb.Specials)
	assert.Equal(t, int32(265), rb.BOS)
	hf, err := rb.HFFiles()
	require.NoError(t, err)
	// "abcabc" ends as "abc" "abc"; " ab" as " " "ab" ("ab" is ranked below
	// " a"); a space is Ġ in the byte alphabet.
	assert.Equal(t, "#version: 0.2\na b\nb c\nab c\nĠ Ġ\nĠĠ ĠĠ\nabc abc\nĠ a\nĠ ab\n", string(hf.MergesTXT))
	assert.Equal(t, 8, hf.Merges)
	assert.Equal(t, []int32{259}, hf.Unreachable)
	assert.Contains(t, string(hf.TokenizerJSON), `"ignore_merges":true`)
	assert.Contains(t, string(hf.TokenizerJSON), `{"id":265,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}`)
	assert.Contains(t, string(hf.VocabJSON), `"xyz":259,"ĠĠ":260`)
	assert.Contains(t, string(hf.VocabJSON), `"</s>":266}`)

	back, err := FromBytes("tokenizer.json", hf.TokenizerJSON, nil)
	require.NoError(t, err)
	assert.Equal(t, HuggingFace, back.Kind())
	assert.Equal(t, 267, back.VocabSize())
	assert.Equal(t, int32(265), back.BOS(), "BOS from the post-processor's template")
	assert.Equal(t, int32(266), back.EOS(), "EOS by its name")
	texts := []string{"abc", "abcabc", "xyz", "xyzxyz", "xyzab", " ab abc", "    abc  x", "<s>abc</s> xyz", "café abc日本", "ab\n\nbc\r\n", "a<s", ""}
	for _, s := range texts {
		want, err := tok.Encode([]byte(s))
		require.NoError(t, err)
		got, err := back.Encode([]byte(s))
		require.NoError(t, err)
		assert.Equal(t, want, got, "%q", s)
		assert.Equal(t, s, back.Decode(got), "decoded")
	}
	w, err := tok.Encode([]byte("xyz"))
	require.NoError(t, err)
	assert.Equal(t, []int32{259}, w, "the unreachable token is a word's token")

	// No BOS: no template; a pattern of "" is ByteLevel without its regex.
	rb.BOS, rb.Pattern = -1, ""
	hf, err = rb.HFFiles()
	require.NoError(t, err)
	assert.NotContains(t, string(hf.TokenizerJSON), "TemplateProcessing")
	assert.Contains(t, string(hf.TokenizerJSON), `"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}`)
}

// TestRankedBPERefusals: what cannot be written as a byte-level BPE is refused,
// named.
func TestRankedBPERefusals(t *testing.T) {
	rb, _ := smallRanks(t).RankedBPE()
	for _, c := range []struct {
		change func(b *RankedBPE)
		want   string
	}{
		{func(b *RankedBPE) { b.Ranks[7] = nil }, "the single byte 0x07 has no rank"},
		{func(b *RankedBPE) { b.Ranks[260] = []byte("ab") }, `token "ab" has ranks 256 and 260`},
		{func(b *RankedBPE) { b.Specials[0].ID = 12 }, `special token "<s>" has id 12: special ids run from 265`},
		{func(b *RankedBPE) { b.Specials[1].Content = "<s>" }, `special token "<s>" (id 266) is given twice`},
		{func(b *RankedBPE) { b.Specials[1].Content = "abc" }, `special token "abc" is also a ranked token`},
		{func(b *RankedBPE) { b.Specials[1].Content = "Ġab" }, `special token "Ġab" is also a ranked token`}, // " ab" in vocab.json
		{func(b *RankedBPE) { b.BOS = 3 }, "BOS 3 is not a special token"},
		{func(b *RankedBPE) { b.Pattern = `(?<x` }, "pattern"},
	} {
		b := rb
		b.Ranks = slices.Clone(rb.Ranks)
		b.Specials = slices.Clone(rb.Specials)
		c.change(&b)
		_, err := b.HFFiles()
		assert.ErrorContains(t, err, c.want)
	}
}

// TestCharHF: a character vocabulary written as tokenizer.json encodes each
// character to its index (a character outside it is dropped, as Hugging Face's
// BPE does without an unk_token) and decodes back; CharHFVocab recognises the
// file and nothing else.
func TestCharHF(t *testing.T) {
	chars := []rune("\n\t !<>Tacehtxé日😀\u00a0")
	b, err := CharHF(chars)
	require.NoError(t, err)
	tok, err := FromBytes("tokenizer.json", b, nil)
	require.NoError(t, err)
	text := "the cat <> é日😀\n\tT\u00a0x"
	var want []int32
	for _, r := range text {
		want = append(want, int32(slices.Index(chars, r)))
	}
	got, err := tok.Encode([]byte(text))
	require.NoError(t, err)
	assert.Equal(t, want, got)
	assert.Equal(t, text, tok.Decode(got))
	got, err = tok.Encode([]byte("tq"))
	require.NoError(t, err)
	assert.Equal(t, []int32{int32(slices.Index(chars, 't'))}, got, "q is dropped")

	back, ok := CharHFVocab(b)
	assert.True(t, ok)
	assert.Equal(t, chars, back)
	_, ok = CharHFVocab(must(os.ReadFile(filepath.Join("testdata", "tiny-tokenizer.json"))))
	assert.False(t, ok)
	_, ok = CharHFVocab([]byte(strings.Replace(string(b), `"type":"Fuse"`, `"type":"Fuse","x":1`, 1)))
	assert.False(t, ok, "not the bytes CharHF writes")
	_, err = CharHF([]rune("aba"))
	assert.ErrorContains(t, err, "repeated")
	_, err = CharHF(nil)
	assert.ErrorContains(t, err, "empty")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
