package data

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/parquet-go/parquet-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var testDocs = []string{"Of the Reflexions of Light.", "A literal <|endoftext|> is text.", "½ œuvre\nwith two lines"}

// jsonl is testDocs as JSON lines with an extra field and a blank line.
func jsonl() []byte {
	var b strings.Builder
	for i, d := range testDocs {
		q, _ := jsonQuote(d)
		b.WriteString(`{"id": ` + string(rune('0'+i)) + `, "text": ` + q + "}\n")
		if i == 0 {
			b.WriteString("\n")
		}
	}
	return []byte(b.String())
}

func jsonQuote(s string) (string, error) {
	var b bytes.Buffer
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '\n':
			b.WriteString(`\n`)
		case '"':
			b.WriteString(`\"`)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String(), nil
}

type textRow struct {
	ID   int64  `parquet:"id"`
	Body string `parquet:"body"`
}

func writeParquet(t *testing.T, path string, docs []string) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	w := parquet.NewGenericWriter[textRow](f, parquet.MaxRowsPerRowGroup(2)) // several row groups
	for i, d := range docs {
		_, err := w.Write([]textRow{{ID: int64(i), Body: d}})
		require.NoError(t, err)
	}
	require.NoError(t, w.Close())
	require.NoError(t, f.Close())
}

// wantTokens is docs encoded by gpt2, each ended by <|endoftext|>.
func wantTokens(t *testing.T, docs []string) []int32 {
	var out []int32
	for _, d := range docs {
		ids, err := GPT2{}.Encode([]byte(d))
		require.NoError(t, err)
		out = append(append(out, ids...), endOfText)
	}
	return out
}

// Every document format reads as its documents, each ended by the end-of-text
// token (a literal "<|endoftext|>" in a document stays text).
func TestDocumentFormats(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b, 0o644))
		return p
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(jsonl())
	zw.Close()
	zs, err := zstd.NewWriter(nil)
	require.NoError(t, err)
	sources := map[string]struct {
		path  string
		field string
	}{
		"jsonl":     {write("a.jsonl", jsonl()), ""},
		"jsonl.gz":  {write("b.jsonl.gz", gz.Bytes()), ""},
		"jsonl.zst": {write("c.jsonl.zst", zs.EncodeAll(jsonl(), nil)), ""},
		"parquet":   {filepath.Join(dir, "d.parquet"), "body"},
	}
	writeParquet(t, sources["parquet"].path, testDocs)
	want := wantTokens(t, testDocs)
	for name, src := range sources {
		ds, err := Open(src.path, OpenOptions{Tokenizer: "gpt2", Field: src.field})
		require.NoError(t, err, name)
		assert.Equal(t, want, all(ds), name)
		assert.Equal(t, 3, ds.Train.Docs()+ds.Val.Docs(), name)
	}
	// A directory of text files: one document each, in lexical order; a glob alike.
	texts := filepath.Join(dir, "texts")
	require.NoError(t, os.MkdirAll(filepath.Join(texts, "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(texts, "1.txt"), []byte(testDocs[0]), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(texts, "sub", "2.txt"), []byte(testDocs[1]), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(texts, "3.txt"), []byte(testDocs[2]), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(texts, ".hidden"), []byte("skipped"), 0o644))
	ds, err := Open(texts, OpenOptions{Tokenizer: "gpt2"})
	require.NoError(t, err)
	assert.Equal(t, wantTokens(t, []string{testDocs[0], testDocs[2], testDocs[1]}), all(ds), "1.txt, 3.txt, sub/2.txt")
	ds, err = Open(filepath.Join(texts, "*.txt"), OpenOptions{Tokenizer: "gpt2"})
	require.NoError(t, err)
	assert.Equal(t, wantTokens(t, []string{testDocs[0], testDocs[2]}), all(ds))
}

// A malformed record is refused naming the file, the line or row, and the field.
func TestMalformedRecords(t *testing.T) {
	dir := t.TempDir()
	cases := []struct{ body, want string }{
		{"{\"text\": \"a\"}\n{\"text\": \"b\"\n", "x.jsonl:2: not JSON"},
		{"{\"text\": \"a\"}\n\n{\"body\": \"b\", \"id\": 1}\n", `x.jsonl:3: no field "text" (the object has fields body, id)`},
		{"{\"text\": 3}\n", `x.jsonl:1: field "text" is a number, not a string`},
		{"[1, 2]\n", "x.jsonl:1: not a JSON object"},
	}
	for _, c := range cases {
		p := filepath.Join(dir, "x.jsonl")
		require.NoError(t, os.WriteFile(p, []byte(c.body), 0o644))
		_, err := Prepare(PrepareOptions{Sources: []string{p}, Tokenizer: "gpt2"}, filepath.Join(dir, "out"))
		require.Error(t, err)
		assert.Contains(t, err.Error(), c.want)
		assert.Contains(t, err.Error(), p)
	}
	pq := filepath.Join(dir, "y.parquet")
	writeParquet(t, pq, testDocs)
	_, err := Prepare(PrepareOptions{Sources: []string{pq}, Tokenizer: "gpt2"}, filepath.Join(dir, "out"))
	assert.ErrorContains(t, err, `y.parquet: no column "text" (the file has columns id, body)`)
	_, err = Prepare(PrepareOptions{Sources: []string{pq}, Tokenizer: "gpt2", Field: "id"}, filepath.Join(dir, "out"))
	assert.ErrorContains(t, err, `column "id" is INT(64,true), not a string column`)
	// Invalid UTF-8 in a text file is refused naming the file and the offset.
	raw := filepath.Join(dir, "r.txt")
	require.NoError(t, os.WriteFile(raw, []byte("ok\xff"), 0o644))
	_, err = Prepare(PrepareOptions{Sources: []string{raw}, Tokenizer: "gpt2"}, filepath.Join(dir, "out"))
	assert.ErrorContains(t, err, "r.txt at byte 0: the gpt2 tokenizer needs UTF-8 text: invalid byte 0xff at offset 2")
}

// byte and char have no end-of-text token: several documents are refused
// before anything is read; one text file is one document as before.
func TestTokenizerWithoutEOSTakesOneDocument(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.jsonl")
	require.NoError(t, os.WriteFile(p, jsonl(), 0o644))
	for _, tok := range []string{"byte", "char"} {
		_, err := Prepare(PrepareOptions{Sources: []string{p}, Tokenizer: tok}, filepath.Join(dir, "out"))
		assert.ErrorContains(t, err, "the "+tok+" tokenizer has no end-of-text token to end each document of "+p)
		assert.ErrorContains(t, err, "use --tokenizer gpt2")
	}
}

// Documents are split for validation by document, evenly: with 0.25 every
// fourth; shards hold at most shardTokens and a split spans several; the
// document index counts them.
func TestShardsAndDocumentSplit(t *testing.T) {
	defer func(n int) { shardTokens = n }(shardTokens)
	shardTokens = 5
	dir := t.TempDir()
	var b strings.Builder
	var docs []string
	for i := range 12 {
		d := strings.Repeat(string(rune('a'+i)), i+1)
		docs = append(docs, d)
		b.WriteString(`{"text": "` + d + "\"}\n")
	}
	src := filepath.Join(dir, "docs.jsonl")
	require.NoError(t, os.WriteFile(src, []byte(b.String()), 0o644))
	out := filepath.Join(dir, "out")
	res, err := Prepare(PrepareOptions{Sources: []string{src}, Tokenizer: "gpt2", ValFraction: 0.25}, out)
	require.NoError(t, err)
	assert.Equal(t, 9, res.TrainDocs)
	assert.Equal(t, 3, res.ValDocs)
	ds, err := Open(out, OpenOptions{Tokenizer: "gpt2"})
	require.NoError(t, err)
	var train, val []string
	for i, d := range docs {
		if SplitDoc(i, 0.25) {
			val = append(val, d)
		} else {
			train = append(train, d)
		}
	}
	assert.Equal(t, []string{docs[3], docs[7], docs[11]}, val)
	assert.Equal(t, wantTokens(t, train), ds.Train.Slice(0, ds.Train.Len()))
	assert.Equal(t, wantTokens(t, val), ds.Val.Slice(0, ds.Val.Len()))
	shards, _ := filepath.Glob(filepath.Join(out, "train-*.tok"))
	assert.Equal(t, (ds.Train.Len()+4)/5, len(shards))
	// Reading across shard boundaries anywhere gives the stream.
	whole := ds.Train.Slice(0, ds.Train.Len())
	for lo := 0; lo < len(whole); lo++ {
		for hi := lo; hi <= len(whole); hi += 3 {
			require.Equal(t, whole[lo:hi], ds.Train.Slice(lo, hi))
		}
	}
	// A document index that disagrees with dataset.json is refused.
	flip(t, filepath.Join(out, "train.docs"), 9)
	_, err = Open(out, OpenOptions{Tokenizer: "gpt2"})
	assert.ErrorContains(t, err, "train.docs")
}

// wideTok is a tokenizer with a vocabulary past uint16.
type wideTok struct{ Byte }

func (wideTok) Name() string   { return "wide" }
func (wideTok) VocabSize() int { return 70000 }

// A vocabulary past 65536 is stored as uint32 and read back.
func TestUint32Shards(t *testing.T) {
	p := filepath.Join(t.TempDir(), "w.tok")
	want := []int32{69999, 0, 65536, 12}
	require.NoError(t, WriteShard(p, want, "wide", 70000))
	v, err := openShardView(p, wideTok{})
	require.NoError(t, err)
	assert.Equal(t, 4, v.width)
	tk := &Tokens{}
	tk.append(v, 0, v.count)
	assert.Equal(t, want, tk.Slice(0, 4))
	require.NoError(t, WriteShard(p, []int32{1, 70000}, "wide", 70001))
	_, err = openShardView(p, wideTok{})
	assert.ErrorContains(t, err, "holds wide tokens below 70001")
}

// countReader counts the bytes read through it.
type countReader struct {
	r io.Reader
	n *int
}

func (c countReader) Read(b []byte) (int, error) {
	k, err := c.r.Read(b)
	*c.n += k
	return k, err
}

// A plain text file is handed on a piece at a time and never held much past
// a piece: what has been read but not handed on stays within two pieces (it
// grew by half a piece each read before, holding a 300 MB file as 1.2 GB).
func TestTextPiecesStayBounded(t *testing.T) {
	defer func(n int) { textPiece = n }(textPiece)
	textPiece = 1 << 12
	text := bytes.Repeat([]byte("Of the Reflexions of Light.\nAnd of their Colours.\n"), 4000) // 200 kB
	for _, cut := range []func([]byte, int) int{Byte{}.Cut, GPT2{}.Cut} {
		read, handed := 0, 0
		var got []byte
		err := readTextDoc("t.txt", countReader{bytes.NewReader(text), &read}, cut, func(p piece) error {
			handed += len(p.text)
			got = append(got, p.text...)
			require.LessOrEqual(t, read-handed, 2*textPiece, "pending after a piece")
			return nil
		}, -1)
		require.NoError(t, err)
		require.Equal(t, text, got)
	}
}
