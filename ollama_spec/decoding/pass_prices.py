"""What a pass costs, learned online from the passes the step loop runs: the target's by tokens, the
draft's by rows.

A step of B slots at K is K draft passes of B rows and one target pass of B·(K+1) tokens; the step
loop times every pass it runs (engine/step_loop.py) and tells them here, so the K it chooses is priced
by what this machine does now. A calibration (or the costs a previous process saved) is only the
prior: its shape stands in for the sizes not seen yet, scaled by how the sizes that were seen
compare with it, so a calibration taken while the machine was busy does not outlive the first
passes, and a restart does not keep slow costs. Each size follows its last few passes (below); a size
not run in the last STALE_PASSES steps keeps its last price only as the machine has moved since (the
target's sizes seen then against those seen now), so that a size last run during a busy spell (a K the
loop left then) does not keep that spell's price while the machine is quiet again. A draft with no
pass seen lately is scaled as the target is: both run on the same machine.

A pass's price is what the loop's time between passes says it took (engine/step_loop.py): its decode
and the Python around it (a draft token sampled and weighed, a step verified and the next begun),
which a calibration, timing llama.cpp's calls alone, leaves out. On the tiny pair a draft token's
Python is about its decode: priced by the decode alone, a lone slot drafts 16 tokens where 3 pay.

A pass the process was descheduled in (a busy machine's other processes ran) takes many times its
price; such timings come now and then, and only ever too slow. A size's price is therefore the fastest
of its last RECENT passes, which one or two such passes do not move (the machine turning faster moves
it at the first pass, slower at the RECENT-th), and the first pass of a size with no price of its own
lately counts at most OUTLIER_FACTOR times what it was priced at (any faster is taken as timed): one
descheduled pass must not make a shape (a K) look dear and keep the loop from running it again.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import itemgetter

from ollama_spec.decoding.step_costs import OUTLIER_FACTOR, StepCosts

RECENT = 3  # a size's price: the fastest of its last this many passes (see the module)
STALE_PASSES = 16  # a size not run in this many steps (target passes) is priced as one never seen
# With no prior at all (no calibration yet), a target pass costs this much more per token than one
# of a single token (a CPU's kernels; a GPU's is near 0, and the first passes say which), and a draft
# pass this share of the target's (a draft is about a tenth of its target's size).
PRIOR_SLOPE = 0.1
# In the verify line (`PassPrices.step_costs`), a size not run lately weighs this much of one run lately.
STALE_WEIGHT = 0.2
PRIOR_DRAFT_SHARE = 0.1
# `step_costs` (a line through every size's price, ~20-60 us of Python) is worked out again once this many
# target passes ran since, and they took RECOST_S: a price follows ~10 of them. On the tiny pair (a step of
# 0.15-0.2 ms, a GPU's small pair alike) every 4th pass made the pricing and the lone rule's repricing
# that followed it about half of -k auto's Python a step; a demo pair's pass takes 10-60 ms.
RECOST_PASSES = 4
RECOST_S = 0.004
# A size with no price of its own rises from the sizes run lately as the prior rises, at this share of
# the prior's rise scaled to the machine's speed at least and at most (see PassPrices._unseen), once the
# sizes run lately span this ratio of the prior's price (two close sizes' noise says nothing of a slope).
RISE_BOUNDS = (0.25, 2.0)
RISE_SPAN = 1.5


def pass_seconds(prices: StepCosts, tokens: int) -> float:
    """A pass over `tokens` tokens by calibrated one-sequence costs: as timed up to the longest
    calibrated batch, then on the line through the upper half of the timed sizes (a CPU pays each
    token more, a GPU little)."""
    timed = prices.verify_s
    if tokens <= len(timed):
        return timed[max(tokens, 1) - 1]
    mid = len(timed) // 2
    slope = max(0.0, (timed[-1] - timed[mid]) / max(len(timed) - 1 - mid, 1))
    return timed[-1] + slope * (tokens - len(timed))


def least_squares(points: Iterable[tuple[float, float, float]]) -> tuple[float, float, float]:
    """The weighted least-squares line y = mean_y + slope·(x − mean_x) through (x, y, weight) points, in
    one pass over them: (mean_x, mean_y, slope); slope 0 where the xs do not spread."""
    sw = swx = swxx = swy = swxy = 0.0
    for x, y, w in points:
        sw += w
        swx += w * x
        swxx += w * x * x
        swy += w * y
        swxy += w * x * y
    spread = sw * swxx - swx * swx
    slope = (sw * swxy - swx * swy) / spread if spread > 1e-12 * sw * sw else 0.0
    return swx / sw, swy / sw, slope


@dataclass
class _BySize:
    """One model's pass seconds by size, each the fastest of its recent passes, and the target pass (the
    step) each size was last seen at."""

    _seen: dict[int, tuple[float, int]] = field(default_factory=dict)
    _recent: dict[int, deque[float]] = field(default_factory=dict)  # each size's last RECENT passes
    _scale: float | None = None  # worked out once between passes

    def observe(self, size: int, seconds: float, now: int, priced: float | None = None) -> None:
        """A pass of `size` took `seconds` at target pass `now`; `priced`: what the size was priced at,
        where it has no price of its own lately (its first pass is bounded by it, see the module)."""
        entry = self._seen.get(size)
        recent = self._recent.get(size)
        if entry is None or recent is None or now - entry[1] >= STALE_PASSES:
            if priced:  # only ever too slow: a faster first pass is the machine faster than priced
                seconds = min(seconds, OUTLIER_FACTOR * priced)
            recent = self._recent[size] = deque(maxlen=RECENT)
        recent.append(seconds)
        self._seen[size] = (min(recent), now)
        self._scale = None

    def recent(self, now: int) -> Iterable[tuple[int, float]]:
        """Each size run in the last STALE_PASSES target passes, and its price."""
        return ((size, s) for size, (s, at) in self._seen.items() if now - at < STALE_PASSES)

    def get(self, size: int, now: int) -> float | None:
        """The size's seconds, if it ran in the last STALE_PASSES target passes."""
        entry = self._seen.get(size)
        return entry[0] if entry is not None and now - entry[1] < STALE_PASSES else None

    def last(self, size: int) -> tuple[float, int] | None:
        """The size's seconds when it last ran, and the target pass that was, if it ran."""
        return self._seen.get(size)

    def forget_stale(self, now: int) -> None:
        self._seen = {size: entry for size, entry in self._seen.items() if now - entry[1] < STALE_PASSES}
        self._recent = {size: self._recent[size] for size in self._seen if size in self._recent}

    def scale(self, prior, now: int, otherwise: float = 1.0) -> float:
        """How the sizes seen lately compare with `prior` (`otherwise` where none was): the median ratio."""
        if self._scale is None:
            ratios = [s / prior(size) for size, s in self.recent(now)]
            self._scale = statistics.median(ratios) if ratios else 0.0
        return self._scale or otherwise

    def forget_scale(self) -> None:
        self._scale = None


@dataclass
class PassPrices:
    """The passes' seconds as learned (see the module); `prior`: one sequence's costs by size."""

    prior: StepCosts | None = None
    _target: _BySize = field(default_factory=_BySize)
    _draft: _BySize = field(default_factory=_BySize)
    _now: int = 0  # target passes seen: the clock that ages both models' sizes
    # the target's scale (the machine's speed) at the target passes it was worked out at: a stale
    # size's price moves as it has moved since
    _scales: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=4 * STALE_PASSES))
    # step_costs by (k_max, drafts): the target pass they were worked out at, the target's seconds by
    # then (`target_s`), and them
    _costs: dict[tuple[int, bool], tuple[int, float, StepCosts]] = field(default_factory=dict)
    target_s: float = 0.0  # the seconds of every target pass seen
    # target_pass by tokens since the last target pass (a step's plan and each of its draft passes ask)
    _priced: dict[int, float] = field(default_factory=dict)
    _prior_at: dict[int, float] = field(default_factory=dict)  # _target_prior by tokens, until the prior changes
    _rise: tuple[float, float, float] | None = None  # _unseen's line and floor, until the next target pass

    def observe(self, draft: bool, size: int, seconds: float) -> None:
        """A pass ran: the draft's over `size` rows, or the target's over `size` tokens (padding counted)."""
        if draft:
            priced = None if self.seen_lately(True, size) or not self._now else self.draft_pass(size)
            self._draft.observe(size, seconds, self._now, priced)
        else:
            priced = None if self.seen_lately(False, size) or not self._now else self.target_pass(size)
            self._now += 1
            self.target_s += seconds
            self._priced.clear()
            self._rise = None
            self._target.observe(size, seconds, self._now, priced)
            self._draft.forget_scale()  # the draft's scale follows the target's where it saw nothing lately

    def set_prior(self, prior: StepCosts) -> None:
        """A calibration (or the costs saved last time): the shape of the sizes not seen yet."""
        if prior != self.prior:
            self.prior = prior
            self._prior_at.clear()
            for model in (self._target, self._draft):  # the scales the stale sizes kept were of the old prior
                model.forget_scale()
                model.forget_stale(self._now)
            self._scales.clear()
            self._costs.clear()
            self._priced.clear()
            self._rise = None

    @property
    def known(self) -> bool:
        """Is there anything to price by: a prior, or a target pass seen?"""
        return self.prior is not None or self._now > 0

    def seen_lately(self, draft: bool, size: int) -> bool:
        """Has a pass of this size (the draft's rows, or the target's tokens) run in the last STALE_PASSES
        target passes, so that its price is its own as the machine runs now?"""
        return (self._draft if draft else self._target).get(size, self._now) is not None

    def target_pass(self, tokens: int) -> float:
        price = self._priced.get(tokens)
        if price is None:
            price = self._target.get(tokens, self._now)
            if price is None:
                price = self._moved(self._target.last(tokens)) or self._unseen(tokens)
            self._priced[tokens] = price
        return price

    def draft_pass(self, rows: int) -> float:
        seen = self._draft.get(rows, self._now) or self._moved(self._draft.last(rows))
        if seen is not None:
            return seen
        # with a prior, scaled as the target's is where the draft ran nothing lately; without, its prior
        # is already a share of the target's as seen
        otherwise = self._target.scale(self._target_prior, self._now) if self.prior is not None else 1.0
        return self._draft_prior(rows) * self._draft.scale(self._draft_prior, self._now, otherwise)

    def step_costs(self, k_max: int, drafts: bool = True) -> StepCosts:
        """One sequence's draft step and target passes of 1..k_max+1 tokens, as learned; `drafts`
        False: proposals that cost no draft pass (a lookup in the text). The same object until
        RECOST_PASSES target passes ran and took RECOST_S (the first pass seen included)."""
        at, seconds, costs = self._costs.get((k_max, drafts), (-1, 0.0, None))
        if costs is not None and (
            at == self._now or (0 < at and (self._now < at + RECOST_PASSES or self.target_s - seconds < RECOST_S))
        ):
            return costs
        # the machine's speed now, noted for the sizes that go stale later (once a pricing: working it out
        # at every step was 5 us of the tiny pair's 0.25 ms steps, and a note every 4 passes places as well)
        self._target_scale()
        draft = self.draft_pass(1) if drafts else 0.0
        costs = StepCosts(draft, self._verify_line(k_max + 1))
        self._costs[(k_max, drafts)] = (self._now, self.target_s, costs)
        return costs

    def _verify_line(self, sizes: int) -> tuple[float, ...]:
        """Target passes of 1..`sizes` tokens on the line a + b·tokens (b ≥ 0) through their prices, the
        sizes run lately weighing most. Each size's price is learned from the few passes of its own that
        a shared CPU times ±10-30 %: per size, one soon looks cheaper than a smaller one (on the tiny
        pair, 4 tokens at 0.098 ms against 0.131 for 1), which a lone slot's K rule reads as drafts that
        cost nothing, and it drafts 16 where drafting does not pay at all. The target alone is its own
        price (run lately, else as the machine moved since it ran), unless the line says dearer: while
        a lone slot drafts 4-6 tokens the line runs through those few close sizes, and their noise
        (a rise of 10 us a token seen as 60-80) put its foot at a third of the target alone's price,
        where drafting looked no faster than the target alone."""
        now, last = self._now, self._target.last
        points = []
        fresh_floor = stale_floor = float("inf")
        for x in range(1, sizes + 1):
            if (seen := last(x)) is not None and now - seen[1] < STALE_PASSES:  # its own price, run lately
                y = seen[0]
                fresh_floor = min(fresh_floor, y)
                points.append((x, y, 1.0))
                continue
            y = self._moved(seen) if seen is not None else None  # (never run: it has not moved)
            if y is None:
                y = self._unseen(x)
            stale_floor = min(stale_floor, y)
            points.append((x, y, STALE_WEIGHT))
        mean_x, mean_y, slope = least_squares(points)
        slope = max(0.0, slope)
        # no pass at under half the cheapest run lately (the line's foot, bent by a few far sizes, is no price)
        floor = 0.5 * (fresh_floor if fresh_floor < float("inf") else stale_floor)
        line = [max(mean_y + slope * (x - mean_x), floor) for x in range(1, sizes + 1)]
        line[0] = max(line[0], points[0][1])
        return tuple(line)

    def _unseen(self, tokens: int) -> float:
        """A target size with no price of its own: the prior's price at the machine's speed now, or where
        the sizes run lately span enough of the prior, on the line a + b·prior through them. A calibration
        times llama.cpp's calls alone; the passes as the loop prices them carry the Python around them,
        about the same at every size (on the tiny pair most of a pass): scaled by a ratio, the prior's
        rise with the tokens would be that ratio too steep, and every drafting shape too dear. b stays
        within RISE_BOUNDS of the scale, so two noisy sizes do not make the rise free or a cliff."""
        if self._rise is None:  # worked out once a target pass: the verify line asks for every unseen size
            scale = self._target_scale()
            self._rise = (0.0, scale, RISE_BOUNDS[0] * scale)
            seen = [(self._target_prior(size), s, 1.0) for size, s in self._target.recent(self._now)]
            xs = [x for x, _, _ in seen]
            if len(seen) >= 2 and max(xs) >= RISE_SPAN * min(xs):
                mean_x, mean_y, slope = least_squares(seen)
                slope = min(max(slope, RISE_BOUNDS[0] * scale), RISE_BOUNDS[1] * scale)
                self._rise = (mean_y - slope * mean_x, slope, RISE_BOUNDS[0] * scale)
        base, slope, least = self._rise
        prior = self._target_prior(tokens)
        return max(base + slope * prior, least * prior)

    def _target_scale(self) -> float:
        """How the target's sizes seen lately compare with its prior: the machine's speed now (noted
        in `_scales` each time it is worked out afresh)."""
        fresh = self._target._scale is None
        scale = self._target.scale(self._target_prior, self._now, otherwise=0.0)
        if fresh and scale:
            self._scales.append((self._now, scale))
        return scale or 1.0

    def _moved(self, last: tuple[float, int] | None) -> float | None:
        """A size not run lately, `last` its price when it last ran and the target pass that was
        (`_BySize.last`): that price as the machine's speed has moved since (the target's scale now
        against then); None where it never ran, or no scale was noted by then."""
        if last is None:
            return None
        seconds, at = last
        noted = bisect.bisect_right(self._scales, at, key=itemgetter(0))  # the last noted by then
        then = self._scales[noted - 1][1] if noted else None
        return seconds * self._target_scale() / then if then else None

    def _target_prior(self, tokens: int) -> float:
        price = self._prior_at.get(tokens)
        if price is None:
            # with no prior, a shape only: scaled by the passes seen
            price = pass_seconds(self.prior, tokens) if self.prior is not None else 1.0 + PRIOR_SLOPE * (tokens - 1)
            self._prior_at[tokens] = price
        return price

    def _draft_prior(self, rows: int) -> float:
        # the draft's pass grows with its rows as the target's does: both mostly read their weights
        if self.prior is not None:
            return self.prior.draft_step_s * pass_seconds(self.prior, rows) / self.prior.verify_s[0]
        return PRIOR_DRAFT_SHARE * self.target_pass(rows)
