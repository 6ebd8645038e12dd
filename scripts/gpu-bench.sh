#!/usr/bin/env bash
# The GPU benchmark, prepared for a CUDA machine without network (docs/benchmark.md: "GPU benchmark").
#
#   scripts/make-gpu-bundle.sh             # here, with network: gpu-bundle/ (~8 MB) to carry along
#   scripts/gpu-bench.sh                   # there: CUDA build, 8B/1B-shaped pair, check, offload, bench
#   scripts/gpu-bench.sh --cpu --tiny      # anywhere: the same steps on the CPU with a toy-size pair
#
# Steps: (1) llama-cpp-python for CUDA (Hopper: CMAKE_CUDA_ARCHITECTURES, default 90) built from
# gpu-bundle/ by scripts/install-backend.sh, with the bundle's wheels for what the image lacks;
# (2) the synthetic Llama-3.1-8B-shaped Q4_K_M target and Llama-3.2-1B-shaped Q8_0 draft
# (`demo-store --nested`); (3) `check` against the real device; (4) both models loaded with full
# offload, checked in llama.cpp's load log; (5) `bench`, whose table is printed last.
# Each step keeps its result under .gpu-work/, so a rerun on the same machine continues.
# --no-build: use the llama-cpp-python $PYTHON already has. GPU_BENCH_ARGS replaces the bench flags;
# GPU_BENCH_WORK moves .gpu-work.
set -euo pipefail
cd "$(dirname "$0")/.."
backend=cuda profile=8b-1b build=1
for arg; do
    case $arg in
        --cpu) backend=cpu ;;
        --tiny) profile=tiny ;;
        --no-build) build=0 ;;
        *) echo "usage: scripts/gpu-bench.sh [--cpu] [--tiny] [--no-build]" >&2; exit 2 ;;
    esac
done
py=${PYTHON:-python3}
work=${GPU_BENCH_WORK:-.gpu-work}
bundle=${GPU_BUNDLE:-gpu-bundle}
store=$work/store-$profile
results=$work/bench-$profile-$backend
ctx=4096  # what bench uses for -n up to 3072: check and the offload test plan for the same
if [ "$profile" = tiny ]; then default_args="-k 2,4 -n 32 --runs 1"; else default_args="-k 2,3,4,5,6,8 -n 128 --runs 1"; fi
bench_args=${GPU_BENCH_ARGS:-$default_args}
mkdir -p "$work"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
step() { echo "== $(date -u +%T) ($((SECONDS))s) $*" >&2; }
spec() { "$py" -c "from ollama_spec.synthetic.nested import NESTED; s = NESTED['$profile']; print(s.target_name, s.draft_name)"; }

if [ "$build" = 1 ]; then
    step "llama-cpp-python for $backend from $bundle/"
    [ -d "$bundle/wheels" ] || { echo "no $bundle/: run scripts/make-gpu-bundle.sh where there is network" >&2; exit 1; }
    export PIP_NO_INDEX=1 PIP_FIND_LINKS="$PWD/$bundle/wheels $PWD/$bundle" PIP_DISABLE_PIP_VERSION_CHECK=1
    export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
    export SKBUILD_BUILD_DIR=$PWD/$work/build-$backend  # a cut-off compile resumes here
    [ "$backend" = cuda ] && export CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} ${CMAKE_ARGS:-}"
    scripts/install-backend.sh "$(command -v "$py")" "$backend"
    "$py" -m pip install -q gguf ollama diskcache pydantic
fi
"$py" -c "import llama_cpp, gguf, ollama" || { echo "llama-cpp-python, gguf or ollama missing for $py" >&2; exit 1; }

step "synthetic pair ($profile) in $store"
"$py" -m ollama_spec demo-store "$store" --nested "$profile"
read -r target draft < <(spec)

step "check against this machine"
"$py" -m ollama_spec check "$target" --draft "$draft" --ctx "$ctx" --models-dir "$store" || true

step "full offload, from llama.cpp's load log"
offload_flags=()
[ "$backend" = cpu ] && offload_flags=(--cpu)
"$py" scripts/gpu_offload_check.py "$target" "$draft" --models-dir "$store" --ctx "$ctx" "${offload_flags[@]}" \
    | tee "$work/offload.txt"

step "bench $bench_args"
# shellcheck disable=SC2086  # the flags are meant to split
"$py" -m ollama_spec bench "$target" --draft "$draft" --models-dir "$store" --out "$results" $bench_args \
    > "$work/bench.txt"
step "done in ${SECONDS}s; results in $results/"
cat "$work/bench.txt"
