"""What a speculative step costs and yields: the model that picks K, and the costs learned from timed steps.

The best K depends on the hardware more than on the pair: a GPU verifies K+1 tokens for about the
price of one, a CPU pays more for every token in the batch. With α the probability that a tried
draft token is accepted, a step that drafts K tokens emits E(α, K) = (1 − α^(K+1)) / (1 − α)
tokens and costs K draft steps plus one target batch of K+1 tokens, so

    tokens per second(K) = E(α, K) / (K · t_draft + t_verify(K+1)),

and K = 0 (the target alone, t_verify(1) per token) is the answer when the draft does not pay.
`k_policy.AutoK` keeps α and these costs up to date from the steps it sees and picks K before each step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from ollama_spec.decoding.k_tuning import DRAFT_GAIN_MARGIN, LOOKUP_GAIN_MARGIN, SWITCH_MARGIN, SWITCH_STEPS

COST_DECAY = 0.8  # per observation: step times follow the context depth and the machine's load
LINE_DECAY = 0.97  # per drafting step: the verify line follows the last ~30 steps


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
        return expected_tokens_per_step(alpha, k) / self.step_s(k)

    def step_s(self, k: int) -> float:
        """Seconds for a step that drafts k tokens."""
        return k * self.draft_step_s + self.verify_s[k]

    def added_verify_s(self, n: int, more: int) -> float:
        """What `more` tokens add to a verify batch of n; never negative (a dip in the curve is no saving
        to count on: the tokens before it still cost their rise)."""
        peaks = self._peaks
        last = len(peaks)
        return max(0.0, peaks[min(n + more, last) - 1] - peaks[min(n, last) - 1])

    @cached_property
    def _peaks(self) -> tuple[float, ...]:
        """The dearest verify batch of 1..n tokens, for each n (the K policy asks at every draft token)."""
        return tuple(itertools.accumulate(self.verify_s, max))


def best_k(alpha: float, costs: StepCosts) -> int:
    """The K in 0..k_max with the most expected tokens per second (the smaller K on a tie): the best
    drafting K where it beats the target alone. Every request's policy asks (`AutoK`): the expected tokens
    summed K by K, not the closed form 17 times (18 us of its 34)."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"acceptance must be in [0, 1], got {alpha}")
    k, rate = best_drafting_k([alpha] * costs.k_max, costs)
    return k if rate > 1.0 / costs.step_s(0) else 0


def expected_tokens_by_position(alphas: Sequence[float], k: int) -> float:
    """Mean tokens per target pass when position i's draft is accepted with probability alphas[i] given
    that those before it were: 1 + α0 + α0·α1 + ... (k terms after the 1)."""
    return expected_tokens_for_each_k(alphas[:k])[-1]


def expected_tokens_for_each_k(alphas: Sequence[float]) -> list[float]:
    """expected_tokens_by_position(alphas, k) for k = 0..len(alphas), summed in one pass."""
    expected, survival = [1.0], 1.0
    for alpha in alphas:
        survival *= alpha
        expected.append(expected[-1] + survival)
    return expected


def best_k_by_position(alphas: Sequence[float], costs: StepCosts, margin: float = 0.0) -> int:
    """best_k with an acceptance for each position (alphas[i]: the (i+1)-th drafted token's); 0 unless
    the best K beats the target alone by `margin` (0.1: 10 %)."""
    k, rate = best_drafting_k(alphas, costs)
    return k if beats_target_alone(rate, costs, margin) else 0


def best_drafting_k(alphas: Sequence[float], costs: StepCosts) -> tuple[int, float]:
    """The K ≥ 1 with the most expected tokens per second (the smaller K on a tie), and that rate;
    (0, 0.0) where nothing can be drafted."""
    expected = expected_tokens_for_each_k(alphas[: min(costs.k_max, len(alphas))])
    best, best_rate = 0, 0.0
    for k in range(1, len(expected)):
        rate = expected[k] / costs.step_s(k)
        if rate > best_rate:
            best, best_rate = k, rate
    return best, best_rate


@dataclass
class KeptK:
    """The K a lone rule drafts: the one it drafted at its last drafting step, unless the best K beats it
    by SWITCH_MARGIN or has been the best for SWITCH_STEPS drafting steps in a row. A change of K costs
    llama.cpp a graph rebuild once (k_tuning.SWITCH_MARGIN); a K a little better for good pays it."""

    last: int = 0
    pull: tuple[int, int] = (0, 0)  # another K, the best at the last drafting steps, and at how many in a row

    def choose(self, k: int, rate: float, alphas: Callable[[], Sequence[float]], costs: StepCosts) -> int:
        """The K to draft where the best is `k` at `rate` tokens a second (`alphas`: the acceptance by
        position, asked only where it stays at another K)."""
        last, (pulled_to, pulls) = self.last, self.pull
        if last and last != k and last <= costs.k_max:
            pulls = pulls + 1 if pulled_to == k else 1
            staying = expected_tokens_by_position(alphas(), last) / costs.step_s(last)
            if rate <= (1 + SWITCH_MARGIN) * staying and pulls < SWITCH_STEPS:
                self.pull = (k, pulls)
                return last
        self.last, self.pull = k, (0, 0)
        return k


def beats_target_alone(rate: float, costs: StepCosts, margin: float = 0.0) -> bool:
    """Are `rate` tokens per second more than the target alone's, and by `margin` (0.1: 10 %)?"""
    alone = 1 / costs.verify_s[0]
    return rate > alone and rate >= (1 + margin) * alone


def lookup_worth(alphas: Sequence[float], costs: StepCosts) -> int:
    """A lookup's length (up to len(alphas)) with the most expected tokens per second of verify batch,
    if that beats the target alone by LOOKUP_GAIN_MARGIN; else 0. Priced, not taken whenever a token
    is expected: on the quantized pair a batch of 6 costs 3 steps of the target alone, and lookups of 5
    at α ≈ 0.4 (the default prompts) lost 2-4 % against the target alone. The best drafting K, with
    drafting free: a lookup runs no draft step."""
    n, rate = best_drafting_k(alphas, replace(costs, draft_step_s=0.0))
    return n if beats_target_alone(rate, costs, LOOKUP_GAIN_MARGIN) else 0


def run_pays(
    costs: StepCosts, alphas: Sequence[float], rate: float, drafted: int, first_gain: float, draft_steps: int
) -> bool:
    """After `drafted` tokens of a step: does some run of tokens after them, the first accepted with
    probability `first_gain` and each next one with α given the last (`alphas`), add tokens at least
    as fast as `rate`, counting `draft_steps` draft steps before the first (0: its row is read) and its
    places in the verify batch? (AutoK.decide, token by token.)"""
    expected, survival = 0.0, first_gain
    for more in range(1, costs.k_max - drafted + 1):
        if more > 1:
            survival *= alphas[drafted + more - 1]
        expected += survival
        seconds = (more - 1 + draft_steps) * costs.draft_step_s + costs.added_verify_s(drafted + 1, more)
        if seconds <= 0 or expected / seconds >= rate:
            return True
    return False


def free_next(calibrated: Sequence[float], drafted: int) -> bool:
    """Does a verify batch with one more token than `drafted` cost no more, as calibrated (seconds by
    drafted tokens)? llama.cpp's CPU kernels split a batch unevenly: on the bench's 2-core CPU a batch of
    8 costs 2.0 target steps and one of 9 costs 1.9 (10 and 11: 2.2 and 2.1), in every run. A token whose
    draft step is already paid then costs nothing; the line a policy decides by smooths such bumps away."""
    nxt = drafted + 1
    return nxt < len(calibrated) and calibrated[nxt] <= calibrated[drafted]


def could_pay_at_all(costs: StepCosts) -> bool:
    """Would drafting beat the target alone by DRAFT_GAIN_MARGIN at these costs if every draft were accepted?"""
    _, rate = best_drafting_k([1.0] * costs.k_max, costs)
    return beats_target_alone(rate, costs, DRAFT_GAIN_MARGIN)


def worth_a_token(alphas: Sequence[float]) -> int:
    """A lookup's length without step costs: all of it, where at least one of its tokens is expected
    accepted; else 0."""
    return len(alphas) if expected_tokens_for_each_k(alphas)[-1] >= 2.0 else 0


class VerifyLine:
    """The seconds of a verify batch with k ≥ 1 drafted tokens as a line, a + b·k (b ≥ 0), fitted by
    least squares to the steps seen, each weighing LINE_DECAY of the next, with the calibration's
    sizes as the first points.

    Not one running cost per size: each is learned from single steps that a shared CPU times ±10 %,
    so one size soon looks a few percent dearer than the next and reads as a cliff to stop before
    (seen on the bench pair: a third of all steps stopping at K=3). A line has no cliffs, and every
    step refines it, whatever its K. The real curve's bumps (a batch of 8 can cost more than one of
    9) are not in the line; AutoK reads them from the calibration (`free_next`)."""

    def __init__(self, verify_s: Sequence[float]):
        self.k_max = len(verify_s) - 1
        # the calibration's sizes, each of weight 1, summed at once (an `add` each, with its numpy arrays,
        # was a third of a -k auto request's setup): Σw, Σw·k, Σw·k², Σw·t, Σw·k·t
        ks, ts = range(1, len(verify_s)), verify_s[1:]
        self._sums = np.array(
            [len(ts), sum(ks), sum(k * k for k in ks), sum(ts), sum(k * t for k, t in zip(ks, ts))], dtype=float
        )

    def add(self, k: int, seconds: float, decay: float = LINE_DECAY) -> None:
        self._sums = decay * self._sums + np.array([1.0, k, k * k, seconds, k * seconds])

    def verify_s(self) -> tuple[float, ...]:
        """The line at 1..k_max drafted tokens."""
        w, wk, wkk, wt, wkt = self._sums
        spread = w * wkk - wk * wk
        slope = max(0.0, (w * wkt - wk * wt) / spread) if spread > 1e-12 * w * w else 0.0
        intercept = (wt - slope * wk) / w
        return tuple(max(float(intercept + slope * k), 1e-9) for k in range(1, self.k_max + 1))


# One step's time may be far off its kind's (a pause of the process, another program's burst on a
# shared CPU): it moves the learned cost by at most this factor of what was expected. Unbounded, one
# 130 ms pause can make the target alone look 60x dearer than it is, and since only K=0 steps
# relearn that cost, K=0 would never be chosen again (and the cost would be saved for the next run).
OUTLIER_FACTOR = 2.0


def bounded(seconds: float, expected: float) -> float:
    """One timing, kept within OUTLIER_FACTOR of what was expected."""
    return min(max(seconds, expected / OUTLIER_FACTOR), expected * OUTLIER_FACTOR)


def blend(old: float, new: float) -> float:
    """A learned cost moved toward one new timing, bounded (a timing of 0 tells nothing)."""
    return COST_DECAY * old + (1 - COST_DECAY) * bounded(new, old) if new > 0 else old


def median_costs(pricings: Sequence[StepCosts]) -> StepCosts:
    """The costs each of `pricings` gives a draft step and each verify batch, as their median (the lower
    of the middle two, for an even count), up to the longest K_max all of them price: one pricing far
    off the others (a busy spell the passes were timed in) moves nothing."""
    if len(pricings) == 1:
        return pricings[0]
    low_middle = (len(pricings) - 1) // 2  # median_low's place (statistics' own checks took half the time)
    sizes = min(len(costs.verify_s) for costs in pricings)
    verify = tuple(sorted(size)[low_middle] for size in zip(*(costs.verify_s[:sizes] for costs in pricings)))
    return StepCosts(sorted(costs.draft_step_s for costs in pricings)[low_middle], verify)


def consistent(verify_s: tuple[float, ...]) -> tuple[float, ...]:
    """A batch of one token costs no more than one of two: a learned target-alone cost above that
    is an outlier, which would keep K=0 from ever being chosen (and so relearned)."""
    if len(verify_s) > 1 and verify_s[0] > verify_s[1]:
        return (verify_s[1], *verify_s[1:])
    return verify_s
