#!/usr/bin/env bash
# Expert parallelism on the CPU: moe-tiny with 32 experts on 8 ranks at EP 1, 2, 4,
# 8 (optim_grads_params), as goroutines (in-process collectives) and as processes
# (TCP over loopback). For each, the measured tokens/s (median of
# 20 steps) and per-rank memory held, beside the plan's per-rank traffic on the ep
# (token all-to-all) and edp (expert FSDP) groups, which explain the curve.
set -euo pipefail
cd "$(dirname "$0")/.."
go build -o bin/shardline ./cmd/shardline
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=(recipes/moe-tiny.toml --num-experts 32 --global-batch-size 64 --micro-batch-size 8 --set model.moe.capacity_factor=1.0)
printf "%-9s %-4s %14s %14s %16s %16s\n" ranks EP tokens/s mem/rank "plan ep sent" "plan edp sent"
for how in run launch; do
	for ep in 1 2 4 8; do
		./bin/shardline $how "${args[@]}" --nproc 8 --expert-model-parallel-size $ep --train-iters 20 --set train.eval_interval=0 \
			--set run.output_dir="$out" --set run.name=$how$ep --set logging.level=warn --set logging.progress=false >/dev/null
		./bin/shardline plan "${args[@]}" --world-size 8 --expert-model-parallel-size $ep --format json > "$out/plan$ep.json"
		/usr/bin/python3 - "$out/$how$ep/run.json" "$out/plan$ep.json" $ep $how <<'PY'
import json, sys
run, plan, ep, how = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3], sys.argv[4]
comm = plan["communication"]
mib = lambda b: f"{b/2**20:.1f} MiB"
print(f"{'in-proc' if how == 'run' else 'tcp-proc':<9} {ep:<4} {run['result']['tokens_per_s_median']:14.0f} {mib(run['memory']['held']['total']):>14} "
      f"{mib(comm.get('ep', {}).get('rank_bytes', 0)):>16} {mib(comm.get('edp', {}).get('rank_bytes', 0)):>16}")
PY
	done
done
