#!/usr/bin/env bash
# The GPU checks one device call can hold, most needed first, each under its own
# time cap and all within BUDGET seconds (default 540, so a 600-second call
# returns with its logs). Device time is short (a session may get 15 minutes,
# start-up included), so everything is built here and nothing is compiled there:
#
#   here:   make gpu-bundle        # bin/gpu/: the tagged test binaries, shardline-cuda, opticks.txt (gzipped: about 25 MB)
#   there:  bash scripts/gpu-session.sh [BUDGET]   # run from the repository root, carrying bin/gpu
#
# Writes $OUT/gpu-session/ (or /tmp/gpu-session/ without $OUT): one log per stage
# and summary.txt, a line per stage: PASS, FAIL rc=N, TIMEOUT (its cap ran out)
# or SKIP (too little budget left to start it), with its seconds. A failed stage
# does not stop the next. GPU_SESSION_ONLY=REGEX runs only the stages whose
# names match.
#
# The stages, in order: what this GPU is; the device code that has never run on
# a GPU (the engine's kernel set and memory, NCCL at world size 1, the engine's
# model on the device); the engine's 134M step, with and without full
# recomputation, beside PyTorch (eager and torch.compile), which decides
# whether one engine is as fast as trainer/gpu was (0.78x torch.compile,
# 366k tokens/s on an H100, 2026-11-23); in-process ranks sharing the GPU;
# ranks as processes picking their GPU, NCCL and the communication stream
# where there are GPUs enough, a lost rank, resuming; the checks that ran on
# 2026-11-23, again; the memory-bound kernels' bandwidth and the 1.24B shape's
# MLP products in bf16 and in FP8 (cuBLASLt's FP8 kernels); the 1.24B step in
# bf16 and FP8 beside torch.compile and torchao's float8; the plan against a
# finished GPU run.
set -uo pipefail
budget=${1:-540}
root=$PWD
out=${OUT:-/tmp}/gpu-session
mkdir -p "$out"
summary=$out/summary.txt
: > "$summary"
start=$(date +%s)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SHARDLINE_OPTICKS=$root/bin/gpu/opticks.txt

# make gpu-bundle gzips the binaries (a device call carries 64 MiB): unpack
# them in place, once.
for f in bin/gpu/*.gz; do
	[ -e "$f" ] && gunzip -f "$f" && chmod +x "${f%.gz}"
done
for f in bin/gpu/cuda.test bin/gpu/trainer.test bin/gpu/model.test bin/gpu/cli.test bin/gpu/shardline-cuda bin/gpu/opticks.txt; do
	if [ ! -e "$f" ]; then
		echo "gpu-session: $f is missing: run make gpu-bundle here and carry bin/gpu to the GPU machine" | tee -a "$summary" >&2
		exit 2
	fi
done

# stage NAME CAP DIR CMD...: runs CMD in DIR for at most CAP seconds (less if
# the budget has less left), logging to NAME.log.
stage() {
	local name=$1 cap=$2 dir=$3
	shift 3
	if [ -n "${GPU_SESSION_ONLY:-}" ] && ! [[ $name =~ $GPU_SESSION_ONLY ]]; then
		return
	fi
	local left=$((budget - ($(date +%s) - start)))
	if ((left < 15)); then
		echo "SKIP $name (${left}s of the budget left)" | tee -a "$summary"
		return
	fi
	local t0 rc verdict
	t0=$(date +%s)
	(cd "$root/$dir" && timeout --kill-after=5 "$((cap < left ? cap : left))" "$@") > "$out/$name.log" 2>&1
	rc=$?
	case $rc in
	0) verdict=PASS ;;
	124 | 137) verdict=TIMEOUT ;;
	*) verdict="FAIL rc=$rc" ;;
	esac
	echo "$verdict $name $(($(date +%s) - t0))s" | tee -a "$summary"
}

# Tests that arrived after the H100 run of 2026-11-23 (docs/cuda.md).
new_kernels='TestFlashAttentionMasksByDType|TestKernelConformance|TestMemoryConformance|TestKernelsFromGoroutines|TestKernelsRefuse|TestExpertsStaticSegments|TestExpertsMatmul|TestGroupOnMemory|TestNCCLGroupOfOne|TestNCCLManyGPUs|TestEmbeddingBackwardBF16RoundsOnce|TestRMSNormBackwardBF16RoundsOnce|TestGemmIntoBF16|TestFP8Casts|TestFP8NativeProducts|TestTransposeFP8'
runs=$out/runs

stage info 20 . bash -c 'nvidia-smi; nvidia-smi -L; ls -l /usr/local/cuda/lib64/libcublasLt.so* /usr/lib/x86_64-linux-gnu/libnccl.so* 2>&1; python3 -c "import torch; print(\"torch\", torch.__version__, torch.version.cuda)"'
stage new-kernels 120 cuda ../bin/gpu/cuda.test -test.v -test.run "$new_kernels"
stage engine-model 90 trainer/model ../../bin/gpu/model.test -test.v -test.run 'TestEngineModelOnDevice|TestEngineMasksOnDevice|TestDocumentsApartOnDevice'
stage bench-step 90 trainer ../bin/gpu/trainer.test -test.run '^$' -test.bench 'EngineStep134M' -test.benchtime 20x
stage torch-step 150 . python3 scripts/torch_llama.py 134m eager compile
stage engine-shares-gpu 150 cmd/shardline ../../bin/gpu/cli.test -test.v -test.run 'TestEngineSharesOneGPU|TestGPUCheckpointResumes'
stage ranks-on-gpus 120 cmd/shardline ../../bin/gpu/cli.test -test.v -test.run 'TestRanksOnTheirGPUs|TestLaunchOnGPUs|TestGPUTraceShowsOverlap|TestUserBuffersNeedNCCL|TestLostRankEndsGPURun|TestRanksOnGPUsResume'
stage kernels-again 90 cuda ../bin/gpu/cuda.test -test.v -test.skip "$new_kernels"
stage cli-again 60 cmd/shardline ../../bin/gpu/cli.test -test.v -test.run 'TestRunOnGPU'
stage bench-kernels 60 cuda ../bin/gpu/cuda.test -test.run '^$' -test.bench 'MemoryBound|Matmul|FlashAttentionBF16|Collectives|EmbeddingBackward' -test.benchtime 20x
stage fp8-step 150 . bash -c "cd trainer && ../bin/gpu/trainer.test -test.run '^\$' -test.bench 'EngineStep1B\$|EngineStep1BFP8' -test.benchtime 10x; cd .. && python3 scripts/torch_llama.py 1b compile float8"
stage plan-against 90 . bash -c "bin/gpu/shardline-cuda run recipes/dense-125m.toml --device cuda --train-iters 8 --set data.path=bin/gpu/opticks.txt \
	--set parallel.world_size=1 --set checkpoint.interval=0 --set checkpoint.keep_last=0 --set run.output_dir=$runs --set run.name=dense-125m \
	&& bin/gpu/shardline-cuda plan --against $runs/dense-125m"
echo "gpu-session: $(($(date +%s) - start))s of $budget; logs in $out" | tee -a "$summary"
