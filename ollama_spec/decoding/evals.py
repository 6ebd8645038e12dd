"""The evaluations a step asks for, as values: the step yields an `Eval` and gets its rows back.

A request's draft/verify step is a generator (`loop.generate_steps`, `Proposer.propose_steps`) that
never calls a model itself: it yields each evaluation it needs, and whoever drives it runs that
evaluation, alone (`run_evals`, `evaluated`) or in one llama.cpp pass with other requests' (the
engine's step loop). So one request's step and a batch of them are the same code, and a request is
plain state between its evaluations, not a thread.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Eval:
    """`tokens` appended to `model`'s sequence, and the logits rows `logits` asks for (Model.eval's:
    "last", "all" or the last n rows)."""

    model: Any  # decoding.proposers.Model
    tokens: Sequence[int]
    logits: str | int = "last"


@dataclass(frozen=True)
class Declined:
    """What a driver sends back for a draft step's Eval it chooses not to run (the step loop, stopping
    every slot's drafts together): drafting stops there, with the first `keep` tokens drafted."""

    keep: int


# A step: yields Evals (sent their rows back) and, for a token stream, the items it makes (sent None).
Steps = Generator[Any, "np.ndarray | None", R]


def run_evals(steps: Generator[Eval, np.ndarray, R]) -> R:
    """Drive steps that yield only Evals, each evaluated directly; their return value."""
    try:
        wanted = next(steps)
        while True:
            wanted = steps.send(wanted.model.eval(wanted.tokens, logits=wanted.logits))
    except StopIteration as done:
        return done.value


def evaluated(steps: Generator[Any, np.ndarray | None, None]) -> Iterator[Any]:
    """The items a token stream of steps yields, its Evals evaluated directly (a request alone)."""
    try:
        item = next(steps)
        while True:
            if isinstance(item, Eval):
                item = steps.send(item.model.eval(item.tokens, logits=item.logits))
            else:
                yield item
                item = next(steps)
    except StopIteration:
        return
    finally:
        steps.close()
