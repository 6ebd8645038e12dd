#!/usr/bin/env bash
# Builds llama.cpp's own `llama-speculative-simple` from the llama.cpp tree vendored in the sdist of
# the installed llama-cpp-python, so `bench` can be compared with the native loop on the same
# llama.cpp. For comparison only: nothing in ollama-spec needs it.
#
#   scripts/build-native-speculative.sh [BUILD_DIR]      (default build/native; about 5 minutes on 2 cores)
#   build/native/bin/llama-speculative-simple -m TARGET.gguf -md DRAFT.gguf --draft-max 5 -p "..." -n 256
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/native}
python=${PYTHON:-.venv/bin/python}
version=$("$python" -c "import llama_cpp; print(llama_cpp.__version__)")
src="$out/src"
if [ ! -d "$src/llama_cpp_python-$version/vendor/llama.cpp" ]; then
    mkdir -p "$src"
    "$python" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$src"
    tar -xzf "$src/llama_cpp_python-$version.tar.gz" -C "$src"
fi
cmake -S "$src/llama_cpp_python-$version/vendor/llama.cpp" -B "$out" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF ${CMAKE_ARGS:-} >/dev/null
cmake --build "$out" --target llama-speculative-simple -j "$(nproc)" >/dev/null
echo "built $out/bin/llama-speculative-simple (llama.cpp from llama-cpp-python $version)"
