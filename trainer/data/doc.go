// Package data turns text into token streams and batches.
//
// Tokenizers: byte (vocabulary 256, no state), char (the corpus's distinct
// characters, sorted; the vocabulary is saved with the data) and gpt2 (GPT-2's
// byte-pair encoding, 50,257 tokens, from github.com/tiktoken-go/tokenizer, which
// embeds the merge table, so it works offline); gpt2 and byte give their ranks
// for writing as Hugging Face files (hfexport.go). Token shards (shard.go)
// hold a header (magic, version, dtype, count, tokenizer) and the tokens; a prepared
// directory holds train.tok, val.tok and tokenizer.json. A run can also read text
// directly: it is tokenized once and cached.
//
// Batches are a pure function of (seed, step, global sequence index): the loader
// has no hidden position, so a resumed run sees the same batches, and any number of
// ranks sees the same global batch.
//
// Of shardline it imports fileio (atomic writes) and trainer/tokenizer (the
// tokenizer files).
package data
