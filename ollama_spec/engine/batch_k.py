"""The K of the step loop's steps: planned for every slot before the target pass, and where drafting
beside each other stops.

Beside other slots one K is planned for all of them (decoding/batch_steps.plan_step: goodput over
every slot's acceptance by position, priced on a line through the passes as timed:
decoding/pass_line.py), every slot drafts as deep as the others up to DEEPER columns past it, and
after each draft pass `stop` says whether the batch drafts on (batch_steps.further: the drafts so
far by their margins, at the rate the planned K makes, on the same line). A slot alone keeps its own
rule, token by token, priced by the passes as timed (decoding/pass_prices.py).

While the plan says K=0 the batch's drafting shapes are not run, so their prices are the prior's
shape (a calibration times llama.cpp's calls alone, not the Python around them) scaled by the sizes
that do run, or what they cost when last run, moved as the machine moved since. Either can be wrong
in the direction that keeps K at 0 for good: on the tiny pair the Python around each pass is the same
at every size, so the calibration's rise with the batch, scaled by a K=0 pass, makes every drafting
step look dear. So now and then (EXPLORE_EVERY steps at K=0, twice as long after each try, up to
EXPLORE_MAX_EVERY) a step explores: it drafts EXPLORE_K columns whatever the plan says, where those
passes have no price of their own from lately, and the plan then decides on what they cost. A slot
alone explores the same way (backing off further) while its own rule keeps it at K=0 (its probes draft one token: the
draft pass that reads what K=0 skipped, never priced), its steps then priced from those passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ollama_spec.decoding.batch_steps import further, plan_step
from ollama_spec.decoding.k_policy import AutoK
from ollama_spec.decoding.k_tuning import DRAFT_GAIN_MARGIN, DRAFT_KEEP_MARGIN
from ollama_spec.decoding.pass_line import LinePrices
from ollama_spec.decoding.pass_prices import PassPrices

# Beside other slots, the batch drafts at most this many columns past the K planned from acceptance by
# position: deeper where every slot's drafts so far are sure (replayed on the demo pair's greedy texts
# in modelled time, a cap of K+2 made 2-4 % fewer tokens a second than none below k_max). Only where
# the slots weigh each drafted token (AutoK.keep_drafting: a draft step dearer than STOPS_MIN_DRAFT_S);
# else they draft the planned K. On the tiny pair (a draft row ~30 us) a token's weighing (its margin
# over the vocabulary, its survival) and `stop` after each draft pass were a third of what `-k auto`'s
# turn spent in Python above a fixed K's at 8 slots (py-spy of the loop thread), and that Python is
# what its steps cost there.
DEEPER = 16
# Beside other slots, after this many steps planned at K=0 one step explores at EXPLORE_K (see the
# module); each try doubles the wait, up to EXPLORE_MAX_EVERY, until a plan drafts again. Its cost is
# bounded: at most one step in EXPLORE_EVERY drafts where the plan would not, one in 128 once backed
# off, and only while those passes have no recent price. EXPLORE_K is 2, not 1: a slot's first draft
# pass after K=0 steps reads what it missed (not priced), so only the second prices a draft pass.
EXPLORE_EVERY = 8
EXPLORE_MAX_EVERY = 128
# A slot alone backs off further: its exploring step also reads, as a probe does, a window of what K=0
# skipped (proposers.PROBE_WINDOW), so on the tiny pair with its EAGLE-3 head one costs ~6 steps at K=0
# (0.8 ms against 0.13 ms), and one every 128 steps was 4-5 % of the time where drafting never pays.
EXPLORE_MAX_EVERY_ALONE = 512
EXPLORE_K = 2
# Beside other slots, a plan that drafts (20-40 us of Python for 2-4 slots, 50-80 for 8) is made again
# at most this often while as many slots run: on the tiny pair a step takes 0.3-3 ms and the plan was a
# tenth of its Python; a pair whose passes take milliseconds (the demo pair's: 30 ms and more) is
# planned at every step. A slot that ends and one that comes in its place leave the plan as it was (a
# fresh slot's acceptance is the others' mean: decoding/batch_steps.SEASONED_STEPS). At 8 slots of the
# tiny pair a step outlasted the 1 ms this was, and the plan was made at every step. A
# plan of K=0 is made again at every step: its steps have nothing else to price, and a stale K=0 costs
# the most. Each plan that comes out at the K before it, as many slots, doubles the wait before the
# next, up to REPLAN_MAX_S; one that changes K starts again at REPLAN_S. At 8 slots of the tiny pair (a
# step ~2 ms) a third of the steps were planned, ~120 us each in the loop, 248 of 352 plans at K=1. A
# pair whose steps take 16 ms and more is still planned at every one: at 32 ms the demo pair (30-60 ms a
# step at 2-4 slots) made 3-4 % less at 2 and 4 clients, in 2 runs alternated with the code before.
# A change in the number of slots makes the plan again where it moves past REPLAN_SLOTS times the
# number planned for, either way (else the wait stands): at 8 clients the slots come and go one by
# one as answers end and start (8, 7, 6 ... at each round's end), and a plan at each count was 0.26
# plans a step (~100 us each in the loop, a twentieth of a step), nearly all at the K before.
REPLAN_S = 0.004
REPLAN_MAX_S = 0.016
REPLAN_SLOTS = 1.5
# A slot alone at K=0 is priced again only every so many steps, counted from its last drafting step (and
# at once after a probe's step, which drafted; while it drafts, see REPRICE_DRAFTING_S):
# its K=0 steps change the price of the target alone, which follows ~10 passes anyway, and the prices
# worked out again (pass_prices.step_costs, the policy's best drafting K after them) take ~40-50 us on
# the tiny pair, a third of a K=0 step (0.12 ms): every 8th step, that was the lone rule's largest cost
# where K stays at 0. The wait doubles while K stays at 0, up to REPRICE_AT_ZERO_MAX: a K=0 chosen on a
# passing bump of the prices (the tiny draft pair, whose drafts pay 1.25x) is looked at again soon.
REPRICE_AT_ZERO = 8
REPRICE_AT_ZERO_MAX = 32
# A slot alone that drafts is priced again at most this often by the clock (at once where its step before
# drafted nothing: a probe's, a try's), as its rule works its best K out again (k_tuning.RECHOOSE_S): on
# the tiny pair (a K=1 step of 0.21-0.23 ms) every ~14th step, where a pricing and the best K after it
# took ~17 us (`-k auto` spent 14-16 us a step above a fixed K's Python). Each pass moves the prices by
# a step's worth. Tiny pair in process, auto ÷ K=1 over 12 alternated runs: 0.901 against 0.885 at 1 ms.
# Steps of a few milliseconds and more (the demo pair's: 30 ms) are priced at every one, as before.
# Each pricing at the K the one before it found doubles the wait, up to REPRICE_DRAFTING_MAX_S; one
# at another K starts again at REPRICE_DRAFTING_S. The wait outlives the request (a new request's
# policy takes the last one's prices: AutoK.carry_over): a K=1 step of the tiny pair takes ~0.4 ms,
# an answer ~20 ms, and a wait begun afresh with each answer kept ~5 pricings an answer.
REPRICE_DRAFTING_S = 0.003
REPRICE_DRAFTING_MAX_S = 0.024


@dataclass
class BatchK:
    """The step loop's choice of K over `prices`, the passes as its loop timed them."""

    prices: PassPrices
    least_width: int = 1  # tokens each sequence brings to a target pass beside others at least (batch_steps)
    rate: float = 0.0  # tokens per second the planned K makes: what a further draft column must beat
    weighs: bool = False  # the slots drafting beside each other weigh their drafts: `stop` is asked
    _at_zero: int = 0  # shared steps planned at K=0 since one drafted or explored
    _explore_every: int = EXPLORE_EVERY
    _again: int = 0  # the K of an exploration's second step, where the next step is planned at K=0 (_explored)
    clock: Callable[[], float] = time.perf_counter  # what REPLAN_S is measured by
    _plan: tuple[int, float] = (0, 0.0)  # the last plan_step's K and rate, for `_planned_for` slots
    _planned_for: int = 0  # how many
    _planned_at: float = 0.0
    _replan_s: float = REPLAN_S  # the wait before the next plan (REPLAN_MAX_S)
    # the lone policy last priced, its K=0 steps since, how many there are to be before the next, and when
    _repriced: tuple[Any, int, int, float] = (None, 0, REPRICE_AT_ZERO, 0.0)
    _lone_drafted: bool = False  # the lone policy's step before drafted (the last `choose` saw)
    # while the lone policy drafts: the wait before it is priced again, and the K it drafted then
    _drafting_wait: tuple[float, int] = (REPRICE_DRAFTING_S, -1)
    # beside other slots, the passes priced on a line through the loop's recent ones (decoding/pass_line.py)
    _lines: LinePrices = field(init=False)
    # The generations of the last `choose` beside each other, their learning AutoKs, the least k_max, whether all
    # weigh their tokens, and the K set on them. A policy beside others changes neither its costs nor its
    # weighing, and once `choose` set its K none but `choose` sets it (prompt_chunks sets K=0 only on a fresh
    # policy, whose generation is new here): the same generations are set only a new K (at 8 slots of the
    # tiny pair working all of it out and setting it again was 19 of `choose`'s 31 us a step).
    _members: tuple[list[Any], list[AutoK], int, bool, int | None] | None = None

    def __post_init__(self) -> None:
        self._lines = LinePrices(self.prices)

    def observe(self, draft: bool, size: int, seconds: float, sequences: int = 1, reshaped: bool = False) -> None:
        """A pass the step loop priced (as told to `prices`): the draft's over `size` rows (`reshaped`: of
        another shape than the draft pass before it), or the target's over `size` tokens of `sequences`
        sequences."""
        self._lines.observe(draft, size, seconds, sequences, reshaped)

    def choose(self, generations: Sequence[Any]) -> None:
        """Before the target pass: the next step's K for every generation running (see the module)."""
        self.weighs = False
        if len(generations) == 1:
            self._choose_alone(generations[0].policy)
            self._members = None
            return
        members = self._members
        if members is None or members[0] != generations:  # others than last step's (the same: as they were)
            policies = [g.policy for g in generations if isinstance(g.policy, AutoK) and g.policy.learn_costs]
            for policy in policies:  # a slot alone till now: its steps held while its K stood (k_steady)
                policy.settle()
            k_max = min([p.costs.k_max for p in policies], default=0)
            members = (list(generations), policies, k_max, all(p.keep_drafting for p in policies), -1)
        _, policies, k_max, weighs, k_before = members
        k = None
        if policies and self.prices.known:
            self.weighs = weighs
            k, self.rate = self._planned(policies, k_max)
            if k:
                deeper = DEEPER if self.weighs else 0
                k, self._at_zero, self._explore_every, self._again = min(k + deeper, k_max), 0, EXPLORE_EVERY, 0
            else:
                k = self._explored(len(generations), k_max)
        # kept only while a K is set: with none, each policy learns its own costs (its weighing may move)
        self._members = (*members[:4], k) if k is not None else None
        if k == k_before:
            return
        for policy in policies:
            policy.shared_k, policy.exploring = k, False
        for generation in generations:
            generation.shared = True

    def _choose_alone(self, lone: Any) -> None:
        """`choose` for a slot alone: its rule's own K (shared_k None), or the step loop's exploration.
        While its K stands (decoding/k_steady.py), nothing before its pricing is due by the clock: then
        its held steps are taken in, and it is priced as it would be."""
        if not (isinstance(lone, AutoK) and lone.learn_costs):
            return
        if lone.stands:
            if self._repriced[0] is lone and self.clock() - self._repriced[3] < self._wait_for(lone.last_drafted):
                return
            lone.settle()
        k = None
        if self.prices.known:
            self._reprice(lone)
            lone.explore_in = 0
            # its rule drafting (K=1 too, its draft pass priced): its passes are priced as they run
            if lone.own_drafted:
                self._at_zero, self._explore_every, self._again = 0, EXPLORE_EVERY, 0
            elif lone.confidence_stops:  # K=0, or a probe's one token: a draft pass is never priced
                k = self._explored(1, lone.costs.k_max, EXPLORE_MAX_EVERY_ALONE) or None
                if k is None:  # the steps until the soonest exploration (_explored's count)
                    lone.explore_in = min(self._explore_every, EXPLORE_MAX_EVERY_ALONE) - self._at_zero
        lone.shared_k, lone.exploring = k, bool(k)

    def _reprice(self, lone: AutoK) -> None:
        """Price the lone slot's rule again where it is due (REPRICE_AT_ZERO, REPRICE_DRAFTING_S)."""
        priced, at_zero, wait, at = self._repriced
        if priced is not lone and lone.priced is not None:  # a new request's, priced as the one before (carry_over)
            self._repriced, self._lone_drafted = (lone, at_zero, wait, at), True
            return  # its first step reads the prompt, and drafts nothing: no sign that its K moved
        if priced is lone and not lone.observed:
            return  # ... nor are the steps that read it (none is observed): its first drafting step is no try's
        drafted, now = bool(lone.last_drafted), self.clock()
        if drafted:
            due = not self._lone_drafted or self._timed_due(now - at, lone.last_drafted)
        else:
            due = at_zero >= wait
        if due or priced is not lone:
            lone.reprice(self.prices.step_costs(lone.costs.k_max, drafts=lone.confidence_stops))
            wait = REPRICE_AT_ZERO if drafted or priced is not lone else min(2 * wait, REPRICE_AT_ZERO_MAX)
            at_zero, at = -1, now
        elif drafted:
            at_zero, wait = -1, REPRICE_AT_ZERO
        self._repriced, self._lone_drafted = (lone, at_zero + 1, wait, at), drafted

    def _timed_due(self, since: float, k: int) -> bool:
        """Is a lone policy drafting `k` due its pricing by the clock, `since` seconds after the last?
        Each one due at the K of the one before doubles the wait (REPRICE_DRAFTING_MAX_S); a step at
        another K starts it again."""
        wait, last_k = self._wait_for(k), self._drafting_wait[1]
        due = since >= wait
        self._drafting_wait = (min(2 * wait, REPRICE_DRAFTING_MAX_S) if due and k == last_k else wait, k)
        return due

    def _wait_for(self, k: int) -> float:
        """The wait before a lone policy drafting `k` is priced again by the clock (`_timed_due`)."""
        wait, last_k = self._drafting_wait
        return wait if k == last_k else REPRICE_DRAFTING_S

    def _planned(self, policies: list[AutoK], k_max: int) -> tuple[int, float]:
        """plan_step's K and rate for these slots: made again where it was K=0, their number moved past
        REPLAN_SLOTS times the one planned for, or the wait went by (REPLAN_S, longer while the plans keep
        K). Drafting is taken up where it beats the target alone by DRAFT_GAIN_MARGIN, and kept while it
        beats it at all (DRAFT_KEEP_MARGIN), as a lone slot's rule does: on the tiny pair at 8 slots the
        pricings put drafting at 1.0-1.1x the target alone, each one by the margin alone deciding, and
        the batch spent 60 % of its steps at K=0 where a fixed K=3 made 1.8x its tokens."""
        now, slots, planned_for = self.clock(), len(policies), self._planned_for
        moved = not planned_for / REPLAN_SLOTS < slots < planned_for * REPLAN_SLOTS
        if not self._plan[0] or moved or now - self._planned_at >= self._replan_s:
            margin = DRAFT_KEEP_MARGIN if self._plan[0] else DRAFT_GAIN_MARGIN
            lines = self._lines.beside(slots)
            plan = plan_step(policies, lines, margin, k_max, self.least_width, lines.reshape_s(slots))
            self._replan_s = min(2 * self._replan_s, REPLAN_MAX_S) if plan[0] == self._plan[0] else REPLAN_S
            self._plan, self._planned_for, self._planned_at = plan, slots, now
        return self._plan

    def _explored(self, slots: int, k_max: int, most_every: int = EXPLORE_MAX_EVERY) -> int:
        """At a step planned at K=0 (a lone slot's: its last step drafted less than EXPLORE_K): EXPLORE_K
        where this one explores (see the module), else 0; the waits back off up to `most_every`.

        An exploration runs two steps at EXPLORE_K, and the second prices its passes. The first step's
        passes change shape from the K=0 steps', and llama.cpp rebuilds its graph at every change of
        shape; they also find the draft's weights out of the caches after the K=0 steps. On the tiny pair
        a target pass of 1-4 tokens took 81-86 us at the shape of the pass before it, 133-136 us at
        another (a draft pass 29-30 against 43-44 us), and a lone slot's draft pass was priced 0.09-0.11 ms
        after an exploration against 0.04-0.05 while drafting: each exploration said drafting does not
        pay where K=2 made 1.2-1.3x the target alone, and the slot stayed at K=0 for 90 % of its steps."""
        if self._again:  # an exploration's second step
            k, self._again, self.rate = min(self._again, k_max), 0, 0.0
            return k
        self._at_zero += 1
        k = min(EXPLORE_K, k_max)
        if self._at_zero < min(self._explore_every, most_every) or k < 1:
            return 0
        self._at_zero = 0
        if self.prices.seen_lately(False, slots * (k + 1)) and self.prices.seen_lately(True, slots):
            return 0  # its passes are priced by what they cost now: the plan stands
        self._explore_every = min(2 * self._explore_every, most_every)
        self.rate = 0.0  # every column up to EXPLORE_K drafted and verified (batch_steps.further)
        self._again = k
        return k

    def stop(self, policies: Sequence[Any], rows: int, draft_rows: int) -> int | None:
        """Before a draft pass of `draft_rows` slots: None to run it, else how many columns the slots
        drafting beside each other (`policies`: each `drafting_beside`) have the verify pass of `rows`
        sequences take, their drafting stopped."""
        cap = min(policy.shared_k for policy in policies)
        return further(policies, self._lines.beside(rows), rows, draft_rows, self.rate, cap, self.least_width)


def drafting_beside(policy: Any) -> bool:
    """Is this a slot's policy drafting the batch's columns, one drafted this step at least (its next
    draft pass the one `BatchK.stop` may stop)?"""
    return isinstance(policy, AutoK) and bool(policy.shared_k) and len(policy.survivals) > 1
