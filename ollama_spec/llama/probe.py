"""Does the installed llama.cpp load this GGUF? Its weights read (memory-mapped, on the CPU), no context made.

What a header cannot prove: every tensor llama.cpp's loader asks for is there with the shape it expects and
none is left over. A file converted here (an EAGLE-3 head from its checkpoint) is probed before it enters the
store, and tests probe what the synthetic writers make.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from ollama_spec.errors import ModelLoadError
from ollama_spec.llama.log import last_error, log_mark


@dataclass(frozen=True)
class Probe:
    """What llama.cpp made of the file."""

    architecture: str
    n_layer: int
    n_embd: int
    n_vocab: int


def probe_model(path: str | Path) -> Probe:
    """Load `path`'s weights with llama.cpp and free them; ModelLoadError with llama.cpp's reason if it refuses."""
    mark = log_mark()
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ModelLoadError(f"llama.cpp cannot load {path}: {last_error(mark) or 'no reason given'}")
    try:
        buffer = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_meta_val_str(model, b"general.architecture", buffer, len(buffer))
        return Probe(
            architecture=buffer.value.decode("utf-8", "replace"),
            n_layer=llama_cpp.llama_model_n_layer(model),
            n_embd=llama_cpp.llama_model_n_embd(model),
            n_vocab=llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)),
        )
    finally:
        llama_cpp.llama_model_free(model)
