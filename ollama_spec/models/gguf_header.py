"""A total reader for the header of a GGUF file: any bytes give a header or a clean error.

The `gguf` package's GGUFReader memory-maps the whole file and builds a view of every tensor,
and decodes string arrays one numpy view at a time (seconds for Llama 3's 128k tokens + 280k
merges). We only need the header, so we walk it with `struct`, using the package's constants
for value types. Tensor data is never touched: a 40 GB blob is inspected from its first few
megabytes.

Files in an Ollama store come from many tools, some half-written, so every count and length
read from the file is checked against the bytes that can still follow it before anything is
allocated or looped over, the walk is iterative (arrays of arrays are refused, as llama.cpp's
own reader refuses them), and the header may not exceed MAX_HEADER_BYTES: time and memory are
bounded whatever the file holds. The limits below are far above any published model's.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ollama_spec.errors import CorruptGGUF, NotGGUF
from ollama_spec.models.gguf_constants import GGUFValueType

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
TOKENS_KEY = "tokenizer.ggml.tokens"
# Llama 3's header is ~8 MB, Gemma 3's (262k tokens with scores) ~20 MB.
MAX_HEADER_BYTES = 128 << 20
MAX_KEYS = 1 << 16  # real models have ~20-60 metadata keys
MAX_TENSORS = 1 << 18  # DeepSeek V3 has ~1,000
# Strings in all arrays together (tokens, merges): Gemma 3 has 262k tokens, Llama 3 128k + 280k.
# Each costs a step of the walk, so this bounds its time (about a second per million).
MAX_ARRAY_STRINGS = 1 << 22
MAX_TENSOR_DIMS = 4  # GGML_MAX_DIMS
MAX_LAYERS = 512  # LLAMA_MAX_LAYERS: llama.cpp refuses models with more
# Per-layer hyperparameters that llama.cpp reads as a scalar or an array of n_layer values
# (get_key_or_arr): DeciLM, LFM2, OpenELM and hybrid models store arrays.
# Hybrid models may list which layers are recurrent (one flag per layer).
# Arrays of up to this many items are kept whatever their key (general.languages, general.tags):
# Ollama's /api/show gives them, and empties longer ones.
SHORT_ARRAY = 5
PER_LAYER_KEYS = (
    "attention.head_count",
    "attention.head_count_kv",
    "feed_forward_length",
    "attention.recurrent_layers",
    "attention.sliding_window_pattern",
)
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
_INTEGER_TYPES = {t for t, fmt in _SCALAR_FORMATS.items() if fmt in "BbHhIiQq"}
_STRING_HEAD = 8  # a string is its u64 length, then the bytes
_MIN_KV = _STRING_HEAD + 4 + 1  # key, value type, the smallest value
_MIN_TENSOR_INFO = _STRING_HEAD + 4 + 4 + 8  # name, n_dims, type, offset
_READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class SkippedArray:
    """An array whose items were not kept: its item type and length."""

    item_type: int
    count: int


@dataclass(frozen=True)
class RawTensor:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the contiguous dimension
    type_id: int
    offset: int  # relative to the start of the data section


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]  # scalars, strings, per-layer tuples, SkippedArray for other arrays
    tokens: tuple[str, ...] | None  # tokenizer.ggml.tokens when asked for
    tensors: tuple[RawTensor, ...]
    data_offset: int  # where tensor data starts (aligned)


def shown(value: Any, limit: int = 60) -> str:
    """A value read from a file, safe for a one-line message: as repr() writes it, shortened."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def read_header(f: BinaryIO, path: Path, file_size: int, *, read_vocab: bool = True) -> GGUFHeader:
    """Walk the GGUF header in `f`; raise NotGGUF / CorruptGGUF naming `path`."""
    try:
        return _Walker(f, path, file_size, read_vocab).header()
    except struct.error as exc:  # cannot happen after the length checks; kept as a last line
        raise CorruptGGUF(f"{path} is not a valid GGUF file ({exc})") from exc


class _Walker:
    """A forward-only reader that fetches bytes only after checking they can exist."""

    def __init__(self, f: BinaryIO, path: Path, file_size: int, read_vocab: bool):
        self.f, self.path, self.file_size, self.read_vocab = f, path, file_size, read_vocab
        self.limit = min(file_size, MAX_HEADER_BYTES)
        self.buf = b""
        self.buf_start = 0  # file offset of buf[0]; the file position is buf_start + len(buf)
        self.pos = 0
        self.endian = "<"
        self.kept_layer_values = 0
        self.array_strings = 0

    def error(self, what: str) -> CorruptGGUF:
        return CorruptGGUF(f"{self.path} {what}")

    def tell(self) -> int:
        return self.buf_start + self.pos

    def remaining(self) -> int:
        return self.limit - self.tell()

    def _check(self, n: int) -> None:
        if self.tell() + n <= self.limit:
            return
        if self.tell() + n > self.file_size:
            raise self.error("is truncated inside its GGUF header")
        raise self.error(f"has a GGUF header larger than {MAX_HEADER_BYTES >> 20} MiB, more than any real model's")

    def _need(self, n: int) -> None:
        if self.pos + n <= len(self.buf):
            return
        self._check(n)
        more = self.f.read(max(self.pos + n - len(self.buf), _READ_CHUNK))
        self.buf, self.buf_start = self.buf[self.pos :] + more, self.tell()
        self.pos = 0
        if n > len(self.buf):  # the file shrank while we read it
            raise self.error("is truncated inside its GGUF header")

    def _skip(self, n: int) -> None:
        if self.pos + n <= len(self.buf):
            self.pos += n
            return
        self._check(n)
        target = self.tell() + n
        self.f.seek(target)
        self.buf, self.buf_start, self.pos = b"", target, 0

    def _unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self._need(size)
        (value,) = struct.unpack_from(self.endian + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def _string(self, keep: bool = True) -> str | None:
        length = self._unpack("Q")
        if length > self.remaining():
            self._check(length)
        if not keep:
            self._skip(length)
            return None
        self._need(length)
        start, self.pos = self.pos, self.pos + length
        return self.buf[start : self.pos].decode("utf-8", errors="replace")

    def _scalar(self, key: str, vtype: int) -> Any:
        if vtype == GGUFValueType.STRING:
            return self._string()
        if vtype not in _SCALAR_FORMATS:
            raise self.error(f"has an unknown GGUF value type {vtype} for key {shown(key)}")
        return self._unpack(_SCALAR_FORMATS[GGUFValueType(vtype)])

    def _array(self, key: str) -> Any:
        item_type, count = self._unpack("I"), self._unpack("Q")
        if item_type == GGUFValueType.ARRAY:
            raise self.error(f"has an array of arrays under key {shown(key)}, which llama.cpp cannot read")
        if item_type != GGUFValueType.STRING and item_type not in _SCALAR_FORMATS:
            raise self.error(f"has an unknown GGUF value type {item_type} in array {shown(key)}")
        item_size = _STRING_HEAD if item_type == GGUFValueType.STRING else struct.calcsize(_SCALAR_FORMATS[item_type])
        if count * item_size > self.remaining():
            if count * item_size > self.file_size:
                raise self.error("has an array longer than the file itself")
            self._check(count * item_size)
        if item_type == GGUFValueType.STRING:
            self.array_strings += count
            if self.array_strings > MAX_ARRAY_STRINGS:
                raise self.error(f"has more than {MAX_ARRAY_STRINGS} strings in its arrays, more than any model's")
            keep = self.read_vocab if key == TOKENS_KEY else count <= SHORT_ARRAY
            items = [self._string(keep) for _ in range(count)]
            return tuple(items) if keep else SkippedArray(item_type, count)
        per_layer = (
            (item_type in _INTEGER_TYPES or item_type == GGUFValueType.BOOL)
            and key.split(".", 1)[-1] in PER_LAYER_KEYS
            and count <= MAX_LAYERS
            and self.kept_layer_values + count <= 16 * MAX_LAYERS
        )
        if per_layer or count <= SHORT_ARRAY:
            self.kept_layer_values += count if per_layer else 0
            fmt = f"{self.endian}{count}{_SCALAR_FORMATS[item_type]}"
            self._need(struct.calcsize(fmt))
            values = struct.unpack_from(fmt, self.buf, self.pos)
            self.pos += struct.calcsize(fmt)
            return values
        self._skip(count * item_size)  # token scores and types, merges: not needed
        return SkippedArray(item_type, count)

    def header(self) -> GGUFHeader:
        if self.file_size < 4:
            raise NotGGUF(f"{self.path} is not a GGUF file (it has only {self.file_size} bytes)")
        self._need(4)
        if self.buf[:4] != GGUF_MAGIC:
            raise NotGGUF(f"{self.path} is not a GGUF file (it starts with {self.buf[:4]!r})")
        self.pos = 4
        version = self._unpack("I")
        if version > 0xFFFF:  # a big-endian file reads as a huge little-endian number
            self.endian, self.pos = ">", 4
            version = self._unpack("I")
        if version not in SUPPORTED_VERSIONS:
            raise self.error(f"is GGUF version {version}; only versions 2 and 3 are supported")
        n_tensors, n_kv = self._unpack("Q"), self._unpack("Q")
        if n_kv * _MIN_KV + n_tensors * _MIN_TENSOR_INFO > self.file_size:
            raise self.error("has an impossible tensor or key count")
        if n_kv > MAX_KEYS or n_tensors > MAX_TENSORS:
            raise self.error(f"claims {n_kv} metadata keys and {n_tensors} tensors, more than any model has")

        metadata: dict[str, Any] = {}
        tokens = None
        for _ in range(n_kv):
            key = self._string()
            if key in metadata:  # llama.cpp refuses such files too
                raise self.error(f"has the metadata key {shown(key)} twice")
            vtype = self._unpack("I")
            value = self._array(key) if vtype == GGUFValueType.ARRAY else self._scalar(key, vtype)
            if key == TOKENS_KEY and isinstance(value, tuple):
                tokens, value = value, SkippedArray(GGUFValueType.STRING, len(value))
            metadata[key] = value

        tensors = []
        names = set()
        for _ in range(n_tensors):
            name = self._string()
            if name in names:  # llama.cpp refuses such files too
                raise self.error(f"has the tensor {shown(name)} twice")
            names.add(name)
            n_dims = self._unpack("I")
            if n_dims > MAX_TENSOR_DIMS:
                raise self.error(f"has tensor {shown(name)} with {n_dims} dimensions (at most {MAX_TENSOR_DIMS})")
            shape = tuple(self._unpack("Q") for _ in range(n_dims))
            if any(dim >= 1 << 63 for dim in shape):
                raise self.error(f"has tensor {shown(name)} with a negative dimension")
            tensors.append(RawTensor(name, shape, self._unpack("I"), self._unpack("Q")))
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
            raise self.error(f"has general.alignment {shown(alignment)}, which is not a power of 2")
        data_offset = -(-self.tell() // alignment) * alignment
        return GGUFHeader(version, metadata, tokens, tuple(tensors), data_offset)
