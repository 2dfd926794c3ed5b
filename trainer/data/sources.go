package data

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/klauspost/compress/zstd"
	"github.com/parquet-go/parquet-go"

	"github.com/shardline/shardline/fileio"
)

// DefaultField is the JSON field or Parquet column a document's text is read
// from unless another is chosen: the name Hugging Face datasets use.
const DefaultField = "text"

// Document formats, told apart by file name (after a .gz or .zst suffix):
// .jsonl, .ndjson and .json are JSON lines (one object per line, the text in a
// chosen field), .parquet a Parquet file (the text in a chosen column), and
// anything else plain text (the whole file is one document).
type docFormat int

const (
	formatText docFormat = iota
	formatJSONL
	formatParquet
)

// formatOf names a file's format and compression ("", "gz" or "zst").
func formatOf(name string) (docFormat, string) {
	lower := strings.ToLower(name)
	comp := ""
	for _, c := range []string{"gz", "zst"} {
		if strings.HasSuffix(lower, "."+c) {
			comp, lower = c, strings.TrimSuffix(lower, "."+c)
		}
	}
	switch filepath.Ext(lower) {
	case ".jsonl", ".ndjson", ".json":
		return formatJSONL, comp
	case ".parquet":
		return formatParquet, comp
	}
	return formatText, comp
}

// hasMeta says whether a path holds glob characters.
func hasMeta(p string) bool { return strings.ContainsAny(p, "*?[") }

// ResolveFiles lists the files a document source names, in the order they are
// read: a file is itself; a directory is every regular file under it (in
// lexical order of path, names starting with "." skipped); a glob (*, ?, [...])
// is its matches in lexical order, each a file or a directory as above.
func ResolveFiles(spec string) ([]string, error) {
	paths := []string{spec}
	if hasMeta(spec) {
		m, err := filepath.Glob(spec)
		if err != nil {
			return nil, fmt.Errorf("%s: bad glob pattern: %w", spec, err)
		}
		if len(m) == 0 {
			return nil, fmt.Errorf("%s matches no file", spec)
		}
		sort.Strings(m)
		paths = m
	}
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("%s does not exist", p)
			}
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		var under []string
		err = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if q != p && strings.HasPrefix(d.Name(), ".") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if d.Type().IsRegular() || d.Type()&fs.ModeSymlink != 0 && !d.IsDir() {
				under = append(under, q)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if len(under) == 0 {
			return nil, fmt.Errorf("directory %s holds no files", p)
		}
		files = append(files, under...) // WalkDir walks in lexical order
	}
	return files, nil
}

// piece is a document or a piece of one: start marks a document's first
// piece, end its last (a JSON line or Parquet row is one piece, start and
// end); tail marks the piece from which a one-document corpus is validation.
// where says where it lies, for errors ("a.txt at byte 1048576", "b.jsonl:17
// field text"). The text is not kept after the sink returns.
type piece struct {
	text             []byte
	start, end, tail bool
	where            string
}

// maxDocBytes caps one JSON line or Parquet value; a plain text file is read
// a piece at a time instead.
const maxDocBytes = 1 << 30

// textPiece is how much of a plain text file is read before it is handed on
// (cut where the tokenizer allows, cutter).
var textPiece = 4 << 20

// readDocs reads the documents of files in order into sink. field names the
// JSON field or Parquet column holding the text. cut, when not nil, says where
// a plain text file can be cut without changing its tokens (Cutter); without
// it each text file is read whole.
//
// splitAt, when not negative, is the byte of a one-document corpus (one plain
// text file) where validation begins: the piece that starts there (cut there
// where the tokenizer allows, the first place at or after it) is marked tail.
// read, when not nil, counts the input bytes read (compressed ones for a
// compressed file).
func readDocs(files []string, field string, cut func(text []byte, from int) int, sink func(piece) error, splitAt int64, read *atomic.Int64) error {
	for _, path := range files {
		if prefix, ok := MegatronPrefix(path); ok && prefix != path {
			return fmt.Errorf("%s is a Megatron indexed dataset (tokens, not text); train on it directly with data.path = %q", path, prefix)
		}
		format, comp := formatOf(path)
		if format == formatParquet {
			if comp != "" {
				return fmt.Errorf("%s: a compressed Parquet file; Parquet compresses its own pages, give the .parquet file", path)
			}
			if err := readParquet(path, field, sink); err != nil {
				return err
			}
			if read != nil {
				if st, err := os.Stat(path); err == nil {
					read.Add(st.Size())
				}
			}
			continue
		}
		if err := readStream(path, comp, read, func(r io.Reader) error {
			if format == formatJSONL {
				return readJSONL(path, r, field, sink)
			}
			return readTextDoc(path, r, cut, sink, splitAt)
		}); err != nil {
			return err
		}
	}
	return nil
}

// readStream opens path, decompressing it (comp "gz" or "zst"), for fn.
func readStream(path, comp string, read *atomic.Int64, fn func(io.Reader) error) error {
	f, _, err := fileio.OpenRegular(path)
	if err != nil {
		return fmt.Errorf("cannot read %s: %w", path, unwrapPath(err))
	}
	defer f.Close()
	var r io.Reader = bufio.NewReaderSize(countingReader{f, read}, 1<<20)
	switch comp {
	case "gz":
		z, err := gzip.NewReader(r)
		if err != nil {
			return fmt.Errorf("%s: not gzip data (%v); give the file its real extension", path, err)
		}
		defer z.Close()
		r = z
	case "zst":
		z, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true), zstd.WithDecoderMaxWindow(1<<27))
		if err != nil {
			return fmt.Errorf("%s: %v", path, err)
		}
		defer z.Close()
		r = z
	}
	if err := fn(r); err != nil {
		return err
	}
	return nil
}

// countingReader counts what it reads in n (when not nil).
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(b []byte) (int, error) {
	k, err := c.r.Read(b)
	if c.n != nil {
		c.n.Add(int64(k))
	}
	return k, err
}

// readTextDoc hands a plain text file on as one document, in pieces cut where
// cut allows.
func readTextDoc(path string, r io.Reader, cut func([]byte, int) int, sink func(piece) error, splitAt int64) error {
	var buf []byte
	chunk := make([]byte, textPiece)
	start, tail, at := true, false, int64(0)
	emit := func(n int, end bool) error {
		p := piece{text: buf[:n], start: start, end: end, tail: tail, where: fmt.Sprintf("%s at byte %d", path, at)}
		err := sink(p)
		start, at = false, at+int64(n)
		buf = append(buf[:0], buf[n:]...)
		return err
	}
	for {
		n, err := io.ReadFull(r, chunk)
		buf = append(buf, chunk[:n]...)
		eof := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
		if err != nil && !eof {
			return fmt.Errorf("cannot read %s at byte %d: %w", path, at+int64(len(buf)), err)
		}
		// The validation tail begins at splitAt, or the first place after it
		// the tokenizer can cut (a character start without a Cutter, or where
		// the rest of the text has no such place); until that place is found
		// no other cut is made.
		covers := !tail && splitAt >= 0 && splitAt <= at+int64(len(buf))
		if covers {
			from, c := int(splitAt-at), -1
			switch {
			case cut == nil && eof:
				c = utf8Cut(buf, from)
			case cut == nil:
			case eof:
				// No place the tokenizer allows: the next character start
				// (tokens at the boundary may then differ from the whole's).
				if c = cut(buf, from); c == len(buf) {
					c = utf8Cut(buf, from)
				}
			default:
				if lim := len(buf) - textPiece/4; lim > from {
					if c = cut(buf[:lim], from); c == lim {
						c = -1
					}
				}
			}
			if c >= 0 {
				if c > 0 {
					if err := emit(c, false); err != nil {
						return err
					}
				}
				tail, covers = true, false
			}
		}
		if eof {
			if len(buf) == 0 && start {
				return nil // an empty file: no document
			}
			return emit(len(buf), true)
		}
		if covers {
			continue
		}
		if cut == nil || len(buf) < textPiece {
			continue
		}
		// Pieces of at least half a textPiece, as many as the buffer holds, each
		// cut no closer than a quarter piece from the end (so the cut sees
		// what follows): what stays behind is less than a piece, unless the
		// text has no place to cut.
		for lim := len(buf) - textPiece/4; lim > textPiece/2; lim = len(buf) - textPiece/4 {
			c := cut(buf[:lim], textPiece/2)
			if c >= lim {
				break
			}
			if err := emit(c, false); err != nil {
				return err
			}
		}
	}
}

// readJSONL hands on each line's field as a document; blank lines are skipped.
func readJSONL(path string, r io.Reader, field string, sink func(piece) error) error {
	br := bufio.NewReaderSize(r, 1<<20)
	var line []byte
	for n := 1; ; n++ {
		line = line[:0]
		var err error
		for {
			var part []byte
			part, err = br.ReadSlice('\n')
			line = append(line, part...)
			if err != bufio.ErrBufferFull {
				break
			}
			if len(line) > maxDocBytes {
				return fmt.Errorf("%s:%d: a line of more than %d bytes; split the document", path, n, maxDocBytes)
			}
		}
		if err != nil && err != io.EOF {
			return fmt.Errorf("cannot read %s at line %d: %w", path, n, err)
		}
		if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 {
			text, perr := jsonField(trimmed, field)
			if perr != nil {
				return fmt.Errorf("%s:%d: %w", path, n, perr)
			}
			if len(text) > 0 {
				if err := sink(piece{text: text, start: true, end: true, where: fmt.Sprintf("%s:%d field %q", path, n, field)}); err != nil {
					return err
				}
			}
		}
		if err == io.EOF {
			return nil
		}
	}
}

// jsonField reads a JSON object's string field.
func jsonField(line []byte, field string) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(line, &obj); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("not JSON (column %d: %v); each line must be one JSON object", se.Offset, err)
		}
		return nil, fmt.Errorf("not a JSON object (%v); each line must be one JSON object holding field %q", err, field)
	}
	raw, ok := obj[field]
	if !ok {
		names := make([]string, 0, len(obj))
		for k := range obj {
			names = append(names, k)
		}
		slices.Sort(names)
		return nil, fmt.Errorf("no field %q (the object has %s); choose the text's field with --field or data.field", field, listOr(names))
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		kind := "not a string"
		if len(raw) > 0 {
			switch raw[0] {
			case 'n':
				kind = "null"
			case '{':
				kind = "an object"
			case '[':
				kind = "an array"
			case 't', 'f':
				kind = "a boolean"
			default:
				kind = "a number"
			}
		}
		return nil, fmt.Errorf("field %q is %s, not a string; choose the text's field with --field or data.field", field, kind)
	}
	return []byte(s), nil
}

// listOr lists names for an error ("none" when empty).
func listOr(names []string) string {
	if len(names) == 0 {
		return "no fields"
	}
	if len(names) > 8 {
		return fmt.Sprintf("fields %s and %d more", strings.Join(names[:8], ", "), len(names)-8)
	}
	return "fields " + strings.Join(names, ", ")
}

// readParquet hands on each row's text column as a document; rows are
// numbered from 1 across the file's row groups.
func readParquet(path, column string, sink func(piece) error) error {
	f, size, err := fileio.OpenRegular(path)
	if err != nil {
		return fmt.Errorf("cannot read %s: %w", path, unwrapPath(err))
	}
	defer f.Close()
	pf, err := parquet.OpenFile(f, size, parquet.SkipPageIndex(true), parquet.SkipBloomFilters(true))
	if err != nil {
		return fmt.Errorf("%s: not a Parquet file: %v", path, err)
	}
	leaf, ok := pf.Schema().Lookup(column)
	if !ok {
		var names []string
		for _, c := range pf.Schema().Columns() {
			names = append(names, strings.Join(c, "."))
		}
		return fmt.Errorf("%s: no column %q (the file has %s); choose the text's column with --field or data.field", path, column, strings.Replace(listOr(names), "fields", "columns", 1))
	}
	if leaf.MaxRepetitionLevel > 0 || leaf.Node.Type().Kind() != parquet.ByteArray {
		return fmt.Errorf("%s: column %q is %s, not a string column; choose the text's column with --field or data.field", path, column, leaf.Node.Type())
	}
	row := int64(0)
	values := make([]parquet.Value, 256)
	for _, rg := range pf.RowGroups() {
		pages := rg.ColumnChunks()[leaf.ColumnIndex].Pages()
		for {
			page, err := pages.ReadPage()
			if err == io.EOF {
				break
			}
			if err != nil {
				pages.Close()
				return fmt.Errorf("%s: row %d: column %q: %v", path, row+1, column, err)
			}
			vr := page.Values()
			for {
				n, err := vr.ReadValues(values)
				for _, v := range values[:n] {
					row++
					if v.IsNull() {
						pages.Close()
						return fmt.Errorf("%s: row %d: column %q is null; drop the row or fill it", path, row, column)
					}
					if b := v.ByteArray(); len(b) > 0 {
						if err := sink(piece{text: b, start: true, end: true, where: fmt.Sprintf("%s row %d column %q", path, row, column)}); err != nil {
							pages.Close()
							return err
						}
					}
				}
				if err == io.EOF {
					break
				}
				if err != nil {
					pages.Close()
					return fmt.Errorf("%s: row %d: column %q: %v", path, row+1, column, err)
				}
			}
			parquet.Release(page)
		}
		pages.Close()
	}
	return nil
}
