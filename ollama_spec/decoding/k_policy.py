"""How many tokens to draft each step: a fixed K, or the K that a measured cost model says is fastest.

The cost model and the costs as learned from timed steps are `step_costs`'s: K = 0 (the target alone) is the
answer when the draft does not pay. `AutoK` keeps α and the costs up to date from the steps it sees and picks K
before each step.

With a draft model it does better than one K per step: α is not the same for every token. How far the draft's best
token leads its second (the margin, p1 − p2) tells an easy token from a coin toss: on the bench pair a margin
under 0.02 is accepted 55 % of the time, over 0.2 always. So the draft keeps going while the next token, at the
acceptance its margin has earned so far, still pays for its draft step and its place in the verify batch at the
rate the steps achieve (`keep_drafting`, decoding/k_by_token.py), up to K_max: long drafts through easy text,
short ones where the draft hesitates (measured in docs/architecture.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import replace

from ollama_spec.decoding.acceptance import (
    PRIOR_ALPHA,
    PRIOR_WEIGHT,
    AcceptanceByMargin,
    AcceptanceByPosition,
    AlphaEstimator,
)
from ollama_spec.decoding.k_by_token import WeighsTokens
from ollama_spec.decoding.k_short_observe import ObservesShort
from ollama_spec.decoding.k_steady import SteadyK
from ollama_spec.decoding.k_tuning import (
    DRAFT_GAIN_MARGIN,
    DRAFT_KEEP_MARGIN,
    EXPLORE_EVERY,
    PRICINGS_KEPT,
    PROBE_ACCEPTANCE,
    PROBE_CEILING_EVERY,
    PROBE_COSTS,
    PROBE_EVERY,
    PROBE_EXPLORE,
    PROBE_MAX_EVERY,
    RATE_DECAY,
    RECHOOSE_S,
    SEEDED_WEIGHT,
    STOPS_MIN_DRAFT_S,
)
from ollama_spec.decoding.step_costs import (
    KeptK,
    StepCosts,
    VerifyLine,
    beats_target_alone,
    best_drafting_k,
    best_k,
    blend,
    bounded,
    consistent,
    could_pay_at_all,
    expected_tokens_per_step,
    lookup_worth,
    median_costs,
)
from ollama_spec.decoding.step_prices import StepsByK


class AutoK(WeighsTokens, ObservesShort):
    """Picks K before each step from a live α and step costs seeded by calibration.

    With `confidence_stops` (a draft model, which reports each token's margin) K is only the most
    it may draft; `keep_drafting` decides token by token. With `learn_costs` the step times it sees
    refine the costs too. That makes K depend on the clock, and a sampled text on K (the random
    draws fall differently), so a run with a fixed seed keeps the calibrated costs: the same seed
    then writes the same text.
    """

    _drafting: tuple[int, float] | None  # best_drafting_k now, until worked out again (observe)

    def __init__(
        self,
        costs: StepCosts,
        prior_alpha: float = PRIOR_ALPHA,
        *,
        learn_costs: bool = True,
        confidence_stops: bool = False,
        calibrated: StepCosts | None = None,
        stops_min_draft_s: float = STOPS_MIN_DRAFT_S,
    ):
        self._line = VerifyLine(costs.verify_s)
        # per batch size as timed, with the kernels' own bumps (see step_costs.free_next); `costs` may be a learned line
        self._calibrated = (calibrated or costs).verify_s
        # what it decides by: the draft step and the target alone as calibrated, the batches as a line
        self.costs = replace(costs, verify_s=consistent((costs.verify_s[0], *self._line.verify_s())))
        self.learn_costs, self.confidence_stops = learn_costs, confidence_stops
        self.stops_min_draft_s = stops_min_draft_s  # weighs token by token from this draft step (k_tuning)
        self._estimator, self._by_position = AlphaEstimator(prior_alpha), AcceptanceByPosition()
        self.by_margin = AcceptanceByMargin()
        # steps (drafted, accepted) not taken into α and the acceptance by position yet: only `alphas` reads those,
        # beside others at each plan of the batch's K (every few steps), so they are taken in then, in one go
        self._unseen: list[tuple[int, int]] = []
        self._steps_without_draft, self._probe_every, self._probe_paid = 0, PROBE_EVERY, False  # paid: probe at once
        self.probing = ""  # this step drafts one token only to see whether drafting pays again (KPolicy)
        self._drafting_steps, self._drafting, self._unchosen_s = 0, None, 0.0  # the seconds since: RECHOOSE_S
        self._remeasuring = 0  # the K of a step that prices it again after a probe (step_prices.remeasure)
        self._taken_up = False  # its rule drafted at the last step it chose (a probe's step is not)
        self._kept, self._steady = KeptK(), SteadyK()  # the K its rule drafted last (step_costs, k_steady)
        self._by_token = self.weighs_tokens(self.costs)  # tokens weighed one by one (keep_drafting), as costs move
        # The rate (tokens per second of modelled step cost) a further draft token must beat, seeded
        # by the best fixed K's: the ratio of decayed sums, so a slow step weighs by its length.
        k = max(1, best_k(prior_alpha, self.costs))
        self._rate_tokens = PRIOR_WEIGHT * expected_tokens_per_step(prior_alpha, k)
        self._rate_seconds = PRIOR_WEIGHT * costs.step_s(k)
        self._draft_steps = 0  # this step's: the first, which reads the last accepted token, and each one asked for
        self._margins: list[float] = []  # this step's drafted tokens' margins
        self._survival = 1.0  # the chance that every token drafted so far this step is accepted
        self._stopping = False  # this step drafts token by token, by margin
        self._explore = ""  # "armed", "take", "done": a step going one token past the margins' stop; "": none
        self.shared_k: int | None = None  # beside others, the step's K: the step loop's (batch_k); None: its own rule
        self.exploring = False  # alone, this step's shared_k is the step loop's exploration (PROBE_EXPLORE)
        self._priced = False  # the step loop prices the steps (reprice): nothing to learn from step times
        self._priced_by: StepCosts | None = None  # the costs `reprice` was last given
        self._pricings: deque[StepCosts] = deque(maxlen=PRICINGS_KEPT)  # the last ones, for their median
        self._steps = StepsByK()  # priced, alone: its whole steps as timed, by K (decoding/step_prices.py)
        self.observed = 0  # steps seen (the batch's K leans on others' acceptance until there are a few)
        self.last_drafted = 0  # the tokens the last step seen drafted
        self.own_drafted = 0  # ... by its own rule: 0 where the step's K was the step loop's (shared_k) or a probe's
        self._ruled = True  # the step under way drafts by its own rule
        # beside others: the chance that all of this step's drafts so far are accepted, after 0, 1, 2 ...
        # of them, each by its margin (the step loop's `further` reads every slot's)
        self.survivals: list[float] = [1.0]
        self._alphas: list[float] | None = None  # alphas(), until the next step is seen
        # Alone: the steps at K=0 before the step loop's next exploration at the soonest, this one
        # included (engine/batch_k.py sets it); with the probe waits, what `quiet_steps` promises
        self.explore_in = 0
        self.quiet_steps = 0  # KPolicy's

    @property
    def rate(self) -> float:
        return self._rate_tokens / self._rate_seconds

    @property
    def priced(self) -> StepCosts | None:  # the costs it decides by, where the step loop priced them (or carry_over)
        return self.costs if self._priced else None

    @property
    def estimator(self) -> AlphaEstimator:
        """α over the recent steps, every step seen taken in."""
        if self._unseen:
            self._take_in_acceptance()
        return self._estimator

    @property
    def by_position(self) -> AcceptanceByPosition:
        """The acceptance by position, every step seen taken in."""
        if self._unseen:
            self._take_in_acceptance()
        return self._by_position

    def _take_in_acceptance(self) -> None:
        unseen, self._unseen = self._unseen, []
        self._estimator.observe_all(unseen)
        self._by_position.observe_all(unseen)

    def alphas(self) -> list[float]:
        """Each position's acceptance given the ones before it were (kept till a step is seen: the step loop asks)."""
        if self._alphas is None:
            self._alphas = self.by_position.alphas(self.costs.k_max, self.estimator.alpha)
        return self._alphas

    def next_k(self) -> int:
        if self.shared_k is None:  # (beside others nothing is held: BatchK.choose took it in)
            if k := self._steady.k:
                return k  # its choice stands, its steps held (decoding/k_steady.py)
            self.settle()
        self.quiet_steps, self.probing, self._remeasuring = 0, "", 0
        shared = self.shared_k
        if shared and not self.exploring and self.confidence_stops and not self._by_token:
            # beside others, the batch's K whole (keep_drafting None): no state of its own rule is read
            self._ruled = False
            if self._margins:  # a step before weighed its tokens: theirs are not this step's
                self._margins, self.survivals = [], [1.0]
            return shared
        self._margins, self._survival, self._stopping, self._explore = [], 1.0, False, ""
        self.survivals, self._draft_steps, self._ruled = [1.0], 1, not shared
        if shared is None and (k := self._steady.same(self._drafting)) and not self._steps.trying:
            self._drafting_steps += 1  # its choice stands (decoding/k_steady.py)
            return self._steady.stood(k, self.alphas, self.costs)
        if shared:
            # Beside other slots: at most the batch's K, every slot drafting as deep as the others (a
            # shorter draft leaves padding in the verify pass, not time); the step loop stops them all
            # together where the next column no longer pays (batch_steps.further), from `survivals`.
            # At 0, the probes below keep α current as alone.
            if self.exploring:
                self.probing = PROBE_EXPLORE
            return shared
        # A step at K=0 changes only the target alone's cost: the best drafting K is kept until a step
        # drafts (9.5 µs a step to work out again, against a 2 ms step of a small quantized target).
        if self._drafting is None:
            self._drafting = best_drafting_k(self.alphas(), self.costs)
        k, rate = self._drafting
        # Drafting is taken up where it beats the target alone by the margin, and kept while it beats it
        # at all (see DRAFT_KEEP_MARGIN)
        margin = DRAFT_KEEP_MARGIN if self._taken_up else DRAFT_GAIN_MARGIN
        self._taken_up = shared != 0 and beats_target_alone(rate, self.costs, margin)
        if not self._taken_up or k == 0:
            return self._at_zero(shared)
        k = self._kept.choose(k, rate, self.alphas, self.costs)
        self._drafting_steps += 1
        if self._priced:  # a K its steps have not priced is tried (step_prices), not a neighbour; by token, K=0
            ruled, k = k, self._steps.tried(k, self.costs, self.alphas, whole=not self._by_token)
            if not self._by_token:
                if k != ruled or self._steps.trying:  # a try
                    return k
                self._steady.chose(self._drafting, k)  # its own K: it stands till it is chosen again (k_steady)
                return self._steady.stood(k, self.alphas, self.costs)
            if not k:  # weighing each token, a try of K=0
                return k
        explore = self.learn_costs and self._drafting_steps % EXPLORE_EVERY == 0
        if self._by_token:
            self._stopping = True  # a probe (above) drafts its one token whatever its margin
            self._explore = "armed" if explore else ""  # this step drafts one token past where the margins say stop
            return self.costs.k_max
        if explore:
            neighbour = k + 1 if (self._drafting_steps // EXPLORE_EVERY) % 2 else k - 1
            if 1 <= neighbour <= self.costs.k_max:
                return neighbour
        return k

    def _at_zero(self, shared: int | None) -> int:
        """next_k where its rule drafts nothing: a re-measure's K (step_prices.remeasure), a probe's 1, or 0."""
        self._remeasuring = self._steps.trial()  # a probe's K, priced again
        if self._remeasuring:
            return self._remeasuring
        # No draft step runs while K is 0: the draft reads what it missed in one batch when it
        # drafts again (DraftModelProposer.propose), so waiting costs nothing.
        self._steps_without_draft += 1
        if self._steps_without_draft >= self._probe_every or self._probe_paid:
            could_pay = could_pay_at_all(self.costs)
            if could_pay or self._probe_every < PROBE_MAX_EVERY or self._steps_without_draft >= PROBE_CEILING_EVERY:
                self.probing = PROBE_ACCEPTANCE if could_pay else PROBE_COSTS
                return 1
        if shared is None and not self._probe_paid:  # alone, no probe before this many steps
            self.quiet_steps = max(0, min(self._probe_every - self._steps_without_draft, self.explore_in))
        return 0

    def reprice(self, costs: StepCosts) -> None:
        """Price the steps by `costs`, as the step loop learned them from its own passes (each timed
        alone): those replace what this policy would learn from its own step times. While it drafts, it
        decides by the median of the last PRICINGS_KEPT (see there), so that no one pricing stops it;
        at K=0 by these alone, so that one pricing that says drafting pays takes it up (its drafting
        steps then price what drafting costs now). The same costs again change nothing."""
        if costs is self._priced_by or costs.k_max < self.costs.k_max:
            return
        self.settle()  # its steps held: taken in at the prices they ran at
        self._priced_by = costs
        if not self._pricings or costs is not self._pricings[-1]:
            self._pricings.append(costs)
        if self._taken_up:
            costs = median_costs(self._pricings)
        costs = StepCosts(costs.draft_step_s, consistent(costs.verify_s[: self.costs.k_max + 1]))
        costs = self._steps.priced(costs, whole=not self.weighs_tokens(costs))  # by its own steps (step_prices)
        self._rate_seconds *= costs.verify_s[0] / self.costs.verify_s[0]  # the rate in the new costs' seconds
        self.costs, self._calibrated, self._priced = costs, costs.verify_s, True
        self._drafting, self._by_token = None, self.weighs_tokens(costs)

    def lookup_worth(self, alphas: Sequence[float]) -> int:
        return lookup_worth(alphas, self.costs)

    def seed_acceptance(self, bands: tuple[float, ...]) -> None:
        """Start each margin band from the acceptance a previous run of this pair learned (the cache),
        weighed as SEEDED_WEIGHT tried drafts: this run's own soon outweigh it."""
        self.by_margin = AcceptanceByMargin(bands, weight=SEEDED_WEIGHT)

    def carry_over(self, earlier: AutoK) -> None:
        """Start from what an earlier request's policy learned: the acceptance (by margin, overall and by position), the
        probe waits, the last pricings (a request's first steps decide by a median too), its steps by K and the prices
        it decides by (a pricing took ~60 us of a 0.4 ms step on the tiny pair). The rate starts afresh. Measured in
        docs/architecture.md (`k_policy.py`).

        The acceptance by margin holds for the pair; one answer's ~40 steps are too few to learn it from the prior. α
        belongs to the text as well but starts from the pair's (acceptance.PAIR_DECAY, not the last answer's end): from
        the prior, one early rejection kept the tiny pair at K=0 at each request's start; the text's own outweighs it
        within ~20 steps (ALPHA_DECAY). Where drafting does not pay, the probe waits take ~500 steps to back off."""
        earlier.settle()
        self.by_margin = earlier.by_margin.copy()
        self._probe_every = earlier._probe_every
        self._pricings.extend(c for c in earlier._pricings if c.k_max >= self.costs.k_max)
        self._estimator, self._by_position = earlier.estimator.carried(), earlier.by_position.carried()
        self._steps = earlier._steps.copy()
        if (priced := earlier.priced) is not None and priced.k_max == self.costs.k_max:  # and the loop's prices
            self._rate_seconds *= priced.verify_s[0] / self.costs.verify_s[0]
            self.costs, self._calibrated, self._priced_by = priced, earlier._calibrated, earlier._priced_by
            self._priced, self._by_token = True, self.weighs_tokens(self.costs)

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float, *, lookup: bool = False) -> None:
        if drafted and self.shared_k and not (self.probing or lookup):
            self._observe_beside(drafted, accepted)
            return
        if not (lookup or self.probing) and self._steady.hold(drafted, accepted, draft_s, verify_s):
            return  # observed when its stand ends (settle)
        self.settle()
        self._observe(drafted, accepted, draft_s, verify_s, lookup)

    def _observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float, lookup: bool = False) -> None:
        """`observe` of a step alone, or beside others but probing or looking up (not held)."""
        if self._priced and self.shared_k is None:
            self._steps.observe(drafted, draft_s + verify_s, counted=not (self.probing or lookup))
        if not drafted and not self.probing:
            self._observe_at_zero(verify_s)
            return
        self.observed, self.last_drafted = self.observed + 1, drafted
        self._steady.observe(drafted, accepted)
        self.own_drafted = drafted if self._ruled and not self.probing else 0
        self._alphas = None
        step_s = self.costs.step_s(min(drafted, self.costs.k_max))  # as priced: the rate's, and RECHOOSE_S's
        if drafted:  # the acceptance and the costs of drafting move: the best K is worked out again, soon
            self._unchosen_s += step_s
            if self._unchosen_s >= RECHOOSE_S or self.probing or not self._taken_up:
                self._drafting, self._unchosen_s = None, 0.0
        if lookup and drafted and self.confidence_stops:
            # A lookup step beside the draft model (HybridProposer): its verify batch is timed like any,
            # but its acceptance and its free drafting say nothing of the draft model's.
            if self.learn_costs:
                self.costs = replace(self.costs, verify_s=self._learn_verify(drafted, verify_s))
            return  # (nor does it count as a probe of the draft model: those still come while K=0)
        if self.probing != PROBE_COSTS:  # a guess from the text's end is not the draft's
            self._unseen.append((drafted, accepted))
            if self._margins:
                self.by_margin.observe(self._margins[:drafted], accepted)
        if self.probing in (PROBE_ACCEPTANCE, PROBE_COSTS):
            # One that paid for itself (its tokens at the target alone's step cost, against its draft catch-up and verify
            # batch) halves the wait for the next and is followed by another at once; one that did not doubles it (k_tuning)
            paid = (accepted + 1) * self.costs.verify_s[0] >= draft_s + verify_s
            wait = max(PROBE_EVERY, self._probe_every // 2) if paid else 2 * self._probe_every
            self._probe_every, self._probe_paid = min(wait, PROBE_MAX_EVERY), paid
            if accepted and self._priced and self.shared_k is None and not self._by_token:  # its steps priced whole
                self._steps.remeasure(drafted)
        elif drafted and self.probing != PROBE_EXPLORE and not self._remeasuring:  # nor these: no sign it pays
            self._probe_every, self._probe_paid = PROBE_EVERY, False
        self._rate_tokens = RATE_DECAY * self._rate_tokens + accepted + 1
        self._rate_seconds = RATE_DECAY * self._rate_seconds + step_s
        if drafted:
            self._steps_without_draft = 0
        if not self.learn_costs or self.shared_k is not None or self._priced:
            return  # a step beside others is timed whole, theirs too: not what this one's steps cost
        draft_step, verify = self.costs.draft_step_s, self.costs.verify_s
        if drafted:
            measured = blend(draft_step, draft_s / max(self._draft_steps, drafted))
            # A probe's draft time is mostly the catch-up on what K=0 skipped: it may only say the draft step is cheaper
            # than thought. Only drafting steps relearn it otherwise, so a draft step learned far too dear (a busy
            # spell, an earlier run's cache) would keep K at 0 for good (on the weak pair, 0.66x of K=8).
            draft_step = min(draft_step, measured) if self.probing else measured
            verify = self._learn_verify(drafted, verify_s)
        else:
            verify = consistent((blend(verify[0], verify_s), *verify[1:]))
        self.costs = replace(self.costs, draft_step_s=draft_step, verify_s=verify)
        self._by_token = self.weighs_tokens(self.costs)

    def settle(self) -> None:
        """Observe the steps held while its K stood (decoding/k_steady.py), in order, as the lone steps they were."""
        if held := self._steady.settle():
            shared, self.shared_k = self.shared_k, None
            self._observe_held(held)  # (decoding/k_short_observe.py)
            self.shared_k = shared

    @property
    def stands(self) -> bool:
        """Its K stands, steps held (decoding/k_steady.py): the step loop prices it only where that is due."""
        return self._steady.holds

    def _learn_verify(self, drafted: int, seconds: float) -> tuple[float, ...]:
        """The verify costs once a batch with `drafted` drafts took `seconds` (bounded, into the line)."""
        n = min(drafted, self.costs.k_max)
        self._line.add(n, bounded(seconds, self.costs.verify_s[n]))
        return consistent((self.costs.verify_s[0], *self._line.verify_s()))
