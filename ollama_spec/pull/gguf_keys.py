"""A GGUF's metadata keys with their GGUF types, read straight from its header for copying into another file.

gguf's own GGUFReader builds a numpy view per array item: on a Llama 3 vocabulary (128k tokens, 280k merges)
it takes tens of seconds. A converted head needs only its target's `tokenizer.*` keys; this walks the key
section once, decodes the keys asked for into Python values (as GGUFWriter takes them) and skips the others.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType

from ollama_spec.errors import PullError

_SCALARS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
TypedValue = tuple[str, GGUFValueType, GGUFValueType | None, Any]  # key, type, array item type, value


def read_keys(path: Path, wanted: Callable[[str], bool]) -> list[TypedValue]:
    """The metadata keys of the GGUF at `path` for which `wanted(key)`, in file order, with their types."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    buf = memoryview(data)
    pos = 0

    def unpack(fmt: str) -> Any:
        nonlocal pos
        value = struct.unpack_from(fmt, buf, pos)[0]
        pos += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal pos
        length = unpack("<Q")
        text = bytes(buf[pos : pos + length]).decode("utf-8", errors="replace")
        pos += length
        return text

    def skip_string() -> None:
        nonlocal pos
        pos += unpack("<Q")

    try:
        if bytes(buf[:4]) != b"GGUF":
            raise PullError(f"{path} is not a GGUF file")
        pos = 4
        if unpack("<I") > 0xFFFF:
            raise PullError(f"{path} is a big-endian GGUF, whose keys cannot be copied into a little-endian head")
        _, n_kv = unpack("<Q"), unpack("<Q")
        found = []
        for _ in range(n_kv):
            key = string()
            vtype = GGUFValueType(unpack("<I"))
            keep = wanted(key)
            if vtype == GGUFValueType.ARRAY:
                item, count = GGUFValueType(unpack("<I")), unpack("<Q")
                if item == GGUFValueType.STRING:
                    value = [string() for _ in range(count)] if keep else [skip_string() for _ in range(count)]
                else:
                    size = struct.calcsize(_SCALARS[item])
                    value = np.frombuffer(buf, _SCALARS[item], count, pos).tolist() if keep else None
                    pos += size * count
                if keep and count:  # gguf cannot write an empty array; llama.cpp reads a missing key the same
                    found.append((key, vtype, item, value))
            elif vtype == GGUFValueType.STRING:
                value = string()
                if keep:
                    found.append((key, vtype, None, value))
            else:
                value = unpack(_SCALARS[vtype])
                if keep:
                    found.append((key, vtype, None, value))
        return found
    except (struct.error, ValueError, KeyError, IndexError) as exc:
        raise PullError(f"cannot read the metadata of {path}: {exc}") from None
