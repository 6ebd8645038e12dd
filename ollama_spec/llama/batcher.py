"""One llama.cpp pass for every slot: the evaluations that slot threads ask for, gathered into one batch.

Each running request has its own thread, its own sequence in both models' caches and its own
draft/verify loop (decoding/loop.py, unchanged). When every slot that has joined is waiting for an
evaluation, the waiting evaluations of one model run as one llama_decode (padded to one shape, so
that each slot's rows are the ones it gets alone: passes.py): the slots draft their next token
together, then verify together, as llama-server's slots do. Draft batches go first: a slot still
drafting would otherwise hold up the verify pass of the others.

A thread that has not joined (a single request, calibration, the CLI) evaluates directly.

Every batch runs on one thread of the batcher's own, not on the slot thread that arrived last:
llama.cpp's CPU threads are OpenMP's, which keeps a team of workers for each thread that calls it,
and a team's workers spin for a while after its batch, on the cores the next caller's team needs.
Run by whichever slot came last, a 4x1 batch of the tiny nested pair took 1.6 ms instead of the
0.52 it takes alone, and four slots of the synth pair at K=5 made 127 tok/s in process, not 139-142.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
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
    own_seconds: float = 0.0  # its tokens' part of the time of the batch it ran in


@dataclass(frozen=True)
class Pass:
    """One batch as it ran: which model (its index in StepBatcher.models), how many sequences, how many
    tokens and logits rows in all, the most tokens of one sequence (the others' are padded up to it:
    passes.py), and its seconds."""

    model: int
    sequences: int
    tokens: int
    rows: int
    widest: int
    seconds: float


LINE_DECAY = 0.98  # per batch: the fit follows the last ~50 batches of a model


class _BatchLine:
    """A model's batch seconds as a + c·tokens, fitted to its batches, to split each batch's time
    between the slots in it: the fixed part a (reading the weights) in equal shares, the part c·n
    that a slot's n tokens add to it. A slot's step then costs it what one more token really adds
    (its K policy's question), not the batch's average per token, which carries a share of a too."""

    def __init__(self) -> None:
        self._sums = np.zeros(5)  # Σw, Σw·n, Σw·n², Σw·t, Σw·n·t

    def split(self, seconds: float, tokens: Sequence[int]) -> list[float]:
        total = sum(tokens)
        self._sums = LINE_DECAY * self._sums + np.array([1.0, total, total * total, seconds, total * seconds])
        w, wn, wnn, wt, wnt = self._sums
        spread = w * wnn - wn * wn
        per_token = (w * wnt - wn * wt) / spread if spread > 1e-9 * w * w else 0.0
        # never more than the batch's own seconds, nor less than nothing (a fit off on a noisy machine)
        per_token = min(max(per_token, 0.0), seconds / total)
        fixed = (seconds - per_token * total) / len(tokens)
        return [fixed + per_token * n for n in tokens]


@dataclass
class StepBatcher:
    """Gathers the evaluations of the slot threads that joined; `models` in the order their batches run."""

    models: list[BatchModel]
    decodes: int = 0  # batches run (the tests read it)
    # when a list: every batch run, as a Pass (bench's ceiling is priced from them)
    passes: list[Pass] | None = None
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _joined: set[int] = field(default_factory=set)  # thread ids
    _pending: dict[int, list[_Wanted]] = field(default_factory=dict)  # by model index
    _others: dict[int, float] = field(default_factory=dict)  # by thread id: see others_seconds
    _lines: dict[int, _BatchLine] = field(default_factory=dict)  # by model index
    _runner: ThreadPoolExecutor = field(  # the one thread that runs every batch (see the module's docstring)
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="ollama-spec-batch")
    )

    def close(self) -> None:
        """Stop the batch thread (once the slots have left)."""
        self._runner.shutdown(wait=True)

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

    def others_seconds(self) -> float:
        """Seconds this thread has spent on the other slots: waiting while their work ran, and their
        tokens' part of the batches its own ran in. A slot's K policy times its steps without them:
        what it decides is what its own tokens cost, and with four slots a step's wall time is
        mostly the others' (timed whole, a verify batch of 4 tokens read as 200 ms, not 40)."""
        return self._others.get(threading.get_ident(), 0.0)

    def evaluate(self, model: BatchModel, seq: int, tokens: Sequence[int], n_rows: int) -> np.ndarray:
        """`model`'s logits rows for `tokens` appended to sequence `seq`, in the next batch of its kind."""
        wanted = _Wanted(seq, list(tokens), n_rows)
        started = time.perf_counter()
        with self._cond:
            self._pending.setdefault(self.models.index(model), []).append(wanted)
            self._run_ready()
            while not wanted.done:
                self._cond.wait()
            waited = time.perf_counter() - started
            me = threading.get_ident()
            self._others[me] = self._others.get(me, 0.0) + max(0.0, waited - wanted.own_seconds)
        if wanted.error is not None:
            raise wanted.error
        return wanted.rows

    def _run_ready(self) -> None:
        """With the lock held: while every joined slot waits, run the first model's waiting batch.

        The thread that arrived last has the batch thread run it, and waits under the lock: nobody
        else could use the contexts meanwhile anyway, since every slot is waiting."""
        while (waiting := sum(map(len, self._pending.values()))) and waiting >= len(self._joined):
            index = min(self._pending)
            batch = self._pending.pop(index)
            started = time.perf_counter()
            try:
                items = [(w.seq, w.tokens, w.n_rows) for w in batch]
                rows = self._runner.submit(self.models[index].decode_many, items).result()
                for wanted, result in zip(batch, rows):
                    wanted.rows = result
            except BaseException as exc:  # noqa: BLE001 - each slot raises it in its own thread
                for wanted in batch:
                    wanted.error = exc
            elapsed = time.perf_counter() - started
            line = self._lines.setdefault(index, _BatchLine())
            for wanted, seconds in zip(batch, line.split(elapsed, [len(w.tokens) for w in batch])):
                wanted.own_seconds = seconds
            self.decodes += 1
            if self.passes is not None:
                tokens, rows = sum(len(w.tokens) for w in batch), sum(w.n_rows for w in batch)
                widest = max(len(w.tokens) for w in batch)
                self.passes.append(Pass(index, len(batch), tokens, rows, widest, elapsed))
            for wanted in batch:
                wanted.done = True
            self._cond.notify_all()
