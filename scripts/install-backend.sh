#!/usr/bin/env bash
# Install llama-cpp-python into a venv, built for the backend this machine has.
#
#   scripts/install-backend.sh VENV_PYTHON [cpu|cuda|metal|rocm|auto]    (or BACKEND=... in the environment)
#
# auto: Apple Silicon -> metal; an NVIDIA GPU with the CUDA toolkit (nvcc on PATH, in $CUDA_HOME,
# $CUDA_PATH or /usr/local/cuda) -> cuda; an AMD GPU with ROCm (hipcc) -> rocm; else cpu. A GPU
# without its toolkit gets the CPU build and a line saying what to install.
#
# Every build has llama.cpp's RPC backend (-DGGML_RPC=ON: `ollama-spec rpc-server`, `--rpc`), and
# none has what ollama-spec never loads: llama-cpp-python's multimodal library (mtmd, for its
# Llava chat handlers) and llama.cpp's `common` library (scripts/llama-slim.cmake), two thirds of the
# compile (docs/install.md). The compile shows one progress line; its log stays beside the wheel
# (build.log), and on failure its last lines are printed (scripts/build_progress.py).
# Builds compile llama.cpp from source once per (backend, flags, Python) and are kept as wheels in
# our own cache, $OLLAMA_SPEC_WHEELS (default ~/.cache/ollama-spec/wheels), in a folder named by
# the flags: pip's cache is keyed by the sdist alone, so it would hand back a CPU wheel for a CUDA
# request, or a wheel without RPC. Later installs (CI, a new venv) take the cached wheel: seconds.
# What is installed is read from the package's own libraries (libggml-cuda, -metal, -hip, -rpc), so
# a build made for the wrong backend is rebuilt; the choice is recorded in VENV/.llama-backend.
# $CMAKE_ARGS, if set, is added to the flags. DRY_RUN=1 prints the plan and changes nothing.
set -euo pipefail

python=${1:?usage: install-backend.sh VENV_PYTHON [cpu|cuda|metal|rocm|auto]}
wanted=${2:-${BACKEND:-auto}}
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$(cd "$(dirname "$python")/.." && pwd)
stamp=$venv/.llama-backend
# The one pin, from pyproject.toml.
spec=$(grep -o '"llama-cpp-python[^"]*"' "$root/pyproject.toml" | tr -d '"')

say() { echo "install-backend: $*" >&2; }
any_exists() { local f; for f in "$@"; do [ -e "$f" ] && return 0; done; return 1; }

find_nvcc() {
    local dir
    for dir in "${CUDA_HOME:-}" "${CUDA_PATH:-}" ${CUDA_DEFAULT_ROOT-/usr/local/cuda}; do
        if [ -n "$dir" ] && [ -x "$dir/bin/nvcc" ]; then echo "$dir/bin/nvcc"; return; fi
    done
    command -v nvcc || true
}

find_hipcc() { command -v hipcc || { [ -x /opt/rocm/bin/hipcc ] && echo /opt/rocm/bin/hipcc; } || true; }

has_nvidia_gpu() { [ -e /proc/driver/nvidia/version ] || command -v nvidia-smi >/dev/null 2>&1; }
has_amd_gpu() { [ -e /dev/kfd ] || command -v rocm-smi >/dev/null 2>&1; }

detect() {
    if [ "$(uname -s)" = Darwin ] && [ "$(uname -m)" = arm64 ]; then echo metal; return; fi
    if has_nvidia_gpu; then
        if [ -n "$(find_nvcc)" ]; then echo cuda; return; fi
        say "an NVIDIA GPU is here but not the CUDA toolkit (nvcc): installing the CPU build."
        say "  for GPU offload install the toolkit (https://developer.nvidia.com/cuda-downloads, or"
        say "  'sudo apt install nvidia-cuda-toolkit'), then run 'make install' again (or set CUDA_HOME)."
    elif has_amd_gpu; then
        if [ -n "$(find_hipcc)" ]; then echo rocm; return; fi
        say "an AMD GPU is here but not ROCm's hipcc: installing the CPU build."
        say "  for GPU offload install ROCm (https://rocm.docs.amd.com), then run 'make install' again."
    fi
    echo cpu
}

# The backend the installed llama-cpp-python was built with ("none" when it is not installed).
installed_backend() {
    local lib
    lib=$("$python" - <<'EOF' 2>/dev/null || true
import importlib.util, pathlib
spec = importlib.util.find_spec("llama_cpp")
print(pathlib.Path(spec.origin).parent / "lib" if spec else "")
EOF
)
    if [ -z "$lib" ] || [ ! -d "$lib" ]; then echo none; return; fi
    if ls "$lib" | grep -q '^libggml-cuda'; then echo cuda
    elif ls "$lib" | grep -q '^libggml-metal'; then echo metal
    elif ls "$lib" | grep -q '^libggml-hip'; then echo rocm
    else echo cpu; fi
}

# Whether the installed build has llama.cpp's RPC backend.
has_rpc() {
    "$python" - <<'EOF' 2>/dev/null
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("llama_cpp")
sys.exit(0 if spec and any((pathlib.Path(spec.origin).parent / "lib").glob("libggml-rpc*")) else 1)
EOF
}

# CUDA toolkits without cuBLAS (some container images): take headers and libraries from NVIDIA's
# PyPI package, and skip linking libcuda (-DGGML_CUDA_NO_VMM=ON) where the driver stub is missing.
cuda_args() {
    local nvcc home major site inc lib
    nvcc=$(find_nvcc)
    home=$(cd "$(dirname "$nvcc")/.." && pwd)
    args="-DGGML_CUDA=on -DCMAKE_CUDA_COMPILER=$nvcc"
    if ! any_exists "$home"/include/cublas_v2.h "$home"/targets/*/include/cublas_v2.h; then
        major=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
        say "this CUDA toolkit has no cuBLAS: taking it from PyPI (nvidia-cublas for CUDA $major)"
        if [ -n "${DRY_RUN:-}" ]; then
            inc="<nvidia-cublas>/include" cublas="<nvidia-cublas>/lib/libcublas.so" cublaslt="<nvidia-cublas>/lib/libcublasLt.so"
        else
            if [ "$major" -ge 13 ]; then "$python" -m pip install -q "nvidia-cublas>=13,<14"
            else "$python" -m pip install -q "nvidia-cublas-cu$major"; fi
            site=$("$python" -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))')
            inc=$(dirname "$(find "$site/nvidia" -name cublas_v2.h | head -1)")
            cublas=$(find "$site/nvidia" -name 'libcublas.so*' | head -1)
            cublaslt=$(find "$site/nvidia" -name 'libcublasLt.so*' | head -1)
        fi
        # libggml-cuda finds the libraries at run time through its RPATH
        args="$args -DCMAKE_CUDA_FLAGS=-I$inc -DCMAKE_CXX_FLAGS=-I$inc -DCUDA_cublas_LIBRARY=$cublas"
        args="$args -DCUDA_cublasLt_LIBRARY=$cublaslt -DCMAKE_INSTALL_RPATH=$(dirname "$cublas")"
    fi
    if ! any_exists "$home"/lib64/libcuda.so "$home"/lib64/stubs/libcuda.so "$home"/targets/*/lib/stubs/libcuda.so \
            /usr/lib/x86_64-linux-gnu/libcuda.so*; then
        args="$args -DGGML_CUDA_NO_VMM=ON"
    fi
    echo "$args"
}

[ "$wanted" = auto ] && wanted=$(detect)
case $wanted in
    cpu) args="" ;;
    cuda) [ -n "$(find_nvcc)" ] || { say "BACKEND=cuda but no nvcc found (set CUDA_HOME)"; exit 1; }; args=$(cuda_args) ;;
    metal) args="-DGGML_METAL=on" ;;
    rocm) [ -n "$(find_hipcc)" ] || { say "BACKEND=rocm but no hipcc found"; exit 1; }
          # llama.cpp's build docs: HIP's clang and ROCm's root come from hipconfig
          export HIPCXX="$(hipconfig -l)/clang" HIP_PATH="$(hipconfig -R)"; args="-DGGML_HIP=on" ;;
    *) say "unknown BACKEND '$wanted' (cpu, cuda, metal, rocm or auto)"; exit 2 ;;
esac
args="-DGGML_RPC=ON${args:+ $args}${CMAKE_ARGS:+ $CMAKE_ARGS}"
# Left out of the build, first so that $CMAKE_ARGS can turn mtmd back on (-DLLAVA_BUILD=ON). Not part
# of the recorded flags: an installed build that has these libraries too is as good.
slim_cmake=$root/scripts/llama-slim.cmake
slim="-DLLAVA_BUILD=OFF -DCMAKE_PROJECT_INCLUDE=$slim_cmake"

# The wheel for these flags and this Python (its ctypes bindings are py3, its libraries are not
# for every platform): from our cache, else built into it.
pytag=$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
# The include file counts by its content, not its path: every clone shares one cached wheel.
slim_key="${slim//$slim_cmake/llama-slim.cmake:$(sha256sum < "$slim_cmake" | cut -c1-12)}"
key=$(printf '%s %s %s %s %s' "$spec" "$wanted" "$args" "$slim_key" "$pytag" | sha256sum | cut -c1-12)
cache=${OLLAMA_SPEC_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/ollama-spec/wheels}/$wanted-$key

have=$(installed_backend)
if [ -n "${DRY_RUN:-}" ]; then
    echo "left out: $slim"
    echo "wheel cache: $cache"
    echo "installed: $have; wanted: $wanted; CMAKE_ARGS: $args"
    exit 0
fi
recorded=$(sed -n 's/^cmake_args=//p' "$stamp" 2>/dev/null || true)
record() {
    local version
    version=$("$python" -c 'from importlib.metadata import version; print(version("llama-cpp-python"))')
    printf 'backend=%s\nversion=%s\ncmake_args=%s\n' "$(installed_backend)" "$version" "$args" > "$stamp"
    echo "$version"
}
if [ "$have" = "$wanted" ] && [ "$recorded" = "$args" ] && has_rpc; then
    exit 0  # already right: every `make test` passes here in well under a second
fi

wheel=$(ls "$cache"/llama_cpp_python-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
    say "building llama-cpp-python for $wanted (CMAKE_ARGS=$args); this compiles llama.cpp once:"
    say "  about 3 minutes for the CPU on 2 cores, 5-30 for a GPU; later installs take the wheel in seconds"
    mkdir -p "$cache"
    building=$(mktemp -d "$cache/.build.XXXXXX")
    trap 'rm -rf "$building"' EXIT
    # -v: the compiler's lines go to the log, where the progress line reads its counter
    CMAKE_ARGS="$slim $args" "$python" "$root/scripts/build_progress.py" --log "$cache/build.log" \
        --label "building llama-cpp-python" -- "$python" -m pip wheel -v --no-deps --no-cache-dir -w "$building" "$spec"
    mv "$building"/llama_cpp_python-*.whl "$cache"/  # only a finished wheel enters the cache
    printf '%s\n' "$args" > "$cache/cmake-args"
    wheel=$(ls "$cache"/llama_cpp_python-*.whl | head -1)
fi
install_wheel() {
    "$python" "$root/scripts/build_progress.py" --log "$cache/install.log" --label "installing llama-cpp-python" \
        -- "$python" -m pip install --no-compile "$@" "$wheel"  # no-compile: see the Makefile
}
if [ "$have" = none ]; then
    install_wheel  # a fresh venv: llama-cpp-python's own dependencies too
else
    say "replacing the $have build of llama-cpp-python (flags: ${recorded:-none recorded}) with a $wanted build ($args)"
    install_wheel --force-reinstall --no-deps
fi
version=$(record)
now=$(installed_backend)
if [ "$now" != "$wanted" ] || ! has_rpc; then
    say "asked for $wanted with RPC but the installed llama-cpp-python $version is a $now build$(has_rpc || echo ' without RPC'); see the pip output above, or remove $cache"
    exit 1
fi
say "llama-cpp-python $version, $now backend, with RPC"
