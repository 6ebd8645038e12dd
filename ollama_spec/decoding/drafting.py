"""Drafting token by token from a model's rows: greedy or sampled, under penalties and a grammar,
stopping where the K policy or the draft's confidence says (a draft model's and a head's alike)."""

from __future__ import annotations

from collections.abc import Callable, Generator

import numpy as np

from ollama_spec.decoding.evals import Declined, Eval
from ollama_spec.decoding.grammar import TokenGrammar
from ollama_spec.decoding.penalties import adjusted
from ollama_spec.decoding.sampling import SamplingSettings, logits_to_probs, sample

# Asked before each drafted token: (tokens drafted so far this step, the draft's margin p1 − p2 for
# the next one) -> take it?, and before each draft step past the first, with margin None -> run it?
# The K policy's keep_drafting.
KeepDrafting = Callable[[int, "float | None"], bool]


def following_rows(model: object, vocab: int) -> Callable[[int], Generator[Eval, object, np.ndarray | Declined]]:
    """The next row after each drafted token, from `model` (a draft model, a head): the steps of
    `following(token)` for draft_token_steps, its row cut to the `vocab` ids the target shares, or the
    driver's Declined as it came."""

    def following(token: int) -> Generator[Eval, np.ndarray | Declined, np.ndarray | Declined]:
        rows = yield Eval(model, [token])
        return rows if isinstance(rows, Declined) else rows[-1][:vocab]

    return following


def draft_token_steps(
    logits: np.ndarray,
    following: Callable[[int], Generator[Eval, np.ndarray | Declined, np.ndarray | Declined]],
    k: int,
    sampling: SamplingSettings,
    rng: np.random.Generator,
    keep_drafting: KeepDrafting | None,
    grammar: TokenGrammar | None,
    p_min: float,
    tail: list[int],
) -> Generator[Eval, np.ndarray, tuple[list[int], np.ndarray | None]]:
    """Draft up to k tokens from a model's first `logits`, each next row from the steps of
    `following(token)` (decoding/evals.py; a driver that declines the next step stops it, `Declined`):
    greedy or sampled as `sampling` says, under the penalties (over `tail`, the text's window) and
    the `grammar` (advanced as tokens are drafted), stopping where `keep_drafting` or `p_min` say."""
    penalties = sampling.penalties
    tokens: list[int] = []
    probs: list[np.ndarray] = []
    while True:
        if penalties.active:  # as the target's rows will be: proposals that follow them get accepted
            logits = adjusted(logits, [*tail, *tokens], penalties)
        if grammar is not None and not sampling.greedy:
            logits = grammar.mask(logits)
            if not np.isfinite(logits.max()):
                break
        q = None if sampling.greedy else logits_to_probs(logits, sampling)
        # Decide from the distribution alone, before sampling: a rule that looked at the sampled
        # token would keep tokens from q cut to its confident part while acceptance divides by q.
        if keep_drafting is not None or p_min > 0:
            best, margin = _top_prob_and_margin(logits) if q is None else _top_and_margin(q)
            if tokens and best < p_min:
                break
            if keep_drafting is not None and not keep_drafting(len(tokens), margin):
                break
        if q is None:
            token = int(logits.argmax()) if grammar is None else grammar.best(logits)
            if token is None:
                break
        else:
            token = sample(q, rng)
            probs.append(q)
        tokens.append(token)
        if grammar is not None:
            grammar.accept(token)
        if len(tokens) == k or (keep_drafting is not None and not keep_drafting(len(tokens), None)):
            break
        logits = yield from following(token)
        if isinstance(logits, Declined):
            del tokens[logits.keep :], probs[logits.keep :]
            break
    return tokens, np.array(probs) if probs else None


def _top_prob_and_margin(logits: np.ndarray) -> tuple[float, float]:
    """The softmax's largest probability and its lead over the second, without a copy of the vocabulary
    beyond one exp (~80 µs for 128k logits)."""
    best = int(logits.argmax())
    e = np.exp(logits - logits[best])
    total = float(e.sum())
    e[best] = 0.0
    return 1.0 / total, (1.0 - float(e.max(initial=0.0))) / total


def _top_and_margin(probs: np.ndarray) -> tuple[float, float]:
    best = int(probs.argmax())
    top = float(probs[best])
    return top, top - float(np.delete(probs, best).max(initial=0.0))
