#!/usr/bin/env bash
# Make gpu-bundle/: what scripts/gpu-bench.sh needs on a GPU machine that has no network.
#
#   scripts/make-gpu-bundle.sh [OUT_DIR]      (default gpu-bundle; ignored by git, carried with the repo)
#
# - llama_cpp_python-VERSION.tar.gz: the installed version's sdist without what a CUDA build never
#   reads (.git, models, docs, examples, tests, the other GPU backends): ~220 MB unpacked -> ~9 MB.
#   tools/ and scripts/ stay: llama-server (`gpu-bench.sh --llama-server`) is built from them;
# - wheels/: the project's pure-Python dependencies that a CUDA/PyTorch image usually lacks (serve's
#   too), for CPython 3.12 on x86-64 Linux, plus scikit-build-core for building the sdist.
# Prints the total size: it must stay well under the 64 MiB a GPU session can carry.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-bundle}
py=${PYTHON:-.venv/bin/python}
pyver=${BUNDLE_PYTHON_VERSION:-3.12}

version_of() { "$py" -c "from importlib.metadata import version; print(version('$1'))"; }
version=$(version_of llama-cpp-python)
rm -rf "$out"
mkdir -p "$out/wheels"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "llama-cpp-python $version: trimming the sdist" >&2
"$py" -m pip download -q --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$version"
tar -xzf "$tmp/llama_cpp_python-$version.tar.gz" -C "$tmp"
src=$tmp/llama_cpp_python-$version
vendor=$src/vendor/llama.cpp
rm -rf "$src"/{.git,docs,examples,tests,docker}
rm -rf "$vendor"/{.git,.github,models,docs,examples,tests,benches,media,app,pocs,gguf-py,conversion,skills,ci,grammars}
for backend in cann et hexagon hip metal musa opencl openvino sycl virtgpu vulkan webgpu zdnn zendnn; do
    rm -rf "$vendor/ggml/src/ggml-$backend"
done
tar -czf "$out/llama_cpp_python-$version.tar.gz" -C "$tmp" "llama_cpp_python-$version"

echo "wheels for CPython $pyver" >&2
packages=(gguf ollama diskcache pydantic pydantic_core annotated_types typing_inspection typing_extensions
          scikit_build_core pathspec packaging fastapi starlette uvicorn annotated_doc opentelemetry_api)
specs=()
for name in "${packages[@]}"; do
    have=$(version_of "$name" 2>/dev/null || true)
    specs+=("$name${have:+==$have}")
done
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --platform any -d "$out/wheels" "${specs[@]}"
du -sh "$out"/* "$out" >&2
