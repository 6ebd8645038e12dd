"""A tiny loadable Mamba GGUF: a recurrent model (no per-token KV cache) for tests of the memory
plan and of refusing recurrent models as speculation pairs."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, LlamaFileType

from ollama_spec.synthetic.models import add_vocabulary
from ollama_spec.synthetic.tokenizer import build_vocabulary


def write_mamba_gguf(
    path: Path,
    *,
    name: str = "tiny-mamba",
    n_embd: int = 64,
    n_layer: int = 2,
    d_state: int = 16,
    d_conv: int = 4,
    dt_rank: int = 4,
    vocab_size: int = 512,
    seed: int = 5,
) -> Path:
    """Write a Mamba (v1) model with random weights; llama.cpp needs d_inner = 2 x n_embd."""
    vocab = build_vocabulary(vocab_size, 200)
    d_inner = 2 * n_embd
    writer = GGUFWriter(path, arch="mamba")
    writer.add_name(name)
    writer.add_file_type(LlamaFileType.ALL_F32)
    writer.add_context_length(8192)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_ssm_conv_kernel(d_conv)
    writer.add_ssm_inner_size(d_inner)
    writer.add_ssm_state_size(d_state)
    writer.add_ssm_time_step_rank(dt_rank)
    writer.add_layer_norm_rms_eps(1e-5)
    add_vocabulary(writer, vocab)

    def normal(tensor: str, shape: tuple[int, ...], std: float) -> np.ndarray:
        rng = np.random.default_rng([seed, zlib.crc32(tensor.encode())])
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    # numpy shapes are [out, in]: the reverse of llama.cpp's {in, out}
    writer.add_tensor("token_embd.weight", normal("embd", (vocab.size, n_embd), 1.0))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    for i in range(n_layer):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(p + "ssm_in.weight", normal(p + "in", (2 * d_inner, n_embd), n_embd**-0.5))
        writer.add_tensor(p + "ssm_conv1d.weight", normal(p + "conv", (d_inner, d_conv), 0.5))
        writer.add_tensor(p + "ssm_conv1d.bias", np.zeros(d_inner, dtype=np.float32))
        writer.add_tensor(p + "ssm_x.weight", normal(p + "x", (dt_rank + 2 * d_state, d_inner), d_inner**-0.5))
        writer.add_tensor(p + "ssm_dt.weight", normal(p + "dt", (d_inner, dt_rank), dt_rank**-0.5))
        writer.add_tensor(p + "ssm_dt.bias", np.full(d_inner, -2.0, dtype=np.float32))
        a = -np.tile(np.arange(1, d_state + 1, dtype=np.float32), (d_inner, 1))  # llama.cpp stores A = -exp(A_log)
        writer.add_tensor(p + "ssm_a", a)
        writer.add_tensor(p + "ssm_d", np.ones(d_inner, dtype=np.float32))
        writer.add_tensor(p + "ssm_out.weight", normal(p + "out", (n_embd, d_inner), 0.1 * d_inner**-0.5))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
