"""Hand-made GGUF headers for tests: byte by byte, so they can be as wrong as a test needs."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
from gguf import GGUFValueType, GGUFWriter

from ollama_spec.synthetic.models import Architecture
from tests.builders.shapes import write_shape_only_gguf

SMALL = Architecture(n_embd=64, n_layer=2, n_head=4, n_kv_head=2, n_ff=128, context_length=256)
TINY = Architecture(n_embd=32, n_layer=1, n_head=2, n_kv_head=1, n_ff=64, context_length=256)


def string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return string(key) + struct.pack("<I", vtype) + payload


def u32(key: str, value: int) -> bytes:
    return kv(key, GGUFValueType.UINT32, struct.pack("<I", value))


def text(key: str, value: str) -> bytes:
    return kv(key, GGUFValueType.STRING, string(value))


def array(key: str, item_type: int, count: int, items: bytes = b"") -> bytes:
    return kv(key, GGUFValueType.ARRAY, struct.pack("<IQ", item_type, count) + items)


def header(*kvs: bytes, tensors: bytes = b"", n_tensors: int = 0, version: int = 3, n_kv: int | None = None) -> bytes:
    count = len(kvs) if n_kv is None else n_kv
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, count) + b"".join(kvs) + tensors


def tensor_info(name: str, shape: tuple[int, ...], type_id: int = 0, offset: int = 0) -> bytes:
    return (
        string(name)
        + struct.pack("<I", len(shape))
        + struct.pack(f"<{len(shape)}Q", *shape)
        + struct.pack("<IQ", type_id, offset)
    )


def small_model_header(path: Path, arch: Architecture = SMALL, vocab_size: int = 300) -> bytes:
    """A real, small, header-only llama GGUF (the synthetic family's writer); returns its header bytes."""
    size = write_shape_only_gguf(path, name="small", arch=arch, vocab_size=vocab_size, n_merges=20)
    data = path.read_bytes()
    assert len(data) == size
    return data.rstrip(b"\0")


def write_model(path: Path, metadata: dict, arch: str = "llama") -> Path:
    """A small GGUF with one tensor and the given keys (values: int, str, bool, list of int or str)."""
    writer = GGUFWriter(path, arch=arch)
    for key, value in metadata.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, value)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_deci_model(path: Path, kv_heads=(4, 0, 1, 2), ffs=(128, 256, 0, 64), n_head=4, head_dim=16) -> Path:
    """A runnable DeciLM-architecture GGUF whose layers differ: per-layer KV heads (0: no attention)
    and feed-forward sizes stored as arrays, as Nemotron-51B's are."""
    from gguf import LlamaFileType

    from ollama_spec.synthetic.tokenizer import build_vocabulary

    d, vocab = n_head * head_dim, build_vocabulary(300, 20)
    writer = GGUFWriter(path, arch="deci")
    writer.add_file_type(LlamaFileType.ALL_F32)
    writer.add_context_length(512)
    writer.add_embedding_length(d)
    writer.add_block_count(len(kv_heads))
    writer.add_feed_forward_length(list(ffs))
    writer.add_head_count([n_head if h else 0 for h in kv_heads])
    writer.add_head_count_kv(list(kv_heads))
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_types(list(vocab.token_types))
    writer.add_token_merges(list(vocab.merges))
    rng = np.random.default_rng(0)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    ones = np.ones(d, np.float32)
    writer.add_tensor("token_embd.weight", weight(vocab.size, d))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", weight(vocab.size, d))
    for i, (n_kv, ff) in enumerate(zip(kv_heads, ffs)):
        p = f"blk.{i}."
        if n_kv:
            writer.add_tensor(p + "attn_norm.weight", ones)
            writer.add_tensor(p + "attn_q.weight", weight(n_head * head_dim, d))
            writer.add_tensor(p + "attn_k.weight", weight(n_kv * head_dim, d))
            writer.add_tensor(p + "attn_v.weight", weight(n_kv * head_dim, d))
            writer.add_tensor(p + "attn_output.weight", weight(d, n_head * head_dim))
        if ff:
            writer.add_tensor(p + "ffn_norm.weight", ones)
            writer.add_tensor(p + "ffn_gate.weight", weight(ff, d))
            writer.add_tensor(p + "ffn_up.weight", weight(ff, d))
            writer.add_tensor(p + "ffn_down.weight", weight(d, ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
