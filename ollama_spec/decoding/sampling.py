"""Sampling settings and the pure helpers that turn logits into the distribution we sample from.

Draft and target go through the same `logits_to_probs`, so rejection sampling compares the
distributions that are actually sampled (DESIGN.md). Order as in llama.cpp's default chain:
logit bias and penalties first (penalties.py, applied to rows by the loop: they depend on the text
before each row), then top-k, top-p and min-p cut on the untempered softmax, then temperature
reshapes what is left.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ollama_spec.decoding.penalties import Penalties
from ollama_spec.errors import InvalidSetting

# Ollama's defaults, so a model behaves here as it does under `ollama run`.
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.9
DEFAULT_MIN_P = 0.0


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K  # 0: off
    top_p: float = DEFAULT_TOP_P  # 1.0: off
    min_p: float = DEFAULT_MIN_P  # 0.0: off
    seed: int | None = None  # None or negative: a random seed
    penalties: Penalties = Penalties()  # logit bias and repetition penalties, applied first (greedy too)

    def __post_init__(self) -> None:
        if self.seed is not None and self.seed < 0:
            # Ollama's params layers and clients send -1 for "random": do the same for any negative seed.
            object.__setattr__(self, "seed", None)
        if not self.temperature >= 0:
            raise InvalidSetting(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InvalidSetting(f"top-k must be >= 0 (0 turns it off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise InvalidSetting(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise InvalidSetting(f"min-p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: np.ndarray, settings: SamplingSettings) -> np.ndarray:
    """One row of logits -> the probability vector that sampling uses (zeros where cut)."""
    # Work on the top-k candidates only: sorting 40 values, not a 128k vocabulary, per row, and
    # only they are widened to float64 (the partition runs on llama.cpp's float32 row as it is).
    if 0 < settings.top_k < logits.size:
        ids = np.argpartition(logits, -settings.top_k)[-settings.top_k :]
    else:
        ids = np.arange(logits.size)
    values = logits[ids].astype(np.float64)
    if settings.top_p < 1 or settings.min_p > 0:
        probs = _softmax(values)
        keep = np.arange(ids.size)
        if settings.top_p < 1:
            order = np.argsort(-probs, kind="stable")
            # keep the smallest prefix whose mass reaches top_p (always at least one token)
            cut = int(np.searchsorted(np.cumsum(probs[order]), settings.top_p)) + 1
            keep = order[:cut]
        if settings.min_p > 0:
            keep = keep[probs[keep] >= settings.min_p * probs[keep].max()]
        ids, values = ids[keep], values[keep]
    out = np.zeros(logits.size)
    out[ids] = _softmax(values / settings.temperature)
    return out


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a probability vector."""
    cumulative = np.cumsum(probs)
    return int(min(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"), probs.size - 1))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x))
    return e / e.sum()


def token_logprobs(logits: np.ndarray, token: int, top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """`token`'s log-probability under the model's distribution (the softmax of its logits, before any
    sampling setting), and the `top` most likely tokens with theirs, best first."""
    finite = logits[np.isfinite(logits)]  # a grammar's mask leaves -inf where a token is forbidden
    peak = float(finite.max())
    log_total = peak + float(np.log(np.exp(finite.astype(np.float64) - peak).sum()))
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        ids = np.argpartition(logits, -top)[-top:] if top < logits.size else np.arange(logits.size)
        ids = ids[np.argsort(-logits[ids], kind="stable")]
        best = tuple((int(i), float(logits[i]) - log_total) for i in ids if np.isfinite(logits[i]))
    return float(logits[token]) - log_total, best
