#!/usr/bin/env bash
# Sgemm against PyTorch's matmul (OpenBLAS) on the model's own shapes, in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
go test ./tensor/cpu -run '^$' -bench Sgemm -count 1 | awk '/GFLOP/ {n=$1; sub(/^BenchmarkSgemm\//, "", n); sub(/-[0-9]+$/, "", n); print n, $(NF-1)}' > /tmp/shardline-gemm-go.txt
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
	sed 's/^/sgemm /; s/$/ GFLOP\/s (PyTorch missing: make bench-deps)/' /tmp/shardline-gemm-go.txt
	exit 0
fi
/usr/bin/python3 bench/torch_mm.py > /tmp/shardline-gemm-torch.txt

awk 'NR==FNR {t[$1]=$2; next} ($1 in t) {printf "sgemm %-18s shardline %6.1f GFLOP/s, PyTorch/OpenBLAS %6.1f: %.2fx\n", $1, $2, t[$1], $2/t[$1]}' \
	/tmp/shardline-gemm-torch.txt /tmp/shardline-gemm-go.txt
