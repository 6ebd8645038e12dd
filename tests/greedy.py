"""Greedy identity as `bench` and `generate --compare` judge it: equal, or parted at a near-tie.

A batch of K+1 tokens and a single token sum in different orders, and so does another CPU: where
the target's two best logits are closer than NEAR_TIE_LOGITS, either may win. Tests that demand
token identity use this rule so that they fail on a verification error, never on rounding.
"""

from __future__ import annotations

from ollama_spec.engine.engine import NEAR_TIE_LOGITS, Engine, Request


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where a and b differ (or where the shorter one ends); None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def assert_greedy_identical(engine: Engine, request: Request, expected: list[int], got: list[int]) -> None:
    """`got` equals the target's greedy `expected`, or parts from it where rounding explains it.

    At the first difference the target's top two (as the request chooses: its penalties and grammar
    applied) must be within NEAR_TIE_LOGITS, or the target itself must pick `got`'s token there in a
    batch of 2..K+1 (a quantized model's batch kernels round by up to a tenth of a logit, as the verify
    batch does); after it the outputs continue from different texts and are not compared.
    """
    at = first_difference(expected, got)
    if at is None:
        return
    prompt = engine.prompt_tokens(request)
    tokens = expected[: at + 1] if at < len(expected) else [*expected, got[at]]
    gap = engine.greedy_margins(prompt, tokens, request=request)[at]
    if gap < NEAR_TIE_LOGITS:
        return
    if (
        at < len(expected)
        and at < len(got)
        and engine.chosen_in_a_batch(prompt, tokens, at, got[at], request=request) is not None
    ):
        return
    raise AssertionError(
        f"greedy outputs differ at token {at} of {len(expected)} where the target's logits are {gap:.4f} apart "
        f"(a near-tie is < {NEAR_TIE_LOGITS}) and no batch explains it: {expected[at : at + 3]} expected, "
        f"{got[at : at + 3]} produced"
    )
