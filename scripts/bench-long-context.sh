#!/usr/bin/env bash
# Long context on the CPU: tiny (2 layers) on one 32768-token sequence. A memory
# budget (parallel.device_memory_gib) is set between what the plan needs on one
# rank and at context parallelism 4: the plan says one rank does not fit and cp 4
# does; cp 4 then trains a step with a Chrome trace. Prints the plans' memory, what
# each cp-4 rank held, the step time, and how much of the K/V ring's transfer time
# ran while ring attention computed on the same rank.
set -euo pipefail
cd "$(dirname "$0")/.."
go build -o bin/shardline ./cmd/shardline
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
text="$(go env GOROOT)/src/testdata/Isaac.Newton-Opticks.txt"
args=(recipes/tiny.toml --set data.path="$text" --num-layers 2 --seq-length 32768 --micro-batch-size 1 --global-batch-size 1)
total() { ./bin/shardline plan "${args[@]}" --world-size "$1" --context-parallel-size "$1" --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["memory"]["total"])'; }
one=$(total 1)
four=$(total 4)
budget=$(python3 -c "print(($one + $four) / 2 / 2**30)")
# plan refuses a layout that does not fit the device (SL501).
fits() {
	if ./bin/shardline plan "${args[@]}" --world-size "$1" --context-parallel-size "$1" --set parallel.device_memory_gib="$budget" >/dev/null 2>&1; then
		echo yes
	else
		echo "no, SL501"
	fi
}
printf 'budget %.1f MiB per rank; plan at cp 1: %.1f MiB (fits: %s); at cp 4: %.1f MiB (fits: %s)\n' \
	"$(python3 -c "print($budget * 1024)")" "$(python3 -c "print($one / 2**20)")" "$(fits 1)" "$(python3 -c "print($four / 2**20)")" "$(fits 4)"
./bin/shardline run "${args[@]}" --nproc 4 --context-parallel-size 4 --train-iters 1 --set train.eval_interval=0 --set data.val_fraction=0 \
	--set parallel.device_memory_gib="$budget" --set run.output_dir="$out" --set run.name=cp4 --set logging.level=warn --set logging.progress=false \
	--trace "$out/trace.json" >/dev/null
python3 - "$out/cp4/run.json" "$out/trace.json" <<'PY'
import json, sys
run, trace = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))["traceEvents"]
held, plan = run["memory"]["held"]["total"], run["memory"]["predicted"]["total"]
print(f"cp 4: held {held/2**20:.1f} MiB per rank (plan {plan/2**20:.1f} MiB); step {32768/run['result']['tokens_per_s_median']:.1f} s")
for rank in range(4):
    attn = [(e["ts"], e["ts"] + e["dur"]) for e in trace if e["pid"] == rank and e["name"].startswith("ring attention")]
    xfer = [(e["ts"], e["ts"] + e["dur"]) for e in trace if e["pid"] == rank and e["name"].startswith("cp send_recv K/V")]
    total = sum(b - a for a, b in xfer)
    hidden = sum(max(0, min(b, d) - max(a, c)) for a, b in xfer for c, d in attn)
    print(f"rank {rank}: {len(xfer)} K/V transfers, {total/1e3:.1f} ms, {100*hidden/max(total, 1):.0f}% of it during ring attention")
PY
