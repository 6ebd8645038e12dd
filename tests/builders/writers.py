"""GGUF writers only tests use: a model's first layers from a tensor dict, and LoRA adapters."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from ollama_spec.synthetic.models import Architecture


def write_first_layers(writer: GGUFWriter, tensors: dict[str, np.ndarray], n_layer: int) -> None:
    """Add the tensors outside the blocks and those of the first `n_layer` blocks, write, close."""
    for key, array in tensors.items():
        if not key.startswith("blk.") or int(key.split(".")[1]) < n_layer:
            writer.add_tensor(key, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_lora_gguf(
    path: Path,
    *,
    arch: Architecture,
    n_layer: int,
    rank: int = 4,
    seed: int = 7,
    scale: float = 1.0,
    architecture: str = "llama",
) -> None:
    """A GGUF LoRA adapter for the first `n_layer` blocks of a model of `arch`, laid out as llama.cpp's
    convert_lora_to_gguf.py writes one (A: rank x n_in, B: n_out x rank), on every block's attention
    query and feed-forward down matrices. `scale` sizes its change to the weights (B·A)."""
    writer = GGUFWriter(path, arch=architecture)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(rank))  # alpha / rank = 1: the update is B·A as written
    rng = np.random.default_rng(seed)
    d = arch.n_embd
    for layer in range(n_layer):
        for name, (n_out, n_in) in (("attn_q", (d, d)), ("ffn_down", (d, arch.n_ff))):
            a = rng.normal(0, 1 / np.sqrt(n_in), (rank, n_in)).astype(np.float32)
            b = rng.normal(0, scale / np.sqrt(rank), (n_out, rank)).astype(np.float32)
            writer.add_tensor(f"blk.{layer}.{name}.weight.lora_a", a)
            writer.add_tensor(f"blk.{layer}.{name}.weight.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
