from ollama_spec.planning.backends import read_backends
from ollama_spec.llama.model import gpu_offload_supported


def test_the_registry_lists_the_cpu_backend_and_its_memory():
    report = read_backends()
    assert "CPU" in report.backends
    cpu = next(d for d in report.devices if d.type == "cpu")
    assert cpu.total > 0 and 0 < cpu.free <= cpu.total
    # A build with GPU offload registers a GPU backend, and only then.
    assert bool(report.gpu_backends) == gpu_offload_supported()
