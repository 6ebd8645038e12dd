"""The two acceptance rules of speculative decoding, as pure functions over numpy arrays.

Both return (number of draft tokens accepted, the token the target adds after them). At
temperature 0 they give the same tokens: rejection sampling with one-hot p and q *is* greedy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ollama_spec.decoding.sampling import sample


def verify_greedy(draft_tokens: Sequence[int], target_logits: np.ndarray) -> tuple[int, int]:
    """Accept draft tokens while each equals the target's argmax; then emit the target's argmax.

    `target_logits` has len(draft_tokens) + 1 rows: row i scores position i of the draft.
    """
    choices = target_logits.argmax(axis=1)
    for i, token in enumerate(draft_tokens):
        if token != choices[i]:
            return i, int(choices[i])
    return len(draft_tokens), int(choices[len(draft_tokens)])


def verify_rejection(
    draft_tokens: Sequence[int], draft_probs: np.ndarray | None, target_probs: np.ndarray, rng: np.random.Generator
) -> tuple[int, int]:
    """Leviathan et al.'s rule: the output is distributed exactly as sampling the target alone.

    Row i of draft_probs (q) and target_probs (p) is the distribution at draft position i;
    target_probs has one extra row for the bonus token when every draft is accepted. q may be
    narrower than p (a draft vocabulary without the target's padding): ids past its end have q = 0.
    draft_probs None means every token was proposed with certainty (n-gram lookup: q one-hot).
    """
    if draft_probs is not None and len(draft_tokens) and draft_probs.shape[1] < target_probs.shape[1]:
        draft_probs = np.pad(draft_probs, ((0, 0), (0, target_probs.shape[1] - draft_probs.shape[1])))
    for i, token in enumerate(draft_tokens):
        p, q = target_probs[i, token], 1.0 if draft_probs is None else draft_probs[i, token]
        # q <= p: always accept; q > p: accept with probability p / q.
        if q <= p or rng.random() < p / q:
            continue
        # Rejected: sample from what the target wants and the draft under-proposed.
        if draft_probs is None:
            residual = target_probs[i].copy()
            residual[token] = 0.0  # max(0, p - one-hot)
        else:
            residual = np.maximum(target_probs[i] - draft_probs[i], 0.0)
        total = residual.sum()
        return i, sample(residual / total if total > 0 else target_probs[i], rng)
    return len(draft_tokens), sample(target_probs[len(draft_tokens)], rng)


def verify_sample_and_compare(
    draft_tokens: Sequence[int], target_probs: np.ndarray, rng: np.random.Generator
) -> tuple[int, int]:
    """The simpler lossless rule (llama-cpp-python's draft_model path): sample the target's own
    token at each position and accept the draft's only if they match. Same output distribution,
    lower acceptance when sampling: P(match) = sum(p*q) <= sum(min(p, q)). Kept as a reference.
    """
    for i, token in enumerate(draft_tokens):
        own = sample(target_probs[i], rng)
        if own != token:
            return i, own
    return len(draft_tokens), sample(target_probs[len(draft_tokens)], rng)
