package data

import (
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"

	"github.com/shardline/shardline/fileio"
)

// FuzzReadShard: any bytes as a token shard are read or refused, never a panic,
// and what is read holds only tokens below its vocabulary.
func FuzzReadShard(f *testing.F) {
	dir := f.TempDir()
	good := filepath.Join(dir, "good.tok")
	if err := WriteShard(good, []int32{1, 2, 3, 255}, "byte", 256); err != nil {
		f.Fatal(err)
	}
	b, _ := os.ReadFile(good)
	f.Add(b)
	if err := WriteShard(good, []int32{70000, 1}, "gpt2", 70001); err != nil {
		f.Fatal(err)
	}
	b, _ = os.ReadFile(good)
	f.Add(b)
	f.Add([]byte("SHLTOKEN"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(t.TempDir(), "x.tok")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		sh, err := ReadShard(p)
		if err != nil {
			return
		}
		for i, tok := range sh.Tokens {
			if tok < 0 || int(tok) >= sh.Vocab {
				t.Fatalf("token %d = %d read past vocabulary %d", i, tok, sh.Vocab)
			}
		}
	})
}

// FuzzLoadTokenizer: any bytes as tokenizer.json load or are refused; a loaded
// tokenizer encodes and decodes its own vocabulary without a panic.
func FuzzLoadTokenizer(f *testing.F) {
	dir := f.TempDir()
	c, _ := NewChar([]byte("hello, world"))
	for _, tok := range []Tokenizer{Byte{}, c, GPT2{}} {
		p := filepath.Join(dir, "t.json")
		if err := SaveTokenizer(p, tok); err != nil {
			f.Fatal(err)
		}
		b, _ := os.ReadFile(p)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(t.TempDir(), "tokenizer.json")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		tok, err := LoadTokenizer(p)
		if err != nil {
			return
		}
		ids, err := tok.Encode([]byte("hello"))
		if err == nil {
			_ = tok.Decode(ids)
		}
		_ = tok.Decode([]int32{-1, 0, int32(tok.VocabSize()), 1 << 30})
	})
}

// FuzzText: any bytes as training text are tokenized or refused by each
// tokenizer, never a panic, and every token is below the tokenizer's vocabulary;
// UTF-8 text encoded by gpt2 in pieces of a few bytes has the ids of the whole.
func FuzzText(f *testing.F) {
	f.Add([]byte("Of the Reflexions of Light — ½ œuvre.\n"))
	f.Add([]byte{0xff, 0xfe, 0x00})
	f.Add([]byte("a\nb\n\nc \nd\r\ne\u00a0\nf'\ns1\n2"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if utf8.Valid(b) {
			ids, _, err := gpt2().Encode(string(b))
			if err != nil {
				t.Fatalf("gpt2 codec: %v", err)
			}
			got, err := encodePieces(b, 3, 2, nil)
			if err != nil {
				t.Fatalf("gpt2 in pieces: %v", err)
			}
			if len(got) != len(ids) {
				t.Fatalf("gpt2 in pieces: %d ids, whole %d", len(got), len(ids))
			}
			for i, id := range ids {
				if got[i] != int32(id) {
					t.Fatalf("gpt2 in pieces: id %d is %d, whole %d", i, got[i], id)
				}
			}
		}
		for _, name := range Tokenizers {
			ds, err := openText(t, b, name, 0.1)
			if err != nil {
				continue
			}
			for _, split := range []*Tokens{ds.Train, ds.Val} {
				for _, tok := range split.Slice(0, split.Len()) {
					if tok < 0 || int(tok) >= ds.Tok.VocabSize() {
						t.Fatalf("%s: token %d past vocabulary %d", name, tok, ds.Tok.VocabSize())
					}
				}
			}
		}
	})
}

// FuzzMegatronIndex: any bytes as a Megatron .idx (beside a .bin of any size)
// are read or refused, never a panic, and what is read holds only tokens
// below the vocabulary, its documents within the tokens.
func FuzzMegatronIndex(f *testing.F) {
	dir := f.TempDir()
	write := func(docs [][]int32) ([]byte, []byte) {
		p := filepath.Join(dir, "w")
		out, err := fileio.ClaimDir(p, PrepareCommand, []string{"train.bin", "train.idx"}, true, "")
		if err != nil {
			f.Fatal(err)
		}
		w, err := newMegatronWriter(out, "train", 1000)
		if err != nil {
			f.Fatal(err)
		}
		for _, d := range docs {
			if err := w.startDoc(); err != nil {
				f.Fatal(err)
			}
			if err := w.write(d); err != nil {
				f.Fatal(err)
			}
		}
		if err := w.commit(); err != nil {
			f.Fatal(err)
		}
		idx, _ := os.ReadFile(filepath.Join(p, "train.idx"))
		bin, _ := os.ReadFile(filepath.Join(p, "train.bin"))
		return idx, bin
	}
	idx, bin := write([][]int32{{1, 2, 3}, {999}, {}})
	f.Add(idx, bin)
	idx, bin = write(nil)
	f.Add(idx, bin)
	f.Add([]byte(megatronMagic), []byte{1, 2})
	f.Fuzz(func(t *testing.T, idx, bin []byte) {
		p := filepath.Join(t.TempDir(), "d")
		if os.WriteFile(p+".idx", idx, 0o644) != nil || os.WriteFile(p+".bin", bin, 0o644) != nil {
			t.Fatal("write")
		}
		mi, err := openMegatron(p, 1000)
		if err != nil {
			return
		}
		train, val := splitMegatron(mi, 0.3)
		for _, s := range []*Tokens{train, val} {
			for i, tok := range s.Slice(0, s.Len()) {
				if tok < 0 || tok >= 1000 {
					t.Fatalf("token %d = %d past the vocabulary", i, tok)
				}
			}
		}
		if train.Len()+val.Len() != mi.tokens.count {
			t.Fatalf("split %d + %d of %d tokens", train.Len(), val.Len(), mi.tokens.count)
		}
	})
}
