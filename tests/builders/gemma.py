"""A Gemma-3-architecture GGUF pair: sliding-window attention beside global layers.

Most popular Ollama models are not Llama: Gemma 2/3 and gpt-oss attend over a window of recent
tokens in some layers, and llama.cpp gives them a second, window-sized cache. These files let
the tests check what that changes: memory plans (a second attention mask) and lossless
speculation when the cache is cut back past the window. Tensor names and keys are those of
llama.cpp's src/models/gemma3.cpp: q/k norms, norms after attention and feed-forward, tied
embeddings. The draft is the target's first layers; the target's others add small updates.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
from gguf import LlamaFileType

from ollama_spec.synthetic.models import LLAMA3_CHAT_TEMPLATE, Architecture, add_vocabulary, new_llama_writer
from ollama_spec.synthetic.tokenizer import EOS, EOT, Vocabulary
from tests.builders.writers import write_first_layers

ARCH = Architecture(n_embd=64, n_layer=4, n_head=4, n_kv_head=2, n_ff=128, rope_theta=10000.0, rms_eps=1e-6)
N_EMBD, N_HEAD, N_KV_HEAD, HEAD_DIM, N_FF = ARCH.n_embd, ARCH.n_head, ARCH.n_kv_head, ARCH.head_dim, ARCH.n_ff
# Norm gain after each block: the block's output is renormalised, so this sets its weight
# against the token's own embedding (1.0 leaves the embedding dominant: one token repeated).
POST_NORM_GAIN = 30.0


def _random(seed: int, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)


def gemma3_tensors(
    vocab: Vocabulary, n_layer: int, draft_layers: int, seed: int = 1, residual_scale: float = 0.1
) -> dict[str, np.ndarray]:
    """The target's tensors; a draft takes those of its first `draft_layers` layers."""
    ones = np.ones(N_EMBD, np.float32)
    embeddings = _random(seed, "embd", (vocab.size, N_EMBD), 0.5)
    # raw bytes and the end tokens rarely win: readable text, runs that do not end at once
    quiet = [i for i in range(256) if not 32 <= i < 127] + [vocab.id_of(EOS), vocab.id_of(EOT)]
    embeddings[quiet] *= np.float32(0.3)
    tensors = {"token_embd.weight": embeddings, "output_norm.weight": ones}
    for i in range(n_layer):
        scale = 1.0 if i < draft_layers else residual_scale
        p = f"blk.{i}."
        tensors |= {
            p + "attn_norm.weight": ones,
            p + "attn_q.weight": _random(seed, p + "q", (N_HEAD * HEAD_DIM, N_EMBD), N_EMBD**-0.5),
            p + "attn_k.weight": _random(seed, p + "k", (N_KV_HEAD * HEAD_DIM, N_EMBD), N_EMBD**-0.5),
            p + "attn_v.weight": _random(seed, p + "v", (N_KV_HEAD * HEAD_DIM, N_EMBD), N_EMBD**-0.5),
            p + "attn_q_norm.weight": np.ones(HEAD_DIM, np.float32),
            p + "attn_k_norm.weight": np.ones(HEAD_DIM, np.float32),
            p + "attn_output.weight": _random(seed, p + "o", (N_EMBD, N_HEAD * HEAD_DIM), scale * N_EMBD**-0.5),
            p + "post_attention_norm.weight": ones * np.float32(POST_NORM_GAIN * scale),
            p + "ffn_norm.weight": ones,
            p + "ffn_gate.weight": _random(seed, p + "gate", (N_FF, N_EMBD), N_EMBD**-0.5),
            p + "ffn_up.weight": _random(seed, p + "up", (N_FF, N_EMBD), N_EMBD**-0.5),
            p + "ffn_down.weight": _random(seed, p + "down", (N_EMBD, N_FF), scale * N_FF**-0.5),
            p + "post_ffw_norm.weight": ones * np.float32(POST_NORM_GAIN * scale),
        }
    return tensors


def write_gemma3_gguf(
    path: Path,
    *,
    name: str,
    vocab: Vocabulary,
    tensors: dict[str, np.ndarray],
    n_layer: int,
    sliding_window: int = 16,
    window_pattern: int | list[bool] = 2,
) -> Path:
    """Write one Gemma-3 file; every `window_pattern`-th layer is global, the others see the last
    `sliding_window` tokens (Gemma 3 itself: 5 window layers of 1,024 tokens per global one). A
    list flags each layer that sees only the window, as Ollama's converter writes the pattern."""
    writer = new_llama_writer(path, name, ARCH, n_layer, LlamaFileType.ALL_F32, architecture="gemma3")
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_sliding_window(sliding_window)
    if isinstance(window_pattern, list):
        writer.add_array("gemma3.attention.sliding_window_pattern", window_pattern)
    else:
        writer.add_uint32("gemma3.attention.sliding_window_pattern", window_pattern)
    add_vocabulary(writer, vocab)
    writer.add_chat_template(LLAMA3_CHAT_TEMPLATE)
    write_first_layers(writer, tensors, n_layer)
    return path
