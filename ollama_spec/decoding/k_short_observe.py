"""`AutoK`'s short ways to observe a step (decoding/k_policy.py): steps that cannot move most of what the
whole of `AutoK._observe` looks at, taken in with only what they move. On a pair whose steps take a fraction
of a millisecond (the tiny pair; a GPU's small pair) every step pays its bookkeeping, and between
llama.cpp's passes it runs from cold caches.

- Beside other slots, a step at the batch's K: none of its own costs, probes or tries.
- Alone, a step at K=0 that probed nothing: the rate, and the target alone's price where it learns it.
- The steps held while its K stood (decoding/k_steady.py), taken in at once where the stand ends: all at
  that K, none a probe's, a try's or a lookup's, the step loop pricing them (so no cost is learned from
  one). Their whole steps' times and the rate each run in a loop of their own, in the order the steps
  came: the rule ends as observing each step would have left it.

Every way leaves a step's acceptance (α, by position) unseen till it is read (`AutoK.alphas`, at each plan
of the batch's K beside others, every few steps; alone where the rule works its K out again), then takes
all of them in, in order, in one loop. Counted in instructions on scripts/bench_k_bookkeeping.py's scripts
(runs of the same code differ by up to ±3k): a lone step 73.5k (each held step through `_observe`) ->
58.9k (held steps at once) -> 58.5-59.3k (acceptance where read); 8 slots beside each other 269.7k ->
266-273k -> 261-262k a step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ollama_spec.decoding.acceptance import AcceptanceByMargin
from ollama_spec.decoding.k_steady import SteadyK
from ollama_spec.decoding.k_tuning import PROBE_EVERY, RATE_DECAY, RECHOOSE_S
from ollama_spec.decoding.step_costs import StepCosts, blend, consistent
from ollama_spec.decoding.step_prices import StepsByK


class ObservesShort:
    """The short ways (see the module), over the state `AutoK` keeps."""

    costs: StepCosts
    learn_costs: bool
    shared_k: int | None
    probing: str
    _unseen: list[tuple[int, int]]  # steps (drafted, accepted) not taken into the acceptance yet (AutoK.alphas)
    by_margin: AcceptanceByMargin
    observed: int
    last_drafted: int
    own_drafted: int
    _steady: SteadyK
    _steps: StepsByK
    _priced: bool
    _ruled: bool
    _taken_up: bool
    _remeasuring: int
    _drafting: tuple[int, float] | None
    _unchosen_s: float
    _alphas: list[float] | None
    _margins: list[float]
    _probe_every: int
    _probe_paid: bool
    _steps_without_draft: int
    _rate_tokens: float
    _rate_seconds: float
    _observe: Callable[[int, int, float, float], None]  # AutoK's whole body

    def _observe_beside(self, drafted: int, accepted: int) -> None:
        """`observe` of a step at the batch's K beside others, without the cases that cannot be its (none timed)."""
        self.observed, self.last_drafted, self.own_drafted, self._alphas = self.observed + 1, drafted, 0, None
        self._steady.observe(drafted, accepted)
        self._drafting, self._unchosen_s = None, 0.0
        self._unseen.append((drafted, accepted))  # taken in where read (AutoK.alphas: at each plan, beside others)
        if self._margins:
            self.by_margin.observe(self._margins[:drafted], accepted)
        self._probe_every, self._probe_paid, self._steps_without_draft = PROBE_EVERY, False, 0
        costs = self.costs  # costs.step_s(min(drafted, k_max)) written out: its calls were 3k instructions more
        k = drafted if drafted < len(costs.verify_s) else len(costs.verify_s) - 1
        self._rate_tokens = RATE_DECAY * self._rate_tokens + accepted + 1
        self._rate_seconds = RATE_DECAY * self._rate_seconds + k * costs.draft_step_s + costs.verify_s[k]

    def _observe_at_zero(self, verify_s: float) -> None:
        """`observe` of a step that drafted and probed nothing: only the rate moves, and the target alone's price
        where this policy learns it (most steps of a pair whose drafts do not pay: `observe` was 2-3 % of one)."""
        self.observed += 1
        self.last_drafted = self.own_drafted = 0
        verify = self.costs.verify_s
        self._rate_tokens = RATE_DECAY * self._rate_tokens + 1
        self._rate_seconds = RATE_DECAY * self._rate_seconds + verify[0]
        if self.learn_costs and self.shared_k is None and not self._priced:
            self.costs = replace(self.costs, verify_s=consistent((blend(verify[0], verify_s), *verify[1:])))

    def _observe_held(self, held: list[tuple[int, int, float, float]]) -> None:
        """The steps held while its K stood, in order, as `_observe` of each would (see the module)."""
        if not self._priced or self.probing or self._remeasuring or self._margins:  # not theirs alone: one by one
            for step in held:
                self._observe(*step)
            return
        k, accepted_each = held[0][0], [accepted for _, accepted, _, _ in held]
        self._steps.observe_run(k, [draft_s + verify_s for _, _, draft_s, verify_s in held])
        self._unseen += [(k, accepted) for accepted in accepted_each]
        step_s = self.costs.step_s(min(k, self.costs.k_max))  # as priced: the rate's, and RECHOOSE_S's
        tokens, seconds, unchosen, drafting = self._rate_tokens, self._rate_seconds, self._unchosen_s, self._drafting
        for accepted in accepted_each:
            unchosen += step_s
            if unchosen >= RECHOOSE_S or not self._taken_up:  # the best K is worked out again, soon
                drafting, unchosen = None, 0.0
            tokens, seconds = RATE_DECAY * tokens + accepted + 1, RATE_DECAY * seconds + step_s
        self._rate_tokens, self._rate_seconds, self._unchosen_s, self._drafting = tokens, seconds, unchosen, drafting
        self.observed, self.last_drafted, self.own_drafted = self.observed + len(held), k, k if self._ruled else 0
        self._alphas = None
        self._steady.observe(k, accepted_each[-1])
        self._probe_every, self._probe_paid, self._steps_without_draft = PROBE_EVERY, False, 0
