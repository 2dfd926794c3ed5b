#!/usr/bin/env bash
# The plan against the trainer on this machine's CPU backend: for tiny, moe-tiny,
# nanoGPT's Shakespeare-char shape and two larger dense shapes, at 1, 2 and 4
# in-process ranks (each rank a micro-batch of the recipe's size, so the global
# batch grows with the ranks), `shardline run` trains a few steps and `shardline
# plan --against` compares the measured median step time and memory with the plan.
# Then context parallelism: tiny and the 6x256 shape with every sequence split over
# cp 2 and 4 ranks (the same global batch as one rank).
# Prints the planned and measured step, their ratio (measured ÷ planned), and the
# memory ratio. The plan times the CPU from `shardline calibrate`'s table
# (docs/plan.md): the one shardline ships. The last column is the step ratio with a
# table calibrated at the start of this script (about a minute): the difference
# between the two columns is how much the calibration itself moves between runs on
# this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
go build -o bin/shardline ./cmd/shardline
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
text="$(go env GOROOT)/src/testdata/Isaac.Newton-Opticks.txt"
nano="bench/shakespeare-char.toml --set data.path=$text"
if [ -f ../shared/data/tinyshakespeare.txt ]; then
	nano="bench/shakespeare-char.toml --set data.path=$(realpath ../shared/data/tinyshakespeare.txt)"
else
	nano="$nano --set data.tokenizer=byte --set model.vocab_size=256"
	echo "note: Opticks with the byte tokenizer stands in for tinyshakespeare (absent)" >&2
fi
echo "calibrating this machine (shardline calibrate)..." >&2
./bin/shardline calibrate -o "$out/calibration.json" 2>/dev/null
shapes=(
	"tiny|recipes/tiny.toml|16"
	"moe-tiny|recipes/moe-tiny.toml|16"
	"nanogpt|$nano|12"
	"dense-6x256|recipes/tiny.toml --num-layers 6 --hidden-size 256 --num-attention-heads 8 --num-query-groups 8 --ffn-hidden-size 768 --seq-length 256|8"
	"dense-4x512|recipes/tiny.toml --num-layers 4 --hidden-size 512 --num-attention-heads 8 --num-query-groups 8 --ffn-hidden-size 1408 --seq-length 256|4"
)
# against RUN JSON: the plan against a finished run, with the shipped table and
# with this session's.
against() {
	env -u SHARDLINE_CALIBRATION ./bin/shardline plan --against "$1" --format json >"$2"
	SHARDLINE_CALIBRATION="$out/calibration.json" ./bin/shardline plan --against "$1" --format json >"$2.now"
}
row() {
	python3 - "$@" <<'PY'
import json, sys
j, now = json.load(open(sys.argv[1])), json.load(open(sys.argv[1] + ".now"))
row = {c["what"]: c for c in j["comparison"]}
st, mem = row["step time"], row["total"]
fresh = {c["what"]: c for c in now["comparison"]}["step time"]
print(f'{sys.argv[2]:<12} {sys.argv[3]:>5}  {st["planned"]*1e3:10.1f}ms {st["measured"]*1e3:10.1f}ms {st["ratio"]:9.3f}  {mem["ratio"]:9.3f}  {fresh["ratio"]:9.3f}')
PY
}
printf '%-12s %5s  %12s %12s %9s  %9s  %9s\n' shape ranks planned measured step×     memory× "step× now"
for s in "${shapes[@]}"; do
	IFS='|' read -r name recipe mb <<<"$s"
	for world in 1 2 4; do
		run="$name-$world"
		# shellcheck disable=SC2086
		./bin/shardline run $recipe --train-iters 6 --set train.eval_interval=0 --micro-batch-size "$mb" \
			--global-batch-size $((mb * world)) --set parallel.world_size="$world" --set run.output_dir="$out" --set run.name="$run" \
			--set logging.progress=false >/dev/null 2>"$out/$run.err" || { cat "$out/$run.err" >&2; exit 1; }
		against "$out/$run" "$out/$run.json"
		row "$out/$run.json" "$name" "$world"
	done
done
for s in "tiny|recipes/tiny.toml|16" "dense-6x256|recipes/tiny.toml --num-layers 6 --hidden-size 256 --num-attention-heads 8 --num-query-groups 8 --ffn-hidden-size 768 --seq-length 256|8"; do
	IFS='|' read -r name recipe mb <<<"$s"
	for cp in 2 4; do
		run="$name-cp$cp"
		# shellcheck disable=SC2086
		./bin/shardline run $recipe --train-iters 6 --set train.eval_interval=0 --micro-batch-size "$mb" --global-batch-size "$mb" \
			--set parallel.world_size="$cp" --context-parallel-size "$cp" --set run.output_dir="$out" --set run.name="$run" \
			--set logging.progress=false >/dev/null 2>"$out/$run.err" || { cat "$out/$run.err" >&2; exit 1; }
		against "$out/$run" "$out/$run.json"
		row "$out/$run.json" "$name" "cp$cp"
	done
done
