#!/usr/bin/env bash
# Compile llama.cpp for CUDA here, on a machine without a GPU, so a lent GPU machine spends none of
# its minutes compiling (docs/benchmark.md: "GPU benchmark"):
#
#   scripts/make-gpu-prebuilt.sh [OUT_DIR]      (default gpu-bundle/cuda; ~45 minutes on 2 cores)
#   scripts/gpu-bench.sh --prebuilt --llama-server     # there: no compile at all
#
# OUT_DIR/site/llama_cpp: llama-cpp-python's own Python package (from the installed version's sdist)
# with the CUDA build of its llama.cpp in llama_cpp/lib, and a dist-info naming the version;
# OUT_DIR/bin: llama-server and llama-speculative-simple built from the same compile (one compile of
# the CUDA kernels serves both, where the bundle's route compiles them twice on the GPU machine).
# OUT_DIR.tar.xz: the same, compressed, which is what a GPU session carries (with gpu-bundle/wheels:
# ~50 MB of the 64 MiB it may carry with the repository; the sizes are printed); gpu-bench.sh
# --prebuilt unpacks it where OUT_DIR is missing.
#
# Needs nvcc (CUDA 13 here: the driver on the lent H200s is 580, CUDA 13.0) and cmake and ninja.
# What a CPU machine's toolkit lacks is put beside it in a merged toolkit (BUILD_DIR/toolkit):
# cuBLAS from PyPI's nvidia-cublas wheel of the same CUDA major, and a stub of the driver library
# (libcuda.so.1, only the calls ggml-cuda makes) to link the programs against (-rpath-link: their
# libggml-cuda needs both); the GPU machine has the real ones.
# CUDA_ARCH (default 90: Hopper), BUILD_DIR (default build/gpu-prebuilt) and GPU_TOOLKIT (a merged
# toolkit made earlier) may be set. The CPU backend is built for AVX2 machines, not this one.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-bundle/cuda}
py=${PYTHON:-.venv/bin/python}
build=${BUILD_DIR:-build/gpu-prebuilt}
arch=${CUDA_ARCH:-90}
nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || { echo "no nvcc on PATH: install the CUDA toolkit (13.x) first" >&2; exit 1; }
# the toolkit's own folder, which nvcc names (the nvcc on PATH may be a wrapper script elsewhere)
cuda_root=$("$nvcc" --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
cuda_root=$(cd "${cuda_root:?nvcc did not say where its toolkit is}" && pwd -P)
major=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
version=$("$py" -c "from importlib.metadata import version; print(version('llama-cpp-python'))")
mkdir -p "$build"
build=$(cd "$build" && pwd)
toolkit=${GPU_TOOLKIT:-$build/toolkit}

src=$build/src/llama_cpp_python-$version
if [ ! -d "$src/vendor/llama.cpp" ]; then
    mkdir -p "$build/src"
    "$py" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$build/src"
    tar -xzf "$build/src/llama_cpp_python-$version.tar.gz" -C "$build/src"
fi

if [ ! -x "$toolkit/bin/nvcc" ]; then
    echo "a merged CUDA $major toolkit in $toolkit" >&2
    rm -rf "$toolkit"
    cp -asL "$cuda_root" "$toolkit"  # real folders, links to the toolkit's files: nothing written into it
    if [ ! -e "$toolkit/include/cublas_v2.h" ]; then
        "$py" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_27_x86_64 \
            --platform manylinux2014_x86_64 -d "$build/wheels" "nvidia-cublas==$major.*"
        mkdir -p "$build/cublas"
        unzip -q -o "$build"/wheels/nvidia_cublas-*.whl -d "$build/cublas"
        cublas=$build/cublas/nvidia/cu$major
        for dir in "$toolkit/include" "$toolkit/targets/x86_64-linux/include"; do ln -sf "$cublas"/include/*.h "$dir/"; done
        for dir in "$toolkit/lib" "$toolkit/targets/x86_64-linux/lib"; do
            for lib in libcublas libcublasLt; do
                ln -sf "$cublas/lib/$lib.so.$major" "$dir/$lib.so.$major"
                ln -sf "$lib.so.$major" "$dir/$lib.so"
            done
        done
    fi
    if ! ls "$toolkit"/lib/stubs/libcuda.so >/dev/null 2>&1; then
        # the driver calls ggml-cuda makes by name (cuMemCreate, cuDeviceGet, ...; cudaX is the runtime's)
        calls=$(grep -rohE '\bcu[A-Z][A-Za-z0-9_]*\s*\(' "$src/vendor/llama.cpp/ggml/src/ggml-cuda" | tr -d ' (' | sort -u)
        # cuda.h may map a call to a versioned symbol (cuMemAlloc -> cuMemAlloc_v2): let the header say
        { echo '#include <cuda.h>'; for call in $calls; do echo "SYMBOL $call"; done; } > "$build/stub-names.c"
        gcc -E -I"$toolkit/include" "$build/stub-names.c" | awk '/^SYMBOL/ {print "int " $2 "(void) { return 999; }"}' \
            > "$build/stub.c"
        mkdir -p "$toolkit/lib/stubs" "$toolkit/targets/x86_64-linux/lib/stubs"
        gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$toolkit/lib/stubs/libcuda.so" "$build/stub.c"
        ln -sf libcuda.so "$toolkit/lib/stubs/libcuda.so.1"  # the name libggml-cuda asks for (-rpath-link)
        cp -a "$toolkit/lib/stubs/." "$toolkit/targets/x86_64-linux/lib/stubs/"
    fi
fi

echo "llama.cpp of llama-cpp-python $version for CUDA $major, sm_$arch: compiling in $build/cmake" >&2
cmake -S "$src/vendor/llama.cpp" -B "$build/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$toolkit/bin/nvcc" \
    -DCUDAToolkit_ROOT="$toolkit" -DGGML_CUDA_NCCL=OFF -DGGML_RPC=ON -DGGML_NATIVE=OFF -DGGML_AVX=ON \
    -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN' \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$toolkit/lib:$toolkit/lib/stubs" \
    >"$build/configure.log"
cmake --build "$build/cmake" --target llama-server llama-speculative-simple -j "$(nproc)" >"$build/build.log" \
    || { tail -20 "$build/build.log" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out/site/llama_cpp/lib" "$out/bin" "$out/site/llama_cpp_python-$version.dist-info"
cp -r "$src/llama_cpp/." "$out/site/llama_cpp/"
rm -rf "$out/site/llama_cpp/server"  # llama-cpp-python's own server: never used, needs more packages
cp -a "$build/cmake/bin/"*.so* "$out/site/llama_cpp/lib/"
strip --strip-unneeded "$out/site/llama_cpp/lib/"*.so.*.* 2>/dev/null || true
cp "$build/cmake/bin/llama-server" "$build/cmake/bin/llama-speculative-simple" "$out/bin/"
strip "$out/bin/"*
printf 'Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: %s\n' "$version" \
    >"$out/site/llama_cpp_python-$version.dist-info/METADATA"
# what travels: the CUDA kernels alone are ~60 MB, over a GPU session's 64 MiB with the repository
echo "compressing $out into $out.tar.xz" >&2
tar -C "$(dirname "$out")" -cf - "$(basename "$out")" | xz -9 -T0 >"$out.tar.xz"
du -sh "$out/site/llama_cpp/lib" "$out/bin" "$out" "$out.tar.xz" >&2
