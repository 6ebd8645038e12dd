"""Greedy identity as `bench` and `generate --compare` judge it: equal, or parted at a near-tie.

A batch of K+1 tokens and a single token sum in different orders, and so does another CPU: where
the target's two best logits are closer than NEAR_TIE_LOGITS, either may win. Tests that demand
token identity use this rule so that they fail on a verification error, never on rounding.
"""

from __future__ import annotations

import numpy as np

from ollama_spec.engine import NEAR_TIE_LOGITS, Engine, Request


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where a and b differ (or where the shorter one ends); None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def assert_greedy_identical(engine: Engine, request: Request, expected: list[int], got: list[int]) -> None:
    """`got` equals the target's greedy `expected`, or parts from it where the target's logits tie.

    At the first difference both tokens must score within NEAR_TIE_LOGITS in the target's own
    logits (when one output simply ends there, the target's top two must); after it the outputs
    continue from different texts and are not compared.
    """
    at = first_difference(expected, got)
    if at is None:
        return
    target = engine.target
    target.truncate(0)
    logits = target.eval(engine.prompt_tokens(request) + expected[:at])[-1]
    if at < len(expected) and at < len(got):
        gap = abs(float(logits[expected[at]] - logits[got[at]]))
    else:
        top2 = np.sort(logits)[-2:]
        gap = float(top2[1] - top2[0])
    assert gap < NEAR_TIE_LOGITS, (
        f"greedy outputs differ at token {at} of {len(expected)} where the target's logits are {gap:.4f} apart "
        f"(a near-tie is < {NEAR_TIE_LOGITS}): {expected[at:at + 3]} expected, {got[at:at + 3]} produced"
    )
