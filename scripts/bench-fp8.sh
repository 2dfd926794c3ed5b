#!/usr/bin/env bash
# FP8 against bf16 on the CPU: recipes/tiny.toml trained 200 steps (micro-batches
# of 4) in bf16 and with its linear layers in FP8 (hybrid and e4m3 under
# tensorwise current scaling, hybrid under delayed scaling), from the same initialisation and data: each FP8 curve's
# worst per-step and 20-step-mean loss difference from bf16's, the final
# validation losses, tokens a second against bf16's and the scratch the FP8
# copies add; then recipes/moe-tiny.toml the same way in hybrid FP8, with its
# experts' products in FP8 and in bf16; then the tiny comparison on the host
# emulator's GPU (compute capability 9.0: the products on cuBLASLt's FP8
# kernels' rules) at a smaller shape, FP8_EMU_STEPS steps (default 200; the
# emulator runs its kernels as plain loops: 27 minutes on two busy cores).
# docs/engine.md ("FP8") discusses the numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
go test ./trainer -run '^$' -bench '^BenchmarkFP8TracksBF16$' -benchtime 1x -count 1 -timeout 30m | grep -vE '^(goos|goarch|pkg|cpu|PASS|ok)'
go test -tags cudaemu ./trainer -run '^$' -bench '^BenchmarkFP8TracksBF16OnGPU$' -benchtime 1x -count 1 -timeout 60m | grep -vE '^(goos|goarch|pkg|cpu|PASS|ok)'
