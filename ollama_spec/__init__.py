"""ollama-spec: speculative decoding for the models Ollama already pulled.

The names most scripts need are importable from here (`from ollama_spec import Engine`); each is
imported on first use, so `import ollama_spec` stays light (no numpy, no llama.cpp).
"""

from importlib import import_module

__version__ = "0.1.0"

# name -> the module that defines it
PUBLIC = {
    "Engine": "ollama_spec.engine.engine",
    "EngineSettings": "ollama_spec.engine.engine",
    "Request": "ollama_spec.engine.requests",
    "Result": "ollama_spec.engine.requests",
    "SamplingSettings": "ollama_spec.decoding.sampling",
    "SpeculationSettings": "ollama_spec.decoding.loop",
    "resolve_model": "ollama_spec.models.resolve",
    "plan_memory": "ollama_spec.planning.memory",
    "nvidia_gpu": "ollama_spec.planning.devices",
    "system_ram": "ollama_spec.planning.devices",
    "OllamaDraftModel": "ollama_spec.integrations.llama_cpp_python",
    "ollama_model_path": "ollama_spec.integrations.llama_cpp_python",
    "ollama_adapter_paths": "ollama_spec.integrations.llama_cpp_python",
}
__all__ = ["__version__", *PUBLIC.keys()]  # noqa: PLE0604 - the names are PUBLIC's keys


def __getattr__(name: str):
    if name in PUBLIC:
        return getattr(import_module(PUBLIC[name]), name)
    raise AttributeError(f"module 'ollama_spec' has no attribute {name!r}")
