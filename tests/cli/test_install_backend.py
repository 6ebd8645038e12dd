"""scripts/install-backend.sh's choice of backend and flags, on made-up machines (DRY_RUN: nothing installed)."""

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install-backend.sh"


def plan(tmp_path: Path, *args: str, gpu: bool = False, cuda_home: Path | None = None, **env: str):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if gpu:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    environ = {"PATH": f"{bin_dir}:/usr/bin:/bin", "DRY_RUN": "1", "CUDA_DEFAULT_ROOT": "", "HOME": str(tmp_path)}
    if cuda_home:
        environ["CUDA_HOME"] = str(cuda_home)
    result = subprocess.run(
        ["bash", str(SCRIPT), sys.executable, *args], capture_output=True, text=True, env=environ | env, timeout=60
    )
    return result


def toolkit(root: Path, *, cublas: bool, libcuda: bool) -> Path:
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    (root / "include").mkdir()
    (root / "lib64").mkdir()
    if cublas:
        (root / "include" / "cublas_v2.h").write_text("")
    if libcuda:
        (root / "lib64" / "libcuda.so").write_text("")
    return root


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia/version"), reason="this machine has an NVIDIA driver")
def test_no_gpu_means_the_cpu_build(tmp_path):
    result = plan(tmp_path)
    assert result.returncode == 0 and "wanted: cpu; CMAKE_ARGS: -DGGML_RPC=ON\n" in result.stdout


def test_an_nvidia_gpu_without_the_toolkit_says_what_to_install_and_builds_for_the_cpu(tmp_path):
    result = plan(tmp_path, gpu=True)
    assert result.returncode == 0 and "wanted: cpu" in result.stdout
    assert "an NVIDIA GPU is here but not the CUDA toolkit (nvcc)" in result.stderr
    assert "https://developer.nvidia.com/cuda-downloads" in result.stderr


def test_a_full_toolkit_gets_the_plain_cuda_flags(tmp_path):
    home = toolkit(tmp_path / "cuda", cublas=True, libcuda=True)
    result = plan(tmp_path, gpu=True, cuda_home=home)
    assert result.stdout.endswith(
        f"wanted: cuda; CMAKE_ARGS: -DGGML_RPC=ON -DGGML_CUDA=on -DCMAKE_CUDA_COMPILER={home}/bin/nvcc\n"
    )


def test_every_backend_builds_with_rpc_and_the_users_flags(tmp_path):
    result = plan(tmp_path, "cpu", CMAKE_ARGS="-DGGML_NATIVE=OFF")
    assert result.stdout.endswith("wanted: cpu; CMAKE_ARGS: -DGGML_RPC=ON -DGGML_NATIVE=OFF\n")


def test_a_toolkit_without_cublas_or_libcuda_takes_cublas_from_pypi_and_skips_vmm(tmp_path):
    home = toolkit(tmp_path / "cuda", cublas=False, libcuda=False)
    result = plan(tmp_path, gpu=True, cuda_home=home, CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=90")
    assert "no cuBLAS: taking it from PyPI (nvidia-cublas for CUDA 13)" in result.stderr
    flags = result.stdout.split("CMAKE_ARGS: ")[1].split()
    assert "-DCUDA_cublas_LIBRARY=<nvidia-cublas>/lib/libcublas.so" in flags
    assert flags[-1] == "-DCMAKE_CUDA_ARCHITECTURES=90"  # the user's CMAKE_ARGS last
    if not glob.glob("/usr/lib/x86_64-linux-gnu/libcuda.so*"):  # a driver's libcuda serves as well as the stub
        assert flags[-2] == "-DGGML_CUDA_NO_VMM=ON"


def test_backend_override_and_bad_names(tmp_path):
    assert (
        "wanted: cpu"
        in plan(tmp_path, "cpu", gpu=True, cuda_home=toolkit(tmp_path / "c", cublas=True, libcuda=True)).stdout
    )
    bad = plan(tmp_path, "tpu")
    assert bad.returncode == 2 and "unknown BACKEND 'tpu' (cpu, cuda, metal, rocm or auto)" in bad.stderr
    missing = plan(tmp_path, "cuda")
    assert missing.returncode == 1 and "no nvcc found" in missing.stderr


def test_every_build_leaves_out_the_libraries_ollama_spec_never_loads_and_a_gpu_keeps_its_flags(tmp_path):
    home = toolkit(tmp_path / "cuda", cublas=True, libcuda=True)
    result = plan(tmp_path, gpu=True, cuda_home=home)
    slim_cmake = SCRIPT.parent / "llama-slim.cmake"
    assert f"left out: -DLLAVA_BUILD=OFF -DCMAKE_PROJECT_INCLUDE={slim_cmake}\n" in result.stdout
    assert "set(LLAMA_BUILD_COMMON OFF)" in slim_cmake.read_text()
    assert result.stdout.endswith(f"CMAKE_ARGS: -DGGML_RPC=ON -DGGML_CUDA=on -DCMAKE_CUDA_COMPILER={home}/bin/nvcc\n")


def test_two_clones_share_one_cached_wheel_and_other_flags_get_their_own(tmp_path):
    repo = SCRIPT.parents[1]

    def cache_of(clone: Path, **env: str) -> str:
        if not clone.exists():
            (clone / "scripts").mkdir(parents=True)
            for name in ("install-backend.sh", "llama-slim.cmake", "build_progress.py"):
                shutil.copy(repo / "scripts" / name, clone / "scripts" / name)
            shutil.copy(repo / "pyproject.toml", clone / "pyproject.toml")
        result = subprocess.run(
            ["bash", str(clone / "scripts" / "install-backend.sh"), sys.executable, "cpu"],
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "DRY_RUN": "1", "HOME": str(tmp_path)} | env,
            timeout=60,
        )
        return result.stdout.split("wheel cache: ")[1].split("\n")[0]

    first = cache_of(tmp_path / "a")
    assert first.startswith(f"{tmp_path}/.cache/ollama-spec/wheels/cpu-")
    assert cache_of(tmp_path / "b") == first
    assert cache_of(tmp_path / "a", CMAKE_ARGS="-DGGML_NATIVE=OFF") != first
