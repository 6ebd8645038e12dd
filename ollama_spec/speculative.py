"""The draft-verify loop: one generator that the CLI, the server and the benchmark all consume."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .errors import InvalidSetting
from .sampling import SamplingSettings, logits_to_probs, sample
from .verify import verify_greedy, verify_rejection

DEFAULT_NUM_SPECULATIVE_TOKENS = 5


class Model(Protocol):
    """What the loop needs from a loaded model (runtime.LoadedModel provides it)."""

    n_past: int
    n_ctx: int
    cached: Sequence[int]  # the token ids in its KV cache

    def eval(self, tokens: Sequence[int], *, logits: str = "last") -> np.ndarray: ...
    def truncate(self, n_tokens: int) -> None: ...


@dataclass(frozen=True)
class SpeculationSettings:
    num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    # Stop drafting early when the draft's own probability for its token falls below this
    # (llama.cpp's --draft-p-min); 0 always drafts K tokens.
    draft_p_min: float = 0.0

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 1:
            raise InvalidSetting(f"-k/--num-speculative-tokens must be at least 1, got {self.num_speculative_tokens}")
        if not 0 <= self.draft_p_min < 1:
            raise InvalidSetting(f"--draft-p-min must be in [0, 1), got {self.draft_p_min}")


@dataclass
class SpeculationStats:
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0
    prompt_cached: int = 0  # prompt tokens the target already held from an earlier request
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    accepted_by_position: list[int] = field(default_factory=list)
    drafted_by_position: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_per_step(self) -> float:
        """Tokens emitted per target pass: accepted drafts plus the target's own token."""
        return self.generated / self.steps if self.steps else 0.0

    def record(self, n_drafted: int, n_accepted: int) -> None:
        self.steps += 1
        self.drafted += n_drafted
        self.accepted += n_accepted
        for position in range(n_drafted):
            if position == len(self.drafted_by_position):
                self.drafted_by_position.append(0)
                self.accepted_by_position.append(0)
            self.drafted_by_position[position] += 1
            self.accepted_by_position[position] += position < n_accepted


@dataclass(frozen=True)
class Token:
    id: int
    from_draft: bool


def generate_tokens(
    target: Model,
    draft: Model | None,
    prompt: Sequence[int],
    sampling: SamplingSettings,
    speculation: SpeculationSettings,
    stats: SpeculationStats | None = None,
) -> Iterator[Token]:
    """Yield the target's continuation of `prompt`, token by token, forever (the caller stops).

    Without a draft this is plain decoding with the target, the baseline. Invariant at the top
    of each step: both caches hold `seq[:-1]`, or less for the draft, which catches up first.
    Whatever the caches already hold of the prompt (an earlier turn of the same chat) is kept.
    """
    stats = stats if stats is not None else SpeculationStats()
    rng = np.random.default_rng(sampling.seed)
    seq = list(prompt)
    stats.prompt_cached = _keep_common_prefix(target, seq)
    if draft is not None:
        _keep_common_prefix(draft, seq)
    if len(seq) - 1 > target.n_past:
        target.eval(seq[target.n_past : -1])
    while True:
        room = target.n_ctx - len(seq)  # the verify batch caches seq[-1] and k drafts
        if room < 0:
            return  # context full: the caller reports it
        k = min(speculation.num_speculative_tokens, room) if draft is not None else 0
        start = time.perf_counter()
        drafted, draft_probs = _draft(draft, seq, k, sampling, speculation, rng) if k > 0 else ([], [])
        middle = time.perf_counter()
        logits = target.eval([seq[-1], *drafted], logits="all")
        if sampling.greedy:
            n_accepted, next_token = verify_greedy(drafted, logits)
        else:
            target_probs = np.stack([logits_to_probs(row, sampling) for row in logits])
            n_accepted, next_token = verify_rejection(drafted, np.array(draft_probs), target_probs, rng)
        stats.draft_seconds += middle - start
        stats.verify_seconds += time.perf_counter() - middle
        stats.record(len(drafted), n_accepted)

        # Roll back both caches to the accepted prefix: seq[:-1] stays the cached part.
        seq += [*drafted[:n_accepted], next_token]
        target.truncate(len(seq) - 1)
        if draft is not None:
            draft.truncate(min(draft.n_past, len(seq) - 1))
        stats.generated += n_accepted + 1
        for token in drafted[:n_accepted]:
            yield Token(token, from_draft=True)
        yield Token(next_token, from_draft=False)


def _keep_common_prefix(model: Model, seq: list[int]) -> int:
    """Cut the model's cache back to what it shares with `seq[:-1]`; return how many tokens that keeps."""
    cached, limit = model.cached, min(model.n_past, len(seq) - 1)
    n = 0
    while n < limit and cached[n] == seq[n]:
        n += 1
    model.truncate(n)
    return n


def _draft(
    draft: Model,
    seq: list[int],
    k: int,
    sampling: SamplingSettings,
    speculation: SpeculationSettings,
    rng: np.random.Generator,
) -> tuple[list[int], list[np.ndarray]]:
    """Propose up to k tokens with the draft; return them with the distributions they came from."""
    logits = draft.eval(seq[draft.n_past :])[-1]  # catch up on what the draft has not seen
    tokens: list[int] = []
    probs: list[np.ndarray] = []
    while True:
        if sampling.greedy:
            token = int(logits.argmax())
            confidence = _max_prob(logits) if speculation.draft_p_min > 0 else 1.0
        else:
            q = logits_to_probs(logits, sampling)
            token = sample(q, rng)
            probs.append(q)
            confidence = q[token]
        if tokens and confidence < speculation.draft_p_min:
            if probs:
                probs.pop()
            break
        tokens.append(token)
        if len(tokens) == k:
            break
        logits = draft.eval([token])[-1]
    return tokens, probs


def _max_prob(logits: np.ndarray) -> float:
    e = np.exp(logits - logits.max())
    return float(1.0 / e.sum())
