#!/usr/bin/env bash
# Expert-bias balancing (auxiliary-loss-free, model.moe.expert_bias) against no
# balancing and the auxiliary loss: moe-tiny trained 200 steps each way, then
# the trained model's load imbalance (max/mean kept copies per expert over
# validation batches, averaged over layers) and its validation loss. The bias
# run should be better balanced than "none" with a loss no worse than "aux
# loss"'s.
set -euo pipefail
cd "$(dirname "$0")/.."
go test ./trainer -run '^$' -bench '^BenchmarkExpertBalance$' -benchtime 1x -count 1 | grep -vE '^(goos|goarch|pkg|cpu|PASS|ok|BenchmarkExpertBalance)'
