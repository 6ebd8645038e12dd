"""Where models can go: NVIDIA GPUs (nvidia-ml-py), Apple unified memory, CPU RAM (psutil).

`find_devices` never raises: a missing driver, library or GPU just means fewer devices, and
the notes say why in words a user can act on. Whether the llama.cpp build can use a GPU is the
caller's to say (llama/backends.discover_devices asks the installed one).
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass

import psutil

GIB = 1 << 30
MIB = 1 << 20
# Memory the CUDA context and cuBLAS workspace take that llama.cpp never logs; Ollama keeps back
# the same amounts per device (457 MiB on NVIDIA, 512 MiB on Metal).
CUDA_RESERVE = 457 * MIB
METAL_RESERVE = 512 * MIB
CUDA_BUILD_HINT = 'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir llama-cpp-python'
METAL_BUILD_HINT = 'CMAKE_ARGS="-DGGML_METAL=on" pip install --force-reinstall --no-cache-dir llama-cpp-python'
# "rpc": a device of an RPC server on another machine (whatever it is there, llama.cpp offloads
# layers to it as to a GPU)
GPU_KINDS = ("cuda", "metal", "rpc")
CPU_PLAN_NOTE = "planning for CPU RAM"  # ends find_devices' note when no GPU can be used


@dataclass(frozen=True)
class Device:
    """One memory pool: `kind` is "cuda", "metal" or "cpu"; sizes in bytes."""

    name: str
    kind: str
    total: int
    free: int
    reserve: int = 0  # kept back for the driver/runtime, beyond what llama.cpp allocates

    @property
    def is_gpu(self) -> bool:
        return self.kind in GPU_KINDS

    @property
    def is_remote(self) -> bool:
        return self.kind == "rpc"

    @property
    def usable(self) -> int:
        return max(self.free - self.reserve, 0)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "total": self.total,
            "free": self.free,
            "reserve": self.reserve,
            "usable": self.usable,
        }


def nvidia_gpu(total_gib: float, name: str | None = None, free_gib: float | None = None) -> Device:
    """An NVIDIA GPU of this size, for plans made for a machine other than this one (and tests)."""
    total = int(total_gib * GIB)
    free = total if free_gib is None else int(free_gib * GIB)
    return Device(name or f"{total_gib:g} GiB GPU", "cuda", total, free, CUDA_RESERVE)


def rpc_device(name: str, endpoint: str, total: int, free: int) -> Device:
    """A device of the RPC server at `endpoint`, with the memory it reports."""
    return Device(f"{name} at {endpoint}", "rpc", total, free)


def system_ram(total_gib: float, free_gib: float | None = None) -> Device:
    """CPU RAM of this size (see nvidia_gpu)."""
    total = int(total_gib * GIB)
    return Device("CPU RAM", "cpu", total, total if free_gib is None else int(free_gib * GIB))


def find_devices(offload: bool) -> tuple[list[Device], list[str]]:
    """This machine's devices (GPUs first, RAM last) for a llama.cpp build that can (`offload`) or
    cannot put layers on its GPUs, and notes on why a GPU is left out."""
    notes: list[str] = []
    gpus = _nvidia_gpus(notes) + _apple_gpu()
    if gpus and not offload:
        notes.append(unused_gpu_note(gpus))
        gpus = []
    elif not gpus:
        why = (
            "llama-cpp-python has GPU offload but no NVIDIA or Apple GPU was found (other GPUs' memory is not read)"
            if offload
            else "no GPU found"
        )
        notes.append(f"{why}: {CPU_PLAN_NOTE}")
    memory = psutil.virtual_memory()
    ram = Device("CPU RAM", "cpu", int(memory.total), int(memory.available))
    return gpus + [ram], notes


def present_gpus() -> list[Device]:
    """The NVIDIA and Apple GPUs of this machine, whether or not llama-cpp-python can use them."""
    return _nvidia_gpus([]) + _apple_gpu()


def unused_gpu_note(gpus: list[Device]) -> str:
    """What to say when this machine has `gpus` but llama-cpp-python was built without GPU support."""
    kinds = "NVIDIA GPU" if gpus[0].kind == "cuda" else "Apple GPU"
    hint = CUDA_BUILD_HINT if gpus[0].kind == "cuda" else METAL_BUILD_HINT
    return (
        f"llama-cpp-python was built without GPU support, so the {kinds} found here is not used "
        f"and the plan is for CPU RAM; rebuild it with: {hint}"
    )


def _nvidia_gpus(notes: list[str]) -> list[Device]:
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []  # no driver or no GPU: the usual case on laptops and CI
    try:
        devices = []
        for index in _visible_indices(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            devices.append(Device(f"GPU {index}: {name}", "cuda", int(info.total), int(info.free), CUDA_RESERVE))
        return devices
    except pynvml.NVMLError as exc:
        notes.append(f"could not read NVIDIA GPU memory ({exc}); planning without the GPU")
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _visible_indices(count: int) -> list[int]:
    # llama.cpp sees only CUDA_VISIBLE_DEVICES; NVML sees every GPU. UUID lists are not mapped.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    if not all(p.lstrip("-").isdigit() for p in parts):
        return list(range(count))
    indices = []
    for p in parts:
        if int(p) < 0 or int(p) >= count:
            break  # CUDA stops at the first invalid index
        indices.append(int(p))
    return indices


def _apple_gpu() -> list[Device]:
    if sys.platform != "darwin" or platform.machine() != "arm64":
        return []
    memory = psutil.virtual_memory()
    # Metal lets one process use its recommendedMaxWorkingSetSize, about 2/3 of RAM on small
    # machines and 3/4 on large ones; psutil cannot read it, so this is an estimate.
    share = 0.75 if memory.total > 36 * GIB else 2 / 3
    limit = int(memory.total * share)
    return [Device("Apple GPU (unified memory)", "metal", limit, min(limit, int(memory.available)), METAL_RESERVE)]
