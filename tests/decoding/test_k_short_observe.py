"""AutoK's short ways to observe (decoding/k_short_observe.py): each leaves the rule as the whole of
`_observe` would. The held steps of a stand are taken in at once; the acceptance of every step where it
is read; a run of steps at one K into the steps by K at once."""

import random
from copy import deepcopy

import pytest

from ollama_spec.decoding.acceptance import AcceptanceByPosition, AlphaEstimator
from ollama_spec.decoding.k_policy import AutoK
from ollama_spec.decoding.k_steady import SteadyK
from ollama_spec.decoding.step_costs import StepCosts
from ollama_spec.decoding.step_prices import STALE_STEPS, StepsByK
from tests.decoding.test_step_prices import MODEL

# What a policy's bookkeeping is, but for the held steps themselves (a standing policy holds them till `settle`)
STATE = (
    "observed",
    "last_drafted",
    "own_drafted",
    "_unchosen_s",
    "_drafting",
    "_rate_tokens",
    "_rate_seconds",
    "_probe_every",
    "_probe_paid",
    "_steps_without_draft",
    "costs",
)


def _state(policy: AutoK) -> dict:
    steps = policy._steps
    return {
        **{name: getattr(policy, name) for name in STATE},
        "estimator": vars(policy.estimator),
        "by_position": vars(policy.by_position),
        "accepted": policy._steady._accepted,
        "steps": (steps._now, steps._last, {k: (list(r), at) for k, (r, at) in steps._recent.items()}),
        "remeasure_after": steps._remeasure_after,
    }


def _run(policy: AutoK, steps: int, alpha: float, seed: int) -> list[int]:
    """Lone steps, each step timed as priced with a little noise; each step's K."""
    rng = random.Random(seed)
    ks = []
    for _ in range(steps):
        k = policy.next_k()
        accepted = next((i for i in range(k) if rng.random() >= alpha), k)
        seconds = policy.costs.step_s(min(k, policy.costs.k_max)) * rng.uniform(1, 1.2)
        policy.observe(k, accepted, 0.3 * seconds, 0.7 * seconds)
        ks.append(k)
    return ks


@pytest.mark.parametrize(("k_max", "alpha"), [(1, 0.85), (3, 0.97)])
def test_held_steps_taken_in_at_once_leave_the_rule_as_each_observed_would(monkeypatch, k_max, alpha):
    costs = StepCosts(MODEL.draft_step_s, MODEL.verify_s[: k_max + 1])
    at_once, one_by_one = (AutoK(costs, prior_alpha=alpha, confidence_stops=True) for _ in range(2))
    for policy in (at_once, one_by_one):
        policy.reprice(costs)
    runs, run_at_once = [], StepsByK.observe_run
    monkeypatch.setattr(StepsByK, "observe_run", lambda steps, k, each: (runs.append(k), run_at_once(steps, k, each)))
    ks = _run(at_once, 300, alpha, seed=5)
    at_once.settle()
    assert max(ks) == k_max and k_max in runs  # it stood at its deepest K, its held steps taken in at once
    monkeypatch.setattr(AutoK, "_observe_held", lambda self, held: [self._observe(*step) for step in held])
    assert _run(one_by_one, 300, alpha, seed=5) == ks
    one_by_one.settle()
    assert _state(at_once) == _state(one_by_one)


def test_held_steps_after_a_probe_or_unpriced_are_taken_in_one_by_one():
    policy = AutoK(MODEL, confidence_stops=True)  # not priced by the step loop: it learns costs from each step
    policy._steady.stand(1)
    for _ in range(3):
        assert policy._steady.hold(1, 1, 40e-6, 150e-6)
    before = policy.costs
    policy.settle()
    assert policy.observed == 3 and policy.costs != before  # each step's time taught it the costs


def test_steps_taken_in_together_teach_the_acceptance_as_each_step_would():
    rng = random.Random(2)
    steps = [(drafted, rng.randint(0, drafted)) for drafted in rng.choices([0, 1, 2, 4], k=80)]
    estimator, by_position = AlphaEstimator(), AcceptanceByPosition()
    estimator_each, by_position_each = deepcopy(estimator), deepcopy(by_position)
    estimator.observe_all(steps)
    by_position.observe_all(steps)
    for drafted, accepted in steps:
        estimator_each.observe(drafted, accepted)
        by_position_each.observe(drafted, accepted)
    assert vars(estimator) == vars(estimator_each) and vars(by_position) == vars(by_position_each)
    assert estimator.alpha != AlphaEstimator().alpha and len(by_position.tried) == 4


def test_the_acceptance_is_taken_in_where_it_is_read():
    policy = AutoK(MODEL, prior_alpha=0.5, confidence_stops=True)
    policy.shared_k = 2
    for _ in range(10):
        policy.observe(2, 2, 40e-6, 300e-6)  # beside others: nothing folded yet
    assert len(policy._unseen) == 10
    assert policy.alphas()[0] > 0.5 and not policy._unseen
    assert policy.estimator.alpha > 0.5


@pytest.mark.parametrize("last", [None, 1, 2])
@pytest.mark.parametrize("age", [1, STALE_STEPS + 5])
def test_a_run_of_steps_prices_its_k_as_each_step_would(last, age):
    run, each = StepsByK(), StepsByK()
    for steps in (run, each):
        steps.observe(2, 300e-6)
        steps.observe(2, 310e-6)
        for _ in range(age):
            steps.observe(1, 200e-6)
        if last is not None:
            steps.observe(last, 250e-6)
    seconds = [320e-6, 330e-6, 340e-6, 350e-6, 360e-6, 370e-6]
    run.observe_run(2, seconds)
    for step_s in seconds:
        each.observe(2, step_s)
    assert vars(run) == vars(each)
    assert run.priced(MODEL) == each.priced(MODEL)


def test_a_stand_ends_at_its_last_step_held():
    steady = SteadyK()
    steady.stand(2)
    assert steady.k == 2 and not steady.holds
    assert steady.hold(2, 2, 40e-6, 150e-6) and steady.holds and steady.k == 2
