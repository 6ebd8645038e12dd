"""What the speculative loop asks of an output grammar (structured output), and the verify rows under one.

The engine passes llama/grammar.Grammar (llama.cpp's grammar sampler); the loop and the proposers
need only the calls below, so decoding/ imports no llama.cpp and is tested with any grammar.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class TokenGrammar(Protocol):
    """A grammar over a model's vocabulary, in the state after the tokens it has accepted."""

    def copy(self) -> TokenGrammar:
        """An independent copy in the same state (the draft drafts under one)."""

    def allows(self, token: int) -> bool: ...

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of one row of logits with -inf wherever the grammar forbids the token."""

    def best(self, logits: np.ndarray) -> int | None:
        """The highest-scoring allowed token (None: the grammar allows nothing here)."""

    def accept(self, token: int) -> None:
        """Advance past `token`, which must be allowed."""

    def close(self) -> None: ...


def masked_rows(grammar: TokenGrammar, drafted: list[int], logits: np.ndarray, *, greedy: bool) -> np.ndarray:
    """The verify rows as the grammar sees them: row i masked by the grammar after drafted[:i].

    Rows past the first drafted token the grammar forbids are left as they are: that token has
    probability 0 under the mask, so verification rejects it and never reads further. Greedy rows
    whose best token is allowed need no mask (their argmax is the same)."""
    rows = logits.copy()
    state = grammar.copy()
    try:
        for i in range(len(rows)):
            if not greedy or not state.allows(int(rows[i].argmax())):
                rows[i] = state.mask(rows[i])
            if i == len(drafted) or not state.allows(drafted[i]):
                break
            state.accept(drafted[i])
    finally:
        state.close()
    return rows
