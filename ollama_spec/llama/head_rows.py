"""The EAGLE-3 head's rows as llama.cpp reads them and gives them back, and a sequence's state as bytes
(a slot's prefix in host RAM keeps it)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp
import numpy as np


@dataclass
class _Sequence:
    """One sequence's head state: the g waiting for its next token, the last pass's g rows, and
    where the head's cache ends."""

    pending: tuple[int, np.ndarray] | None = None  # (position, g)
    rows: tuple[int, np.ndarray] | None = None  # the last pass's (first position, g rows)
    end: int = 0  # 1 + the last position the head's cache holds
    drafting: tuple[int, np.ndarray] | None = None  # a draft step's (position, g), while drafting
    raw: bool = False  # `rows` are the target's captured rows, not encoded yet (their g None in `pending`)
    before: tuple[int, np.ndarray] | None = None  # the g at the last pass's first position - 1, for a cut there
    # a probe drafting after a window of the pairs it lacks (Eagle3Head.begin): where the cache ended
    # before it, and the window's pairs, decoded with its first step
    window: tuple[int, list] | None = None
    buffer: np.ndarray | None = None  # where `rows` waiting as captured grow (append_rows)
    # Eagle3Head.idle: passes ending before this position are not followed; `slept`: one was not, so the
    # next pass followed starts the rows afresh
    asleep_until: int = 0
    slept: bool = False


def append_rows(state: _Sequence, kept: np.ndarray, new: np.ndarray, most: int) -> np.ndarray:
    """The captured rows `kept` then `new`, as one matrix in the sequence's buffer (of `most` rows at
    most; `kept` stays where it is when it starts the buffer). Steps at K=0 add a row each to the rows
    waiting: growing them by a copy copied every row kept at every step.

    Safe because rows waiting as captured are read only while the head holds its lock, by the call
    that reads them (encoded, or cut back): no view of them outlives a call, so the rows past `kept`,
    cut off or never used, are free to overwrite."""
    n, m = len(kept), len(new)
    buffer = state.buffer
    if buffer is None or len(buffer) < n + m or buffer.shape[1] != new.shape[1]:
        buffer = np.empty((max(min(2 * (n + m), most), n + m), new.shape[1]), dtype=np.float32)
        buffer[:n] = kept
        state.buffer = buffer
    elif kept.ctypes.data != buffer.ctypes.data:
        buffer[:n] = kept  # numpy copies through a temporary where the two overlap
    buffer[n : n + m] = new
    return buffer[: n + m]


def pack_state(state: _Sequence, cells: bytes | bytearray) -> bytes:
    """A sequence's state as bytes: where its cache ends, its pending g and last pass's g rows, its cells."""
    pending_at, pending = state.pending if state.pending is not None else (-1, np.empty((0,), np.float32))
    first, rows = state.rows if state.rows is not None else (-1, np.empty((0, len(pending)), np.float32))
    header = np.array([state.end, pending_at, len(pending), first, len(rows), len(cells)], dtype=np.int64)
    floats = np.concatenate([np.ravel(pending), np.ravel(rows)]).astype(np.float32)
    return header.tobytes() + floats.tobytes() + cells


def unpack_state(data: bytes, n_embd: int) -> tuple[_Sequence, bytes]:
    """pack_state's sequence state and cells."""
    end, pending_at, n_pending, first, n_rows, n_cells = np.frombuffer(data, np.int64, 6).tolist()
    floats = np.frombuffer(data, np.float32, n_pending + n_rows * n_embd, 48)
    state = _Sequence(end=end)
    if pending_at >= 0:
        state.pending = (pending_at, floats[:n_pending].copy())
    if first >= 0:
        state.rows = (first, floats[n_pending:].reshape(n_rows, n_embd).copy())
    return state, data[len(data) - n_cells :] if n_cells else b""


def embd_rows(rows: np.ndarray):
    """A llama_embd for each row of the float32 matrix `rows`, built at once (a ctypes cast a row
    costs more than the call that reads it); the result keeps `rows` alive."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    n, width = rows.shape
    fields = np.empty((n, 3), dtype=np.uint64)  # struct llama_embd {const float * data; size_t n_rows, n_embd;}
    fields[:, 0] = rows.ctypes.data + np.arange(n, dtype=np.uint64) * np.uint64(width * 4)
    fields[:, 1], fields[:, 2] = 1, width
    embds = (llama_cpp.llama_embd * n).from_buffer(fields)
    embds._keep = (rows, fields)
    return embds


class RowIO:
    """The head's rows in and out of llama.cpp, without a ctypes object made per row.

    In: llama.cpp copies a row's floats when it is added to a batch (llama_batch_ext_set_embd_token,
    _add_embd), so rows up to `rows` at a time are copied into a scratch matrix whose llama_embd
    structs are made once; more (a prompt's pairs) get structs made for them. Out: a numpy view of a
    buffer llama.cpp hands out (the target's captured rows, the head's g and logits) is made once per
    address and width, as wide as the most rows read there: a buffer is valid at the address
    llama.cpp gives for the rows it holds now, and only those are read."""

    MAX_VIEWS = 1024  # addresses remembered: the buffers' and each row's a pass reads by index

    def __init__(self, width: int, rows: int):
        self.width = width
        self._scratch = np.zeros((rows, width), dtype=np.float32)
        embds = embd_rows(self._scratch)
        self._embds = [embds[i] for i in range(rows)]  # each struct points at its scratch row for good
        self._views: dict[tuple[int, int], np.ndarray] = {}
        self.pos = llama_cpp.llama_pos(0)  # llama_batch_ext_set_pos copies the position it is pointed at
        self.pos_ref = ctypes.pointer(self.pos)

    def embds(self, rows) -> Sequence:
        """A llama_embd for each of `rows` (float32 rows `width` wide: a matrix, or a list of rows),
        valid until the next call."""
        n = len(rows)
        if n > len(self._embds):
            return embd_rows(rows if isinstance(rows, np.ndarray) else np.stack(rows))
        scratch = self._scratch
        if isinstance(rows, np.ndarray):
            scratch[:n] = rows
        else:
            for i, row in enumerate(rows):
                scratch[i] = row
        return self._embds

    def view(self, address: int | None, n: int, width: int) -> np.ndarray | None:
        """The n × width float32 rows at `address` (None where llama.cpp gave none), not copied."""
        if not address:
            return None
        rows = self._views.get((address, width))
        if rows is None or len(rows) < n:
            if len(self._views) >= self.MAX_VIEWS:
                self._views.clear()
            rows = np.frombuffer((ctypes.c_float * (n * width)).from_address(address), np.float32)
            rows = self._views[address, width] = rows.reshape(n, width)
        return rows[:n]
