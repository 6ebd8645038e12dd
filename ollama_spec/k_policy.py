"""How many tokens to draft each step: a fixed K, or the K that a measured cost model says is fastest.

The best K depends on the hardware more than on the pair: a GPU verifies K+1 tokens for about the
price of one, a CPU pays more for every token in the batch. With α the probability that a tried
draft token is accepted, a step that drafts K tokens emits E(α, K) = (1 − α^(K+1)) / (1 − α)
tokens and costs K draft steps plus one target batch of K+1 tokens, so

    tokens per second(K) = E(α, K) / (K · t_draft + t_verify(K+1)),

and K = 0 (the target alone, t_verify(1) per token) is the answer when the draft does not pay.
`AutoK` keeps α and the costs up to date from the steps it sees and picks K before each step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

# α before anything is seen: a well-matched pair accepts 60-85 % of tried drafts.
PRIOR_ALPHA = 0.7
PRIOR_WEIGHT = 4.0  # as many tried tokens as the prior counts for
ALPHA_DECAY = 0.95  # per step: α follows the last ~20 steps (easy and hard stretches differ)
COST_DECAY = 0.8  # per observation: step times follow the context depth and the machine's load
PROBE_EVERY = 8  # while K = 0 wins, still draft one token every few steps to keep α current
# While learning costs: every so many drafting steps try a neighbouring K (one more, then one fewer),
# so that its cost is measured again too. Otherwise a calibration that made K+1 look dear (a busy
# moment, a stale cache) would never be corrected: only the costs of the Ks tried are updated.
EXPLORE_EVERY = 8


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Mean tokens emitted per target pass: accepted drafts plus the target's own token."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"acceptance must be in [0, 1], got {alpha}")
    if alpha == 1:
        return float(k + 1)  # the limit of the geometric sum
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def estimate_alpha(accepted: int, rejections: int) -> float | None:
    """α as the formula defines it: accepted / tried, where the drafts after a rejection were never tried.

    accepted / drafted understates it, more so as K grows. None when nothing was tried.
    """
    tried = accepted + rejections
    return accepted / tried if tried else None


@dataclass(frozen=True)
class StepCosts:
    """Seconds for one draft step and for target batches of 1..k_max+1 tokens (verify[n-1]: n tokens)."""

    draft_step_s: float
    verify_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.verify_s or self.draft_step_s < 0 or min(self.verify_s) <= 0:
            raise ValueError("step costs must be positive")

    @property
    def k_max(self) -> int:
        return len(self.verify_s) - 1

    def tokens_per_second(self, alpha: float, k: int) -> float:
        return expected_tokens_per_step(alpha, k) / (k * self.draft_step_s + self.verify_s[k])


def best_k(alpha: float, costs: StepCosts) -> int:
    """The K in 0..k_max with the most expected tokens per second (the smaller K on a tie)."""
    return max(range(costs.k_max + 1), key=lambda k: (costs.tokens_per_second(alpha, k), -k))


class KPolicy(Protocol):
    """What the loop asks before each step and tells after it."""

    def next_k(self) -> int: ...
    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None: ...


@dataclass
class FixedK:
    k: int

    def next_k(self) -> int:
        return self.k

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        pass


class AlphaEstimator:
    """Exponentially weighted counts of accepted and rejected tried drafts."""

    def __init__(self, prior: float = PRIOR_ALPHA, weight: float = PRIOR_WEIGHT, decay: float = ALPHA_DECAY):
        self.accepted, self.rejected, self.decay = prior * weight, (1 - prior) * weight, decay

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.accepted = self.decay * self.accepted + accepted
            self.rejected = self.decay * self.rejected + (accepted < drafted)

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)


class AutoK:
    """Picks K before each step from a live α and step costs seeded by calibration.

    With `learn_costs` the step times it sees refine the costs too. That makes K depend on the
    clock, and a sampled text on K (the random draws fall differently), so a run with a fixed seed
    keeps the calibrated costs: the same seed then writes the same text.
    """

    def __init__(self, costs: StepCosts, prior_alpha: float = PRIOR_ALPHA, *, learn_costs: bool = True):
        self.costs = costs
        self.learn_costs = learn_costs
        self.estimator = AlphaEstimator(prior_alpha)
        self._steps_without_draft = 0
        self._drafting_steps = 0

    def next_k(self) -> int:
        k = best_k(self.estimator.alpha, self.costs)
        if k == 0:
            self._steps_without_draft += 1
            if self._steps_without_draft >= PROBE_EVERY:
                return 1
            return 0
        self._drafting_steps += 1
        if self.learn_costs and self._drafting_steps % EXPLORE_EVERY == 0:
            neighbour = k + 1 if (self._drafting_steps // EXPLORE_EVERY) % 2 else k - 1
            if 1 <= neighbour <= self.costs.k_max:
                return neighbour
        return k

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        self.estimator.observe(drafted, accepted)
        if drafted:
            self._steps_without_draft = 0
        if not self.learn_costs:
            return
        if drafted:
            draft_step = _blend(self.costs.draft_step_s, draft_s / drafted)
        else:
            draft_step = self.costs.draft_step_s
        verify = list(self.costs.verify_s)
        if drafted < len(verify):
            verify[drafted] = _blend(verify[drafted], verify_s)
        self.costs = replace(self.costs, draft_step_s=draft_step, verify_s=tuple(verify))


def _blend(old: float, new: float) -> float:
    return COST_DECAY * old + (1 - COST_DECAY) * new if new > 0 else old
