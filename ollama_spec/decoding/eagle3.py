"""The EAGLE-3 proposer: a draft head that reads the target's own hidden states drafts the tokens.

The head (llama/eagle3.py) follows every target pass and cut by itself, so this proposer has nothing
to catch up on or roll back: a step starts from the g the head holds at the target's boundary,
completed with the text's last token, and drafts on the head's own pre-norm states; the head keeps
only what the target read. Each draft step is an evaluation yielded as a draft model's is
(decoding/evals.py), so the engine's step loop runs the steps of every drafting slot in one pass of
the head. Its tokens come with their distributions (q), so verification is the same as for a draft
model: greedy, or rejection sampling at T > 0.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ollama_spec.decoding.drafting import following_rows
from ollama_spec.decoding.evals import run_evals
from ollama_spec.decoding.proposers import PROBE_WINDOW, Proposer, draft_token_steps

HEAD = "eagle3"  # the source of its tokens (Proposer.source)


class HeadModel(Protocol):
    """One sequence of a loaded head, as llama.head_sequences.HeadSequence provides it: `begin` at the
    target's boundary (False: nothing to draft from there), then each draft step is an `eval` of one
    token (the text's last, then each drafted one), then `finish`."""

    n_vocab: int

    def begin(self, n_tokens: int, window: int = 0) -> bool: ...
    def idle(self, n_tokens: int, steps: int, keep: int) -> None: ...
    def eval(self, tokens: list[int], *, logits: str | int = "last") -> np.ndarray: ...
    def finish(self, n_tokens: int) -> None: ...


class Eagle3Proposer(Proposer):
    source = HEAD

    def __init__(self, head: HeadModel, target_vocab: int, draft_p_min: float = 0.0):
        self.head, self.draft_p_min = head, draft_p_min
        self.vocab = min(head.n_vocab, target_vocab)

    def reset(self, seq):
        self.head.idle(len(seq) - 1, 0, 0)  # a request follows every pass until its K policy says otherwise

    def idle(self, seq, steps):
        # the head follows only the passes a probe's window reads (and two more: a margin)
        self.head.idle(len(seq) - 1, steps, PROBE_WINDOW + 3)

    def propose(self, seq, k, sampling, rng, keep_drafting=None, grammar=None, probe=""):
        return run_evals(self.propose_steps(seq, k, sampling, rng, keep_drafting, grammar, probe))

    def propose_steps(self, seq, k, sampling, rng, keep_drafting=None, grammar=None, probe=""):
        held = len(seq) - 1  # the loop's invariant: the target holds all of seq but its last token
        # a probe reads at most PROBE_WINDOW of the pairs steps at K=0 left the head lacking (HeadModel.begin)
        if not self.head.begin(held, PROBE_WINDOW if probe else 0):
            return [], None
        state = grammar.copy() if grammar is not None else None  # drafted tokens advance a copy only
        penalties = sampling.penalties
        tail = list(penalties.window(seq)) if penalties.active else []

        following = following_rows(self.head, self.vocab)
        try:
            logits = yield from following(seq[-1])
            return (
                yield from draft_token_steps(
                    logits, following, k, sampling, rng, keep_drafting, state, self.draft_p_min, tail
                )
            )
        finally:
            self.head.finish(held)
            if state is not None:
                state.close()
