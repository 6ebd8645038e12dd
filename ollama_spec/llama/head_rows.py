"""The EAGLE-3 head's rows as llama.cpp reads them, and a sequence's state as bytes (a slot's prefix in
host RAM keeps it)."""

from __future__ import annotations

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


def pack_state(state: _Sequence, cells: bytes) -> bytes:
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
