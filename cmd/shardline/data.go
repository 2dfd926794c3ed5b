package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/shardline/shardline/tensor/cpu"
	"github.com/shardline/shardline/trainer"
	"github.com/shardline/shardline/trainer/data"
	"github.com/spf13/cobra"
)

func (a *app) dataCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "data", Short: "Prepare training data"}
	var (
		tokenizer string
		valFrac   float64
		out       string
		overwrite bool
		field     string
		format    string
	)
	prep := &cobra.Command{
		Use:   "prepare --tokenizer T [--field F] [--format shardline|megatron] SOURCE... -o DIR",
		Short: "Tokenize documents into token shards with a document index, or into Megatron's .bin/.idx",
		Long: `Prepare reads the documents of each SOURCE in order and tokenizes them (byte:
vocabulary 256; char: the distinct characters of the text; gpt2: GPT-2's
byte-pair encoding, vocabulary 50257, model.vocab_size must be at least that;
or a model's own tokenizer given by its path: a Hugging Face tokenizer.json, a
tiktoken rank file such as Llama 3's tokenizer.model, a SentencePiece .model,
or a directory holding one, with the tokenizer_config.json beside it naming
BOS and EOS: docs/tokenizers.md). A tokenizer file is copied beside
DIR/tokenizer.json as DIR/source.*, fingerprinted.

A SOURCE is a file, a directory (every file under it, in lexical order, names
starting with "." skipped) or a glob ('data/*.jsonl.zst'). Files are read by
name: .jsonl, .ndjson and .json are JSON lines, one document per line in the
--field field; .parquet is Parquet, one document per row in the --field
column; anything else is plain text, one document per file. JSON lines and
text may be compressed (.gz, .zst). A malformed line or row is refused naming
the file, the line or row, and the field.

Each document begins with the tokenizer's BOS (where it has one) and ends with
its end-of-text token (gpt2: <|endoftext|>). byte and char have no such token,
so they take only one plain text file (one document); documents of several
files, JSON lines or Parquet need gpt2 or a tokenizer file with an EOS.

--val-fraction of the documents is held out for validation, spread evenly (for
0.1, every tenth document); a single text file holds out the end of its text.
Preparation streams: memory stays bounded however large the corpus (a shard
of 16M tokens, some text in flight per core, the largest document). gpt2 and
tokenizer files encode on every core and on a terminal show the input read,
its rate and the time left.

--format shardline (the default) writes DIR/train-NNNNN.tok and val-NNNNN.tok
(uint16 tokens where the vocabulary fits, uint32 otherwise, each shard
checksummed), train.docs and val.docs (where each document begins),
dataset.json and tokenizer.json. --format megatron writes Megatron-LM's
indexed dataset instead: DIR/train.bin, train.idx, val.bin and val.idx (one
sequence per document) with tokenizer.json; Megatron reads them as
--data-path DIR/train. Point data.path at DIR to train on either
(docs/data.md).

DIR must be new, empty, or one data prepare wrote before (it records its files
in DIR/.shardline-outputs.json): a directory holding other files is refused
before any text is read, unless --overwrite, which replaces the files it writes
there and leaves the rest. A symbolic link where a file goes is always refused.`,
		Example: `  shardline data prepare --tokenizer char -o data/shakespeare input.txt
  shardline data prepare --tokenizer gpt2 -o data/web 'corpus/*.jsonl.zst'
  shardline data prepare --tokenizer gpt2 --field content --format megatron -o data/mg train.parquet
  shardline data prepare --tokenizer ~/llama3/tokenizer.json -o data/llama3 corpus.txt`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if data.IsTokenizerFile(tokenizer) {
				if _, err := os.Stat(tokenizer); err != nil {
					return usageErr("--tokenizer %s: %v (give a tokenizer.json, a tokenizer.model or the directory holding one)", tokenizer, unwrap(err))
				}
			} else if !slices.Contains(data.Tokenizers, tokenizer) {
				return usageErr("--tokenizer %q is not one of %s, nor a tokenizer file's path (holding a / or ending in .json, .model or .tiktoken)", tokenizer, strings.Join(data.Tokenizers, ", "))
			}
			if !slices.Contains(data.Formats, format) {
				return usageErr("--format %q is not one of %s", format, strings.Join(data.Formats, ", "))
			}
			if !(valFrac >= 0 && valFrac <= 0.5) { // NaN fails both
				return usageErr("--val-fraction %v must be within [0, 0.5]", valFrac)
			}
			if field == "" {
				return usageErr("--field must name the JSON field or Parquet column holding the text (for example text)")
			}
			if out == "" {
				return usageErr("-o DIR is required")
			}
			for _, p := range args {
				if st, err := os.Stat(p); strings.ContainsAny(p, "*?[") || err == nil && st.IsDir() {
					continue // a glob or a directory: data.Prepare names what it cannot read
				}
				if err := checkReadable(p, "source"); err != nil {
					return err
				}
			}
			var progress func(done, total int64)
			if isTerminal(a.stderr) {
				progress = tokenizeProgress(a.stderr, time.Now())
			}
			res, err := data.Prepare(data.PrepareOptions{Sources: args, Field: field, Tokenizer: tokenizer, ValFraction: valFrac,
				Format: format, Overwrite: overwrite, Progress: progress}, out)
			if progress != nil {
				fmt.Fprint(a.stderr, "\r\033[K")
			}
			if err != nil {
				return &exitError{code: exitFindings, err: err}
			}
			_, err = fmt.Fprintf(a.stdout, "%s: %d training tokens in %d documents, %d validation tokens in %d documents, from %d files, %s tokenizer (vocabulary %d), %s format\n",
				out, res.TrainTokens, res.TrainDocs, res.ValTokens, res.ValDocs, res.Files, res.Tokenizer.Name(), res.Tokenizer.VocabSize(), format)
			return err
		},
	}
	prep.Flags().StringVar(&tokenizer, "tokenizer", "byte", "byte, char, gpt2, or the path of a tokenizer.json, tokenizer.model (tiktoken or SentencePiece) or a directory holding one")
	prep.Flags().Float64Var(&valFrac, "val-fraction", 0.1, "fraction of the documents held out for validation (of the text's end for one text file)")
	prep.Flags().StringVar(&field, "field", data.DefaultField, "JSON field or Parquet column holding each document's text")
	prep.Flags().StringVar(&format, "format", data.FormatShardline, "output format: shardline (token shards) or megatron (.bin/.idx)")
	prep.Flags().StringVarP(&out, "output", "o", "", "output directory")
	prep.Flags().BoolVar(&overwrite, "overwrite", false, "write into a non-empty DIR that data prepare did not make, replacing the files it writes")
	cmd.AddCommand(prep)
	return cmd
}

// tokenizeProgress returns a progress callback for data.Prepare that draws,
// on a terminal, the text tokenized so far, its rate and the time left, at most
// five times a second.
func tokenizeProgress(w io.Writer, start time.Time) func(done, total int64) {
	var last time.Time
	return func(done, total int64) {
		now := time.Now()
		if now.Sub(last) < 200*time.Millisecond && done < total {
			return
		}
		last = now
		elapsed := now.Sub(start)
		rate := float64(done) / max(elapsed.Seconds(), 1e-3)
		eta := time.Duration(float64(total-done) / max(rate, 1) * float64(time.Second))
		fmt.Fprintf(w, "\r\033[Ktokenizing: read %.1f of %.1f MB (%.0f%%), %.1f MB/s, %s elapsed, ETA %s",
			float64(done)/1e6, float64(total)/1e6, 100*float64(done)/float64(max(total, 1)), rate/1e6,
			elapsed.Round(time.Second), eta.Round(time.Second))
	}
}

// maxSampleTokens caps one sample: each token is a forward pass, and the text is
// held in memory.
const maxSampleTokens = 1 << 20

func (a *app) sampleCmd() *cobra.Command {
	var (
		prompt      string
		tokens      int
		temperature float64
		seed        int64
	)
	cmd := &cobra.Command{
		Use:     "sample RUN_DIR",
		Short:   "Generate text from a finished run's weights",
		Example: `  shardline sample runs/tiny --prompt "Of the Colours" --tokens 300 --temperature 0.8`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if tokens < 1 || tokens > maxSampleTokens {
				return usageErr("--tokens %d must be between 1 and %d", tokens, maxSampleTokens)
			}
			if !(temperature >= 0) || math.IsInf(temperature, 1) { // NaN fails the comparison
				return usageErr("--temperature %v must be a finite number ≥ 0 (0 is greedy)", temperature)
			}
			text, err := trainer.SampleRun(cpu.Backend{}, args[0], prompt, tokens, temperature, seed)
			if err != nil {
				return &exitError{code: exitFindings, err: err}
			}
			_, err = fmt.Fprintln(a.stdout, prompt+text)
			return err
		},
	}
	cmd.Flags().StringVar(&prompt, "prompt", "\n", "text to continue")
	cmd.Flags().IntVar(&tokens, "tokens", 200, "tokens to generate")
	cmd.Flags().Float64Var(&temperature, "temperature", 0.8, "sampling temperature; 0 takes the most likely token")
	cmd.Flags().Int64Var(&seed, "seed", 1, "seed of the sampler")
	return cmd
}
