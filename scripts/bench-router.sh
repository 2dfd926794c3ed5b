#!/usr/bin/env bash
# Expert-bias balancing (auxiliary-loss-free, model.moe.expert_bias) against no
# balancing and the auxiliary loss: moe-tiny trained 200 steps each way with
# four seeds (the biases alone, and beside a complementary auxiliary loss of
# 1e-3 as DeepSeek-V3 runs them; sixteen runs, about 8 minutes on two cores),
# then each trained model's load imbalance (max/mean kept copies per expert
# over validation batches, averaged over layers) and its validation loss,
# their means and ranges over the seeds, and the bias runs against the others
# seed by seed. The issue's criterion: the bias run better balanced than
# "none" with a loss no worse than "aux loss"'s; the script prints whether
# each bias run meets it. SHARDLINE_BENCH_ROUTER_SIGMOID=1 adds the aux-loss and bias runs with
# DeepSeek-V3's sigmoid scores (eight more). docs/engine.md discusses the numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
go test ./trainer -run '^$' -bench '^BenchmarkExpertBalance$' -benchtime 1x -count 1 -timeout 60m | grep -vE '^(goos|goarch|pkg|cpu|PASS|ok|BenchmarkExpertBalance)'
