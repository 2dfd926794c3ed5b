#!/usr/bin/env bash
# Sgemm against PyTorch's matmul (OpenBLAS) on the model's own shapes, in one run;
# then products on bf16 weights against the same on fp32 weights.
set -euo pipefail
cd "$(dirname "$0")/.."
go test ./tensor/cpu -run '^$' -bench Sgemm -count 1 | awk '/GFLOP/ {n=$1; sub(/^BenchmarkSgemm\//, "", n); sub(/-[0-9]+$/, "", n); print n, $(NF-1)}' > /tmp/shardline-gemm-go.txt
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
	sed 's/^/sgemm /; s/$/ GFLOP\/s (PyTorch missing: make bench-deps)/' /tmp/shardline-gemm-go.txt
else
	/usr/bin/python3 bench/torch_mm.py > /tmp/shardline-gemm-torch.txt
	awk 'NR==FNR {t[$1]=$2; next} ($1 in t) {printf "sgemm %-18s shardline %6.1f GFLOP/s, PyTorch/OpenBLAS %6.1f: %.2fx\n", $1, $2, t[$1], $2/t[$1]}' \
		/tmp/shardline-gemm-torch.txt /tmp/shardline-gemm-go.txt
fi

# bf16 weights (precision.bf16) against fp32 weights, the same products in one run:
# the forward and the input gradient, the two that read a weight. Widened while
# packed (bf16), storage in bf16 must not slow them; on the dot-product path (dot:
# the other operand rounded to bf16, VDPBF16PS, where the CPU has AVX-512 BF16)
# they should be faster.
go test ./tensor/cpu -run '^$' -bench MatmulBF16 -count 1 | awk '/GFLOP/ {
	n=$1; sub(/^BenchmarkMatmulBF16\//, "", n); sub(/-[0-9]+$/, "", n)
	split(n, p, "/"); g[p[1] "," p[2]] = $(NF-1); if (!(p[1] in seen)) { seen[p[1]] = 1; order[++k] = p[1] }
} END {
	if (k == 0) { print "matmul bf16: no benchmark ran"; exit 1 }
	for (i = 1; i <= k; i++) {
		s = order[i]
		printf "matmul bf16 weights %-14s widened %6.1f GFLOP/s, fp32 weights %6.1f: %.2fx", s, g[s ",bf16"], g[s ",fp32"], g[s ",bf16"] / g[s ",fp32"]
		if ((s ",dot") in g) printf "; dot product %6.1f: %.2fx", g[s ",dot"], g[s ",dot"] / g[s ",fp32"]
		printf "\n"
	}
}'

# The experts' products (moe-tiny's: 8 experts of 512 rows, 128 by 128), an
# expert per core (ExpertsMatmul) against each expert's product shared among
# the cores in turn, warm and after 64 MiB were written (cold, as in a step).
go test ./tensor/cpu -run '^$' -bench ExpertsMatmul -count 1 | awk '/ns\/op/ {
	n=$1; sub(/^BenchmarkExpertsMatmul\//, "", n); sub(/-[0-9]+$/, "", n)
	split(n, p, "/"); t[p[1] "/" p[3] "," p[2]] = $3; if (!((p[1] "/" p[3]) in seen)) { seen[p[1] "/" p[3]] = 1; order[++k] = p[1] "/" p[3] }
} END {
	if (k == 0) { print "experts: no benchmark ran"; exit 1 }
	for (i = 1; i <= k; i++) {
		s = order[i]
		printf "experts %-14s an expert per core %8.0f ns, each product shared %8.0f ns: %.2fx\n", s, t[s ",experts"], t[s ",each-alone"], t[s ",each-alone"] / t[s ",experts"]
	}
}'
