#!/usr/bin/env bash
# The plan's CPU step time with no calibration of this machine: `plan` and
# `run` scale the shipped table by a probe of this machine (docs/plan.md, "The
# probe"), taken once into an empty cache directory. For tiny and moe-tiny at 1
# and 2 in-process ranks (each rank a micro-batch of 16), `shardline run` trains
# a few steps and `shardline plan --against` compares the measured median step
# time with the plan the run made (run.json records its probe); then all of it
# again under `taskset -c 0`, one core of the machine's (a machine half as
# fast, which no shipped table describes: its probe is its own).
#
# This machine's speed drifts, and other work shares its cores, so every row
# is run PROBE_REPEAT times (default 3), the rows interleaved, and the median
# of a row's ratios is printed with their spread ((max - min) / median), the
# median of the probes' factors (each run probes afresh), and the ratio with
# the shipped table unscaled (`plan --against --host-probe` plans from it).
# The summary counts the rows within 25% of the plan. PROBE_STEPS (default 16)
# is the steps a run trains; PROBE_OUT=DIR keeps the runs there.
set -euo pipefail
cd "$(dirname "$0")/.."
go build -o bin/shardline ./cmd/shardline
if [ -n "${PROBE_OUT:-}" ]; then
	out=$PROBE_OUT # kept: the runs, their run.json and the comparisons
	mkdir -p "$out"
else
	out=$(mktemp -d)
	trap 'rm -rf "$out"' EXIT
fi
repeat=${PROBE_REPEAT:-3}
steps=${PROBE_STEPS:-16}
export SHARDLINE_CACHE_DIR="$out/cache" # an empty cache: the first plan probes
unset SHARDLINE_CALIBRATION
if ! command -v taskset >/dev/null; then
	echo "taskset (util-linux) is missing: the one-core rows need it" >&2
	exit 1
fi
rows=()
for mode in plain taskset; do
	for s in tiny moe-tiny; do
		for world in 1 2; do rows+=("$mode|$s|$world"); done
	done
done
echo "${#rows[@]} rows, $repeat runs each, interleaved..." >&2
for ((i = 1; i <= repeat; i++)); do
	for r in "${rows[@]}"; do
		IFS='|' read -r mode name world <<<"$r"
		pre=()
		if [ "$mode" = taskset ]; then pre=(taskset -c 0); fi
		run="$mode-$name-$world-$i"
		"${pre[@]}" ./bin/shardline run "recipes/$name.toml" --train-iters "$steps" --set train.eval_interval=0 \
			--micro-batch-size 16 --global-batch-size $((16 * world)) --set parallel.world_size="$world" \
			--set run.output_dir="$out" --set run.name="$run" --set logging.progress=false >/dev/null 2>"$out/$run.err" ||
			{ cat "$out/$run.err" >&2; exit 1; }
		"${pre[@]}" ./bin/shardline plan --against "$out/$run" --format json >"$out/$run.json" 2>"$out/$run.plan.err" ||
			{ cat "$out/$run.plan.err" >&2; exit 1; }
		# The shipped table unscaled (--host-probe plans from it), for comparison.
		"${pre[@]}" ./bin/shardline plan --against "$out/$run" --host-probe --format json >"$out/$run.shipped.json" 2>/dev/null ||
			{ echo "plan --against $out/$run --host-probe failed" >&2; exit 1; }
	done
done
python3 - "$out" "$repeat" "${rows[@]}" <<'PY'
import json, statistics, sys
out, repeat, rows = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def step(path):
    return {c["what"]: c for c in json.load(open(path))["comparison"]}["step time"]
print(f'{"cores":<8} {"shape":<9} {"ranks":>5}  {"planned":>9} {"measured":>9} {"measured/planned":>16} {"spread":>6}  '
      f'{"probe: matmuls":>14} {"memory":>6}  {"shipped table: m/p":>18}')
within = 0
for r in rows:
    mode, name, world = r.split("|")
    ratios, planned, measured, gemm, mem, shipped = [], [], [], [], [], []
    for i in range(1, repeat + 1):
        base = f"{out}/{mode}-{name}-{world}-{i}"
        s = step(base + ".json")
        ratios.append(s["measured"] / s["planned"])
        planned.append(s["planned"]); measured.append(s["measured"])
        u = step(base + ".shipped.json")
        shipped.append(u["measured"] / u["planned"])
        p = json.load(open(base + "/run.json"))["result"].get("probe") or {}
        gemm.append(p.get("gemm_factor", float("nan"))); mem.append(p.get("stream_factor", float("nan")))
    m = statistics.median(ratios)
    within += abs(m - 1) <= 0.25
    cores = "1 of 2" if mode == "taskset" else "all"
    print(f'{cores:<8} {name:<9} {world:>5}  {statistics.median(planned)*1e3:7.1f}ms {statistics.median(measured)*1e3:7.1f}ms '
          f'{m:16.3f} {(max(ratios)-min(ratios))/m:6.2f}  {statistics.median(gemm):14.2f} {statistics.median(mem):6.2f}  '
          f'{statistics.median(shipped):18.3f}')
print(f"{within} of {len(rows)} rows within 25% of the plan, with no calibration of this machine")
PY
