"""What the installed llama.cpp was built with and sees on this machine: ggml's backend registry,
read through ctypes, its CPU features, and from them the devices a plan is made for.

llama-cpp-python 0.3.36 binds `llama_supports_gpu_offload` but not ggml's registry
(`ggml_backend_reg_*`, `ggml_backend_dev_*`); libggml exports them, and llama_cpp has already
loaded that library, so opening it again returns the same handle and registry. llama_cpp is
imported only when asked, so a plan for another machine never loads it.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import sys
from pathlib import Path

from ollama_spec.planning.backends import HOST_BACKENDS, BackendDevice, BackendReport
from ollama_spec.planning.devices import Device, find_devices, present_gpus, unused_gpu_note
from ollama_spec.planning.repack import features_from_system_info

DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}  # enum ggml_backend_dev_type


def discover_devices() -> tuple[list[Device], list[str]]:
    """This machine's devices llama-cpp-python can use (GPUs first, RAM last) and notes on why."""
    return find_devices(_gpu_offload_supported())


def unused_gpu_warning() -> str | None:
    """unused_gpu_note for this machine, or None when there is no GPU or the build can use it."""
    gpus = present_gpus()
    return unused_gpu_note(gpus) if gpus and not _gpu_offload_supported() else None


def _gpu_offload_supported() -> bool:
    try:
        return has_local_gpu()
    except (ImportError, OSError, RuntimeError):  # a broken llama-cpp-python: plan for the CPU, loading will say more
        return False


@functools.lru_cache(maxsize=64)
def llama_cpp_knows(name: str) -> bool:
    """Does this llama.cpp know `name` as an architecture, tokenizer or pre-tokenizer?

    llama.cpp has no call that lists them; their names are C strings compiled into libllama
    (its LLM_ARCH_NAMES table, the literals its vocabulary loader compares with), so we look
    for the name there. A name that happens to occur for another reason only defers the
    refusal to llama.cpp's own load error.
    """
    try:
        library = _libllama().read_bytes()
    except (AttributeError, OSError, StopIteration):
        return True  # cannot tell: let llama.cpp decide at load
    return bool(name) and "\0" not in name and name.encode("utf-8", "replace") + b"\0" in library


def _libllama() -> Path:
    """The libllama that llama-cpp-python loads: the loaded one, else found in its package without
    importing it (an import costs `show` and `pair` a quarter of a second, and jinja2)."""
    loaded = sys.modules.get("llama_cpp.llama_cpp")
    if loaded is not None:
        return Path(loaded._lib._name)
    package = importlib.util.find_spec("llama_cpp")
    folder = Path(next(iter(package.submodule_search_locations))) / "lib"
    return next(p for name in ("libllama.so", "libllama.dylib", "llama.dll") if (p := folder / name).exists())


def cpu_features() -> frozenset[str]:
    """The CPU features llama.cpp was built with and found ("AVX2", "REPACK", "AMX_INT8", "SVE_CNT=32", ...)."""
    return features_from_system_info(_system_info())


@functools.lru_cache(maxsize=1)
def _system_info() -> str:
    try:
        import llama_cpp  # only when this machine is asked about
    except (ImportError, OSError, RuntimeError):  # a broken install: loading will say more
        return ""
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")


def read_backends() -> BackendReport:
    """The backends compiled into llama-cpp-python's llama.cpp and the devices they see."""
    lib = ggml()
    # Each RPC server is registered as a backend of its own, "RPC[host:port]"; they are listed once, as RPC.
    names = dict.fromkeys(_backend_name(lib, lib.ggml_backend_reg_get(i)) for i in range(lib.ggml_backend_reg_count()))
    # GPUs first, then the CPU, then the rest (RPC, BLAS), whatever order they registered in
    backends = tuple(sorted(names, key=lambda name: (name in HOST_BACKENDS, name != "CPU")))
    devices = tuple(describe_device(lib, lib.ggml_backend_dev_get(i)) for i in range(lib.ggml_backend_dev_count()))
    return BackendReport(backends, devices)


def has_local_gpu() -> bool:
    """Whether llama.cpp sees a GPU of this machine (llama_supports_gpu_offload says yes for any build
    with the RPC backend, GPU or not)."""
    return bool(local_gpus())


def local_gpus() -> list[int]:
    """Handles of this machine's GPUs as llama.cpp picks them by default: the discrete ones, else the
    integrated ones; never an RPC server's. Reads no memory (an RPC device's would cross the network)."""
    lib = ggml()
    kinds = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if _backend_name(lib, lib.ggml_backend_dev_backend_reg(dev)) != "RPC":
            kinds.append((dev, DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev))))
    return [dev for dev, kind in kinds if kind == "gpu"] or [dev for dev, kind in kinds if kind == "igpu"]


def describe_device(lib: ctypes.CDLL, dev: int) -> BackendDevice:
    """One device handle's name, kind and memory (for an RPC device, asked of its server)."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return BackendDevice(
        lib.ggml_backend_dev_name(dev).decode(),
        (lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
        DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev), "other"),
        free.value,
        total.value,
        _backend_name(lib, lib.ggml_backend_dev_backend_reg(dev)),
    )


def _backend_name(lib: ctypes.CDLL, reg: int) -> str:
    name = lib.ggml_backend_reg_name(reg).decode()
    return "RPC" if name.startswith("RPC[") else name


@functools.cache
def ggml() -> ctypes.CDLL:
    """libggml with the registry calls typed (the same library and registry llama_cpp uses)."""
    import llama_cpp  # loads libllama and with it libggml

    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    name = {"darwin": "libggml.dylib", "win32": "ggml.dll"}.get(sys.platform, "libggml.so")
    lib = ctypes.CDLL(str(lib_dir / name))
    handle, text, size_p = ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)
    signatures = {
        "ggml_backend_reg_count": ([], ctypes.c_size_t),
        "ggml_backend_reg_get": ([ctypes.c_size_t], handle),
        "ggml_backend_reg_name": ([handle], text),
        "ggml_backend_dev_count": ([], ctypes.c_size_t),
        "ggml_backend_dev_get": ([ctypes.c_size_t], handle),
        "ggml_backend_dev_name": ([handle], text),
        "ggml_backend_dev_description": ([handle], text),
        "ggml_backend_dev_type": ([handle], ctypes.c_int),
        "ggml_backend_dev_memory": ([handle, size_p, size_p], None),
        "ggml_backend_dev_backend_reg": ([handle], handle),
        "ggml_backend_dev_by_name": ([text], handle),
        "ggml_backend_reg_by_name": ([text], handle),
        "ggml_backend_reg_get_proc_address": ([handle, text], handle),
        "ggml_backend_register": ([handle], None),
        "ggml_backend_reg_dev_count": ([handle], ctypes.c_size_t),
        "ggml_backend_reg_dev_get": ([handle, ctypes.c_size_t], handle),
    }
    for fn, (args, result) in signatures.items():
        getattr(lib, fn).argtypes = args
        getattr(lib, fn).restype = result
    return lib
