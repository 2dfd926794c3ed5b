#!/usr/bin/env bash
# Lint speed against the recipe issue's budget (50 ms per recipe): runs the Go
# benchmark and prints each recipe's time and its ratio to the budget.
set -euo pipefail
budget_ns=50000000
go test ./cmd/shardline -run '^$' -bench BenchmarkLint -benchmem -count 1 | tee /tmp/shardline-bench-lint.txt |
	awk -v budget="$budget_ns" '/^BenchmarkLint\// {
		name=$1; sub(/^BenchmarkLint\//, "", name); sub(/-[0-9]+$/, "", name)
		printf "lint %-22s %10.3f ms/recipe  %6.4f of the 50 ms budget\n", name, $3/1e6, $3/budget
	}'
