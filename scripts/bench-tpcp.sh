#!/usr/bin/env bash
# Tensor and context parallelism on the CPU: the 6x256 shape (seq 256) with one
# micro-batch of 8 sequences split over tp and cp degrees (tp x cp ranks, dp 1),
# as goroutines (in-process collectives) and as processes (TCP over loopback).
# For each: the measured tokens/s (median of 6 steps) beside the plan's, memory
# held per rank beside the plan's, and the bytes each rank sent per step on the tp
# and cp groups (counted by the trainer, run.json) beside the plan's sent-per-rank.
set -euo pipefail
cd "$(dirname "$0")/.."
go build -o bin/shardline ./cmd/shardline
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=(recipes/tiny.toml --num-layers 6 --hidden-size 256 --num-attention-heads 8 --num-query-groups 8 --ffn-hidden-size 768 --seq-length 256
	--micro-batch-size 8 --global-batch-size 8)
printf "%-8s %3s %3s %11s %11s %11s %11s %12s %12s %12s %12s\n" how tp cp "tokens/s" "plan tok/s" mem/rank "plan mem" "tp sent" "plan tp" "cp sent" "plan cp"
for how in run launch; do
	for shape in "1 1" "2 1" "4 1" "1 2" "1 4" "2 2"; do
		read -r tp cp <<<"$shape"
		world=$((tp * cp))
		[ "$how" = launch ] && [ "$world" = 1 ] && continue
		name="$how-tp$tp-cp$cp"
		./bin/shardline $how "${args[@]}" --nproc $world --tensor-model-parallel-size "$tp" --context-parallel-size "$cp" --train-iters 6 \
			--set train.eval_interval=0 --set run.output_dir="$out" --set run.name="$name" --set logging.level=warn --set logging.progress=false >/dev/null
		./bin/shardline plan --against "$out/$name" --format json >"$out/$name.json"
		./bin/shardline plan "${args[@]}" --world-size $world --tensor-model-parallel-size "$tp" --context-parallel-size "$cp" --format json >"$out/$name.plan.json"
		python3 - "$out/$name/run.json" "$out/$name.json" "$out/$name.plan.json" "$how" "$tp" "$cp" <<'PY'
import json, sys
run, against, plan = (json.load(open(f)) for f in sys.argv[1:4])
how, tp, cp = sys.argv[4:7]
row = {c["what"]: c for c in against["comparison"]}
st = row["step time"]
tokens = 8 * 256
sent = run.get("model_comm_sent_per_step", {})
comm = plan["communication"]
mib = lambda b: f"{b/2**20:.2f} MiB"
print(f"{how:<8} {tp:>3} {cp:>3} {tokens/st['measured']:11.0f} {tokens/st['planned']:11.0f} {mib(run['memory']['held']['total']):>11} "
      f"{mib(run['memory']['predicted']['total']):>11} {mib(sent.get('tp', 0)):>12} {mib(comm.get('tp', {}).get('rank_bytes', 0)):>12} "
      f"{mib(sent.get('cp', 0)):>12} {mib(comm.get('cp', {}).get('rank_bytes', 0)):>12}")
PY
	done
done
