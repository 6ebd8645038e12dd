#!/usr/bin/env bash
# The GPU benchmark, prepared for a CUDA machine without network (docs/benchmark.md: "GPU benchmark").
#
#   scripts/make-gpu-bundle.sh             # here, with network: gpu-bundle/ (~8 MB) to carry along
#   scripts/gpu-bench.sh                   # there: CUDA build, 8B/1B-shaped pair, check, offload, bench, serve
#   scripts/gpu-bench.sh --cpu --tiny      # anywhere: the same steps on the CPU with a toy-size pair
#   scripts/gpu-bench.sh --no-build --llama-server   # a second command: llama-server too, for serve
#   scripts/gpu-bench.sh --prebuilt --llama-server   # no compile there: gpu-bundle/cuda from
#                                          # scripts/make-gpu-prebuilt.sh, compiled on a CPU machine
#
# Steps: (1) llama-cpp-python for CUDA (Hopper: CMAKE_CUDA_ARCHITECTURES, default 90) built from
# gpu-bundle/ by scripts/install-backend.sh, with the bundle's wheels for what the image lacks;
# (2) the synthetic Llama-3.1-8B-shaped Q4_K_M target and Llama-3.2-1B-shaped Q8_0 draft
# (`demo-store --nested`); (3) `check` against the real device; (4) both models loaded with full
# offload, checked in llama.cpp's load log; (5) `bench`; (6) `serve --parallel 4` timed by 1 and 4
# clients at once (scripts/bench-serve.sh), and with --llama-server llama.cpp's own server with the
# same draft next (built once, with llama-cpp-python's llama.cpp, into
# .gpu-work/native-BACKEND: a second compile of the CUDA kernels, so a command of its own).
# Each step keeps its result under .gpu-work/, so a rerun on the same machine continues.
# --no-build: use the llama-cpp-python $PYTHON already has. --prebuilt: use gpu-bundle/cuda's (its
# llama_cpp package first on PYTHONPATH, its llama-server; cuBLAS and the CUDA runtime of the machine).
# GPU_BENCH_ARGS replaces the bench flags; GPU_BENCH_WORK moves .gpu-work; LLAMA_SERVER names a
# llama-server that is already built.
set -euo pipefail
cd "$(dirname "$0")/.."
backend=cuda profile=8b-1b build=1 native=0 prebuilt=0
for arg; do
    case $arg in
        --cpu) backend=cpu ;;
        --tiny) profile=tiny ;;
        --no-build) build=0 ;;
        --prebuilt) build=0 prebuilt=1 ;;
        --llama-server) native=1 ;;
        *) echo "usage: scripts/gpu-bench.sh [--cpu] [--tiny] [--no-build | --prebuilt] [--llama-server]" >&2; exit 2 ;;
    esac
done
py=${PYTHON:-python3}
work=${GPU_BENCH_WORK:-.gpu-work}
bundle=${GPU_BUNDLE:-gpu-bundle}
case $bundle in /*) ;; *) bundle=$PWD/$bundle ;; esac
store=$work/store-$profile
results=$work/bench-$profile-$backend
ctx=4096  # what bench uses for -n up to 3072: check and the offload test plan for the same
if [ "$profile" = tiny ]; then default_args="-k 2,4 -n 32 --runs 1"; else default_args="-k 2,3,4,5,6,8 -n 128 --runs 1"; fi
bench_args=${GPU_BENCH_ARGS:-$default_args}
mkdir -p "$work"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
step() { echo "== $(date -u +%T) ($((SECONDS))s) $*" >&2; }
spec() { "$py" -c "from ollama_spec.synthetic.nested import NESTED; s = NESTED['$profile']; print(s.target_name, s.draft_name)"; }

if [ -d "$bundle/wheels" ]; then  # offline: pip takes what the bundle holds
    export PIP_NO_INDEX=1 PIP_FIND_LINKS="$bundle/wheels $bundle" PIP_DISABLE_PIP_VERSION_CHECK=1
fi
cuda_args="-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90}"
if [ "$build" = 1 ]; then
    step "llama-cpp-python for $backend from $bundle/"
    [ -d "$bundle/wheels" ] || { echo "no $bundle/: run scripts/make-gpu-bundle.sh where there is network" >&2; exit 1; }
    export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
    export SKBUILD_BUILD_DIR=$PWD/$work/build-$backend  # a cut-off compile resumes here
    [ "$backend" = cuda ] && export CMAKE_ARGS="$cuda_args ${CMAKE_ARGS:-}"
    scripts/install-backend.sh "$(command -v "$py")" "$backend"
fi
if [ "$prebuilt" = 1 ]; then
    prebuilt_dir=$bundle/cuda
    if [ ! -d "$prebuilt_dir" ] && [ -f "$prebuilt_dir.tar.xz" ]; then  # as carried: compressed
        step "unpacking $prebuilt_dir.tar.xz"
        "$py" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" \
            "$prebuilt_dir.tar.xz" "$bundle"
    fi
    [ -d "$prebuilt_dir/site/llama_cpp" ] || { echo "no $prebuilt_dir/: run scripts/make-gpu-prebuilt.sh" >&2; exit 1; }
    # cuBLAS and the CUDA runtime it was linked against (its major version): the machine's toolkit or
    # the nvidia-* wheels beside PyTorch
    runtime_dirs=$(find /usr/local /opt /usr/lib -name 'libcublas.so.[0-9]*' -o -name 'libcudart.so.[0-9]*' 2>/dev/null \
        | xargs -r -n1 dirname | sort -u | paste -sd: -)
    export PYTHONPATH=$prebuilt_dir/site:$PYTHONPATH
    export LD_LIBRARY_PATH=$prebuilt_dir/site/llama_cpp/lib${runtime_dirs:+:$runtime_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    if [ "$native" = 1 ] && [ -x "$prebuilt_dir/bin/llama-server" ]; then
        LLAMA_SERVER=${LLAMA_SERVER:-$prebuilt_dir/bin/llama-server}
    fi
fi
if [ "$build" = 1 ] || [ "$prebuilt" = 1 ]; then
    "$py" -m pip install -q gguf ollama diskcache pydantic fastapi uvicorn
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

# a rerun (for --llama-server, say) keeps the table of a bench with the same flags
if [ ! -s "$work/bench.txt" ] || [ "$(cat "$work/bench.args" 2>/dev/null)" != "$profile $backend $bench_args" ]; then
    step "bench $bench_args"
    # shellcheck disable=SC2086  # the flags are meant to split
    "$py" -m ollama_spec bench "$target" --draft "$draft" --models-dir "$store" --out "$results" $bench_args \
        > "$work/bench.tmp"
    mv "$work/bench.tmp" "$work/bench.txt"
    echo "$profile $backend $bench_args" > "$work/bench.args"
fi
cat "$work/bench.txt"

native_dir=$work/native-$backend
if [ "$native" = 1 ] && [ "$prebuilt" = 1 ] && [ -z "${LLAMA_SERVER:-}" ]; then
    echo "no llama-server in $prebuilt_dir/bin: ours alone" >&2
elif [ "$native" = 1 ] && [ -z "${LLAMA_SERVER:-}" ] && [ ! -x "$native_dir/bin/llama-server" ]; then
    step "llama-server for $backend (llama.cpp of llama-cpp-python)"
    native_args=""
    [ "$backend" = cuda ] && native_args="-DGGML_CUDA=ON $cuda_args"
    CMAKE_ARGS="$native_args" TARGETS=llama-server PYTHON=$py scripts/build-native-speculative.sh "$native_dir"
fi
[ -z "${LLAMA_SERVER:-}" ] && [ -x "$native_dir/bin/llama-server" ] && LLAMA_SERVER=$PWD/$native_dir/bin/llama-server

step "serve --parallel 4, 1 and 4 clients${LLAMA_SERVER:+, then llama-server}"
shim=$work/bin  # bench-serve.sh runs BIN/python and BIN/ollama-spec
mkdir -p "$shim"
py_path=$(command -v "$py")
[ "${py_path#/}" = "$py_path" ] && py_path=$PWD/$py_path
# scripts, not links: a venv's python finds its venv by the path it was started as
printf '#!/bin/sh\nexec "%s" "$@"\n' "$py_path" > "$shim/python"
printf '#!/bin/sh\nexec "%s" -m ollama_spec "$@"\n' "$py_path" > "$shim/ollama-spec"
chmod +x "$shim/python" "$shim/ollama-spec"
OLLAMA_MODELS=$store SLOT_CTX=$ctx LLAMA_SERVER=${LLAMA_SERVER:-} scripts/bench-serve.sh "$shim" "$target" "$draft" \
    | tee "$work/serve.txt"
step "done in ${SECONDS}s; results in $results/, $work/bench.txt and $work/serve.txt"
