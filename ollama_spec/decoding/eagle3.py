"""The EAGLE-3 proposer: a draft head that reads the target's own hidden states drafts the tokens.

The head (llama/eagle3.py) follows every target pass and cut by itself, so this proposer has nothing
to catch up on or roll back: a step starts from the g the head holds at the target's boundary,
completed with the text's last token, and drafts on the head's own pre-norm states; the head keeps
only what the target read. Its tokens come with their distributions (q), so verification is the
same as for a draft model: greedy, or rejection sampling at T > 0.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ollama_spec.decoding.proposers import Proposer, draft_tokens

HEAD = "eagle3"  # the source of its tokens (Proposer.source)


class HeadModel(Protocol):
    """One sequence of a loaded head, as llama.eagle3.HeadSequence provides it."""

    n_vocab: int

    def start(self, n_tokens: int, last_token: int) -> np.ndarray | None: ...
    def step(self, token: int) -> np.ndarray: ...
    def finish(self, n_tokens: int) -> None: ...


class Eagle3Proposer(Proposer):
    source = HEAD

    def __init__(self, head: HeadModel, target_vocab: int, draft_p_min: float = 0.0):
        self.head, self.draft_p_min = head, draft_p_min
        self.vocab = min(head.n_vocab, target_vocab)

    def propose(self, seq, k, sampling, rng, keep_drafting=None, grammar=None, probe=""):
        held = len(seq) - 1  # the loop's invariant: the target holds all of seq but its last token
        logits = self.head.start(held, seq[-1])
        if logits is None:
            return [], None
        state = grammar.copy() if grammar is not None else None  # drafted tokens advance a copy only
        penalties = sampling.penalties
        tail = list(penalties.window(seq)) if penalties.active else []
        following = lambda token: self.head.step(token)[: self.vocab]
        try:
            return draft_tokens(
                logits[: self.vocab], following, k, sampling, rng, keep_drafting, state, self.draft_p_min, tail
            )
        finally:
            self.head.finish(held)
            if state is not None:
                state.close()
