"""How often a lone AutoK works its best drafting K out again: by the modelled time of its steps."""

import pytest

from ollama_spec.decoding import k_policy
from ollama_spec.decoding.k_policy import AutoK
from ollama_spec.decoding.k_tuning import RECHOOSE_S
from ollama_spec.decoding.step_costs import StepCosts
from tests.decoding.test_step_costs import CPU

TINY = StepCosts(40e-6, tuple(100e-6 + 20e-6 * n for n in range(17)))  # the tiny pair's: a step 0.2-0.4 ms


def _drafting_steps(policy: AutoK, steps: int, monkeypatch) -> tuple[int, float]:
    """Run `steps` drafting steps (every other one loses its second draft); how many times the best K
    was worked out, and the modelled seconds of the steps."""
    calls, real = [], k_policy.best_drafting_k
    monkeypatch.setattr(k_policy, "best_drafting_k", lambda alphas, costs: calls.append(1) or real(alphas, costs))
    seconds = 0.0
    for step in range(steps):
        k = policy.next_k()
        assert k >= 1 and not policy.probing
        policy.observe(k, min(k, 1 + step % 2 * k), 40e-6 * k, 150e-6)
        seconds += policy.costs.step_s(min(k, policy.costs.k_max))
    return len(calls), seconds


def test_a_lone_rule_on_sub_millisecond_steps_works_its_k_out_again_each_millisecond(monkeypatch):
    """Its ~10 us of Python is a few percent of a 0.3 ms step: worked out again once the steps since
    took RECHOOSE_S, not at every step (then the K rule's Python was 2-3x a fixed K's)."""
    policy = AutoK(TINY, prior_alpha=0.9, confidence_stops=True)
    policy.next_k()
    policy.observe(1, 1, 40e-6, 150e-6)  # drafting taken up
    worked_out, seconds = _drafting_steps(policy, 60, monkeypatch)
    assert worked_out <= seconds / RECHOOSE_S + 2
    assert worked_out < 60 / 2


def test_a_lone_rule_on_millisecond_steps_works_its_k_out_again_at_every_step(monkeypatch):
    policy = AutoK(CPU, prior_alpha=0.9)
    assert CPU.step_s(1) >= RECHOOSE_S
    policy.next_k()
    policy.observe(1, 1, CPU.draft_step_s, CPU.verify_s[1])
    worked_out, _ = _drafting_steps(policy, 20, monkeypatch)
    assert worked_out == 20


@pytest.mark.parametrize("costs", [TINY, CPU])
def test_new_prices_are_worked_out_at_once(costs, monkeypatch):
    """A reprice (the step loop's new prices) makes the next step choose on them, however short."""
    policy = AutoK(costs, prior_alpha=0.9, confidence_stops=True)
    policy.next_k()
    policy.observe(1, 1, costs.draft_step_s, costs.verify_s[1])
    policy.next_k()
    dear = StepCosts(costs.draft_step_s * 20, costs.verify_s)  # drafting no longer pays
    policy.reprice(dear)
    assert policy.next_k() == 0 or policy.probing
