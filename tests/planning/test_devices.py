"""Finding this machine's devices: NVML's GPUs (CUDA_VISIBLE_DEVICES as llama.cpp reads it), RAM,
and what is said when the llama.cpp build cannot use a GPU that is there."""

from __future__ import annotations

import sys
import types

import pytest

from ollama_spec.planning import devices
from ollama_spec.planning.devices import CUDA_BUILD_HINT, GIB, find_devices


def _fake_pynvml(fail_init: bool = False) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init():
        if fail_init:
            raise NVMLError("Driver Not Loaded")

    nvml.NVMLError = NVMLError
    nvml.nvmlInit, nvml.nvmlShutdown = init, lambda: None
    nvml.nvmlDeviceGetCount = lambda: 2
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: b"NVIDIA GeForce RTX 4090"
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=24 * GIB, free=(20 + h) * GIB)
    return nvml


def test_nvidia_gpus_are_found_through_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    found, notes = find_devices(offload=True)
    assert [(d.name, d.kind, d.free) for d in found[:-1]] == [("GPU 1: NVIDIA GeForce RTX 4090", "cuda", 21 * GIB)]
    assert found[-1].kind == "cpu" and notes == []


def test_a_cpu_only_llama_cpp_build_is_said_plainly(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    found, notes = find_devices(offload=False)
    assert [d.kind for d in found] == ["cpu"]
    assert len(notes) == 1
    assert notes[0] == (
        "llama-cpp-python was built without GPU support, so the NVIDIA GPU found here is not used "
        f"and the plan is for CPU RAM; rebuild it with: {CUDA_BUILD_HINT}"
    )


@pytest.mark.parametrize("nvml", [None, "fail"])
def test_no_nvml_or_no_driver_means_cpu_ram(monkeypatch, nvml):
    # None in sys.modules makes `import pynvml` raise ImportError.
    monkeypatch.setitem(sys.modules, "pynvml", None if nvml is None else _fake_pynvml(fail_init=True))
    monkeypatch.setattr(devices, "_apple_gpu", list)
    found, notes = find_devices(offload=False)
    assert [d.kind for d in found] == ["cpu"] and found[0].total > 0
    assert notes == ["no GPU found: planning for CPU RAM"]
