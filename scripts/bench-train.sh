#!/usr/bin/env bash
# Training throughput on nanoGPT's Shakespeare-char shape (4 layers, width 128,
# context 64, batch 12): shardline's full training step (forward, backward, AdamW;
# the median over 200 steps of `shardline run`) against the same model written in
# PyTorch (bench/torch_llama.py: best of 1 and 2 torch threads, and of OpenBLAS with
# 1 or 2 threads), measured in this one run. Prints both and the ratio, and beside
# them shardline with bf16 compute weights (precision.bf16: stored in bf16, and the
# products that read them multiply bf16 pairs where the CPU has AVX-512 BF16).
# PyTorch stays fp32 (the reference for speed; bf16 in PyTorch on the CPU is not
# measured here).
set -euo pipefail
cd "$(dirname "$0")/.."
data=../shared/data/tinyshakespeare.txt
vocab=65
if [ ! -f "$data" ]; then
	data="$(go env GOROOT)/src/testdata/Isaac.Newton-Opticks.txt"
	vocab=128
	echo "note: $data stands in for tinyshakespeare (absent); vocabulary $vocab" >&2
fi
go build -o bin/shardline ./cmd/shardline
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
have_torch=1
/usr/bin/python3 -c 'import torch' 2>/dev/null || have_torch=0
# The machine is shared and its speed drifts by tens of percent within a minute, so
# the two are measured alternately, three rounds, and the ratio is the median of
# the rounds' ratios (each round: shardline's median step, then PyTorch's best).
ratios=()
bfratios=()
# shardline's median tokens/s over 200 steps, with precision.bf16 = $1.
shardline_tps() {
	rm -rf "$out/shakespeare-char"
	./bin/shardline run bench/shakespeare-char.toml --train-iters 200 --set train.eval_interval=0 \
		--set data.path="$data" --set model.vocab_size=$vocab --set run.output_dir="$out" \
		--set precision.bf16="$1" --set logging.progress=false --set logging.level=warn >/dev/null
	/usr/bin/python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['result']['tokens_per_s_median']))" "$out/shakespeare-char/run.json"
}
for round in 1 2 3; do
	go_tps=$(shardline_tps false)
	bf_tps=$(shardline_tps true)
	if [ $have_torch = 0 ]; then
		echo "train shakespeare-char: shardline $go_tps tokens/s (bf16 $bf_tps); PyTorch missing (make bench-deps installs it)"
		exit 0
	fi
	best=0
	for ob in 1 2; do
		t=$(OPENBLAS_NUM_THREADS=$ob /usr/bin/python3 bench/torch_llama.py --vocab $vocab --steps 60 | tail -1 |
			/usr/bin/python3 -c "import json,sys; print(round(json.load(sys.stdin)['tokens_per_s']))")
		if [ "$t" -gt "$best" ]; then best=$t; fi
	done
	r=$(/usr/bin/python3 -c "import sys; print(f'{float(sys.argv[1])/float(sys.argv[2]):.2f}')" "$go_tps" "$best")
	rb=$(/usr/bin/python3 -c "import sys; print(f'{float(sys.argv[1])/float(sys.argv[2]):.2f}')" "$bf_tps" "$best")
	echo "  round $round: shardline $go_tps tokens/s (bf16 $bf_tps), PyTorch $best tokens/s: ${r}x (bf16 ${rb}x)"
	ratios+=("$r $go_tps $best")
	bfratios+=("$rb $bf_tps")
done
printf '%s\n' "${ratios[@]}" | sort -n | sed -n 2p | {
	read -r r g t
	echo "train shakespeare-char: shardline $g tokens/s, PyTorch $t tokens/s (best of 1/2 threads): ${r}x (median of 3 alternating rounds)"
}
printf '%s\n' "${bfratios[@]}" | sort -n | sed -n 2p | {
	read -r r g
	echo "train shakespeare-char, precision.bf16: shardline $g tokens/s: ${r}x PyTorch fp32 (median of the same rounds)"
}
