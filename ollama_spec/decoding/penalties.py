"""Logit bias and repetition penalties: the first links of llama.cpp's sampler chain.

They change a row of logits according to the text before it, so in a verify batch row i is
adjusted by the sequence plus the first i drafted tokens: exactly the text the target alone would
have read there, which keeps speculation lossless (greedy: the same argmax; sampling: the same
distribution). The draft adjusts its own rows the same way, so that its proposals follow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ollama_spec.errors import InvalidSetting

DEFAULT_REPEAT_LAST_N = 64  # Ollama's and llama.cpp's window
# The penalties' names as Ollama's options, params layers and Modelfiles give them (and our flags spell them)
OPTIONS = ("repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty")
MIN_REPEAT_PENALTY = 1e-3  # and its inverse the largest: a logit divided by 1e-300 is no longer a number


@dataclass(frozen=True)
class Penalties:
    """llama.cpp's `penalties` and `logit_bias` samplers (Ollama's options, OpenAI's parameters).

    The defaults change nothing."""

    repeat_penalty: float = 1.0  # > 1: logits of tokens in the window are divided (negative ones multiplied)
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N  # the window: the last n tokens of the text; -1 all of it, 0 none
    presence_penalty: float = 0.0  # subtracted once from each token in the window
    frequency_penalty: float = 0.0  # subtracted per occurrence in the window
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit); -inf bans it

    def __post_init__(self) -> None:
        if not self.repeat_penalty > 0:
            raise InvalidSetting(f"repeat_penalty must be > 0 (1 turns it off), got {self.repeat_penalty}")
        if not MIN_REPEAT_PENALTY <= self.repeat_penalty <= 1 / MIN_REPEAT_PENALTY:
            raise InvalidSetting(
                f"repeat_penalty must be in {MIN_REPEAT_PENALTY:g}..{1 / MIN_REPEAT_PENALTY:g} (1 "
                f"turns it off; past that the logits it touches overflow), got {self.repeat_penalty}"
            )
        if self.repeat_last_n < -1:
            raise InvalidSetting(
                f"repeat_last_n must be -1 (the whole text), 0 (off) or more, got {self.repeat_last_n}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            if not np.isfinite(getattr(self, name)):
                raise InvalidSetting(f"{name} must be a finite number, got {getattr(self, name)}")

    @property
    def active(self) -> bool:
        return bool(self.logit_bias) or (self.repeat_last_n != 0 and self.penalizes)

    @property
    def penalizes(self) -> bool:
        return self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def window(self, text: Sequence[int]) -> Sequence[int]:
        """The tokens the penalties look at: the last repeat_last_n of `text`."""
        if self.repeat_last_n == 0 or not self.penalizes:
            return ()
        return text if self.repeat_last_n < 0 else text[-self.repeat_last_n :]


def adjusted(row: np.ndarray, text: Sequence[int], penalties: Penalties) -> np.ndarray:
    """`row` (the logits that follow `text`) after logit bias, then penalties, as llama.cpp orders them;
    a new array, `row` is left as it is."""
    out = np.array(row, dtype=np.float32)
    for token, bias in penalties.logit_bias:
        if token < out.size:
            out[token] += bias
    window = [token for token in penalties.window(text) if token < out.size]
    if window:
        ids, counts = np.unique(np.asarray(window), return_counts=True)
        values = out[ids]
        with np.errstate(over="ignore"):  # a huge penalty takes a token to -inf: a ban, not a warning
            values = np.where(values <= 0, values * penalties.repeat_penalty, values / penalties.repeat_penalty)
            out[ids] = values - counts * penalties.frequency_penalty - penalties.presence_penalty
    return out


def adjusted_rows(rows: np.ndarray, text: Sequence[int], drafted: Sequence[int], penalties: Penalties) -> np.ndarray:
    """A verify batch's rows adjusted: row i follows `text` plus the first i drafted tokens."""
    tail = list(penalties.window(text))  # all a row's window can reach back to
    return np.stack([adjusted(row, [*tail, *drafted[:i]], penalties) for i, row in enumerate(rows)])
