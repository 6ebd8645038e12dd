"""What a lone rule drafting whole Ks (its steps priced whole: decoding/step_prices.py) keeps from one
step to the next: the K it chose while nothing it chose by has moved, and how deep it drafts after a
step whose drafts were rejected early.

Steady: on the tiny pair (a step of 0.2 ms) the rule's Python was 13-17 us a step above a fixed K's,
6-7 % of a step. While its best drafting K is the one it chose by (worked out again every RECHOOSE_S of
steps, at new prices, after a probe) and no try is under way, the K is the one chosen then: taken up,
kept and tried gave it, and none of them moves without one of those. Tiny pair in process, auto ÷ K=1
over 14 alternated runs: 0.881 with it against 0.857 without.

Capped: the acceptance by position follows the text over ~20 steps, so a text the draft stops following
(the end of an answer, a quote it cannot guess) leaves the deep positions' acceptance at that of the
stretch before it. On the tiny pair, after 10 steps of 5 of 5 accepted, the rule drafted 10 tokens at
four steps in a row with none accepted, each 1 ms where a step at K=1 took 0.2. So after a step with
`a` drafts accepted the next drafts at most 2(a + 1): the best K up to there, deeper again as its drafts
are accepted (a step at 4 of 4 opens 10). Tiny pair in process, auto ÷ K=1 over 14 alternated runs:
0.875 with it against 0.842 without.

Standing: while the choice stands, nothing in a step that drafts it whole and has all its drafts
accepted (one drafted: any) can move the K, so such steps are held and observed later, in order, when
the stand ends: after STAND_STEPS of them, STAND_S of their time, or the first step that is not one
(`hold`, `AutoK.settle`). The rule is then asked again. The step loop reads only the clock meanwhile
and, where its pricing of the rule is due, takes the held steps in first (engine/batch_k.py). On the
tiny pair the bookkeeping between llama.cpp's passes runs from cold caches, ~25 us a step where the
same calls in a loop take 5. Measured in one process (a bench row made auto
with another stand, 10 processes of 8-9 rounds, auto ÷ K=1 by the medians): no stand 0.906, 16 steps
(8 ms) 0.924; 32 (16 ms) 0.947 beside 16's 0.925; 64 (32 ms) 0.946 beside 16's 0.945. A pair whose
steps take milliseconds holds none (STAND_STEP_S), and reacts as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ollama_spec.decoding.step_costs import StepCosts, best_drafting_k

STAND_STEPS = 32  # steps held at most before the rule is asked again (see the module)
STAND_S = 0.016  # ... and at most this much of their time: the rule reacts within it
# A step this long or longer is never held: ~25 us of bookkeeping is ~1 % of it, and a held step of
# milliseconds would keep the rule from seeing, say, that drafting does not pay for several of them
STAND_STEP_S = 0.002


@dataclass
class SteadyK:
    """The K a lone rule drafts while its choice stands, and the cap after a rejection (see the module)."""

    _chosen: tuple[tuple[int, float] | None, int] = (None, 0)  # the best drafting K it was chosen by, and the K
    _accepted: int | None = None  # drafts accepted at the last step that drafted
    k: int = 0  # the K standing, while the stand goes on (`stand`, fewer than STAND_STEPS held); 0: none
    # the steps held at it, not observed yet (drafted, accepted, draft seconds, verify seconds), their seconds
    _held: list[tuple[int, int, float, float]] = field(default_factory=list)
    _held_s: float = 0.0

    def same(self, drafting: tuple[int, float] | None) -> int:
        """The K chosen where `drafting` (the rule's best drafting K and its rate now) is what it was
        chosen by; 0 where it is not (worked out again since, or never)."""
        chosen_by, k = self._chosen
        return k if drafting is not None and chosen_by is drafting else 0

    def chose(self, drafting: tuple[int, float] | None, k: int) -> None:
        self._chosen = (drafting, k)

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted:
            self._accepted = accepted

    def capped(self, k: int, alphas: Callable[[], Sequence[float]], costs: StepCosts) -> int:
        """`k`, or the best K up to 2(a + 1) where the last drafting step had `a` drafts accepted."""
        if self._accepted is None or k <= (cap := 2 * (self._accepted + 1)):
            return k
        return max(1, best_drafting_k(alphas()[:cap], costs)[0])

    def stood(self, k: int, alphas: Callable[[], Sequence[float]], costs: StepCosts) -> int:
        """`capped(k)`; `k` uncapped, it stands: the steps at it are held (`hold`) until the stand ends."""
        capped = self.capped(k, alphas, costs)
        if capped == k:
            self.stand(k)
        return capped

    def stand(self, k: int) -> None:
        self.k = k

    @property
    def holds(self) -> bool:
        """Steps are held, and the stand goes on."""
        return self.k > 0 and bool(self._held)

    def hold(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> bool:
        """Hold a step, where the stand goes on and nothing in the step can move its K (see the module)."""
        step_s = draft_s + verify_s
        seconds, k = self._held_s + step_s, self.k
        if not k or drafted != k or (accepted < drafted and k > 1) or seconds >= STAND_S or step_s >= STAND_STEP_S:
            return False
        held = self._held
        held.append((drafted, accepted, draft_s, verify_s))
        self._held_s = seconds
        if len(held) >= STAND_STEPS:  # its last: the rule is asked again at the next step
            self.k = 0
        return True

    def settle(self) -> list[tuple[int, int, float, float]]:
        """The steps held, in order, to be observed now; the stand is over."""
        held, self.k = self._held, 0
        if held:
            self._held, self._held_s = [], 0.0
        return held
