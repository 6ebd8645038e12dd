"""A sequence's cells as llama.cpp saves them (llama_state_seq_get_data), read and written again deeper:
the cells of a short read repeated to any depth, in either layout of the V cache.

What a pass costs depends on how many cells it attends over, not on what they hold, so a timing at a
depth (flash_probe.py) reads a few tokens and repeats their cells instead of reading the whole depth
(256 tokens of the demo target are 5-8 s on a 2-core CPU). A context with flash attention keeps V by
cell, one without it transposed (llama.cpp's v_trans): the cells read in one kind go into the other
transposed. Only what this module can account for byte by byte is taken: a single KV cache of f32,
f16 or bf16 cells, one sequence per cell (other memories, an iSWA cache's second half, cells with an
extension, quantized V: None, and the caller reads the tokens instead).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

# ggml's element sizes of the types a V cache is kept transposed in (f32, f16, bf16)
ELEMENT_BYTES = {0: 4, 1: 2, 30: 2}


@dataclass(frozen=True)
class Tensor:
    """One layer's K or V of the saved cells: its ggml type and the bytes of each cell (a row each)."""

    type: int
    rows: np.ndarray  # uint8, cells x bytes a cell


@dataclass(frozen=True)
class SavedCells:
    """The cells of one sequence: the stream they lie in, of how many, and each layer's K and V rows."""

    head: bytes  # the saved bytes' magic and sequence id, written back as they were
    n_stream: int
    stream: int
    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]

    @property
    def n_cells(self) -> int:
        return len(self.keys[0].rows)

    def _cells(self, depth: int, v_trans: bool) -> bytes:
        order = np.arange(depth) % self.n_cells
        meta = np.zeros((depth, 3), "<i4")
        meta[:, 0], meta[:, 1] = np.arange(depth), 1  # pos, one sequence id (0: the reader puts its own)
        out = [meta.tobytes(), struct.pack("<II", int(v_trans), len(self.keys))]
        for k in self.keys:
            out += [struct.pack("<iQ", k.type, k.rows.shape[1]), k.rows[order].tobytes()]
        for v in self.values:
            rows = v.rows[order]
            if not v_trans:
                out += [struct.pack("<iQ", v.type, rows.shape[1]), rows.tobytes()]
                continue
            size = ELEMENT_BYTES[v.type]
            by_element = rows.reshape(depth, -1, size).transpose(1, 0, 2)  # n_embd x cells x element
            out += [struct.pack("<iII", v.type, size, by_element.shape[0]), by_element.tobytes()]
        return b"".join(out)

    def deepened(self, depth: int, v_trans: bool) -> bytearray | None:
        """The bytes llama.cpp restores `depth` cells from (positions 0..depth-1), the saved cells
        repeated in order, with V transposed or not; None where a V type has no known element size."""
        if v_trans and any(v.type not in ELEMENT_BYTES for v in self.values):
            return None
        out = bytearray(self.head)
        out += struct.pack("<I", self.n_stream)
        for stream in range(self.n_stream):  # each stream's count, then its cells (none but one's)
            out += struct.pack("<I", depth if stream == self.stream else 0)
            if stream == self.stream:
                out += self._cells(depth, v_trans)
        return out


def read_saved_cells(state: bytes | bytearray) -> SavedCells | None:
    """`state` (one sequence's, from llama_state_seq_get_data) taken apart; None where it is not one KV
    cache's cells as this module knows them."""
    try:
        return _Reader(memoryview(state)).saved_cells()
    except (struct.error, ValueError):
        return None


class _Reader:
    def __init__(self, data: memoryview):
        self.data, self.at = data, 0

    def take(self, fmt: str) -> tuple:
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values

    def rows(self, n_rows: int, row_bytes: int) -> np.ndarray:
        end = self.at + n_rows * row_bytes
        if row_bytes <= 0 or end > len(self.data):
            raise ValueError("cells past the end")
        rows = np.frombuffer(self.data[self.at : end], np.uint8).reshape(n_rows, row_bytes).copy()
        self.at = end
        return rows

    def saved_cells(self) -> SavedCells:
        head = bytes(self.data[:8])
        self.at = 8  # magic, sequence id
        (n_stream,) = self.take("I")
        stream = -1
        for s in range(n_stream):
            (count,) = self.take("I")
            if not count:
                continue
            if stream >= 0:
                raise ValueError("cells in two streams")
            stream = s
            for _ in range(count):
                _pos, n_seq_id, _seq = self.take("iIi")
                if n_seq_id != 1:
                    raise ValueError("a cell of several sequences")
            keys, values = self._tensors(count)
        if stream < 0 or self.at != len(self.data):
            raise ValueError("not one stream of cells")
        return SavedCells(head, n_stream, stream, keys, values)

    def _tensors(self, n_cells: int) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
        v_trans, n_layer = self.take("II")
        if v_trans not in (0, 1) or not 0 < n_layer < 4096:
            raise ValueError("not a KV cache's cells")
        keys = []
        for _ in range(n_layer):
            k_type, row_bytes = self.take("iQ")
            keys.append(Tensor(k_type, self.rows(n_cells, row_bytes)))
        values = []
        for _ in range(n_layer):
            if not v_trans:
                v_type, row_bytes = self.take("iQ")
                values.append(Tensor(v_type, self.rows(n_cells, row_bytes)))
                continue
            v_type, size, n_embd = self.take("iII")
            if ELEMENT_BYTES.get(v_type) != size:
                raise ValueError("a transposed V of an unknown type")
            by_element = self.rows(n_embd, n_cells * size).reshape(n_embd, n_cells, size)
            values.append(Tensor(v_type, by_element.transpose(1, 0, 2).reshape(n_cells, n_embd * size).copy()))
        return tuple(keys), tuple(values)
