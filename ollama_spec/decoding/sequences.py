"""The sequences a step works on: what the loop needs of a model, and the prefix two texts share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ollama_spec.errors import InferenceError

# What the draft reads in place of a target token it does not have (a padded id): any id works,
# since the draft only proposes and the target decides; 0 is a normal token in every vocabulary.
DRAFT_STAND_IN = 0


class Model(Protocol):
    """What the loop needs from a loaded model (runtime.LoadedModel provides it)."""

    n_past: int
    n_ctx: int
    n_vocab: int
    cached: Sequence[int]  # the token ids in its KV cache

    # logits: "last", "all" or the last n rows
    def eval(self, tokens: Sequence[int], *, logits: str | int = "last") -> np.ndarray: ...
    def truncate(self, n_tokens: int) -> None: ...


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens `a` and `b` share from their start."""
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def keep_common_prefix(model: Model, seq: Sequence[int]) -> int:
    """Cut the model's cache back to what it shares with `seq[:-1]`; return how many tokens that keeps.

    A recurrent model's cache cannot be cut, only emptied (or kept whole when all of it is shared).
    """
    n = common_prefix(model.cached[: model.n_past], seq[:-1])
    try:
        model.truncate(n)
    except InferenceError:
        model.truncate(0)
    return model.n_past  # a window cache cut back past the cells it reused keeps nothing


def as_draft_tokens(tokens: Sequence[int], n_vocab: int) -> list[int]:
    """Target tokens as the draft may read them: an id past its vocabulary becomes the stand-in."""
    return [token if token < n_vocab else DRAFT_STAND_IN for token in tokens]
