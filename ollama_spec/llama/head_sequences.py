"""One sequence of an EAGLE-3 head as the proposer drafts with it, the head as -k auto's calibration
times it, and the head's part of a slot's prefix kept in host RAM (engine/slots.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# Each class here takes the llama/eagle3.py Eagle3Head it belongs to, typed Any: eagle3.py imports this
# module, and the package graph keeps modules out of circles, annotations included.
Eagle3Head = Any


class HeadSequence:
    """One sequence of the head, as the EAGLE-3 proposer (decoding/) drafts with it: `begin`, then
    each draft step is an evaluation of one token (`eval`, or the step loop's pass of every drafting
    sequence: `model` and `seq` name it), then `finish`."""

    def __init__(self, head: Eagle3Head, seq: int):
        self.model, self.seq, self.n_vocab = head, seq, head.n_vocab

    def begin(self, n_tokens: int, window: int = 0) -> bool:
        return self.model.begin(self.seq, n_tokens, window)

    def idle(self, n_tokens: int, steps: int, keep: int) -> None:
        self.model.idle(self.seq, n_tokens, steps, keep)

    def eval(self, tokens: Sequence[int], *, logits: str | int = "last") -> np.ndarray:
        """The logits after drafting `tokens` (one token: the text's last, or the last draft)."""
        return self.model.decode_many([(self.seq, tokens, self.model.rows_asked(tokens, logits))])[0]

    def start(self, n_tokens: int, last_token: int) -> np.ndarray | None:
        """The first draft's logits after a text of `n_tokens + 1` tokens whose first `n_tokens` the
        target holds; None when the head has nothing to draft from there."""
        return self.eval([last_token])[-1] if self.begin(n_tokens) else None

    def step(self, token: int) -> np.ndarray:
        """The logits after drafting `token`."""
        return self.eval([token])[-1]

    def finish(self, n_tokens: int) -> None:
        self.model.drafted(self.seq, n_tokens)


class HeadCalibration:
    """The head as -k auto's calibration times a draft model (engine/calibration.py): a one-token
    `eval` is one draft step at the boundary of sequence 0 of the target, `truncate` drops it."""

    def __init__(self, head: Eagle3Head):
        self.head, self.path = head, head.path
        self.settings, self.n_vocab = head.settings, head.n_vocab  # its rows, as a draft model's (k_policy)

    def eval(self, tokens: Sequence[int], *, logits: str | int = "last") -> np.ndarray | None:
        if len(tokens) != 1:  # the head read the context beside the target already
            return None
        return self.head.sequence(0).start(self.head.target.n_past, tokens[0])

    def truncate(self, n_tokens: int) -> None:
        self.head.drafted(0, n_tokens)


class HeadSlots:
    """The head as the slot pool saves and restores a slot's prefix (engine/slots.SlotModel): its
    cells and the g rows it drafts from come back with the target's, so a restored chat drafts as
    well as before. The pool restores the target first (which empties the head's sequence)."""

    def __init__(self, head: Eagle3Head):
        self.head = head

    def cached_of(self, seq: int) -> list[int]:
        return self.head.target.cached_of(seq)  # the head's pairs read the target's tokens

    def save_sequence(self, seq: int) -> bytes:
        return self.head.save_state(seq)

    def expect_save(self, seq: int, most: int) -> None:
        """Nothing made ready: a head's state is written to fresh memory when saved."""

    def drop_save(self, seq: int) -> None:
        """As `expect_save`."""

    def restore_sequence(self, seq: int, state: bytes, tokens: Sequence[int]) -> bool:
        return self.head.restore_state(seq, state)

    def clear_sequence(self, seq: int) -> None:
        self.head.truncated(seq, 0)
