"""What the K policy knows of acceptance: α over the recent steps, by the draft's margin, and by
position in the draft, each from exponentially weighted counts of tried drafts."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

# α before anything is seen: a well-matched pair accepts 60-85 % of tried drafts.
PRIOR_ALPHA = 0.7
PRIOR_WEIGHT = 4.0  # as many tried tokens as the prior counts for
ALPHA_DECAY = 0.95  # per step: α follows the last ~20 steps (easy and hard stretches differ)
# per step: the pair's α, over the last ~100 steps (a few answers), which a new answer starts from (`carried`).
# The last ~20 are one text's, often its end's: on the tiny pair one answer ended at α 0.31 (0.83 over the
# pair), and the next answers, other texts, started there at K=0, their α learned again from probes only.
PAIR_DECAY = 0.99
# Bands of the draft's margin (top-1 minus top-2 probability); each learns its own acceptance.
# Measured on the bench pair (1,280 tried drafts): 0.55, 0.80, 0.92, 0.99, 1.0 and 1.0 accepted.
MARGIN_EDGES = (0.02, 0.05, 0.1, 0.2, 0.4)
# What each band starts from: any draft is surer of the tokens it leads by more (real pairs accept
# less than the synthetic one at every margin; a few dozen drafts correct either).
MARGIN_PRIOR = (0.5, 0.65, 0.75, 0.85, 0.92, 0.97)
MARGIN_DECAY = 0.98  # per tried draft in a band: it follows the last ~50 of them


class AlphaEstimator:
    """Exponentially weighted counts of accepted and rejected tried drafts."""

    def __init__(self, prior: float = PRIOR_ALPHA, weight: float = PRIOR_WEIGHT, decay: float = ALPHA_DECAY):
        self.accepted, self.rejected, self.decay = prior * weight, (1 - prior) * weight, decay
        self.pair_accepted, self.pair_rejected = self.accepted, self.rejected  # over PAIR_DECAY's longer span

    def copy(self) -> AlphaEstimator:
        """The same counts, learned on apart."""
        other = AlphaEstimator.__new__(AlphaEstimator)
        other.accepted, other.rejected, other.decay = self.accepted, self.rejected, self.decay
        other.pair_accepted, other.pair_rejected = self.pair_accepted, self.pair_rejected
        return other

    def carried(self) -> AlphaEstimator:
        """A new answer's start: the pair's α (PAIR_DECAY), weighed as the recent counts are."""
        other, scale = self.copy(), (self.accepted + self.rejected) / (self.pair_accepted + self.pair_rejected)
        other.accepted, other.rejected = self.pair_accepted * scale, self.pair_rejected * scale
        return other

    def observe(self, drafted: int, accepted: int) -> None:
        self.observe_all(((drafted, accepted),))

    def observe_all(self, steps: Sequence[tuple[int, int]]) -> None:
        """`observe` of each step (drafted, accepted) in turn, in one loop."""
        decay, recent_a, recent_r = self.decay, self.accepted, self.rejected
        pair_a, pair_r = self.pair_accepted, self.pair_rejected
        for drafted, accepted in steps:
            if drafted:
                rejected = accepted < drafted
                recent_a, recent_r = decay * recent_a + accepted, decay * recent_r + rejected
                pair_a, pair_r = PAIR_DECAY * pair_a + accepted, PAIR_DECAY * pair_r + rejected
        self.accepted, self.rejected, self.pair_accepted, self.pair_rejected = recent_a, recent_r, pair_a, pair_r

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)


class AcceptanceByMargin:
    """α per band of the draft's margin: exponentially weighted accepted and tried counts in each."""

    def __init__(
        self, prior: tuple[float, ...] = MARGIN_PRIOR, weight: float = PRIOR_WEIGHT, decay: float = MARGIN_DECAY
    ):
        assert len(prior) == len(MARGIN_EDGES) + 1
        self.accepted, self.tried, self.decay = [a * weight for a in prior], [weight] * len(prior), decay

    def copy(self) -> AcceptanceByMargin:
        """The same counts, learned on apart (a request's policy starting from the last one's)."""
        other = AcceptanceByMargin.__new__(AcceptanceByMargin)
        other.accepted, other.tried, other.decay = list(self.accepted), list(self.tried), self.decay
        return other

    @property
    def bands(self) -> tuple[float, ...]:
        return tuple(a / t for a, t in zip(self.accepted, self.tried))

    @staticmethod
    def band(margin: float) -> int:
        return bisect.bisect_right(MARGIN_EDGES, margin)

    def alpha(self, margin: float) -> float:
        band = self.band(margin)
        return self.accepted[band] / self.tried[band]

    def observe(self, margins: list[float], accepted: int) -> None:
        """A step's drafted tokens, by margin: the first `accepted` were accepted, the next one was
        rejected (if drafted), and those after it were never tried."""
        for position, margin in enumerate(margins[: accepted + 1]):
            band = self.band(margin)
            self.accepted[band] = self.decay * self.accepted[band] + (position < accepted)
            self.tried[band] = self.decay * self.tried[band] + 1


class AcceptanceByPosition:
    """The chance that the draft at position i (0: the first of a step) is accepted given that those
    before it were, from exponentially weighted counts at each position.

    One α for every position overstates long drafts where acceptance falls along the draft (a draft
    that drifts from the target as it reads its own guesses) and understates them where it rises
    (the steps that reach far are the easy stretches). A position with few tried drafts leans on the
    pooled α, weighed as PRIOR_WEIGHT of them, so deep positions seldom reached are not guessed
    from two samples. Each position follows the text as fast as the pooled α does (ALPHA_DECAY)."""

    def __init__(self, decay: float = ALPHA_DECAY, weight: float = PRIOR_WEIGHT):
        self.accepted: list[float] = []
        self.tried: list[float] = []
        self.pair_accepted: list[float] = []  # the same counts over PAIR_DECAY's longer span
        self.pair_tried: list[float] = []
        self.decay, self.weight = decay, weight

    def copy(self) -> AcceptanceByPosition:
        """The same counts, learned on apart."""
        other = AcceptanceByPosition(self.decay, self.weight)
        other.accepted, other.tried = list(self.accepted), list(self.tried)
        other.pair_accepted, other.pair_tried = list(self.pair_accepted), list(self.pair_tried)
        return other

    def carried(self) -> AcceptanceByPosition:
        """A new answer's start: each position's acceptance as the pair's (PAIR_DECAY), weighed as the
        recent counts are."""
        other = self.copy()
        other.accepted = [a * t / pair_t for a, t, pair_t in zip(self.pair_accepted, self.tried, self.pair_tried)]
        return other

    def observe(self, drafted: int, accepted: int) -> None:
        """A step drafted `drafted` tokens and the first `accepted` were accepted; the one after them
        (if drafted) was tried and rejected, later ones were never tried."""
        self.observe_all(((drafted, accepted),))

    def observe_all(self, steps: Sequence[tuple[int, int]]) -> None:
        """`observe` of each step (drafted, accepted) in turn."""
        # every list a local, the pair's decay too: each step of each slot comes here (the tiny pair's at 8 slots)
        decay, pair_decay, seen = self.decay, PAIR_DECAY, self.accepted
        tried, pair_accepted, pair_tried = self.tried, self.pair_accepted, self.pair_tried
        for drafted, accepted in steps:
            for position in range(accepted + 1 if accepted < drafted else drafted):
                if position == len(tried):
                    seen.append(0.0)
                    tried.append(0.0)
                    pair_accepted.append(0.0)
                    pair_tried.append(0.0)
                hit = position < accepted
                seen[position] = decay * seen[position] + hit
                tried[position] = decay * tried[position] + 1
                pair_accepted[position] = pair_decay * pair_accepted[position] + hit
                pair_tried[position] = pair_decay * pair_tried[position] + 1

    def alpha(self, position: int, pooled: float) -> float:
        if position >= len(self.tried):
            return pooled
        return (self.accepted[position] + self.weight * pooled) / (self.tried[position] + self.weight)

    def alphas(self, n: int, pooled: float) -> list[float]:
        weight = self.weight
        lean = weight * pooled
        seen = [(a + lean) / (t + weight) for a, t in zip(self.accepted[:n], self.tried[:n])]
        return seen + [pooled] * (n - len(seen))
