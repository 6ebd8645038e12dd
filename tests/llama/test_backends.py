"""What the installed llama.cpp is asked about this machine: its backend registry, whether it can
offload to a GPU here, its CPU features, the names it knows."""

from ollama_spec.llama import backends
from ollama_spec.llama.backends import llama_cpp_knows, read_backends
from ollama_spec.llama.load_params import gpu_offload_supported
from ollama_spec.planning.devices import nvidia_gpu


def test_the_registry_lists_the_cpu_backend_and_its_memory():
    report = read_backends()
    assert "CPU" in report.backends
    cpu = next(d for d in report.devices if d.type == "cpu")
    assert cpu.total > 0 and 0 < cpu.free <= cpu.total
    # A build with GPU offload registers a GPU backend, and only then.
    assert bool(report.gpu_backends) == gpu_offload_supported()


def test_the_devices_are_found_for_what_this_build_can_offload(monkeypatch):
    seen = []
    monkeypatch.setattr(backends, "find_devices", lambda offload: seen.append(offload) or ([], []))
    backends.discover_devices()

    def broken():
        raise OSError("libggml.so: cannot open shared object file")

    monkeypatch.setattr(backends, "has_local_gpu", broken)
    backends.discover_devices()  # a llama-cpp-python that cannot load: plan for the CPU, loading says more
    assert seen == [gpu_offload_supported(), False]


def test_the_unused_gpu_warning_asks_llama_cpp_only_when_there_is_a_gpu(monkeypatch):
    asked = []
    monkeypatch.setattr(backends, "_gpu_offload_supported", lambda: asked.append(1) or False)
    monkeypatch.setattr(backends, "present_gpus", list)
    assert backends.unused_gpu_warning() is None and asked == []
    monkeypatch.setattr(backends, "present_gpus", lambda: [nvidia_gpu(24)])
    assert "built without GPU support, so the NVIDIA GPU" in backends.unused_gpu_warning() and asked == [1]


def test_llama_cpp_knows_the_names_compiled_into_it():
    assert llama_cpp_knows("llama") and llama_cpp_knows("gpt2")
    assert not llama_cpp_knows("notanarch") and not llama_cpp_knows("")
