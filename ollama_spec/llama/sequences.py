"""One sequence of a loaded model, as the draft/verify loop sees a model (decoding.proposers.Model).

Each slot of `serve --parallel N` runs the loop unchanged over views of sequence i of the target
and of the draft. A view evaluates through the model's StepBatcher when its thread has joined one
(the slots' evaluations then run as one batch), else directly. Everything else (the vocabulary,
token text) is the model's own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np


class SequenceView:
    def __init__(self, model: Any, seq: int):
        self.model, self.seq = model, seq
        self.n_ctx, self.n_vocab = model.n_ctx, model.n_vocab

    @property
    def cached(self) -> list[int]:
        return self.model.cached_of(self.seq)

    @property
    def n_past(self) -> int:
        return len(self.model.cached_of(self.seq))

    def eval(self, tokens: Sequence[int], *, logits: str | int = "last") -> np.ndarray:
        batcher = self.model.batcher
        if batcher is None or not batcher.joined():
            return self.model.eval(tokens, logits=logits, seq=self.seq)
        n_rows = self.model.rows_asked(tokens, logits, self.seq)
        return batcher.evaluate(self.model, self.seq, tokens, n_rows)

    def clock(self) -> float:
        """A clock for this slot's own steps: the time spent on the other slots' work does not run."""
        return time.perf_counter() - self.others_seconds()

    def others_seconds(self) -> float:
        """What this slot's thread has spent on other slots' work so far (StepBatcher.others_seconds)."""
        batcher = self.model.batcher
        return batcher.others_seconds() if batcher is not None else 0.0

    def truncate(self, n_tokens: int) -> None:
        # No batch runs meanwhile while this slot has joined (one runs only while every joined slot,
        # this one too, waits in eval), but another slot may be cutting its own cells right now, and
        # llama.cpp's cache is not safe to cut from two threads at once (a segfault in the tests):
        # one cut at a time, under the lock batches run under.
        batcher = self.model.batcher
        if batcher is None:
            self.model.truncate(n_tokens, self.seq)
            return
        with batcher.exclusive():
            self.model.truncate(n_tokens, self.seq)

    def __getattr__(self, name: str) -> Any:  # tokenize, token_piece, vocab, add_bos, ...
        return getattr(self.model, name)
