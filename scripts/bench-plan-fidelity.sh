#!/usr/bin/env bash
# The plan against the trainer on this machine's CPU backend: for tiny, moe-tiny,
# nanoGPT's Shakespeare-char shape and two larger dense shapes, at 1, 2 and 4
# in-process ranks (each rank a micro-batch of the recipe's size, so the global
# batch grows with the ranks), `shardline run` trains a few steps and `shardline
# plan --against` compares the measured median step time and memory with the plan.
# Then context parallelism: tiny and the 6x256 shape with every sequence split over
# cp 2 and 4 ranks (the same global batch as one rank).
#
# This machine's speed drifts by 10-20% over minutes, so every row is run
# FIDELITY_REPEAT times (default 3), the rows interleaved (all rows once, then
# all again, ...), and the median of a row's step times is compared; the spread
# column is the row's (max - min) / median over its runs.
# FIDELITY_ONLY=REGEX keeps the rows whose "shape ranks" label matches (e.g.
# FIDELITY_ONLY='cp' or 'moe-tiny 2'); FIDELITY_CALIBRATION=FILE stands for the
# table calibrated at the start (to compare several runs against one table);
# FIDELITY_SET='KEY=VALUE ...' adds settings to every run (e.g.
# FIDELITY_SET=precision.bf16=true compares bf16 runs).
#
# Prints the planned and measured step, their ratio (measured ÷ planned), that
# ratio divided by how much slower the host was right after each run than when
# the shipped table was measured (host-adj: `plan --against --host-probe`, the
# median over the row's runs), and the memory ratio. The plan times the CPU from `shardline calibrate`'s table
# (docs/plan.md): the one shardline ships. The last column is the step ratio with a
# table calibrated at the start of this script (about three minutes): the difference
# between the two columns is how much the calibration itself moves between runs on
# this machine. The summary line counts the rows within 15% with that table.
set -euo pipefail
cd "$(dirname "$0")/.."
go build -o bin/shardline ./cmd/shardline
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
repeat=${FIDELITY_REPEAT:-3}
only=${FIDELITY_ONLY:-.}
extra=()
for kv in ${FIDELITY_SET:-}; do extra+=(--set "$kv"); done
text="$(go env GOROOT)/src/testdata/Isaac.Newton-Opticks.txt"
nano="bench/shakespeare-char.toml --set data.path=$text"
if [ -f ../shared/data/tinyshakespeare.txt ]; then
	nano="bench/shakespeare-char.toml --set data.path=$(realpath ../shared/data/tinyshakespeare.txt)"
else
	nano="$nano --set data.tokenizer=byte --set model.vocab_size=256"
	echo "note: Opticks with the byte tokenizer stands in for tinyshakespeare (absent)" >&2
fi
if [ -n "${FIDELITY_CALIBRATION:-}" ]; then
	cp "$FIDELITY_CALIBRATION" "$out/calibration.json"
else
	echo "calibrating this machine (shardline calibrate, about three minutes)..." >&2
	./bin/shardline calibrate -o "$out/calibration.json" 2>/dev/null
fi
d6="recipes/tiny.toml --num-layers 6 --hidden-size 256 --num-attention-heads 8 --num-query-groups 8 --ffn-hidden-size 768 --seq-length 256"
d4="recipes/tiny.toml --num-layers 4 --hidden-size 512 --num-attention-heads 8 --num-query-groups 8 --ffn-hidden-size 1408 --seq-length 256"
# Rows: label|recipe and flags|micro-batch|ranks|cp.
rows=()
for s in "tiny|recipes/tiny.toml|16" "moe-tiny|recipes/moe-tiny.toml|16" "nanogpt|$nano|12" "dense-6x256|$d6|8" "dense-4x512|$d4|4"; do
	IFS='|' read -r name recipe mb <<<"$s"
	for world in 1 2 4; do rows+=("$name|$recipe|$mb|$world|1"); done
done
for s in "tiny|recipes/tiny.toml|16" "dense-6x256|$d6|8"; do
	IFS='|' read -r name recipe mb <<<"$s"
	for cp in 2 4; do rows+=("$name|$recipe|$mb|$cp|$cp"); done
done
label() { # label NAME WORLD CP
	if [ "$3" -gt 1 ]; then echo "$1 cp$3"; else echo "$1 $2"; fi
}
kept=()
for r in "${rows[@]}"; do
	IFS='|' read -r name recipe mb world cp <<<"$r"
	if [[ "$(label "$name" "$world" "$cp")" =~ $only ]]; then kept+=("$r"); fi
done
echo "${#kept[@]} rows, $repeat runs each, interleaved..." >&2
for ((i = 1; i <= repeat; i++)); do
	for r in "${kept[@]}"; do
		IFS='|' read -r name recipe mb world cp <<<"$r"
		run="$name-$world-cp$cp-$i"
		global=$((mb * world / cp))
		# shellcheck disable=SC2086
		./bin/shardline run $recipe --train-iters 6 --set train.eval_interval=0 --micro-batch-size "$mb" \
			--global-batch-size "$global" --set parallel.world_size="$world" --context-parallel-size "$cp" \
			--set run.output_dir="$out" --set run.name="$run" \
			--set logging.progress=false ${extra[@]+"${extra[@]}"} >/dev/null 2>"$out/$run.err" || { cat "$out/$run.err" >&2; exit 1; }
		env -u SHARDLINE_CALIBRATION ./bin/shardline plan --against "$out/$run" --host-probe --format json >"$out/$run.json"
		SHARDLINE_CALIBRATION="$out/calibration.json" ./bin/shardline plan --against "$out/$run" --format json >"$out/$run.now.json"
	done
done
for r in "${kept[@]}"; do
	IFS='|' read -r name recipe mb world cp <<<"$r"
	echo "$(label "$name" "$world" "$cp")|$out/$name-$world-cp$cp"
done >"$out/rows"
python3 - "$repeat" "$out/rows" <<'PY'
import json, statistics, sys
repeat = int(sys.argv[1])
def rows(path):
    return {c["what"]: c for c in json.load(open(path))["comparison"]}
def adjusted(path):
    return json.load(open(path))["host_probe"]["step_ratio_adjusted"]
print(f'{"shape":<12} {"ranks":>5}  {"planned":>10} {"measured":>10} {"spread":>7} {"step×":>7} {"host-adj":>8} {"memory×":>8} {"step× now":>10}')
within = total = 0
for line in open(sys.argv[2]):
    label, base = line.strip().split("|")
    shipped = [rows(f"{base}-{i}.json") for i in range(1, repeat + 1)]
    now = [rows(f"{base}-{i}.now.json") for i in range(1, repeat + 1)]
    meas = [r["step time"]["measured"] for r in shipped]
    m = statistics.median(meas)
    planned, planned_now = shipped[0]["step time"]["planned"], now[0]["step time"]["planned"]
    mem = statistics.median(r["total"]["ratio"] for r in shipped)
    adj = statistics.median(adjusted(f"{base}-{i}.json") for i in range(1, repeat + 1))
    name, ranks = label.rsplit(" ", 1)
    ratio_now = m / planned_now
    total += 1
    within += abs(ratio_now - 1) <= 0.15
    print(f'{name:<12} {ranks:>5}  {planned*1e3:8.1f}ms {m*1e3:8.1f}ms {(max(meas)-min(meas))/m:7.2f} {m/planned:7.3f} {adj:8.3f} {mem:8.3f} {ratio_now:10.3f}')
print(f"{within} of {total} rows within 15% of the plan with this session's table")
PY
