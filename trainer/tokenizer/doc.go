// Package tokenizer reads the tokenizers models ship with and encodes text
// with them exactly as their reference implementations do:
//
//   - a Hugging Face tokenizer.json with a BPE model (byte-level, as Llama 3,
//     Qwen2/3 and GPT-NeoX use; or character-level with byte fallback, as the
//     tokenizer.json of Llama 2 and Mistral 7B): its normalizer, pre-tokenizer,
//     merges (either "a b" strings or [a, b] pairs), added and special tokens,
//     and decoder;
//   - a tiktoken rank file (Llama 3's tokenizer.model: a base64 token and its
//     rank a line) with Llama 3's pattern and special tokens;
//   - a SentencePiece model (the ModelProto protobuf; BPE with byte fallback,
//     as Llama 2 and Mistral 7B use).
//
// A part of a file it cannot reproduce exactly (an unknown normalizer,
// pre-tokenizer or model type, BPE dropout) is refused with an error naming
// it, never ignored. Encode splits added special tokens out of the text first,
// as Hugging Face's tokenizers and tiktoken's encode(allowed_special="all")
// do, then runs the pre-tokenizer and the merges on each piece; long text is
// encoded in pieces on every core where the pre-tokenizer allows cutting it
// without changing a token. A word cache keeps repeated words from being
// merged twice.
//
// It also writes tokenizers as Hugging Face files (hfwrite.go): a byte-level
// BPE given by tiktoken ranks (a rank file, GPT-2's r50k_base, the 256 bytes)
// as tokenizer.json, vocab.json and merges.txt, each token's merge recovered
// from the ranks as transformers' TikTokenConverter does; and a character
// vocabulary as a tokenizer.json without merges.
//
// It imports nothing from shardline but fileio.
package tokenizer
