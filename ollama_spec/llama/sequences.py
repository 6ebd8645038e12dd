"""One sequence of a loaded model, as the draft/verify loop sees a model (decoding.proposers.Model).

Each slot of `serve --parallel N` runs the loop unchanged over views of sequence i of the target
and of the draft; the engine's step loop runs the evaluations the slots ask for as one pass a
model (engine/step_loop.py). Everything else (the vocabulary, token text) is the model's own.
"""

from __future__ import annotations

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
        return self.model.eval(tokens, logits=logits, seq=self.seq)

    def truncate(self, n_tokens: int) -> None:
        self.model.truncate(n_tokens, self.seq)

    def __getattr__(self, name: str) -> Any:  # tokenize, token_piece, vocab, add_bos, ...
        return getattr(self.model, name)
