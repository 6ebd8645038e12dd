#!/usr/bin/env bash
# Builds llama.cpp's own `llama-speculative-simple` and `llama-server` from the llama.cpp tree vendored
# in the sdist of the installed llama-cpp-python, so `bench` (--native) and `serve` (scripts/bench-serve.sh,
# LLAMA_SERVER) can be compared with llama.cpp's own on the same llama.cpp. For comparison only:
# nothing in ollama-spec needs them.
#
#   scripts/build-native-speculative.sh [BUILD_DIR]      (default build/native; about 7 minutes on 2 cores)
#   build/native/bin/llama-speculative-simple -m TARGET.gguf -md DRAFT.gguf --draft-max 5 -p "..." -n 256
#   LLAMA_SERVER=build/native/bin/llama-server make bench
# TARGETS picks the binaries (a trimmed sdist without examples/, as in gpu-bundle/, builds llama-server
# only); CMAKE_ARGS adds flags (-DGGML_CUDA=ON ...); the sdist comes from pip (PIP_FIND_LINKS offline).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/native}
python=${PYTHON:-.venv/bin/python}
targets=${TARGETS:-llama-speculative-simple llama-server}
version=$("$python" -c "import llama_cpp; print(llama_cpp.__version__)")
src="$out/src"
if [ ! -d "$src/llama_cpp_python-$version/vendor/llama.cpp" ]; then
    mkdir -p "$src"
    "$python" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$src"
    tar -xzf "$src/llama_cpp_python-$version.tar.gz" -C "$src"
fi
examples=OFF
case " $targets " in *" llama-speculative-simple "*) examples=ON ;; esac
# shellcheck disable=SC2086  # CMAKE_ARGS and the targets are meant to split
cmake -S "$src/llama_cpp_python-$version/vendor/llama.cpp" -B "$out" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=$examples \
    -DLLAMA_BUILD_SERVER=ON ${CMAKE_ARGS:-} >/dev/null
# shellcheck disable=SC2086
cmake --build "$out" --target $targets -j "$(nproc)" >/dev/null
for target in $targets; do echo "built $out/bin/$target (llama.cpp from llama-cpp-python $version)"; done
