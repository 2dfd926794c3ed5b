#!/usr/bin/env bash
# Data at scale: a JSON lines corpus of SMALL_MB and of LARGE_MB (200 MB and
# 2 GB by default; documents are the paragraphs of Newton's Opticks, numbered)
# is prepared with the gpt2 tokenizer, and the tiny model trains 5 steps on
# each. Prints the peak resident memory (max RSS) of both commands at both
# sizes and their ratio, which the issue bounds at 1.2 (memory bounded by a
# constant, not by the corpus), and the preparation speed in MB of text per
# CPU-second beside Hugging Face's tokenizers (the npm package, its Rust core)
# encoding the same documents with the same GPT-2 tokenizer (its token count
# must equal shardline's less one end-of-text token per document).
set -euo pipefail
cd "$(dirname "$0")/.."
SMALL_MB=${SMALL_MB:-200}
LARGE_MB=${LARGE_MB:-2000}
NPM_DIR=${NPM_DIR:-bin/npm}
if [ ! -d "$NPM_DIR/node_modules/tokenizers" ]; then
	echo "bench-data: Hugging Face tokenizers is not installed in $NPM_DIR: run make bench-deps" >&2
	exit 1
fi
go build -o bin/shardline ./cmd/shardline
out=$(mktemp -d "${TMPDIR:-/tmp}/bench-data.XXXXXX")
trap 'rm -rf "$out"' EXIT
go run ./scripts/gpt2vocab | python3 scripts/gpt2_tokenizer_json.py > "$out/gpt2.json"
text="$(go env GOROOT)/src/testdata/Isaac.Newton-Opticks.txt"
corpus() { # corpus MB FILE
	python3 - "$text" "$1" "$2" <<'PY'
import json, sys
paras = [p.strip() for p in open(sys.argv[1], errors="replace").read().split("\n\n") if p.strip()]
limit, n, i = int(sys.argv[2]) * 1000 * 1000, 0, 0
with open(sys.argv[3], "w") as f:
    while n < limit:
        line = json.dumps({"id": i, "text": f"Document {i}. " + paras[i % len(paras)]}) + "\n"
        f.write(line)
        n += len(line.encode())
        i += 1
PY
}
# measure NAME CMD...: runs CMD under GNU time; prints "maxrss_kb wall user sys".
measure() {
	/usr/bin/time -f "%M %e %U %S" -o "$out/time" "$@" > "$out/stdout" 2> "$out/stderr" || { cat "$out/stderr" >&2; exit 1; }
	cat "$out/time"
}
declare -A prep_rss run_rss prep_cpu text_mb
for size in "$SMALL_MB" "$LARGE_MB"; do
	corpus "$size" "$out/c$size.jsonl"
	read -r rss wall user sys < <(measure ./bin/shardline data prepare --tokenizer gpt2 --val-fraction 0.01 -o "$out/p$size" "$out/c$size.jsonl")
	summary=$(cat "$out/stdout")
	prep_rss[$size]=$rss
	prep_cpu[$size]=$(python3 -c "print($user + $sys)")
	text_mb[$size]=$(python3 -c "import json; print(sum(len(json.loads(l)['text'].encode()) for l in open('$out/c$size.jsonl')) / 1e6)")
	echo "prepare ${size} MB of JSON lines: max RSS $((rss / 1024)) MiB, ${wall} s wall, ${prep_cpu[$size]} CPU-s: $summary"
	read -r rss wall user sys < <(measure ./bin/shardline run recipes/tiny.toml --set data.path="$out/p$size" --set data.tokenizer=gpt2 \
		--set model.vocab_size=50304 --train-iters 5 --set train.eval_interval=0 --set logging.sample_tokens=0 \
		--set run.output_dir="$out/runs" --set run.name="r$size" --set logging.level=warn --set logging.progress=false)
	run_rss[$size]=$rss
	echo "run 5 steps on it: max RSS $((rss / 1024)) MiB, ${wall} s wall"
	if [ "$size" = "$SMALL_MB" ]; then
		read -r _ hf_bytes hf_tokens hf_cpu hf_wall < <(NODE_PATH="$NPM_DIR/node_modules" node scripts/bench_tokenizers.js "$out/gpt2.json" "$out/c$size.jsonl")
		docs=$(python3 -c "import json; d=json.load(open('$out/p$size/dataset.json')); print(d['train']['docs'] + d['val']['docs'])")
		ours=$(python3 -c "import json; d=json.load(open('$out/p$size/dataset.json')); print(d['train']['tokens'] + d['val']['tokens'])")
		same=$([ "$((ours - docs))" = "$hf_tokens" ] && echo "the same tokens count" || echo "DIFFERENT token counts: shardline $((ours - docs)), HF $hf_tokens")
		printf 'preparation speed on %s MB of text: shardline %.2f MB per CPU-second; Hugging Face tokenizers %.2f MB per CPU-second (encoding alone, %.1f s wall); %s\n' \
			"${text_mb[$size]}" "$(python3 -c "print(${text_mb[$size]} / ${prep_cpu[$size]})")" "$(python3 -c "print($hf_bytes / 1e6 / $hf_cpu)")" "$hf_wall" "$same"
	fi
	rm -f "$out/c$size.jsonl"
done
ratio() { python3 -c "r = $1 / $2; print(f'{r:.2f}x', 'within 1.2x' if r <= 1.2 else 'OVER 1.2x')"; }
echo "max RSS, ${LARGE_MB} MB against ${SMALL_MB} MB: data prepare $(ratio "${prep_rss[$LARGE_MB]}" "${prep_rss[$SMALL_MB]}"), 5-step run $(ratio "${run_rss[$LARGE_MB]}" "${run_rss[$SMALL_MB]}")"
