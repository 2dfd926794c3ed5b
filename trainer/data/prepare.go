package data

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/shardline/shardline/fileio"
)

// Formats data prepare writes.
const (
	// FormatShardline is token shards with a document index and dataset.json.
	FormatShardline = "shardline"
	// FormatMegatron is Megatron-LM's indexed dataset: train.bin/.idx and
	// val.bin/.idx (the MMIDIDX layout, megatron.go).
	FormatMegatron = "megatron"
)

// Formats are the formats data prepare writes.
var Formats = []string{FormatShardline, FormatMegatron}

// PrepareOptions say what Prepare reads and how.
type PrepareOptions struct {
	// Sources are files, directories or globs (ResolveFiles), read in order.
	Sources []string
	// Field is the JSON field or Parquet column holding the text ("" is
	// DefaultField).
	Field string
	// Tokenizer names the tokenizer (Tokenizers).
	Tokenizer string
	// ValFraction of the documents is held out for validation (SplitDoc);
	// a corpus of one document holds out the last ValFraction of its text.
	ValFraction float64
	// Format is FormatShardline ("" too) or FormatMegatron.
	Format string
	// Overwrite lets Prepare write into a directory it did not write.
	Overwrite bool
	// Progress, when not nil, is called now and then with the bytes of the
	// input files read so far and their total (compressed files count their
	// compressed bytes).
	Progress func(done, total int64)
}

// Prepared says what Prepare wrote.
type Prepared struct {
	Files                  int
	TrainTokens, ValTokens int
	TrainDocs, ValDocs     int
	EmptyDocs              int
	Tokenizer              Tokenizer
}

// shardTokens is the most tokens one shard file holds (32 MiB of uint16
// tokens): the writer keeps one shard in memory.
var shardTokens = 1 << 24

// SplitDoc says whether document i (from 0) of a corpus is held out for
// validation: the documents where ⌊(i+1)·f⌋ passes an integer, spread evenly
// through the corpus (every tenth for f = 0.1), so a corpus made of different
// sources validates on each in proportion.
func SplitDoc(i int, f float64) bool {
	return int(float64(i+1)*f) > int(float64(i)*f)
}

// oneDocument says whether files make a corpus of one document: a single
// uncompressed plain text file. Its validation is the tail of its text.
func oneDocument(files []string) bool {
	if len(files) != 1 {
		return false
	}
	f, comp := formatOf(files[0])
	return f == formatText && comp == ""
}

// PrepareCommand names data prepare in the manifest of its output directory.
const PrepareCommand = "shardline data prepare"

// Prepare tokenizes the documents of opts.Sources and writes them to outDir
// in opts.Format, streaming: its memory is bounded by a shard, a few pieces of
// text in flight per core and the largest document, never by the corpus. Each
// document begins with the tokenizer's BOS (where it has one) and ends with
// its EOS; a tokenizer without an EOS (byte, char) takes only a corpus of one
// document (one plain text file). outDir is claimed first (fileio.ClaimDir):
// it must be new, empty or an earlier Prepare's, unless opts.Overwrite.
func Prepare(opts PrepareOptions, outDir string) (*Prepared, error) {
	if opts.Field == "" {
		opts.Field = DefaultField
	}
	if opts.Format == "" {
		opts.Format = FormatShardline
	}
	if !slices.Contains(Formats, opts.Format) {
		return nil, fmt.Errorf("format %q is not one of %s", opts.Format, strings.Join(Formats, ", "))
	}
	if !(opts.ValFraction >= 0 && opts.ValFraction <= 0.5) {
		return nil, fmt.Errorf("validation fraction %v is not within [0, 0.5]", opts.ValFraction)
	}
	var files []string
	for _, s := range opts.Sources {
		fs, err := ResolveFiles(s)
		if err != nil {
			return nil, err
		}
		files = append(files, fs...)
	}
	if len(files) == 0 {
		return nil, errors.New("no source files given")
	}
	for _, f := range files {
		if _, err := os.Stat(f); err == nil && sameFile(f, outDir) {
			return nil, fmt.Errorf("%s is inside the output directory %s; write the output elsewhere", f, outDir)
		}
	}
	single := oneDocument(files)
	tok, err := prepareTokenizer(opts.Tokenizer, files, opts.Field)
	if err != nil {
		return nil, err
	}
	if tok.Specials().EOS < 0 && !single {
		return nil, fmt.Errorf("the %s tokenizer has no end-of-text token to end each document of %s (%d files; JSON lines and Parquet rows are documents each), so documents would run into each other; use --tokenizer gpt2 (or a tokenizer with an end-of-text token), or give one plain text file", tok.Name(), strings.Join(opts.Sources, " "), len(files))
	}
	names := append([]string{"tokenizer.json", datasetFile}, SourceFiles...)
	if opts.Format == FormatMegatron {
		names = append([]string{"tokenizer.json", "train.bin", "train.idx", "val.bin", "val.idx"}, SourceFiles...)
	}
	out, err := fileio.ClaimDir(outDir, PrepareCommand, names, opts.Overwrite, "give -o a new or empty directory")
	if err != nil {
		return nil, err
	}
	var train, val splitWriter
	if opts.Format == FormatMegatron {
		if train, err = newMegatronWriter(out, "train", tok.VocabSize()); err == nil {
			val, err = newMegatronWriter(out, "val", tok.VocabSize())
		}
	} else {
		if train, err = newShardWriter(out, "train", tok); err == nil {
			val, err = newShardWriter(out, "val", tok)
		}
	}
	if err != nil {
		if train != nil {
			train.abort()
		}
		return nil, err
	}
	res := &Prepared{Files: len(files), Tokenizer: tok}
	err = encodeCorpus(files, opts, tok, single, train, val, res)
	if err == nil {
		if err = train.commit(); err == nil {
			err = val.commit()
		}
	}
	if err != nil {
		train.abort()
		val.abort()
		return nil, err
	}
	res.TrainTokens, res.ValTokens = train.tokens(), val.tokens()
	res.TrainDocs, res.ValDocs = train.docs(), val.docs()
	if err := SaveTokenizer(out.Path("tokenizer.json"), tok); err != nil {
		return nil, err
	}
	if opts.Format == FormatShardline {
		m := datasetMeta{Format: datasetFormat, Version: datasetVersion, Tokenizer: tok.Name(), Vocab: tok.VocabSize(),
			Train: train.(*shardWriter).meta(), Val: val.(*shardWriter).meta(), Field: opts.Field, Sources: files}
		b, err := json.MarshalIndent(m, "", "  ")
		if err != nil {
			return nil, err
		}
		if err := out.WriteFile(datasetFile, append(b, '\n')); err != nil {
			return nil, err
		}
	}
	return res, out.Commit()
}

// sameFile says whether two paths name the same file or directory.
func sameFile(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// prepareTokenizer builds the tokenizer; char's vocabulary is the corpus's
// characters, read in a first pass.
func prepareTokenizer(name string, files []string, field string) (Tokenizer, error) {
	if name != "char" {
		return NewTokenizer(name, "")
	}
	seen := map[rune]bool{}
	err := readDocs(files, field, utf8Cut, func(p piece) error {
		if !utf8.Valid(p.text) {
			return fmt.Errorf("%s: the char tokenizer needs UTF-8 text", p.where)
		}
		for _, r := range string(p.text) {
			seen[r] = true
		}
		return nil
	}, -1, nil)
	if err != nil {
		return nil, err
	}
	if len(seen) == 0 {
		return nil, errors.New("the text is empty")
	}
	chars := make([]rune, 0, len(seen))
	for r := range seen {
		chars = append(chars, r)
	}
	slices.Sort(chars)
	return NewTokenizer("char", string(chars))
}

// job is a run of pieces encoded together by one worker.
type job struct {
	pieces []piece
	tokens [][]int32
	err    error
	done   chan struct{}
}

// jobBytes is about how much text one job holds.
const jobBytes = 1 << 20

// encodeCorpus reads the documents, encodes them on every core and writes
// them in order to train and val.
func encodeCorpus(files []string, opts PrepareOptions, tok Tokenizer, single bool, train, val splitWriter, res *Prepared) error {
	var total int64
	for _, f := range files {
		if st, err := os.Stat(f); err == nil {
			total += st.Size()
		}
	}
	var cut func([]byte, int) int
	if c, ok := tok.(Cutter); ok {
		cut = c.Cut
	}
	splitAt := int64(-1)
	if single && opts.ValFraction > 0 {
		splitAt = total - int64(float64(total)*opts.ValFraction)
	}
	workers := runtime.GOMAXPROCS(0)
	work := make(chan *job, workers)
	ordered := make(chan *job, 2*workers)
	stop := make(chan struct{})
	var readErr error
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				for _, p := range j.pieces {
					ids, err := tok.Encode(p.text)
					if err != nil {
						j.err = fmt.Errorf("%s: %w", p.where, err)
						break
					}
					j.tokens = append(j.tokens, ids)
				}
				close(j.done)
			}
		}()
	}
	var read atomic.Int64
	go func() {
		defer close(ordered)
		defer close(work)
		cur := &job{done: make(chan struct{})}
		size := 0
		send := func() bool {
			select {
			case ordered <- cur:
			case <-stop:
				return false
			}
			work <- cur
			cur, size = &job{done: make(chan struct{})}, 0
			return true
		}
		readErr = readDocs(files, opts.Field, cut, func(p piece) error {
			p.text = slices.Clone(p.text)
			cur.pieces = append(cur.pieces, p)
			if size += len(p.text); size >= jobBytes && !send() {
				return errStopped
			}
			return nil
		}, splitAt, &read)
		if readErr == nil && len(cur.pieces) > 0 {
			send()
		}
	}()
	sp := tok.Specials()
	doc := -1
	var w splitWriter
	var err error
	for j := range ordered {
		if err != nil {
			continue // drain
		}
		<-j.done
		if err = j.err; err != nil {
			close(stop)
			continue
		}
		for i, p := range j.pieces {
			if p.start {
				doc++
				w = train
				if !single && SplitDoc(doc, opts.ValFraction) {
					w = val
				}
				if err = w.startDoc(); err == nil && sp.BOS >= 0 {
					err = w.write([]int32{sp.BOS})
				}
			}
			if p.tail && w != val {
				w = val
				err = errors.Join(err, w.startDoc())
			}
			if err == nil {
				err = w.write(j.tokens[i])
			}
			if err == nil && p.end && sp.EOS >= 0 {
				err = w.write([]int32{sp.EOS})
			}
			if err != nil {
				close(stop)
				break
			}
		}
		if opts.Progress != nil {
			opts.Progress(read.Load(), total)
		}
	}
	wg.Wait()
	if err != nil {
		return err
	}
	if readErr != nil {
		return readErr
	}
	if doc < 0 {
		return fmt.Errorf("%s holds no text", strings.Join(opts.Sources, " "))
	}
	return nil
}

var errStopped = errors.New("stopped")

// splitWriter writes one split's token stream.
type splitWriter interface {
	startDoc() error
	write(tokens []int32) error
	commit() error
	abort()
	tokens() int
	docs() int
}

// datasetFile describes a prepared shardline directory; it is written last.
const (
	datasetFile    = "dataset.json"
	datasetFormat  = "shardline-tokens"
	datasetVersion = 3
)

// datasetMeta is dataset.json.
type datasetMeta struct {
	Format    string    `json:"format"`
	Version   int       `json:"version"`
	Tokenizer string    `json:"tokenizer"`
	Vocab     int       `json:"vocab"`
	Train     splitMeta `json:"train"`
	Val       splitMeta `json:"val"`
	Field     string    `json:"field"`
	Sources   []string  `json:"sources"`
}

// splitMeta lists a split's shards (in order), its token and document counts,
// and its document index (uint64 start offsets, sealed).
type splitMeta struct {
	Shards   []string `json:"shards"`
	Tokens   int      `json:"tokens"`
	Docs     int      `json:"docs"`
	DocIndex string   `json:"doc_index"`
}

// shardWriter writes a split as shards of at most shardTokens tokens
// (PREFIX-00000.tok, ...) and its document index (PREFIX.docs).
type shardWriter struct {
	out    *fileio.OutputDir
	prefix string
	tok    Tokenizer
	width  int
	buf    []byte
	shards []string
	n      int
	ndocs  int
	index  *fileio.SealedStream
}

func newShardWriter(out *fileio.OutputDir, prefix string, tok Tokenizer) (*shardWriter, error) {
	w := &shardWriter{out: out, prefix: prefix, tok: tok, width: tokenWidth(tok.VocabSize())}
	// The whole shard's capacity at once (pages are resident only once
	// written): appending would double it past a shard.
	w.buf = make([]byte, 0, shardTokens*w.width)
	name := prefix + ".docs"
	if err := out.Add(name); err != nil {
		return nil, err
	}
	var err error
	w.index, err = fileio.CreateSealedStream(out.Path(name))
	return w, err
}

// tokenWidth is the bytes a token takes in a shard: 2 where the vocabulary
// fits uint16, else 4.
func tokenWidth(vocab int) int {
	if vocab <= 1<<16 {
		return 2
	}
	return 4
}

func (w *shardWriter) startDoc() error {
	w.ndocs++
	_, err := w.index.Write(binary.LittleEndian.AppendUint64(nil, uint64(w.n)))
	return err
}

func (w *shardWriter) write(tokens []int32) error {
	for _, t := range tokens {
		if w.width == 2 {
			w.buf = binary.LittleEndian.AppendUint16(w.buf, uint16(t))
		} else {
			w.buf = binary.LittleEndian.AppendUint32(w.buf, uint32(t))
		}
		w.n++
		if len(w.buf) == shardTokens*w.width {
			if err := w.flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

// flush writes the buffered tokens as the next shard.
func (w *shardWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	name := fmt.Sprintf("%s-%05d.tok", w.prefix, len(w.shards))
	if err := w.out.Add(name); err != nil {
		return err
	}
	if err := writeShardBytes(w.out.Path(name), w.buf, w.width, w.tok.Name(), w.tok.VocabSize()); err != nil {
		return err
	}
	w.shards = append(w.shards, name)
	w.buf = w.buf[:0]
	return nil
}

func (w *shardWriter) commit() error {
	if err := w.flush(); err != nil {
		return err
	}
	return w.index.Commit()
}

func (w *shardWriter) abort()      { w.index.Abort() }
func (w *shardWriter) tokens() int { return w.n }
func (w *shardWriter) docs() int   { return w.ndocs }
func (w *shardWriter) meta() splitMeta {
	return splitMeta{Shards: slices.Clone(w.shards), Tokens: w.n, Docs: w.ndocs, DocIndex: w.prefix + ".docs"}
}
