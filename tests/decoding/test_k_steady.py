"""What a lone rule drafting whole Ks keeps between steps (decoding/k_steady.py), and what that makes it draft."""

from collections import Counter

from ollama_spec.decoding.k_policy import AutoK
from ollama_spec.decoding.k_steady import SteadyK
from ollama_spec.decoding.k_tuning import RECHOOSE_S
from ollama_spec.decoding.step_costs import StepCosts, best_drafting_k
from ollama_spec.decoding.step_prices import StepsByK
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
    assert 3 <= asked["tried"] <= 80 * shallow.step_s(3) / RECHOOSE_S + 2


def test_a_rule_weighing_each_token_keeps_no_standing_choice():
    """A draft step of milliseconds (the demo pair's shape): the margins decide each step's depth."""
    slow = StepCosts(5000 * US, tuple((30000 + 2000 * n) * US for n in range(17)))
    policy = AutoK(slow, prior_alpha=0.9, confidence_stops=True)
    policy.reprice(slow)
    for _ in range(10):
        assert policy.next_k() == slow.k_max  # at most: keep_drafting stops it
        assert policy.keep_drafting is not None
        policy.observe(2, 2, 0.01, 0.034)
