"""The K of the step loop's steps beside other slots: planned from the passes as timed, and explored
where those passes have no price of their own."""

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

import pytest

from ollama_spec.decoding.k_policy import AutoK
from ollama_spec.decoding.k_tuning import PROBE_EXPLORE
from ollama_spec.decoding.pass_prices import PassPrices
from ollama_spec.decoding.step_costs import StepCosts, expected_tokens_for_each_k
from ollama_spec.engine.batch_k import (
    EXPLORE_EVERY,
    EXPLORE_K,
    EXPLORE_MAX_EVERY,
    REPRICE_DRAFTING_MAX_S,
    REPRICE_DRAFTING_S,
    BatchK,
    drafting_beside,
)

SLOTS, K_MAX, ALPHA = 4, 8, 0.9
MARGIN = 0.5  # every drafted token's: a sure one


def target(tokens: int) -> float:
    """What a target pass costs here: mostly the Python around it, the same at every size (the tiny pair)."""
    return 100e-6 + 10e-6 * tokens


def draft(rows: int) -> float:
    return 20e-6 + 5e-6 * rows


# A calibration that makes drafting look dear: every verify token a tenth of a pass more, draft steps
# four target passes (timed during a busy spell, or llama.cpp's calls alone where the Python is the cost)
DEAR = StepCosts(draft_step_s=400e-6, verify_s=tuple(100e-6 + 100e-6 * n for n in range(1, K_MAX + 2)))


@dataclass
class Running:
    """What BatchK reads of a running generation."""

    policy: AutoK
    shared: bool = False


class Clock:
    """The time the simulated passes took."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(
    generations: list[Running],
    steps: int,
    rng: random.Random,
    as_the_loop: bool = False,
    prior: StepCosts = DEAR,
    timed: Callable[[float], float] = lambda seconds: seconds,
) -> list[int]:
    """The step loop's K machinery over `steps` steps of these generations, the passes priced as
    `target` and `draft` cost (a slot's first draft pass after a step without drafts reads what it
    missed, and is not priced, as engine/step_loop.py does); each step's widest verify, less one.
    `as_the_loop`: in engine/step_loop.py's order, the K chosen before each target pass and each slot
    asking its next step's K once it verified (else chosen before each step's K is asked). `timed`: a
    pass's cost as the loop times it (a busy machine's noise)."""
    clock = Clock()
    batch = BatchK(PassPrices(prior=prior), clock=clock)
    drafted_before = [True] * len(generations)
    widths = []
    asked = [g.policy.next_k() for g in generations] if as_the_loop else []
    for _ in range(steps):
        if not as_the_loop:
            batch.choose(generations)
            asked = [g.policy.next_k() for g in generations]
        drafted, draft_s = [0] * len(generations), [0.0] * len(generations)
        active = [i for i, k in enumerate(asked) if k]
        while active:
            # a slot alone (its own rule, token by token): does it run the draft step for its next token?
            active = [i for i in active if keep(generations[i], drafted[i])]
            if not active:
                break
            beside = [i for i in active if drafting_beside(generations[i].policy)]
            if beside:
                width = batch.stop([generations[i].policy for i in beside], len(generations), len(active))
                if width is not None:  # the slots drafting beside each other verify `width` columns
                    for i in beside:
                        drafted[i] = width
                    active = [i for i in active if i not in beside]
                    continue
            clock.now += draft(len(active))
            if all(drafted_before[i] or drafted[i] for i in active):
                batch.prices.observe(True, len(active), timed(draft(len(active))))
            taken = []
            for i in active:
                draft_s[i] += draft(len(active))
                ask = generations[i].policy.keep_drafting  # None: the K chosen, whatever the margins
                if ask is None or ask(drafted[i], MARGIN):  # the token, by its margin
                    drafted[i] += 1
                    taken.append(i)
            active = [i for i in taken if drafted[i] < asked[i]]
        widest = max(drafted)
        if as_the_loop:
            batch.choose(generations)
        verify_s = target(len(generations) * (widest + 1))
        clock.now += verify_s
        batch.prices.observe(False, len(generations) * (widest + 1), timed(verify_s))
        for i, generation in enumerate(generations):
            accepted = 0
            while accepted < drafted[i] and rng.random() < ALPHA:
                accepted += 1
            generation.policy.observe(drafted[i], accepted, draft_s[i], verify_s)
            drafted_before[i] = drafted[i] > 0
        if as_the_loop:
            asked = [g.policy.next_k() for g in generations]
        widths.append(widest)
    return widths


def keep(generation: Running, drafted: int) -> bool:
    """Before a draft pass: does this slot run it (beside others: always; alone: its rule says)?"""
    ask = generation.policy.keep_drafting
    return drafting_beside(generation.policy) or ask is None or ask(drafted, None)


def rate(k: int) -> float:
    """Tokens a second of a step at K for every slot, as the passes cost here."""
    tokens = SLOTS * expected_tokens_for_each_k([ALPHA] * k)[k]
    return tokens / (k * draft(SLOTS) + target(SLOTS * (k + 1)))


def test_a_prior_that_makes_drafting_look_dear_does_not_keep_the_batch_at_k_zero():
    """The slots' passes say drafting pays (K=3 makes 1.27x the tokens a second of K=0 here), the prior
    says it does not: the batch must leave K=0 within a few explorations, and then keep drafting."""
    assert rate(3) > 1.25 * rate(0)
    generations = [Running(AutoK(DEAR, ALPHA, confidence_stops=True)) for _ in range(SLOTS)]
    widths = run(generations, 200, random.Random(0))
    first = next(step for step, width in enumerate(widths) if width >= 2)
    assert first <= 4 * EXPLORE_EVERY
    assert sum(width >= 1 for width in widths[100:]) >= 90  # drafting, bar the odd step


def where_drafting_does_not_pay(steps: int, slots: int = 1, seed: int = 3, as_the_loop: bool = True) -> list[int]:
    """The widths of `steps` steps of `slots` whose drafts are accepted 10 % of the time."""
    global ALPHA
    generations = [Running(AutoK(DEAR, 0.1, confidence_stops=True)) for _ in range(slots)]
    saved, ALPHA = ALPHA, 0.1
    try:
        return run(generations, steps, random.Random(seed), as_the_loop=as_the_loop)
    finally:
        ALPHA = saved


def explorations(widths: list[int]) -> int:
    """The explorations among these steps' widths: each two steps in a row at EXPLORE_K."""
    return sum(width == EXPLORE_K and (step == 0 or widths[step - 1] != EXPLORE_K) for step, width in enumerate(widths))


def test_where_drafting_does_not_pay_the_explorations_back_off():
    """Passes priced by what they cost (drafting loses at any acceptance): the batch tries drafting
    again only ever more rarely, so the explorations cost a bounded share of the steps."""
    widths = where_drafting_does_not_pay(600, SLOTS, seed=1, as_the_loop=False)
    explored = explorations(widths[300:])
    assert explored <= 300 // EXPLORE_MAX_EVERY + 1


def test_a_slot_alone_leaves_k_zero_where_its_prior_makes_drafting_look_dear():
    """The same for a slot alone, whose own rule keeps it at K=0 on the prior's prices: its probes draft
    one token (the draft pass that reads what K=0 skipped, never priced), so only an exploring step
    prices a draft pass; after it the slot drafts."""
    generations = [Running(AutoK(DEAR, ALPHA, confidence_stops=True))]
    widths = run(generations, 200, random.Random(2), as_the_loop=True)
    first = next(step for step, width in enumerate(widths) if width >= 2)
    assert first <= 4 * EXPLORE_EVERY
    assert sum(width >= 2 for width in widths[100:]) >= 90


def test_a_slot_alone_keeps_drafting_where_it_pays_through_noisy_timings():
    """A slot alone whose drafts pay (α 0.9, drafting ~1.5x the target alone here), its passes timed as a
    shared CPU times them: each ±30 %, now and then 3x (descheduled), and for a few passes in a row
    draft passes 5x (a busy spell). Priced from their last few passes, some pricings say drafting no
    longer pays: the rule must not leave drafting on any one of them (priced by each alone, it spent
    8-18 % of the steps at K=0 over twenty such runs, here 0-1 %)."""
    noise = random.Random(5)
    spell = [0]

    def timed(seconds: float) -> float:
        if spell[0] == 0 and noise.random() < 0.02:
            spell[0] = 6
        factor = math.exp(noise.gauss(0.0, 0.3)) * (3.0 if noise.random() < 0.05 else 1.0)
        if spell[0]:
            spell[0] -= 1
            factor *= 5.0
        return seconds * factor

    truth = StepCosts(draft(1), tuple(target(n) for n in range(1, K_MAX + 2)))
    generations = [Running(AutoK(truth, ALPHA, confidence_stops=True))]
    widths = run(generations, 600, random.Random(3), as_the_loop=True, prior=truth, timed=timed)
    assert sum(width == 0 for width in widths[20:]) <= 30


def test_a_slot_alone_where_drafting_does_not_pay_explores_ever_more_rarely():
    """A slot alone whose drafts are seldom accepted: each exploring step drafts EXPLORE_K tokens, which
    must not count as its own rule drafting again (that would start the waits afresh, one exploration
    every EXPLORE_EVERY steps for good, each a catch-up of what K=0 skipped)."""
    widths = where_drafting_does_not_pay(600)
    explored = explorations(widths[300:])
    assert explored <= 300 // EXPLORE_MAX_EVERY + 1


def test_a_slot_alone_where_drafting_does_not_pay_explores_rarer_than_slots_beside_others():
    """Alone, each exploring step also reads a window of what K=0 skipped (~6 steps at K=0 on the tiny
    pair with its EAGLE-3 head): once backed off, one in several hundred steps explores."""
    widths = where_drafting_does_not_pay(2000)
    explored = explorations(widths[1000:])
    assert explored <= 3  # 1000 // EXPLORE_MAX_EVERY_ALONE + 1


class CountedPrices(PassPrices):
    """PassPrices that count how often the step costs are asked for."""

    asked = 0

    def step_costs(self, k_max: int, drafts: bool = True) -> StepCosts:
        self.asked += 1
        return super().step_costs(k_max, drafts)


def test_a_slot_alone_at_k_zero_is_priced_again_only_every_few_steps():
    """A lone slot's K=0 steps move only the target alone's price: the prices (the lone rule's largest
    cost on a pair whose steps take 0.1 ms) are worked out again after REPRICE_AT_ZERO steps, the wait
    doubling while K stays at 0, at once for a new request's policy and after a step that drafted."""
    prices = CountedPrices(prior=DEAR)
    batch = BatchK(prices)
    first = Running(AutoK(DEAR, 0.1, confidence_stops=True))
    for _ in range(128):
        batch.choose([first])
        first.policy.observe(0, 0, 0.0, target(1))
        prices.observe(False, 1, target(1))
    assert prices.asked <= 6  # at steps 0, 9, 26, 59, 92, 125: ~40-50 us each on the tiny pair
    asked = prices.asked
    second = Running(AutoK(DEAR, 0.1, confidence_stops=True))
    batch.choose([second])
    assert prices.asked == asked + 1 and second.policy._priced_by is not None
    second.policy.observe(1, 0, draft(1), target(2))
    batch.choose([second])
    assert prices.asked == asked + 2


def test_a_slot_alone_is_priced_again_soon_after_a_step_that_drafted():
    """Once K=0 has lasted, repricing is rare; a step that drafts starts the waits afresh, so a K=0
    chosen on a passing bump of the prices is looked at again within 8 steps (REPRICE_AT_ZERO)."""
    prices = CountedPrices(prior=DEAR)
    batch, lone = BatchK(prices), Running(AutoK(DEAR, 0.1, confidence_stops=True))
    for _ in range(100):
        batch.choose([lone])
        lone.policy.observe(0, 0, 0.0, target(1))
        prices.observe(False, 1, target(1))
    batch.choose([lone])
    lone.policy.observe(1, 1, draft(1), target(2))  # a step that drafted
    asked = []
    for _ in range(24):
        batch.choose([lone])
        asked.append(prices.asked)
        lone.policy.observe(0, 0, 0.0, target(1))
        prices.observe(False, 1, target(1))
    assert asked[9] >= asked[0] + 1 and asked[-1] - asked[0] <= 3


def test_a_lone_slot_that_drafts_is_priced_again_by_the_clock_and_at_once_after_k_zero():
    """Priced at every step, the prices and the best K worked out again were 6-7 of the ~17 us a step
    that `-k auto` spent above a fixed K on the tiny pair: a drafting slot is priced again by the clock
    (REPRICE_DRAFTING_S at first, then longer: the test below), and at once where its step before drafted
    nothing (a probe's, a try's)."""
    prices, clock = CountedPrices(prior=DEAR), Clock()
    batch, lone = BatchK(prices, clock=clock), Running(AutoK(DEAR, 0.9, confidence_stops=True))
    batch.choose([lone])  # a new request's policy: at once
    asked = prices.asked
    for _ in range(12):
        lone.policy.observe(1, 1, draft(1), target(2))
        clock.now += REPRICE_DRAFTING_S / 4 * 1.001
        batch.choose([lone])
    assert prices.asked - asked == 2  # after its first step, then at the 5th (the 13th next: the test below)
    lone.policy.observe(0, 0, 0.0, target(1))
    batch.choose([lone])
    lone.policy.observe(1, 1, draft(1), target(2))  # drafts again after K=0
    asked = prices.asked
    batch.choose([lone])
    assert prices.asked == asked + 1


def test_a_lone_slot_drafting_at_one_k_is_priced_less_often_across_requests():
    """Each pricing by the clock at the K the one before found doubles the wait, up to
    REPRICE_DRAFTING_MAX_S, and the wait outlives the request: a next request's policy takes the last
    one's prices (AutoK.carry_over) and is not priced at once, nor after its first step (the prompt's,
    which drafts nothing), but at the wait the last pricing left. A step at another K starts the wait
    again at REPRICE_DRAFTING_S."""
    clock = Clock()
    batch = BatchK(PassPrices(prior=DEAR), clock=clock)

    def pricings(lone: Running, steps: int, drafted: int = 1) -> list[int]:
        """The steps after which the lone policy was priced."""
        at, reprice = [], lone.policy.reprice
        lone.policy.reprice = lambda costs: at.append(step) or reprice(costs)
        for step in range(steps):
            lone.policy.observe(drafted, drafted, draft(1), target(drafted + 1))
            clock.now += REPRICE_DRAFTING_S / 4 * 1.001
            batch.choose([lone])
        return at

    first = Running(AutoK(DEAR, 0.9, confidence_stops=True))
    batch.choose([first])
    at = pricings(first, 100)  # the first after the first step that drafted: at once
    assert [b - a for a, b in pairwise(at)] == [4, 8, 16, 32, 32]
    assert REPRICE_DRAFTING_MAX_S == 8 * REPRICE_DRAFTING_S
    second = Running(AutoK(DEAR, 0.9, confidence_stops=True))
    second.policy.carry_over(first.policy)
    batch.choose([second])
    batch.choose([second])  # after its prompt's step: nothing observed, nothing drafted
    assert pricings(second, 24) == []  # priced as the one before it: the wait stands
    assert pricings(second, 12, drafted=2) == [0, 4]  # another K: priced at once, the wait begun again


def until_explored(batch: BatchK, lone: Running) -> int:
    """Steps of a lone slot that drafts nothing accepted, up to the step loop's exploring step: its K."""
    policy = lone.policy
    for _ in range(4 * EXPLORE_EVERY):
        batch.choose([lone])
        k = policy.next_k()
        if policy.shared_k:
            break
        policy.observe(k, 0, draft(1) * k, target(k + 1))
        batch.prices.observe(False, k + 1, target(k + 1))
    assert k == EXPLORE_K and policy.probing == PROBE_EXPLORE
    return k


def test_a_lone_slots_exploring_step_is_proposed_as_a_probe_and_leaves_the_probe_waits():
    """A lone slot's exploring step asks its proposer as a probe does (PROBE_EXPLORE: a window of what
    K=0 skipped, not all of it: an EAGLE-3 head's full catch-up took 1.5-2.5 ms on the tiny pair), and
    it is no probe of the rule's: the wait for the next one stays as it was. Its second step (see
    BatchK._explored) is proposed so too, and the step after it is the rule's again."""
    batch, lone = BatchK(PassPrices(prior=DEAR)), Running(AutoK(DEAR, 0.1, confidence_stops=True))
    policy = lone.policy
    k = until_explored(batch, lone)
    waits = policy._probe_every
    for second in (True, False):
        policy.observe(k, 0, 2 * draft(1), target(k + 1))
        assert policy._probe_every == waits
        batch.choose([lone])
        k = policy.next_k()
        assert (policy.probing == PROBE_EXPLORE and policy.exploring and k == EXPLORE_K) == second


def test_a_lone_slots_exploring_step_leaves_probe_waits_that_backed_off():
    """Probes that backed off stay backed off across an exploring step: it drafts whatever the rule
    says, so it tells nothing of whether the rule's drafting pays (waits started afresh at each one
    made 3 probes follow every exploration on the tiny pair with its EAGLE-3 head, ~9 % of its time)."""
    batch, lone = BatchK(PassPrices(prior=DEAR)), Running(AutoK(DEAR, 0.1, confidence_stops=True))
    policy = lone.policy
    policy._probe_every = 8 * EXPLORE_EVERY
    k = until_explored(batch, lone)
    policy.observe(k, k, 2 * draft(1), target(k + 1))
    assert policy._probe_every == 8 * EXPLORE_EVERY and not policy._probe_paid


def test_a_slot_alone_at_k_zero_is_promised_only_steps_that_draft_nothing():
    """At K=0 a lone policy says how many steps, this one included, will draft nothing (`quiet_steps`:
    its proposer may then leave the target's passes unread): neither its probes nor the step loop's
    explorations come sooner, and where drafting does not pay most K=0 steps promise more than a
    probe's window of steps."""
    prices = PassPrices(prior=DEAR)
    batch, lone = BatchK(prices), Running(AutoK(DEAR, 0.1, confidence_stops=True))
    policy, rng = lone.policy, random.Random(4)
    ks, quiets = [], []
    k = policy.next_k()
    for _ in range(3000):
        ks.append(k)
        quiets.append(policy.quiet_steps if k == 0 else 0)
        if k:
            prices.observe(True, 1, draft(1))
        batch.choose([lone])
        prices.observe(False, k + 1, target(k + 1))
        accepted = next((i for i in range(k) if rng.random() >= 0.1), k)
        policy.observe(k, accepted, draft(1) * k, target(k + 1))
        k = policy.next_k()
    for step, quiet in enumerate(quiets):
        assert not any(ks[step : step + quiet]), f"step {step} promised {quiet} steps at K=0"
    assert sum(k > 0 for k in ks[1000:]) >= 3  # it still probes and explores
    assert sum(quiet > 20 for quiet in quiets[1000:]) >= 1500


def test_beside_others_noisy_passes_do_not_make_the_plan_promise_more_than_its_steps_make():
    """On a shared CPU (passes ±15 %, 3 % descheduled) the K of 8 slots is planned at the rate its steps
    make as the passes really cost: that rate is what each further draft column must beat."""
    rng, slots = random.Random(5), 8
    cost, draft_cost = (lambda n: 0.035 + 0.004 * n), (lambda rows: 0.003 + 0.0004 * rows)
    priced = StepCosts(draft_step_s=draft_cost(1), verify_s=tuple(cost(n) for n in range(1, K_MAX + 2)))
    batch = BatchK(PassPrices(prior=priced))
    noise = lambda s: s * math.exp(rng.gauss(0.0, 0.15)) * (3.0 if rng.random() < 0.03 else 1.0)
    for _ in range(60):  # steps whose widths move with the drafts' margins, as `further` stops them
        width = rng.randint(1, 6)
        for _ in range(width):
            seconds = noise(draft_cost(slots))
            batch.prices.observe(True, slots, seconds)
            batch.observe(True, slots, seconds)
        seconds = noise(cost(slots * (width + 1)))
        batch.prices.observe(False, slots * (width + 1), seconds)
        batch.observe(False, slots * (width + 1), seconds, slots)
    generations = [Running(AutoK(priced, 0.8, confidence_stops=True)) for _ in range(slots)]
    batch.choose(generations)
    k = batch._plan[0]  # the planned K (the slots may draft DEEPER past it where their drafts are sure)
    tokens = slots * expected_tokens_for_each_k(generations[0].policy.alphas()[:k])[k]
    assert k >= 1
    assert batch.rate == pytest.approx(tokens / (k * draft_cost(slots) + cost(slots * (k + 1))), rel=0.07)


def test_beside_others_drafting_is_kept_while_it_beats_the_target_alone():
    """Drafting is taken up where the plan beats the target alone by DRAFT_GAIN_MARGIN and kept while it
    beats it at all, as a lone rule does: pricings that put drafting at 1.0-1.1x the target alone (the
    tiny pair at 8 slots) each put the batch back at K=0 where it ran at the margin alone."""
    verify = tuple(100e-6 + 10e-6 * n for n in range(1, K_MAX + 2))
    paying, barely = StepCosts(10e-6, verify), StepCosts(55e-6, verify)  # K=1: 1.38x, 1.06x the target alone
    clock = Clock()
    batch = BatchK(PassPrices(prior=paying), clock=clock)
    generations = [Running(AutoK(paying, ALPHA, confidence_stops=True)) for _ in range(SLOTS)]
    batch.choose(generations)
    assert batch._plan[0] >= 1
    batch.prices.set_prior(barely)
    clock.now += 1.0  # planned again
    batch.choose(generations)
    assert batch._plan[0] >= 1
    fresh = BatchK(PassPrices(prior=barely))  # not drafting: not taken up at that gain
    fresh.choose(generations)
    assert fresh._plan[0] == 0


def test_beside_others_a_slot_in_anothers_place_leaves_the_plan_as_it_was(monkeypatch):
    """A request that ends and one that comes in its place (as many slots), or one slot fewer, do not
    make the plan again before REPLAN_S (a fresh slot's acceptance is the others' mean); the number of
    slots moved past REPLAN_SLOTS times the one planned for, or REPLAN_S gone by, does."""
    from ollama_spec.engine import batch_k

    paying = StepCosts(10e-6, tuple(100e-6 + 10e-6 * n for n in range(1, K_MAX + 2)))
    plans, plan_step = [], batch_k.plan_step
    monkeypatch.setattr(batch_k, "plan_step", lambda *args: plans.append(args) or plan_step(*args))
    clock = Clock()
    batch = BatchK(PassPrices(prior=paying), clock=clock)
    generations = [Running(AutoK(paying, ALPHA, confidence_stops=True)) for _ in range(SLOTS)]
    batch.choose(generations)
    assert batch._plan[0] >= 1 and len(plans) == 1
    generations[0] = Running(AutoK(paying, ALPHA, confidence_stops=True))
    clock.now += batch_k.REPLAN_S / 2
    batch.choose(generations)
    assert len(plans) == 1
    batch.choose(generations[1:])  # 3 of 4
    assert len(plans) == 1
    batch.choose(generations[2:])  # 2 of 4: past REPLAN_SLOTS
    assert len(plans) == 2 and batch_k.REPLAN_SLOTS <= 2
    batch.choose(generations)  # back to 4: past it again
    assert len(plans) == 3
    clock.now += batch_k.REPLAN_S
    batch.choose(generations[1:])
    assert len(plans) == 4


def test_beside_others_plans_that_keep_their_k_are_made_less_often_until_one_changes_it(monkeypatch):
    """REPLAN_S doubles after each plan at the K before it, up to REPLAN_MAX_S, and starts again
    at REPLAN_S once a plan changes K."""
    from ollama_spec.engine import batch_k

    paying = StepCosts(10e-6, tuple(100e-6 + 10e-6 * n for n in range(1, K_MAX + 2)))
    plans, plan_step = [], batch_k.plan_step
    forced: list[int] = []  # a K to plan instead of the rule's

    def planned(*args):
        plans.append(args)
        k, rate = plan_step(*args)
        return (forced[0], rate) if forced else (k, rate)

    monkeypatch.setattr(batch_k, "plan_step", planned)
    clock = Clock()
    batch = BatchK(PassPrices(prior=paying), clock=clock)
    generations = [Running(AutoK(paying, ALPHA, confidence_stops=True)) for _ in range(SLOTS)]
    batch.choose(generations)
    first = batch._plan[0]
    assert first >= 1
    waits = []
    for _ in range(6):  # each plan at the same K: the wait before the next doubles, up to REPLAN_MAX_S
        before = len(plans)
        while len(plans) == before:
            clock.now += batch_k.REPLAN_S / 4
            batch.choose(generations)
        waits.append(round(batch._replan_s / batch_k.REPLAN_S))
    assert waits == [2, 4, 4, 4, 4, 4] and batch_k.REPLAN_MAX_S == 4 * batch_k.REPLAN_S
    forced.append(first + 1)  # a plan that changes K: planned again soon
    clock.now += 2 * batch_k.REPLAN_MAX_S
    batch.choose(generations)
    assert batch._plan[0] == first + 1 and batch._replan_s == batch_k.REPLAN_S


def test_beside_others_what_the_plan_reads_of_the_slots_follows_each_change_of_them():
    """The same generations as the step before are not read again (their weighing and K are as set); a
    slot that joins or leaves makes `choose` read them all again."""
    from ollama_spec.decoding.k_tuning import STOPS_MIN_DRAFT_S

    weigh = StepCosts(2 * STOPS_MIN_DRAFT_S, DEAR.verify_s)  # a draft step dear enough to weigh each token
    weighing = [Running(AutoK(weigh, confidence_stops=True)) for _ in range(2)]
    whole = Running(AutoK(StepCosts(STOPS_MIN_DRAFT_S / 4, DEAR.verify_s), confidence_stops=True))
    batch = BatchK(PassPrices(prior=DEAR))
    batch.choose(weighing)
    assert batch.weighs and all(g.shared and g.policy.shared_k is not None for g in weighing)
    batch.choose([*weighing, whole])
    assert not batch.weighs and whole.shared and whole.policy.shared_k == weighing[0].policy.shared_k
    batch.choose(weighing)
    assert batch.weighs
    batch.choose([weighing[0]])  # alone: its own rule
    assert weighing[0].policy.shared_k is None
    batch.choose(weighing)
    assert weighing[0].policy.shared_k == weighing[1].policy.shared_k is not None
