"""ollama-spec: speculative decoding for the models Ollama already pulled."""

__version__ = "0.1.0"
