#!/usr/bin/env bash
# A lent GPU machine's whole benchmark in one command (a lease is minutes: no compile, no second call):
#
#   scripts/make-gpu-bundle.sh && scripts/make-gpu-prebuilt.sh      # here, before the lease
#   GPU_COMMIT=$(git rev-parse HEAD) scripts/gpu-session.sh OUT_DIR  # there, gpu-bundle/ carried along
#   scripts/gpu-session.sh OUT_DIR --cpu --tiny      # here: the same steps at toy size on the CPU
#
# Writes into OUT_DIR as it goes (whatever is there when a time limit stops it still tells something):
# device.txt (GPU, driver, CUDA, CPU, the commit), gpu-bench.log (every step's output), then bench.txt,
# serve.txt, offload.txt and bench's results.json / results.md. scripts/gpu_results.py turns them into
# docs/benchmarks/. The benchmark's settings can be changed through gpu-bench.sh's and
# bench-serve.sh's environment (GPU_BENCH_ARGS, ROUNDS, NATIVE_KS, CLIENTS).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-session.sh OUT_DIR [gpu-bench.sh flags]}
shift
mkdir -p "$out"
{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: ${GPU_COMMIT:-unknown}"
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max --format=csv,noheader | sed 's/^/gpu: /'
    nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/cuda driver api: \1/p'
    (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version) | sed -n 's/.*release \([0-9.]*\).*/nvcc: \1/p'
    echo "cpu: $(nproc) x $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
    echo "memory: $(free -g | awk '/Mem:/ {print $2}') GiB"
    echo "python: $("${PYTHON:-python3}" --version 2>&1)"  # the one gpu-bench.sh runs
} >"$out/device.txt" 2>&1
cat "$out/device.txt"

export PYTHONUNBUFFERED=1
export GPU_BENCH_ARGS=${GPU_BENCH_ARGS:--k auto,2,3,4,5,6,8 -n 128 --runs 3}
export ROUNDS=${ROUNDS:-3} NATIVE_KS=${NATIVE_KS:-4 6 8}
scripts/gpu-bench.sh --prebuilt --llama-server "$@" 2>&1 | tee "$out/gpu-bench.log"
status=${PIPESTATUS[0]}
work=${GPU_BENCH_WORK:-.gpu-work}
for file in "$work"/{bench,serve,offload}.txt "$work"/bench-*/results.{json,md}; do
    [ -f "$file" ] && cp "$file" "$out/"
done
echo "gpu-session: gpu-bench.sh exited $status; files in $out: $(ls "$out" | tr '\n' ' ')"
exit "$status"
