# shardline — run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
# The module proxy alone: a missing module fails fast instead of hanging on a
# `direct` fetch.
export GOPROXY := $(shell $(GO) env GOPROXY 2>/dev/null | cut -d, -f1)
BIN := bin/shardline

.PHONY: help build test vet bench bench-deps fuzz docs golden clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'

build: ## build bin/shardline
	$(GO) build -o $(BIN) ./cmd/shardline

test: ## vet and run every test (what CI runs)
	$(GO) vet ./...
	$(GO) test -count=1 ./...

vet: ## go vet
	$(GO) vet ./...

bench: bench-deps ## speed benchmarks, each printed against its budget or reference
	./scripts/bench-lint.sh
	./scripts/bench-plan.sh
	./scripts/bench-gemm.sh
	./scripts/bench-train.sh
	./scripts/bench-ep.sh
	$(GO) test ./parallel/comm -run '^$$' -bench BusBandwidth -benchtime 3x -count 1 | grep -E 'MB/s|busGB/s'

bench-deps: ## install the reference PyTorch and OpenBLAS (Debian packages) if missing
	@/usr/bin/python3 -c 'import torch' 2>/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch libopenblas0-pthread; }

fuzz: ## fuzz the recipe loader and linter for 60 s
	$(GO) test ./config -run '^$$' -fuzz FuzzLoadLint -fuzztime 60s

docs: ## regenerate docs/recipes.md from the schema's doc comments
	$(GO) run ./cmd/shardline recipe docs --format markdown > docs/recipes.md

golden: ## rewrite golden files after an intended change (review the diff!)
	$(GO) test ./... -run Golden -update

clean: ## remove build outputs
	rm -rf bin
