#!/usr/bin/env bash
# Plan-compiler speed against the plan issue's budgets: a 600B-class MoE for 2048
# ranks in well under 200 ms and 200 MB; an 8-way sweep in under 2 s.
set -euo pipefail
go test ./parallel -run '^$' -bench 'BenchmarkCompile600B|BenchmarkSweep8' -benchmem -benchtime 5x -count 1 |
	tee /tmp/shardline-bench-plan.txt |
	awk '/^BenchmarkCompile600B/ {
		for (i = 1; i <= NF; i++) { if ($i == "ns/op") ns = $(i-1); if ($i == "live-MB") live = $(i-1); if ($i == "B/op") alloc = $(i-1) }
		printf "plan compile 700B MoE, 2048 ranks  %8.1f ms  %5.3f of 200 ms;  %6.1f MB live, %6.1f MB allocated  %5.3f of 200 MB\n", ns/1e6, ns/2e8, live, alloc/1e6, alloc/2e8
	}
	/^BenchmarkSweep8/ {
		for (i = 1; i <= NF; i++) if ($i == "ns/op") ns = $(i-1)
		printf "plan sweep, 8 variants             %8.1f ms  %5.3f of 2 s\n", ns/1e6, ns/2e9
	}'
