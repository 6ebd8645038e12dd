"""Header-only GGUF inspection.

The `gguf` package's GGUFReader memory-maps the whole file and builds a view of every tensor,
and decodes string arrays one numpy view at a time (seconds for Llama 3's 128k tokens + 280k
merges). We only need the header, so we walk it with `struct`, using the package's constants
for value types and quantization block sizes. Tensor data is never touched: a 40 GB blob is
inspected from its first few megabytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, LlamaFileType

from .errors import CorruptGGUF, NotGGUF

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
TOKENS_KEY = "tokenizer.ggml.tokens"
_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}
_READ_CHUNK = 1 << 20
_MAX_NUMBER_ARRAY = 65536  # per-layer metadata arrays are kept (as tuples); longer ones are only counted


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
    vocab_type: str | None
    pre_tokenizer: str | None
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    add_bos: bool | None
    add_eos: bool | None
    chat_template: str | None
    tensor_bytes: int
    data_offset: int
    tensors: tuple[TensorInfo, ...] = field(repr=False)
    tokens: tuple[str, ...] | None = field(repr=False)
    metadata: dict[str, Any] = field(repr=False, compare=False)

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
    """Parse the header of `path`; raise NotGGUF / CorruptGGUF naming the file."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            file_size = path.stat().st_size
            return _HeaderParser(f, path, file_size, read_vocab).parse()
    except (NotGGUF, CorruptGGUF):
        raise
    except OSError as exc:
        raise CorruptGGUF(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise CorruptGGUF(f"{path} is not a valid GGUF file ({exc})") from exc


class _HeaderParser:
    """A forward-only reader over the file that fetches more bytes only when it needs them."""

    def __init__(self, f: BinaryIO, path: Path, file_size: int, read_vocab: bool):
        self.f, self.path, self.file_size, self.read_vocab = f, path, file_size, read_vocab
        self.buf = b""
        self.pos = 0
        self.endian = "<"

    def _need(self, n: int) -> None:
        if self.pos + n <= len(self.buf):
            return
        more = self.f.read(max(n + self.pos - len(self.buf), _READ_CHUNK, len(self.buf)))
        if self.pos + n > len(self.buf) + len(more):
            raise CorruptGGUF(f"{self.path} is truncated inside its GGUF header")
        self.buf = self.buf[self.pos :] + more
        self.pos = 0

    def _unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self._need(size)
        (value,) = struct.unpack_from(self.endian + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def _string(self, decode: bool = True) -> str | None:
        length = self._unpack("Q")
        if length > self.file_size:
            raise CorruptGGUF(f"{self.path} has a string longer than the file itself")
        self._need(length)
        start, self.pos = self.pos, self.pos + length
        return self.buf[start : self.pos].decode("utf-8", errors="replace") if decode else None

    def _value(self, vtype: int, keep: bool, keep_numbers: bool = False) -> Any:
        if vtype == GGUFValueType.STRING:
            return self._string(keep)
        if vtype == GGUFValueType.ARRAY:
            item_type, count = self._unpack("I"), self._unpack("Q")
            if count > self.file_size:
                raise CorruptGGUF(f"{self.path} has an array longer than the file itself")
            if item_type in _SCALAR_FORMATS and (item_type != GGUFValueType.BOOL or keep_numbers):
                fmt = _SCALAR_FORMATS[GGUFValueType(item_type)]
                size = struct.calcsize(fmt) * count
                self._need(size)
                if keep_numbers and count <= _MAX_NUMBER_ARRAY:  # per-layer values (head_count_kv, ...)
                    values = struct.unpack_from(f"{self.endian}{count}{fmt}", self.buf, self.pos)
                    self.pos += size
                    return tuple(values)
                self.pos += size  # numeric arrays (token types, scores) are not needed
                return count
            items = [self._value(item_type, keep) for _ in range(count)]
            return items if keep else count
        try:
            fmt = _SCALAR_FORMATS[GGUFValueType(vtype)]
        except (ValueError, KeyError):
            raise CorruptGGUF(f"{self.path} has an unknown GGUF value type {vtype}") from None
        return self._unpack(fmt)

    def parse(self) -> ModelInfo:
        self._need(4)
        if self.buf[:4] != GGUF_MAGIC:
            raise NotGGUF(f"{self.path} is not a GGUF file (it starts with {self.buf[:4]!r})")
        self.pos = 4
        version = self._unpack("I")
        if version > 0xFFFF:  # a big-endian file reads as a huge little-endian number
            self.endian, self.pos = ">", 4
            version = self._unpack("I")
        if version < 2:
            raise CorruptGGUF(f"{self.path} is GGUF version {version}; only versions 2 and 3 are supported")
        n_tensors, n_kv = self._unpack("Q"), self._unpack("Q")
        if n_tensors > self.file_size or n_kv > self.file_size:
            raise CorruptGGUF(f"{self.path} has an impossible tensor or key count")

        metadata: dict[str, Any] = {}
        tokens = None
        for _ in range(n_kv):
            key = self._string()
            vtype = self._unpack("I")
            # Of all arrays only the token texts are kept (draft compatibility needs them).
            keep = vtype != GGUFValueType.ARRAY or (key == TOKENS_KEY and self.read_vocab)
            value = self._value(vtype, keep, keep_numbers=not key.startswith("tokenizer."))
            if isinstance(value, list):
                tokens, value = tuple(value), len(value)
            metadata[key] = value

        raw_tensors = []
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._unpack("I")
            if n_dims > 8:
                raise CorruptGGUF(f"{self.path}: tensor {name} has {n_dims} dimensions")
            shape = tuple(self._unpack("Q") for _ in range(n_dims))
            raw_tensors.append((name, shape, self._unpack("I"), self._unpack("Q")))
        alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT)) or DEFAULT_ALIGNMENT
        data_offset = -(-(self.f.tell() - len(self.buf) + self.pos) // alignment) * alignment
        tensors = _tensor_infos(raw_tensors, self.file_size - data_offset)
        tensor_bytes = sum(t.n_bytes for t in tensors)
        if tensors and data_offset + max(t.offset + t.n_bytes for t in tensors) > self.file_size:
            raise CorruptGGUF(
                f"{self.path} is truncated: its tensors need {format_bytes(data_offset + tensor_bytes)}"
                f" but the file has {format_bytes(self.file_size)}"
            )
        return _model_info(self.path, self.file_size, version, metadata, tokens, tensors, data_offset)


def _tensor_infos(raw: list[tuple[str, tuple[int, ...], int, int]], data_size: int) -> tuple[TensorInfo, ...]:
    # Types newer than the installed gguf package get their size from the next tensor's offset.
    ends = sorted({offset for *_, offset in raw} | {data_size})
    infos = []
    for name, shape, type_id, offset in raw:
        n_elements = 1
        for dim in shape:
            n_elements *= dim
        try:
            qtype = GGMLQuantizationType(type_id)
            block, type_size = GGML_QUANT_SIZES[qtype]
            n_bytes, type_name = n_elements * type_size // block, qtype.name
        except (ValueError, KeyError):
            n_bytes = next(end for end in ends if end > offset) - offset
            type_name = f"type{type_id}"
        infos.append(TensorInfo(name, shape, type_name, n_bytes, offset))
    return tuple(infos)


def _file_type_name(metadata: dict[str, Any], tensors: tuple[TensorInfo, ...]) -> str:
    file_type = metadata.get("general.file_type")
    if file_type is not None:
        try:
            return LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            return f"type{file_type}"
    weights = [t for t in tensors if len(t.shape) >= 2]
    if not weights:
        return "unknown"
    return max(weights, key=lambda t: t.n_bytes).type_name


def _model_info(path, file_size, version, metadata, tokens, tensors, data_offset) -> ModelInfo:
    arch = str(metadata.get("general.architecture", "unknown"))

    def arch_int(key: str) -> int | None:
        value = metadata.get(f"{arch}.{key}")
        if isinstance(value, tuple) and value:  # a per-layer array: its largest value stands for the model
            value = max(value)
        return int(value) if isinstance(value, (int, float)) else None

    def opt_int(key: str) -> int | None:
        value = metadata.get(key)
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def opt_bool(key: str) -> bool | None:
        value = metadata.get(key)
        return bool(value) if value is not None else None

    embd, heads = arch_int("embedding_length"), arch_int("attention.head_count")
    head_dim = arch_int("attention.key_length") or (embd // heads if embd and heads else None)
    vocab_size = metadata.get(TOKENS_KEY) if isinstance(metadata.get(TOKENS_KEY), int) else 0
    vocab_size = arch_int("vocab_size") or vocab_size
    template = metadata.get("tokenizer.chat_template")
    return ModelInfo(
        path=path,
        file_size=file_size,
        version=version,
        architecture=arch,
        name=metadata.get("general.name"),
        file_type=_file_type_name(metadata, tensors),
        parameter_count=sum(t.n_elements for t in tensors),
        context_length=arch_int("context_length"),
        block_count=arch_int("block_count"),
        embedding_length=embd,
        feed_forward_length=arch_int("feed_forward_length"),
        head_count=heads,
        head_count_kv=arch_int("attention.head_count_kv") or heads,
        head_dim=head_dim,
        vocab_type=metadata.get("tokenizer.ggml.model"),
        pre_tokenizer=metadata.get("tokenizer.ggml.pre"),
        vocab_size=len(tokens) if tokens is not None else vocab_size,
        bos_id=opt_int("tokenizer.ggml.bos_token_id"),
        eos_id=opt_int("tokenizer.ggml.eos_token_id"),
        eot_id=opt_int("tokenizer.ggml.eot_token_id"),
        add_bos=opt_bool("tokenizer.ggml.add_bos_token"),
        add_eos=opt_bool("tokenizer.ggml.add_eos_token"),
        chat_template=template if isinstance(template, str) else None,
        tensor_bytes=sum(t.n_bytes for t in tensors),
        data_offset=data_offset,
        tensors=tensors,
        tokens=tokens,
        metadata=metadata,
    )
