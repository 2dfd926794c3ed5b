// Command gpt2vocab prints GPT-2's tokens (OpenAI's r50k_base, as shardline's
// gpt2 tokenizer holds them) one a line, "id hex-bytes", for
// scripts/gpt2_tokenizer_json.py to build the same tokenizer for Hugging Face's
// tokenizers (make bench compares preparation speed with it).
//
// It imports nothing from shardline.
package main
