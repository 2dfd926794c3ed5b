package data

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// python is a python3 for the tests that check a format against an
// independent implementation: SHARDLINE_TORCH_PYTHON (which make test sets),
// else python3 on the PATH. Only the standard library is used.
func python(t *testing.T) string {
	if py := os.Getenv("SHARDLINE_TORCH_PYTHON"); py != "" {
		return py
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("python3 is not on the PATH: make ci-deps installs it")
		}
		t.Skip("python3 is not on the PATH")
	}
	return py
}

// megatronPy writes and reads Megatron's MMIDIDX layout as its documentation
// lays it out, with nothing but struct: it is not Megatron's code, and shares
// nothing with megatron.go.
const megatronPy = `
import struct, sys, json

def write(prefix, docs, code):
    fmt = {8: "<H", 4: "<i", 1: "<B", 5: "<q"}[code]
    width = struct.calcsize(fmt)
    sizes, ptrs, off = [], [], 0
    with open(prefix + ".bin", "wb") as b:
        for d in docs:
            for t in d:
                b.write(struct.pack(fmt, t))
            sizes.append(len(d)); ptrs.append(off); off += len(d) * width
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(docs) + 1))
        for s in sizes: f.write(struct.pack("<i", s))
        for p in ptrs: f.write(struct.pack("<q", p))
        for i in range(len(docs) + 1): f.write(struct.pack("<q", i))

def read(prefix):
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", idx[:9]
    version, = struct.unpack_from("<Q", idx, 9); assert version == 1
    code = idx[17]
    n, ndoc = struct.unpack_from("<QQ", idx, 18)
    fmt = {8: "<H", 4: "<i", 1: "<B", 5: "<q"}[code]
    width = struct.calcsize(fmt)
    o = 34
    sizes = struct.unpack_from("<%di" % n, idx, o); o += 4 * n
    ptrs = struct.unpack_from("<%dq" % n, idx, o); o += 8 * n
    docidx = struct.unpack_from("<%dq" % ndoc, idx, o); o += 8 * ndoc
    assert o == len(idx), (o, len(idx))
    b = open(prefix + ".bin", "rb").read()
    seqs = [list(struct.unpack_from("<%d%s" % (s, fmt[1]), b, p)) for s, p in zip(sizes, ptrs)]
    return {"code": code, "docidx": list(docidx), "seqs": seqs}

if sys.argv[1] == "write":
    spec = json.load(sys.stdin)
    write(sys.argv[2], spec["docs"], spec["code"])
else:
    json.dump(read(sys.argv[2]), sys.stdout)
`

// A Megatron dataset written from the published layout by an independent
// Python writer reads back token for token, its documents split by SplitDoc;
// each integer dtype a writer may pick is read.
func TestMegatronFromIndependentWriter(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "mmidx.py")
	require.NoError(t, os.WriteFile(script, []byte(megatronPy), 0o644))
	var docs [][]int32
	for i := range 10 {
		var d []int32
		for j := range i + 3 {
			d = append(d, int32((i*7919+j*104729)%GPT2Vocab))
		}
		docs = append(docs, append(d, endOfText))
	}
	for _, code := range []int{8, 4, 5} {
		prefix := filepath.Join(dir, "corpus_text_document")
		spec, err := json.Marshal(map[string]any{"code": code, "docs": docs})
		require.NoError(t, err)
		cmd := exec.Command(py, script, "write", prefix)
		cmd.Stdin = bytes.NewReader(spec)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, string(out))
		for _, path := range []string{prefix, prefix + ".bin", prefix + ".idx"} {
			ds, err := Open(path, OpenOptions{Tokenizer: "gpt2", ValFraction: 0.2})
			require.NoError(t, err, "dtype %d, %s", code, path)
			var train, val []int32
			for i, d := range docs {
				if SplitDoc(i, 0.2) {
					val = append(val, d...)
				} else {
					train = append(train, d...)
				}
			}
			assert.Equal(t, train, ds.Train.Slice(0, ds.Train.Len()), "dtype %d", code)
			assert.Equal(t, val, ds.Val.Slice(0, ds.Val.Len()), "dtype %d", code)
			assert.Equal(t, 8, ds.Train.Docs())
			assert.Equal(t, 2, ds.Val.Docs())
		}
		// A token past the vocabulary is refused naming the file and position.
		_, err = Open(prefix, OpenOptions{Tokenizer: "byte"})
		assert.ErrorIs(t, err, ErrBadToken)
		assert.ErrorContains(t, err, prefix+".bin: token outside the vocabulary: token 1 (at byte")
	}
}

// data prepare --format megatron writes what the independent Python reader
// reads: one sequence per document, uint16 tokens for GPT-2, the document
// index 0..n; and shardline reads it back as the shardline format's tokens.
func TestPrepareMegatronReadByIndependentReader(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "mmidx.py")
	require.NoError(t, os.WriteFile(script, []byte(megatronPy), 0o644))
	src := filepath.Join(dir, "docs.jsonl")
	require.NoError(t, os.WriteFile(src, jsonl(), 0o644))
	mg := filepath.Join(dir, "mg")
	res, err := Prepare(PrepareOptions{Sources: []string{src}, Tokenizer: "gpt2", ValFraction: 0.34, Format: FormatMegatron}, mg)
	require.NoError(t, err)
	assert.Equal(t, 1, res.ValDocs)
	var train, val []string
	for i, d := range testDocs {
		if SplitDoc(i, 0.34) {
			val = append(val, d)
		} else {
			train = append(train, d)
		}
	}
	for split, docs := range map[string][]string{"train": train, "val": val} {
		out, err := exec.Command(py, script, "read", filepath.Join(mg, split)).Output()
		require.NoError(t, err)
		var got struct {
			Code   int       `json:"code"`
			DocIdx []int     `json:"docidx"`
			Seqs   [][]int32 `json:"seqs"`
		}
		require.NoError(t, json.Unmarshal(out, &got))
		assert.Equal(t, 8, got.Code, "uint16")
		require.Len(t, got.Seqs, len(docs))
		for i, d := range docs {
			assert.Equal(t, wantTokens(t, []string{d}), got.Seqs[i], "%s document %d", split, i)
			assert.Equal(t, i, got.DocIdx[i])
		}
		assert.Equal(t, len(docs), got.DocIdx[len(docs)])
	}
	ds, err := Open(mg, OpenOptions{Tokenizer: "gpt2"})
	require.NoError(t, err)
	assert.Equal(t, wantTokens(t, train), ds.Train.Slice(0, ds.Train.Len()))
	assert.Equal(t, wantTokens(t, val), ds.Val.Slice(0, ds.Val.Len()))
}

// One text file read a piece at a time (cut where the tokenizer allows) gives
// the tokens of the whole; its validation is its tail, cut at such a place.
func TestTextFileInPieces(t *testing.T) {
	defer func(n int) { textPiece = n }(textPiece)
	textPiece = 64 << 10
	opticks, err := os.ReadFile(filepath.Join(runtime.GOROOT(), "src", "testdata", "Isaac.Newton-Opticks.txt"))
	require.NoError(t, err)
	whole, err := GPT2{}.Encode(opticks)
	require.NoError(t, err)
	ds, err := openText(t, opticks, "gpt2", 0.1)
	require.NoError(t, err)
	assert.Equal(t, append(whole, endOfText), all(ds))
	frac := float64(ds.Val.Len()) / float64(len(whole)+1)
	assert.InDelta(t, 0.1, frac, 0.01, "the tail is a tenth of the text, give or take a cut")
	b, err := openText(t, opticks, "byte", 0.1)
	require.NoError(t, err)
	assert.Equal(t, len(opticks)/10, b.Val.Len(), "byte: exactly the last ⌊n·f⌋ bytes, as before")
}
