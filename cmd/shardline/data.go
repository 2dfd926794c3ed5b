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
	)
	prep := &cobra.Command{
		Use:   "prepare --tokenizer T --val-fraction F TEXT... -o DIR",
		Short: "Tokenize text files into token shards (train.tok, val.tok, tokenizer.json)",
		Long: `Prepare concatenates the text files, tokenizes them (byte: vocabulary 256; char: the
distinct characters of the text; gpt2: GPT-2's byte-pair encoding, vocabulary
50257, model.vocab_size must be at least that; or a model's own tokenizer given by
its path: a Hugging Face tokenizer.json, a tiktoken rank file such as Llama 3's
tokenizer.model, a SentencePiece .model, or a directory holding one, with the
tokenizer_config.json beside it naming BOS and EOS), holds out the last
--val-fraction of the tokens for validation, and writes DIR/train.tok,
DIR/val.tok and DIR/tokenizer.json (a tokenizer file is copied beside it as
DIR/source.*, fingerprinted). Point data.path at DIR, and data.tokenizer at the
same tokenizer, to train on it. gpt2 and tokenizer files encode on every core, a
piece of about a MiB at a time, and on a terminal show the text done, its rate
and the time left. See docs/tokenizers.md.

DIR must be new, empty, or one data prepare wrote before (it records its files
in DIR/.shardline-outputs.json): a directory holding other files is refused
before any text is read, unless --overwrite, which replaces train.tok, val.tok
and tokenizer.json there and leaves the rest. A symbolic link where a file goes
is always refused.`,
		Example: `  shardline data prepare --tokenizer char -o data/shakespeare input.txt
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
			if !(valFrac >= 0 && valFrac <= 0.5) { // NaN fails both
				return usageErr("--val-fraction %v must be within [0, 0.5]", valFrac)
			}
			if out == "" {
				return usageErr("-o DIR is required")
			}
			for _, p := range args {
				if err := checkReadable(p, "text file"); err != nil {
					return err
				}
			}
			var progress func(done, total int)
			if isTerminal(a.stderr) {
				progress = tokenizeProgress(a.stderr, time.Now())
			}
			ds, err := data.Prepare(args, tokenizer, valFrac, out, overwrite, progress)
			if progress != nil {
				fmt.Fprint(a.stderr, "\r\033[K")
			}
			if err != nil {
				return &exitError{code: exitFindings, err: err}
			}
			_, err = fmt.Fprintf(a.stdout, "%s: %d training and %d validation tokens, %s tokenizer (vocabulary %d)\n",
				out, len(ds.Train), len(ds.Val), ds.Tok.Name(), ds.Tok.VocabSize())
			return err
		},
	}
	prep.Flags().StringVar(&tokenizer, "tokenizer", "byte", "byte, char, gpt2, or the path of a tokenizer.json, tokenizer.model (tiktoken or SentencePiece) or a directory holding one")
	prep.Flags().Float64Var(&valFrac, "val-fraction", 0.1, "fraction of tokens held out for validation (from the end)")
	prep.Flags().StringVarP(&out, "output", "o", "", "output directory")
	prep.Flags().BoolVar(&overwrite, "overwrite", false, "write into a non-empty DIR that data prepare did not make, replacing its train.tok, val.tok and tokenizer.json")
	cmd.AddCommand(prep)
	return cmd
}

// tokenizeProgress returns a progress callback for data.Prepare that draws,
// on a terminal, the text tokenized so far, its rate and the time left, at most
// five times a second.
func tokenizeProgress(w io.Writer, start time.Time) func(done, total int) {
	var last time.Time
	return func(done, total int) {
		now := time.Now()
		if now.Sub(last) < 200*time.Millisecond && done < total {
			return
		}
		last = now
		elapsed := now.Sub(start)
		rate := float64(done) / max(elapsed.Seconds(), 1e-3)
		eta := time.Duration(float64(total-done) / max(rate, 1) * float64(time.Second))
		fmt.Fprintf(w, "\r\033[Ktokenizing: %.1f of %.1f MB (%.0f%%), %.1f MB/s, %s elapsed, ETA %s",
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
