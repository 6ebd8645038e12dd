"""What a lone rule drafting whole Ks keeps between steps (decoding/k_steady.py), and what that makes it draft."""

import random
from collections import Counter
from itertools import pairwise
from types import SimpleNamespace

from ollama_spec.decoding.k_policy import AutoK
from ollama_spec.decoding.k_steady import STAND_S, STAND_STEPS, SteadyK
from ollama_spec.decoding.k_tuning import RECHOOSE_S
from ollama_spec.decoding.pass_prices import PassPrices
from ollama_spec.decoding.step_costs import StepCosts, best_drafting_k
from ollama_spec.decoding.step_prices import StepsByK
from ollama_spec.engine.batch_k import REPRICE_DRAFTING_S, BatchK
from tests.decoding.test_step_prices import MODEL, US

SURE = [0.98] * 16  # a stretch the draft follows: deep drafts pay


def test_a_choice_stands_only_while_what_it_was_chosen_by_does():
    steady, drafting = SteadyK(), (5, 9000.0)
    again = (drafting[0], drafting[1])  # the same numbers, worked out again
    assert steady.same(drafting) == 0  # nothing chosen yet
    steady.chose(drafting, 4)
    assert steady.same(drafting) == 4
    assert steady.same(again) == 0  # worked out again, though to the same: chosen again
    assert steady.same(None) == 0


def test_after_a_rejection_the_next_step_drafts_at_most_twice_the_accepted_run():
    steady = SteadyK()
    deep = best_drafting_k(SURE, MODEL)[0]
    assert deep > 6
    assert steady.capped(deep, lambda: SURE, MODEL) == deep  # no step seen yet
    steady.observe(deep, 0)
    assert steady.capped(deep, lambda: SURE, MODEL) == best_drafting_k(SURE[:2], MODEL)[0] <= 2
    steady.observe(2, 2)
    assert steady.capped(deep, lambda: SURE, MODEL) == best_drafting_k(SURE[:6], MODEL)[0] <= 6
    steady.observe(0, 0)  # a step at K=0 says nothing of the drafts
    assert steady.capped(deep, lambda: SURE, MODEL) <= 6
    steady.observe(6, 6)
    assert steady.capped(deep, lambda: SURE, MODEL) == deep


def _lone(policy: AutoK, stretches: list[tuple[int, bool]], costs: StepCosts = MODEL) -> list[tuple[int, int]]:
    """Lone steps priced whole at `costs`, in stretches of (steps, the draft follows the text): each
    step's K and its accepted drafts."""
    policy.reprice(costs)
    seen = []
    for steps, follows in stretches:
        for _ in range(steps):
            k = policy.next_k()
            accepted = k if follows else 0
            policy.observe(k, accepted, 0.3 * costs.step_s(k), 0.7 * costs.step_s(k))
            seen.append((0 if policy.probing else k, accepted))
    return seen


def test_a_text_the_draft_stops_following_is_not_drafted_deep_again():
    """After a stretch of every draft accepted, the acceptance by position takes ~20 steps to fall: the
    tiny pair drafted 10 at four steps in a row with none accepted. Capped, one deep step is rejected,
    and the next drafts at most 2."""
    policy = AutoK(MODEL, prior_alpha=0.95, confidence_stops=True)
    seen = _lone(policy, [(60, True), (12, False)])
    assert max(k for k, _ in seen[:60]) > 6
    after = seen[60:]
    assert after[0][0] > 6 and all(k <= 2 for k, _ in after[1:])


def test_a_standing_choice_is_not_worked_out_again_at_every_step(monkeypatch):
    """Between choices (RECHOOSE_S of steps, new prices, a probe) the K stands: on the tiny pair working
    it out again (kept, tried) at every step was a third of the rule's Python above a fixed K's."""
    shallow = StepCosts(MODEL.draft_step_s, MODEL.verify_s[:4])  # up to K=3: steps of 0.17-0.29 ms
    policy = AutoK(shallow, prior_alpha=0.9, confidence_stops=True)
    _lone(policy, [(80, True)], shallow)
    asked = Counter()
    tried = StepsByK.tried
    monkeypatch.setattr(StepsByK, "tried", lambda *a, **kw: asked.update(["tried"]) or tried(*a, **kw))
    seen = _lone(policy, [(80, True)], shallow)
    assert {k for k, _ in seen} == {3}
    assert 80 // STAND_STEPS <= asked["tried"] <= 80 * shallow.step_s(3) / RECHOOSE_S + 2  # at each stand's end


def test_a_rule_weighing_each_token_keeps_no_standing_choice():
    """A draft step of milliseconds (the demo pair's shape): the margins decide each step's depth."""
    slow = StepCosts(5000 * US, tuple((30000 + 2000 * n) * US for n in range(17)))
    policy = AutoK(slow, prior_alpha=0.9, confidence_stops=True)
    policy.reprice(slow)
    for _ in range(10):
        assert policy.next_k() == slow.k_max  # at most: keep_drafting stops it
        assert policy.keep_drafting is not None
        policy.observe(2, 2, 0.01, 0.034)


def test_steps_at_a_standing_k_are_held_in_order_until_one_could_move_it():
    steady = SteadyK()
    assert not steady.hold(2, 2, 40 * US, 150 * US)  # nothing stands
    steady.stand(2)
    assert steady.k == 2
    assert steady.hold(2, 2, 40 * US, 150 * US) and steady.hold(2, 2, 41 * US, 151 * US)
    assert steady.holds
    assert not steady.hold(1, 1, 20 * US, 130 * US)  # a shorter draft (the answer's end): not its K
    assert not steady.hold(2, 1, 40 * US, 150 * US)  # a rejection at K >= 2: the cap moves the next K
    assert steady.settle() == [(2, 2, 40 * US, 150 * US), (2, 2, 41 * US, 151 * US)]
    assert steady.k == 0 and not steady.holds and steady.settle() == []
    steady.stand(1)
    assert steady.hold(1, 0, 20 * US, 130 * US)  # at K=1 a rejection moves nothing: held


def test_a_stand_ends_after_its_steps_or_its_time():
    steady = SteadyK()
    steady.stand(1)
    for _ in range(STAND_STEPS):
        assert steady.hold(1, 1, 20 * US, 130 * US)
    assert steady.k == 0 and not steady.holds  # the rule is asked again
    assert not steady.hold(1, 1, 20 * US, 130 * US)
    assert len(steady.settle()) == STAND_STEPS
    steady.stand(1)
    assert not steady.hold(1, 1, 0.2 * STAND_S, 0.9 * STAND_S)  # a pair whose steps take milliseconds holds none


def _script(policy: AutoK, steps: int, seed: int = 3) -> list[int]:
    """Lone steps priced whole at MODEL (the rule stands at K=1), the draft accepted 85 % of the time, each
    step timed as priced with a little noise: each step's K."""
    rng = random.Random(seed)
    ks = []
    for _ in range(steps):
        k = policy.next_k()
        accepted = sum(1 for _ in range(k) if rng.random() < 0.85)
        seconds = MODEL.step_s(k) * rng.uniform(1, 1.2)
        policy.observe(k, accepted, 0.3 * seconds, 0.7 * seconds)
        ks.append(k)
    return ks


def test_held_steps_teach_the_rule_what_each_step_observed_would(monkeypatch):
    """Observed when its stand ends, in order, as the lone steps they were: the same acceptance, rate and
    steps by K as a policy observing every step (no stand), where the Ks were the same."""
    shallow = StepCosts(MODEL.draft_step_s, MODEL.verify_s[:2])  # K=1 at most: its K never moves
    standing, observing = (AutoK(shallow, prior_alpha=0.85, confidence_stops=True) for _ in range(2))
    standing.reprice(shallow)
    observing.reprice(shallow)
    ks = _script(standing, 200)
    assert standing._steady.holds
    monkeypatch.setattr(SteadyK, "stand", lambda self, k: None)
    assert _script(observing, 200) == ks and set(ks[20:]) == {1}
    standing.settle()
    assert standing.observed == observing.observed == 200
    assert standing.alphas() == observing.alphas()
    assert standing.estimator.alpha == observing.estimator.alpha
    assert standing.rate == observing.rate
    assert standing._steps.priced(shallow) == observing._steps.priced(shallow)


def _holding() -> AutoK:
    """A lone policy standing at K=1 with steps held."""
    shallow = StepCosts(MODEL.draft_step_s, MODEL.verify_s[:2])
    policy = AutoK(shallow, prior_alpha=0.9, confidence_stops=True)
    _lone(policy, [(30, True)], shallow)
    for _ in range(STAND_STEPS):
        if policy._steady.holds:
            return policy
        _lone(policy, [(1, True)], shallow)
    raise AssertionError("no stand")


def test_a_slot_joining_others_takes_its_held_steps_in_as_a_lone_slot_s():
    policy = _holding()
    held = len(policy._steady._held)
    before = policy.observed
    prices = PassPrices(prior=MODEL)
    for _ in range(3):
        prices.observe(True, 2, 50 * US)
        prices.observe(False, 8, 300 * US)
    other = AutoK(MODEL, prior_alpha=0.9, confidence_stops=True)
    BatchK(prices).choose([SimpleNamespace(policy=policy, shared=False), SimpleNamespace(policy=other, shared=False)])
    assert not policy._steady.holds and policy.observed == before + held
    assert policy._steps._now == policy.observed  # its whole steps: lone steps, each timed (beside others none is)


def test_the_step_loop_prices_a_standing_rule_when_due_its_held_steps_taken_in_first(monkeypatch):
    """While the K stands the step loop reads no more than the clock; a pricing due (REPRICE_DRAFTING_S,
    doubling) comes as it would without the stand, after the held steps are observed."""
    shallow = StepCosts(MODEL.draft_step_s, MODEL.verify_s[:2])
    policy = AutoK(shallow, prior_alpha=0.9, confidence_stops=True)
    now, pricings, holding = [0.0], [], []
    choice, lone = BatchK(PassPrices(prior=MODEL), clock=lambda: now[0]), SimpleNamespace(policy=policy, shared=False)
    reprice = AutoK.reprice
    monkeypatch.setattr(
        AutoK, "reprice", lambda self, costs: pricings.append((now[0], self._steady.holds)) or reprice(self, costs)
    )
    policy.reprice(shallow)
    for _ in range(400):
        choice.choose([lone])
        holding.append(policy._steady.holds)
        k = policy.next_k()
        policy.observe(k, k, 0.3 * shallow.step_s(k), 0.7 * shallow.step_s(k))
        now[0] += shallow.step_s(k)
    assert sum(holding) > 300  # most steps held
    times = [at for at, _ in pricings[1:]]
    assert len(times) >= 4 and not any(held for _, held in pricings)  # each after the held steps went in
    assert all(later - earlier >= REPRICE_DRAFTING_S for earlier, later in pairwise(times))
    step = shallow.step_s(1)  # and when due, not at the stand's end (32 steps, 5.4 ms here)
    assert times[0] < REPRICE_DRAFTING_S + 2 * step and times[1] - times[0] < 2 * REPRICE_DRAFTING_S + 2 * step


def test_a_choice_worked_out_again_stands_from_its_first_step():
    """At new prices (or RECHOOSE_S on) the rule works its K out again; that K, its own and uncapped,
    holds its steps at once: on the tiny pair a stand begun only at the step after left a quarter of
    the steps to the whole rule."""
    policy = _holding()
    cheaper = StepCosts(0.9 * MODEL.draft_step_s, MODEL.verify_s[:2])
    policy.reprice(cheaper)
    assert not policy._steady.holds and policy._steady.k == 0
    k = policy.next_k()
    assert k == 1 and policy._steady.k == 1
