"""An EAGLE-3 head's GGUF checked against the target it is loaded beside: its architecture, the target
layers it reads, its width and its vocabulary, each refused in one line."""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp

from ollama_spec.errors import ModelLoadError


def check_head(head: Any, architecture: str) -> None:
    """`head` (an Eagle3Head, its model loaded: it sets `layers`, `target_layers`, `n_target_embd`):
    the head's architecture, target layers, width and vocabulary against its target's (one line each)."""
    buffer = ctypes.create_string_buffer(64)
    llama_cpp.llama_model_meta_val_str(head._model.model, b"general.architecture", buffer, 64)
    arch = buffer.value.decode()
    if arch != architecture:
        raise ModelLoadError(f"{head.path} is a {arch or 'unknown'} model, not an EAGLE-3 head")
    n = head.calls.target_layer_ids_n(head._model.model)
    ids = head.calls.target_layer_ids(head._model.model)
    head.layers = tuple(int(ids[i]) for i in range(n))
    head.target_layers = llama_cpp.llama_model_n_layer(head.target.llama_model.model)
    head.n_target_embd = llama_cpp.llama_model_n_embd(head.target.llama_model.model)
    if n != 3 or max(head.layers) > head.target_layers:
        raise ModelLoadError(
            f"the head {head.path} reads target layers {list(head.layers)}: an EAGLE-3 head reads 3 "
            f"layers of its target, which has {head.target_layers}"
        )
    llama_cpp.llama_model_meta_val_str(head._model.model, b"eagle3.target_hidden_size", buffer, 64)
    width = int(buffer.value or 0)
    if width != head.n_target_embd:
        raise ModelLoadError(
            f"the head {head.path} was made for a target {width} wide; this target is {head.n_target_embd}"
        )
    vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(head._model.model))
    if vocab != head.target.n_vocab:
        raise ModelLoadError(
            f"the head {head.path} has a vocabulary of {vocab} tokens; its target's has {head.target.n_vocab}"
        )
