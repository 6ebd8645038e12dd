"""What a lone rule's whole steps at each K took, by the step loop's clock: the price of a K it ran lately.

The step loop prices each pass (decoding/pass_prices.py) and a step at K is modelled as K draft passes
and one target pass of K+1 tokens. On a pair whose passes take well under a millisecond that model
misses what a whole step really costs: llama.cpp builds its graph again for every pass whose shape
differs from the pass before it (on the tiny pair, 1 thread: a target pass 60-90 us dearer, a draft
pass 27-30 us), and a step at K >= 2 changes its draft passes' shape twice (the first reads the last
step's bonus token beside its draft, the rest one token) where one at K=1 mostly never does; the draft
pass's price, the fastest of its recent passes, is its cheap same-shape kind. Priced by its passes, a
step at K=3 was 413 us where it took 430-470, at K=1 223 us where a fixed K=1 step took 160-170: the
rule drafted 2-4 deep where K=1 made 1.2-1.4x the tokens a second.

So each K a lone rule drafted lately is priced by the second fastest of its last RECENT_STEPS whole
steps as timed (its draft passes, its verify pass and the Python between them: the generation's own
clock in the step loop), once MIN_STEPS of them ran in the last STALE_STEPS steps; the other Ks by the
passes' model, scaled as the Ks run compare with it (`priced`), and the shallower ones never run are
tried once (`tried`). Every step at a K pays that K's graph builds and Python, so the second fastest
of five is its cost as it runs, where three descheduled steps (a busy machine: only ever too slow)
move nothing; the fastest alone would be one lucky step.

The target alone (K=0) is priced apart: it has no draft pass and none of the drafting Python, so how
the drafting steps compare with the model says nothing of it, and while a rule drafts its one-token
pass is never timed (the passes' model then prices it from the K+1-token passes it did time: with
Llama 3's 128,256-token vocabulary on a toy pair, 7-14 ms where it took 3.6). Priced by the drafting
steps' ratio, it looked 2-3x dearer than it ran and the rule drafted at 0.67x of the target alone. So
K=0 keeps a ratio of its own (1.0, the model's price, until its steps say otherwise), and a rule that
drafts tries it for TRY_STEPS steps once every FORGET_STEPS (from ALONE_AFTER steps on), whatever the
model says of it.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ollama_spec.decoding.step_costs import StepCosts, expected_tokens_for_each_k

RECENT_STEPS = 5  # a K's price: the second fastest of its last this many steps
MIN_STEPS = 3  # ... once this many ran (one or two steps' noise is no price)
STALE_STEPS = 256  # ... in the last this many steps of any K
# A K its steps have not priced is tried for this many steps (the first pays the change of K) where the
# model, scaled as the Ks run compare with it, puts it within TRY_WITHIN of the K drafted: once a process.
TRY_STEPS = MIN_STEPS + 1
TRY_WITHIN = 0.25
# A K's ratio to the model, and a try, are forgotten after this many steps without its steps lately: a
# ratio taken in a busy spell must not keep a K out for good (a try costs TRY_STEPS steps, ~0.4 % here).
FORGET_STEPS = 1024
# A probe at K=0 whose draft was accepted goes on at its K for TRY_STEPS steps (the first catches the
# draft up on what K=0 skipped) where that K's own steps are older than this: they then price it again.
# The price K=0 is left for stays while K=0 runs, and one taken in a busy moment kept the tiny pair (K=1
# 1.3x the target alone as it ran) at K=0 for 300-700 steps of 1,000, its probes unable to move it.
# The wait doubles after each re-measure, up to FORGET_STEPS, until the rule drafts again: where drafting
# does not pay (the tiny pair with its crafted EAGLE-3 head, whose catch-up reads every position K=0
# skipped) one every 64 steps made auto 0.97x the target alone against 1.01x without (3 runs each); with
# the back-off 1.00x against 1.02x (6 each), where the tiny draft pair kept its gain (0.855 against 0.833x
# K=1, 8 each).
REMEASURE_STEPS = 64
# K=0 is tried only once this many steps ran (the policies of one pair's requests carry them on): a short
# request keeps its drafts (a 6-token answer whose first 4 steps tried K=0 drafted nothing at all).
ALONE_AFTER = 64


@dataclass
class StepsByK:
    """Recent whole-step seconds of a lone rule by K (see the module)."""

    _recent: dict[int, tuple[deque[float], int]] = field(default_factory=dict)  # K: its steps, the step last run
    _now: int = 0  # steps seen
    _last: int | None = None  # the K of the step before
    # each K's steps against the passes' model when last run lately: how a K not run lately is priced
    _ratios: dict[int, tuple[float, int]] = field(default_factory=dict)  # K: the ratio, the step it was taken at
    _tried: dict[int, int] = field(default_factory=dict)  # Ks drafted or tried (`tried`): the step at
    _trying: tuple[int, int] | None = None  # a K being tried, and its steps still to run
    _in_trial: bool = False  # the step under way is a try's (`trial`), not the rule's own choice
    _remeasure_after: int = REMEASURE_STEPS  # the age of a K's steps that a probe prices again (`remeasure`)
    _remeasured_at: int = -FORGET_STEPS  # the step of the last re-measure
    _scan: bool = False  # new prices: look for a K to try

    def observe(self, k: int, seconds: float, counted: bool = True) -> None:
        """A step that drafted `k` tokens took `seconds`, its passes and the Python between them; not
        `counted`: its K was no rule's (a probe, a lookup), its time no step's at that K. Only a step at
        the K of the step before is kept: one at another pays that change (llama.cpp's graphs built for
        new shapes, and after K=0 the draft's catch-up on what it skipped), once, not at every step."""
        self._now += 1
        if counted and k and not self._in_trial:  # the rule drafts by its own choice: re-measures soon again
            self._remeasure_after = REMEASURE_STEPS
        self._in_trial = False
        steady, self._last = k == self._last, k if counted else None
        if counted and steady:
            self._keep(k, (seconds,))

    def observe_run(self, k: int, seconds_each: Sequence[float]) -> None:
        """`observe` of steps one after another at `k` (>= 1), each counted and none a try's, at once."""
        self._remeasure_after, self._in_trial = REMEASURE_STEPS, False
        if k != self._last:  # the first pays the change of K: not kept
            self._now, self._last, seconds_each = self._now + 1, k, seconds_each[1:]
            if not seconds_each:
                return
        self._now += 1
        self._keep(k, seconds_each)

    def _keep(self, k: int, seconds_each: Sequence[float]) -> None:
        """Keep steady steps at `k`, the first of them the step `_now` (its recent steps begun afresh where
        the last kept is older than STALE_STEPS); `_now` ends at the last."""
        entry = self._recent.get(k)
        recent = entry[0] if entry is not None and self._now - entry[1] <= STALE_STEPS else deque(maxlen=RECENT_STEPS)
        recent.extend(seconds_each)
        self._now += len(seconds_each) - 1
        self._recent[k] = (recent, self._now)

    def copy(self) -> StepsByK:
        """The same steps, kept on apart (a request's policy starting from the last one's)."""
        recent = {k: (deque(steps, maxlen=RECENT_STEPS), at) for k, (steps, at) in self._recent.items()}
        return StepsByK(
            recent,
            self._now,
            None,
            dict(self._ratios),
            dict(self._tried),
            _remeasure_after=self._remeasure_after,
            _remeasured_at=self._remeasured_at,
        )

    def tried(self, k: int, costs: StepCosts, alphas: Callable[[], Sequence[float]], whole: bool = True) -> int:
        """The K to draft where the rule drafts `k` at `costs` (as `priced`): a K not priced by its own
        steps yet whose rate there is within TRY_WITHIN of k's, for TRY_STEPS steps (looked for once a
        pricing), else k. Scaled by the Ks run, the model misprices a K whose steps differ from theirs
        (on the tiny pair, K=1 changes no draft pass's shape, K>=2 two a step): never run, its price
        would never be corrected, nor its rate be the best. K=0 is tried where none of those is, and
        whatever the model says (see the module); not `whole` (a rule weighing each token), K=0 only."""
        if self._trying is not None:
            return self.trial()
        if not self._scan:
            return k
        self._scan = False
        self._tried[k] = self._now
        if whole:  # a rule weighing each token drafts the margins' K: no neighbour of it to try
            expected = expected_tokens_for_each_k(alphas()[: costs.k_max])
            best = expected[k] / costs.step_s(k)
            for other in range(1, min(k + 2, len(expected))):  # shallower, or the next K up: a try costs little
                if self._untried(other) and expected[other] / costs.step_s(other) >= (1 - TRY_WITHIN) * best:
                    return self._try(other)
        # the target alone (see the module), against a K its own steps price: at a generation's first
        # steps, K=1 priced by K=2's ratio (three cold steps at 1.6x) lost to K=0, and the tiny pair (K=1
        # 1.28x the target alone) stayed at K=0 for 250 steps
        if self._untried(0) and self._now >= ALONE_AFTER and (self._fresh(k) or not whole):
            return self._try(0)
        return k

    def remeasure(self, k: int) -> None:
        """A probe drafted `k` and had it accepted: `k` for the next TRY_STEPS steps (`trial`) where its own
        steps are older than REMEASURE_STEPS, twice that after each such re-measure until the rule drafts
        again (see there). Too few of them to price it (fewer than MIN_STEPS steady ones), the last
        re-measure is what must be that old: at the tiny pair's first request two steady steps at K=1
        were no price, K=1 was priced by K=2's ratio (graphs built anew) and K=0 ran for ~60 steps."""
        entry = self._recent.get(k)
        # a K too few of whose steps ran for a price of their own: since the last re-measure
        last = entry[1] if entry is not None and len(entry[0]) >= MIN_STEPS else self._remeasured_at
        if self._trying is None and self._now - last > self._remeasure_after:
            self._trying, self._remeasured_at = (k, TRY_STEPS), self._now
            self._remeasure_after = min(2 * self._remeasure_after, FORGET_STEPS)

    @property
    def trying(self) -> bool:
        """A try (`tried`, `remeasure`) has steps still to run."""
        return self._trying is not None

    def trial(self) -> int:
        """The K being tried at this step (`tried`, `remeasure`); 0 where none is."""
        if self._trying is None:
            return 0
        k, left = self._trying
        self._trying = (k, left - 1) if left > 1 else None
        self._in_trial = True
        return k

    def _untried(self, k: int) -> bool:
        """Neither tried nor priced by its own steps within FORGET_STEPS."""
        return k not in self._tried and k not in self._ratios

    def _try(self, k: int) -> int:
        """`k` for this step and the next TRY_STEPS - 1."""
        self._tried[k] = self._now
        self._trying = (k, TRY_STEPS - 1)
        return k

    def _fresh(self, k: int) -> bool:
        """Is `k` priced by its own steps: MIN_STEPS of them in the last STALE_STEPS steps?"""
        entry = self._recent.get(k)
        return entry is not None and len(entry[0]) >= MIN_STEPS and self._now - entry[1] <= STALE_STEPS

    def priced(self, costs: StepCosts, whole: bool = True) -> StepCosts:
        """`costs` with each K run lately priced by its steps (its verify batch as what they took beyond
        its draft steps' price, so that step_s(K) is their second fastest). A K run before, not lately,
        keeps how its steps compared with the passes' model then (the model follows the machine's speed;
        the ratio, that K's own Python and graph builds) for FORGET_STEPS; a drafting K not run, the
        median ratio of the drafting Ks run lately (else of all): the model misses the same there, and a
        K priced cheaper than it runs would be drafted at once. K=0 only ever by its own (see the module).
        Not `whole` (a rule weighing each token: its steps' K is the margins', no K to price), K=0 only."""
        fresh = {k: sorted(recent)[1] for k, (recent, _) in self._recent.items() if k <= costs.k_max and self._fresh(k)}
        for k, seconds in fresh.items():
            self._ratios[k] = (seconds / costs.step_s(k), self._now)
        self._ratios = {k: r for k, r in self._ratios.items() if self._now - r[1] <= FORGET_STEPS}
        self._tried = {k: at for k, at in self._tried.items() if self._now - at <= FORGET_STEPS}
        self._scan = True
        if not self._ratios:
            return costs
        ratios = {k: ratio for k, (ratio, _) in self._ratios.items()}
        drafting = [ratios[k] for k in fresh if k] or [ratio for k, ratio in ratios.items() if k]
        scale = statistics.median(drafting) if drafting else 1.0
        d, verify = costs.draft_step_s, []
        for k, (v, ratio) in enumerate(zip(costs.verify_s, _ratio_of_each(ratios, scale, len(costs.verify_s)))):
            drafts = k * d
            seconds = fresh.get(k)
            verify.append(max(ratio * (drafts + v) if seconds is None else seconds, drafts + 0.5 * v) - drafts)
        return StepCosts(d, tuple(verify) if whole else (verify[0], *costs.verify_s[1:]))


def _ratio_of_each(ratios: dict[int, float], scale: float, sizes: int) -> list[float]:
    """How a step at each K below `sizes` compares with the passes' model: its own ratio; else, drafting, the
    nearest K's of its kind (K=1 changes no draft pass's shape, a deeper K two a step: see the module; the
    deeper of two as near), else `scale`; K=0 never by another's. On the tiny pair K=1's steps ran at 0.44x
    the model and K=2, 3 and 5 at 1.03-1.15x: K=4, never run, priced by K=1's ratio, looked the cheapest
    tokens and the rule drafted 4 deep where K=1 made 1.2x the tokens a second (fresh ratios: the median of
    the drafting Ks run lately). All at once, in one loop: a lone rule's pricing asks for every K up to
    K_max (16 on the tiny pair), each of them looked up alone was a third of its ~35 us."""
    deep = sorted(k for k in ratios if k > 1)
    each = [ratios.get(0, 1.0), ratios.get(1, scale)]
    for k in range(2, sizes):
        ratio = ratios.get(k)
        if ratio is None and not deep:
            ratio = scale
        elif ratio is None:  # k is none of them: the nearest below or above it
            i = bisect.bisect_left(deep, k)
            below, above = deep[i - 1] if i else None, deep[i] if i < len(deep) else None
            ratio = ratios[above if below is None or (above is not None and above - k <= k - below) else below]
        each.append(ratio)
    return each[:sizes]
