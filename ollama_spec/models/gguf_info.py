"""What the header of a GGUF file says about the model in it, read as llama.cpp reads it.

The bytes are walked by gguf_header (total: any file gives a header or a clean error); here the
metadata becomes facts: architecture, shapes (per layer where the file stores arrays), the
vocabulary with llama.cpp's defaults for what the header leaves out, tensor sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ollama_spec.errors import CorruptGGUF
from ollama_spec.models.gguf_constants import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType
from ollama_spec.models.gguf_header import (
    GGUF_MAGIC,
    MAX_LAYERS,
    TOKENS_KEY,
    GGUFHeader,
    RawTensor,
    SkippedArray,
    read_header,
)
from ollama_spec.models.vocab_defaults import forces_add_bos, vocab_defaults

__all__ = [
    "GGUF_MAGIC",
    "TOKENS_KEY",
    "ModelInfo",
    "TensorInfo",
    "format_bytes",
    "format_count",
    "is_gguf",
    "read_model_info",
]


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the contiguous dimension
    type_name: str
    n_bytes: int
    offset: int  # relative to the start of the data section

    @property
    def n_elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(frozen=True)
class ModelInfo:
    """What the header of one GGUF file says about the model inside it."""

    path: Path
    file_size: int
    version: int
    architecture: str
    name: str | None
    file_type: str
    parameter_count: int
    context_length: int | None
    block_count: int | None
    embedding_length: int | None
    feed_forward_length: int | None
    head_count: int | None
    head_count_kv: int | None
    head_dim: int | None
    head_dim_v: int | None  # attention.value_length, else head_dim
    # one value per layer (None when the header lacks it); the scalars above are the largest
    head_count_layers: tuple[int, ...] | None
    head_count_kv_layers: tuple[int, ...] | None
    feed_forward_layers: tuple[int, ...] | None
    vocab_type: str | None
    pre_tokenizer: str | None
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    add_bos: bool  # as llama.cpp will use them: the header's, else its default for the tokenizer
    add_eos: bool
    chat_template: str | None
    tensor_bytes: int
    data_offset: int
    tensors: tuple[TensorInfo, ...] = field(repr=False)
    tokens: tuple[str, ...] | None = field(repr=False)
    metadata: dict[str, Any] = field(repr=False, compare=False)
    n_tokens: int = 0  # entries in tokenizer.ggml.tokens (read or not)

    @property
    def kv_head_total(self) -> int:
        """KV heads summed over all layers (layers without attention count 0)."""
        return sum(self.head_count_kv_layers or ())

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    @property
    def parameter_label(self) -> str:
        return format_count(self.parameter_count)

    def token_text(self, token_id: int | None) -> str | None:
        if token_id is None or self.tokens is None or not 0 <= token_id < len(self.tokens):
            return None
        return self.tokens[token_id]

    @property
    def is_eagle3_head(self) -> bool:
        """An EAGLE-3 draft head (models/heads has what it reads and the rules its target must meet)."""
        return self.architecture == "eagle3"

    @property
    def nextn_layers(self) -> int:
        """The MTP (NextN) layers after the trunk (`{arch}.nextn_predict_layers`), counted in block_count."""
        return _count(self.metadata.get(f"{self.architecture}.nextn_predict_layers")) or 0

    @property
    def sliding_window(self) -> int | None:
        """Tokens the window layers of a sliding-window model (Gemma, gpt-oss) attend over, as the header says."""
        window = self.metadata.get(f"{self.architecture}.attention.sliding_window")
        return window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None

    def summary(self) -> dict[str, Any]:
        """JSON-ready view of the header facts (no tensors, no vocabulary)."""
        return {
            "path": str(self.path),
            "file_size": self.file_size,
            "gguf_version": self.version,
            "architecture": self.architecture,
            "name": self.name,
            "file_type": self.file_type,
            "parameter_count": self.parameter_count,
            "parameters": self.parameter_label,
            "context_length": self.context_length,
            "block_count": self.block_count,
            "embedding_length": self.embedding_length,
            "feed_forward_length": self.feed_forward_length,
            "head_count": self.head_count,
            "head_count_kv": self.head_count_kv,
            "head_dim": self.head_dim,
            "sliding_window": self.sliding_window,
            "head_count_per_layer": _varying(self.head_count_layers),
            "head_count_kv_per_layer": _varying(self.head_count_kv_layers),
            "feed_forward_length_per_layer": _varying(self.feed_forward_layers),
            "vocab_type": self.vocab_type,
            "pre_tokenizer": self.pre_tokenizer,
            "vocab_size": self.vocab_size,
            "bos_token_id": self.bos_id,
            "eos_token_id": self.eos_id,
            "eot_token_id": self.eot_id,
            "add_bos_token": self.add_bos,
            "add_eos_token": self.add_eos,
            "has_chat_template": self.has_chat_template,
            "tensor_count": len(self.tensors),
            "tensor_bytes": self.tensor_bytes,
        }


def _varying(values: tuple[int, ...] | None) -> list[int] | None:
    return list(values) if values and len(set(values)) > 1 else None


def format_count(count: int) -> str:
    """1_234_567_890 -> '1.2B', like Ollama's parameter sizes."""
    for limit, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= limit:
            return f"{count / limit:.1f}{suffix}"
    return str(count)


def format_bytes(n: float) -> str:
    for limit, suffix in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(n) >= limit:
            return f"{n / limit:.1f} {suffix}"
    return f"{int(n)} B"


def is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def read_model_info(path: str | Path, *, read_vocab: bool = True) -> ModelInfo:
    """Parse the header of `path`; raise NotGGUF / CorruptGGUF naming the file, whatever it holds."""
    path = Path(path)
    try:
        file_size = path.stat().st_size
        if not path.is_file():  # a FIFO or device would block or never end
            raise CorruptGGUF(f"cannot read {path}: not a regular file")
        with open(path, "rb") as f:
            header = read_header(f, path, file_size, read_vocab=read_vocab)
    except OSError as exc:
        raise CorruptGGUF(f"cannot read {path}: {exc.strerror or exc}") from exc
    tensors = _tensor_infos(header.tensors, file_size - header.data_offset)
    if tensors and header.data_offset + max(t.offset + t.n_bytes for t in tensors) > file_size:
        raise CorruptGGUF(
            f"{path} is truncated: its tensors need {format_bytes(header.data_offset + sum(t.n_bytes for t in tensors))}"
            f" but the file has {format_bytes(file_size)}"
        )
    return _model_info(path, file_size, header, tensors)


def _tensor_infos(raw: tuple[RawTensor, ...], data_size: int) -> tuple[TensorInfo, ...]:
    # Types newer than the installed gguf package get their size from the next tensor's offset.
    ends = sorted({t.offset for t in raw} | {data_size})
    infos = []
    for t in raw:
        n_elements = 1
        for dim in t.shape:
            n_elements *= dim
        try:
            qtype = GGMLQuantizationType(t.type_id)
            block, type_size = GGML_QUANT_SIZES[qtype]
            n_bytes, type_name = n_elements * type_size // block, qtype.name
        except (ValueError, KeyError):
            n_bytes = next((end for end in ends if end > t.offset), t.offset) - t.offset
            type_name = f"type{t.type_id}"
        infos.append(TensorInfo(t.name, t.shape, type_name, n_bytes, t.offset))
    return tuple(infos)


def _file_type_name(metadata: dict[str, Any], tensors: tuple[TensorInfo, ...]) -> str:
    file_type = _count(metadata.get("general.file_type"))
    if file_type is not None:
        try:
            return LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            return f"type{file_type}"
    weights = [t for t in tensors if len(t.shape) >= 2]
    if not weights:
        return "unknown"
    return max(weights, key=lambda t: t.n_bytes).type_name


def _model_info(path: Path, file_size: int, header: GGUFHeader, tensors: tuple[TensorInfo, ...]) -> ModelInfo:
    metadata, tokens = header.metadata, header.tokens
    arch = _text(metadata, "general.architecture") or "unknown"

    def arch_count(key: str) -> int | None:
        return _count(metadata.get(f"{arch}.{key}"))

    block_count = arch_count("block_count")
    n_layer = block_count if block_count and block_count <= MAX_LAYERS else None

    heads = _per_layer(metadata.get(f"{arch}.attention.head_count"), n_layer)
    kv_heads = _per_layer(metadata.get(f"{arch}.attention.head_count_kv"), n_layer, heads)
    ff = _per_layer(metadata.get(f"{arch}.feed_forward_length"), n_layer)
    embd = arch_count("embedding_length")
    # llama.cpp: head size = embedding / the first layer's head count, unless key_length says otherwise
    head_dim = arch_count("attention.key_length") or (embd // heads[0] if embd and heads and heads[0] else None)
    n_tokens = len(tokens) if tokens is not None else _array_length(metadata.get(TOKENS_KEY))
    vocab_type, pre = _text(metadata, "tokenizer.ggml.model"), _text(metadata, "tokenizer.ggml.pre")
    defaults = vocab_defaults(vocab_type, pre)
    add_bos = _flag(metadata, "tokenizer.ggml.add_bos_token", defaults.add_bos) or forces_add_bos(vocab_type, pre)
    return ModelInfo(
        path=path,
        file_size=file_size,
        version=header.version,
        architecture=arch,
        name=_text(metadata, "general.name"),
        file_type=_file_type_name(metadata, tensors),
        parameter_count=sum(t.n_elements for t in tensors),
        context_length=arch_count("context_length"),
        block_count=n_layer,
        embedding_length=embd,
        feed_forward_length=max(ff) if ff else None,
        head_count=max(heads) if heads else None,
        head_count_kv=max(kv_heads) if kv_heads else None,
        head_dim=head_dim,
        head_dim_v=arch_count("attention.value_length") or head_dim,
        head_count_layers=heads,
        head_count_kv_layers=kv_heads,
        feed_forward_layers=ff,
        vocab_type=vocab_type,
        pre_tokenizer=pre,
        vocab_size=n_tokens or arch_count("vocab_size") or 0,
        bos_id=_special_id(metadata, "tokenizer.ggml.bos_token_id", defaults.bos_id, n_tokens),
        eos_id=_special_id(metadata, "tokenizer.ggml.eos_token_id", defaults.eos_id, n_tokens),
        eot_id=_special_id(metadata, "tokenizer.ggml.eot_token_id", None, n_tokens),
        add_bos=add_bos,
        add_eos=_flag(metadata, "tokenizer.ggml.add_eos_token", defaults.add_eos),
        chat_template=_text(metadata, "tokenizer.chat_template"),
        tensor_bytes=sum(t.n_bytes for t in tensors),
        data_offset=header.data_offset,
        tensors=tensors,
        tokens=tokens,
        metadata=metadata,
        n_tokens=n_tokens,
    )


def _per_layer(value: Any, n_layer: int | None, default: tuple[int, ...] | None = None) -> tuple[int, ...] | None:
    """A per-layer header value (one for all layers, or an array of one per layer) as one value per layer;
    `default` where the header has none, None where it is unusable."""
    if value is None:
        return default
    if n_layer is None:
        return None
    if isinstance(value, tuple):  # llama.cpp requires one value per layer
        return value if len(value) == n_layer and all(v >= 0 for v in value) else None
    count = _count(value)
    return (count,) * n_layer if count is not None else None


def _text(metadata: dict[str, Any], key: str) -> str | None:
    value = metadata.get(key)
    return value if isinstance(value, str) else None


def _count(value: Any) -> int | None:
    """A non-negative whole number from a header value of any numeric type; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            return None
        value = int(value)
    return value if isinstance(value, int) and value >= 0 else None


def _array_length(value: Any) -> int:
    return value.count if isinstance(value, SkippedArray) else 0


def _flag(metadata: dict[str, Any], key: str, default: bool) -> bool:
    value = metadata.get(key)
    return value if isinstance(value, bool) else default


def _special_id(metadata: dict[str, Any], key: str, default: int | None, n_tokens: int) -> int | None:
    """llama.cpp's rule: an id past the vocabulary is ignored, and so is a default past it."""
    value = _count(metadata.get(key))
    if value is not None and value < n_tokens:
        return value
    return default if default is not None and default < n_tokens else None
