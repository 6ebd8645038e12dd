"""One llama.cpp pass for every slot: the evaluations that slot threads ask for, gathered into one batch.

Each running request has its own thread, its own sequence in both models' caches and its own
draft/verify loop (decoding/loop.py, unchanged). When every slot that has joined is waiting for an
evaluation, the waiting evaluations of one model run as one llama_decode: the slots draft their
next token together, then verify together, as llama-server's slots do. Draft batches go first: a
slot still drafting would otherwise hold up the verify pass of the others.

A thread that has not joined (a single request, calibration, the CLI) evaluates directly.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class BatchModel(Protocol):
    """What a batch runs on: a loaded model that evaluates several sequences in one pass."""

    def decode_many(self, items: Sequence[tuple[int, Sequence[int], int]]) -> list[np.ndarray]: ...


@dataclass
class _Wanted:
    seq: int
    tokens: list[int]
    n_rows: int
    rows: np.ndarray | None = None
    error: BaseException | None = None
    done: bool = False


@dataclass
class StepBatcher:
    """Gathers the evaluations of the slot threads that joined; `models` in the order their batches run."""

    models: list[BatchModel]
    decodes: int = 0  # batches run (the tests read it)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _joined: set[int] = field(default_factory=set)  # thread ids
    _pending: dict[int, list[_Wanted]] = field(default_factory=dict)  # by model index

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Run the body as one of the slots whose evaluations are batched together."""
        with self._cond:
            self._joined.add(threading.get_ident())
        try:
            yield
        finally:
            with self._cond:
                self._joined.discard(threading.get_ident())
                self._run_ready()  # the others may all be waiting on this one

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """No batch runs while the body does (batches run under this lock): for work on the caches
        by a thread that has not joined, such as saving a slot's cells."""
        with self._cond:
            yield

    def joined(self) -> bool:
        return threading.get_ident() in self._joined

    def evaluate(self, model: BatchModel, seq: int, tokens: Sequence[int], n_rows: int) -> np.ndarray:
        """`model`'s logits rows for `tokens` appended to sequence `seq`, in the next batch of its kind."""
        wanted = _Wanted(seq, list(tokens), n_rows)
        with self._cond:
            self._pending.setdefault(self.models.index(model), []).append(wanted)
            self._run_ready()
            while not wanted.done:
                self._cond.wait()
        if wanted.error is not None:
            raise wanted.error
        return wanted.rows

    def _run_ready(self) -> None:
        """With the lock held: while every joined slot waits, run the first model's waiting batch.

        The decode runs in the thread that arrived last, under the lock: nobody else could use the
        contexts meanwhile anyway, since every slot is waiting."""
        while (waiting := sum(map(len, self._pending.values()))) and waiting >= len(self._joined):
            index = min(self._pending)
            batch = self._pending.pop(index)
            try:
                rows = self.models[index].decode_many([(w.seq, w.tokens, w.n_rows) for w in batch])
                for wanted, result in zip(batch, rows):
                    wanted.rows = result
            except BaseException as exc:  # noqa: BLE001 - each slot raises it in its own thread
                for wanted in batch:
                    wanted.error = exc
            self.decodes += 1
            for wanted in batch:
                wanted.done = True
            self._cond.notify_all()
