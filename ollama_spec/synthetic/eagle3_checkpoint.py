"""Synthetic EAGLE-3 head checkpoints, laid out as people publish them, for a synthetic target.

A folder with config.json and the weights in either published layout: EAGLE's own (`LlamaForCausalLMEagle3`,
the decoder layer under `midlayer.*`, hyper-parameters at the top) or vLLM speculators' (`Eagle3Speculator`,
`layers.0.*`, hyper-parameters nested in `transformer_layer_config`). Weights are in Hugging Face's
orientation ([out, in], q/k rows in Hugging Face's RoPE order) as `model.safetensors`, or as a torch.save
zip (`pytorch_model.bin`, written here without torch) as yuhuili's heads ship. The weights are random: these
checkpoints exist to be converted (pull/head_convert) and loaded, not to agree with their target.
"""

from __future__ import annotations

import json
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader

LAYOUTS = {"eagle": ("midlayer.", "LlamaForCausalLMEagle3"), "speculators": ("layers.0.", "Eagle3Speculator")}
SAFETENSORS_NAMES = {np.dtype("<f2"): "F16", np.dtype("<f4"): "F32", np.dtype("<i8"): "I64", np.dtype("?"): "BOOL"}
TORCH_STORAGES = {"F16": "HalfStorage", "BF16": "BFloat16Storage", "F32": "FloatStorage", "I64": "LongStorage"}
TORCH_STORAGES["BOOL"] = "BoolStorage"
BF16 = 30  # GGMLQuantizationType.BF16: GGUFReader gives its data as bytes


@dataclass(frozen=True)
class HeadCheckpoint:
    """The shape of a head and of the target it is made for."""

    target_width: int  # the target's n_embd
    target_vocab: int
    n_embd: int  # the head's own width (the target's, when it borrows the target's embeddings)
    n_head: int
    n_kv_head: int
    n_ff: int
    draft_vocab: int | None = None  # a smaller draft vocabulary (with d2t), None: the target's
    target_layers: tuple[int, ...] | None = None  # written as eagle_aux_hidden_state_layer_ids
    own_embeddings: bool = False
    dtype: str = "F16"  # F16, BF16 or F32
    seed: int = 0


def head_for(spec, **kwargs) -> HeadCheckpoint:
    """A head shaped for a synthetic pair's target (synthetic.catalog.PairSpec): its width and vocabulary."""
    arch = spec.arch
    defaults = {
        "target_width": arch.n_embd,
        "target_vocab": spec.vocab_size,
        "n_embd": arch.n_embd,
        "n_head": arch.n_head,
        "n_kv_head": arch.n_kv_head,
        "n_ff": arch.n_ff,
    }
    return HeadCheckpoint(**(defaults | kwargs))


def head_tensors(head: HeadCheckpoint, layout: str = "eagle") -> dict[str, np.ndarray]:
    """The checkpoint's tensors by their published names (F32 here; written as `head.dtype`)."""
    prefix, _ = LAYOUTS[layout]
    d, hd = head.n_embd, head.n_embd // head.n_head
    q, kv = head.n_head * hd, head.n_kv_head * hd
    vocab = head.draft_vocab or head.target_vocab

    def normal(name: str, shape: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng([head.seed, zlib.crc32(name.encode())])
        return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])).astype(np.float32)

    ones = np.ones(d, dtype=np.float32)
    tensors = {
        "fc.weight": normal("fc", (d, 3 * head.target_width)),
        "norm.weight": ones,
        "lm_head.weight": normal("lm_head", (vocab, d)),
        prefix + "input_layernorm.weight": ones,
        prefix + "hidden_norm.weight": ones,
        prefix + "post_attention_layernorm.weight": ones,
        prefix + "self_attn.q_proj.weight": normal("q", (q, 2 * d)),
        prefix + "self_attn.k_proj.weight": normal("k", (kv, 2 * d)),
        prefix + "self_attn.v_proj.weight": normal("v", (kv, 2 * d)),
        prefix + "self_attn.o_proj.weight": normal("o", (d, q)),
        prefix + "mlp.gate_proj.weight": normal("gate", (head.n_ff, d)),
        prefix + "mlp.up_proj.weight": normal("up", (head.n_ff, d)),
        prefix + "mlp.down_proj.weight": normal("down", (d, head.n_ff)),
    }
    if head.own_embeddings:
        tensors["embed_tokens.weight"] = normal("embed", (head.target_vocab, d))
    if head.draft_vocab:
        # the draft vocabulary: a random sorted subset of target ids, stored as offsets (target id - draft id)
        ids = np.sort(np.random.default_rng(head.seed).choice(head.target_vocab, head.draft_vocab, replace=False))
        tensors["d2t"] = ids.astype(np.int64) - np.arange(head.draft_vocab, dtype=np.int64)
        mask = np.zeros(head.target_vocab, dtype=bool)
        mask[ids] = True
        tensors["t2d"] = mask
    return tensors


def head_config(head: HeadCheckpoint, layout: str = "eagle") -> dict:
    """config.json as each layout publishes it."""
    llama = {
        "model_type": "llama",
        "hidden_size": head.n_embd,
        "intermediate_size": head.n_ff,
        "num_attention_heads": head.n_head,
        "num_key_value_heads": head.n_kv_head,
        "num_hidden_layers": 1,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "vocab_size": head.target_vocab,
        "hidden_act": "silu",
        "torch_dtype": {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}[head.dtype],
    }
    extra = {"draft_vocab_size": head.draft_vocab or head.target_vocab}
    if head.target_layers is not None:
        extra["eagle_aux_hidden_state_layer_ids"] = list(head.target_layers)
    _, architecture = LAYOUTS[layout]
    if layout == "eagle":
        return {"architectures": [architecture], **llama, **extra}
    return {
        "architectures": [architecture],
        "speculators_model_type": "eagle3",
        "norm_before_residual": False,
        "target_hidden_size": None,
        "transformer_layer_config": llama,
        **extra,
    }


def write_head_checkpoint(
    folder: Path,
    head: HeadCheckpoint,
    layout: str = "eagle",
    *,
    weights: str = "safetensors",
    config: dict | None = None,
) -> Path:
    """Write config.json (`config` laid over the layout's own) and the weights (`safetensors` or `bin`) into
    `folder`; return it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(head_config(head, layout) | (config or {}), indent=2))
    tensors = {name: _stored(a, head.dtype) for name, a in head_tensors(head, layout).items()}
    if weights == "bin":
        write_torch_zip(folder / "pytorch_model.bin", tensors)
    else:
        write_safetensors(folder / "model.safetensors", tensors)
    return folder


def _stored(array: np.ndarray, dtype: str) -> tuple[str, np.ndarray]:
    """(type name, array as stored): floats as `dtype` (BF16 as uint16 bits), ids and masks as they are."""
    if array.dtype != np.float32:
        return SAFETENSORS_NAMES[array.dtype], array
    if dtype == "BF16":
        return "BF16", (array.view(np.uint32) >> 16).astype("<u2")
    return dtype, array.astype("<f2" if dtype == "F16" else "<f4")


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """The safetensors format: an 8-byte header length, the JSON header, then the raw little-endian data."""
    header, offset = {}, 0
    for name, (dtype, array) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    meta = json.dumps(header).encode()
    meta += b" " * (-len(meta) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(meta)) + meta)
        for _, array in tensors.values():
            f.write(np.ascontiguousarray(array).tobytes())


def write_torch_zip(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """A state dict as torch.save writes it (zip of data.pkl, data/<key>, byteorder), made without torch."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", _state_dict_pickle(tensors))
        archive.writestr("archive/byteorder", b"little")
        archive.writestr("archive/version", b"3\n")
        for key, (_, array) in enumerate(tensors.values()):
            archive.writestr(f"archive/data/{key}", np.ascontiguousarray(array).tobytes())


def _state_dict_pickle(tensors: dict[str, tuple[str, np.ndarray]]) -> bytes:
    """Protocol-2 pickle opcodes for an OrderedDict of tensors, each `_rebuild_tensor_v2` over a storage."""
    ordered_dict = b"ccollections\nOrderedDict\n)R"  # GLOBAL, EMPTY_TUPLE, REDUCE
    out = bytearray(b"\x80\x02" + ordered_dict)
    for key, (name, (dtype, array)) in enumerate(tensors.items()):
        strides = [int(np.prod(array.shape[i + 1 :])) for i in range(array.ndim)]
        storage = b"(" + _text("storage") + f"ctorch\n{TORCH_STORAGES[dtype]}\n".encode()
        storage += _text(str(key)) + _text("cpu") + _int(array.size) + b"tQ"  # TUPLE, BINPERSID
        out += _text(name) + b"ctorch._utils\n_rebuild_tensor_v2\n(" + storage + _int(0)
        out += b"(" + b"".join(_int(v) for v in array.shape) + b"t"
        out += b"(" + b"".join(_int(v) for v in strides) + b"t"
        out += b"\x89" + ordered_dict + b"tRs"  # NEWFALSE, hooks, TUPLE, REDUCE, SETITEM
    return bytes(out + b".")


def _text(value: str) -> bytes:
    data = value.encode()
    return b"X" + struct.pack("<I", len(data)) + data  # BINUNICODE


def _int(value: int) -> bytes:
    return b"J" + struct.pack("<i", value)  # BININT


def checkpoint_from_gguf(head_gguf: Path, folder: Path, layout: str = "eagle") -> Path:
    """The checkpoint a head GGUF was converted from, as `layout` publishes it: the inverse of pull/head_convert
    (names back, q/k rows back in Hugging Face's RoPE order, d2t back to offsets, t2d rebuilt). Any head
    written with `gguf` (a crafted one) thus becomes a checkpoint to convert and compare."""
    reader = GGUFReader(head_gguf)
    meta = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    arch = meta["general.architecture"]

    def key(name, default=None):
        return meta.get(f"{arch}.{name}", default)

    n_head = key("attention.head_count")
    n_kv = key("attention.head_count_kv", n_head)
    n_vocab = len(meta["tokenizer.ggml.tokens"])
    tensors = _checkpoint_tensors(reader, head_gguf, LAYOUTS[layout][0], n_head, n_kv, n_vocab)
    draft_vocab = len(tensors["d2t"][1]) if "d2t" in tensors else n_vocab
    dtypes = {kind for kind, a in tensors.values() if a.ndim == 2}
    head = HeadCheckpoint(
        target_width=key("target_hidden_size"),
        target_vocab=n_vocab,
        n_embd=key("embedding_length"),
        n_head=n_head,
        n_kv_head=n_kv,
        n_ff=key("feed_forward_length"),
        draft_vocab=draft_vocab,
        target_layers=tuple(int(v) for v in key("target_layers")),
        dtype=dtypes.pop() if len(dtypes) == 1 else "F32",
    )
    config = head_config(head, layout)
    flags = {
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(key("context_length", 2048)),
    }
    if layout == "eagle":
        config |= flags
    else:
        config["transformer_layer_config"] |= flags
    config["target_hidden_size"] = key("target_hidden_size")
    config["norm_before_residual"] = bool(key("norm_before_residual", False))
    config["norm_before_fc"] = bool(key("norm_before_fc", False))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    write_safetensors(folder / "model.safetensors", tensors)
    return folder


def _checkpoint_tensors(
    reader: GGUFReader, head_gguf: Path, prefix: str, n_head: int, n_kv: int, n_vocab: int
) -> dict[str, tuple[str, np.ndarray]]:
    """The head's tensors by their checkpoint names (the layer's under `prefix`), each with its kind."""
    names = {gguf: hf for hf, gguf in _HF_TO_GGUF.items()}
    tensors: dict[str, tuple[str, np.ndarray]] = {}
    for t in reader.tensors:
        data = np.asarray(t.data)
        data = (data.view("<u2") if int(t.tensor_type) == BF16 else data).reshape(tuple(reversed(t.shape.tolist())))
        if t.name == "d2t":
            ids = data.astype(np.int64)
            tensors["d2t"] = ("I64", ids - np.arange(ids.size, dtype=np.int64))
            mask = np.zeros(n_vocab, dtype=bool)
            mask[ids] = True
            tensors["t2d"] = ("BOOL", mask)
            continue
        if t.name not in names:
            raise ValueError(f"{head_gguf}: {t.name} has no place in a published head checkpoint")
        if t.name == "blk.0.attn_q.weight":
            data = _unpermute(data, n_head)
        elif t.name == "blk.0.attn_k.weight":
            data = _unpermute(data, n_kv)
        kind = {0: "F32", 1: "F16", BF16: "BF16"}[int(t.tensor_type)]
        name = names[t.name]
        tensors[prefix + name.removeprefix("layer.") if name.startswith("layer.") else name] = (kind, data)
    return tensors


_HF_TO_GGUF = {
    "fc.weight": "fc.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "embed_tokens.weight": "token_embd.weight",
    "input_norm.weight": "enc.output_norm.weight",
    "layer.input_layernorm.weight": "blk.0.attn_norm.weight",
    "layer.hidden_norm.weight": "blk.0.attn_norm_2.weight",
    "layer.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "layer.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "layer.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "layer.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "layer.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "layer.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "layer.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "layer.mlp.down_proj.weight": "blk.0.ffn_down.weight",
}


def _unpermute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face's q/k row order from llama.cpp's (the inverse of head_convert.permute)."""
    rows = weights.shape[0]
    return weights.reshape(n_head, rows // n_head // 2, 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)
