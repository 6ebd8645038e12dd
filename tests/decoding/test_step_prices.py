"""A lone rule priced by its whole steps (decoding/step_prices.py), and what that makes it draft."""

from collections import Counter

import numpy as np
import pytest

from ollama_spec.decoding.k_policy import AutoK
from ollama_spec.decoding.k_tuning import PROBE_ACCEPTANCE, PROBE_EVERY
from ollama_spec.decoding.step_costs import StepCosts, best_k
from ollama_spec.decoding.step_prices import (
    ALONE_AFTER,
    FORGET_STEPS,
    MIN_STEPS,
    REMEASURE_STEPS,
    TRY_STEPS,
    StepsByK,
)
from tests.decoding.test_step_costs import CPU

US = 1e-6
# The passes' model of a pair whose passes take well under a millisecond (the tiny pair's shape)
MODEL = StepCosts(40 * US, tuple((110 + 20 * n) * US for n in range(17)))


def _steady(steps: StepsByK, k: int, seconds: float) -> None:
    """Enough steps at `k`, each taking `seconds`, for its own price (the first pays the change of K)."""
    for _ in range(MIN_STEPS + 1):
        steps.observe(k, seconds)


def test_a_k_run_lately_is_priced_by_its_steady_steps():
    """Its steps' second fastest of five; the step that changed K (graphs built anew, a catch-up) and
    probes are no steps of the K they ran at."""
    steps = StepsByK()
    for _ in range(4):
        steps.observe(1, 200 * US)
    steps.observe(3, 900 * US)  # the change from K=1
    for seconds in (400, 420, 410):
        steps.observe(3, seconds * US)
    steps.observe(3, 2000 * US, counted=False)  # a probe's, or a lookup's
    steps.observe(3, 5000 * US)  # the first after it: not steady either
    priced = steps.priced(MODEL)
    assert priced.step_s(1) == pytest.approx(200 * US)
    assert priced.step_s(3) == pytest.approx(410 * US)
    assert priced.draft_step_s == MODEL.draft_step_s


def test_three_descheduled_steps_in_five_move_no_price():
    steps = StepsByK()
    for seconds in (200, 5000, 210, 4000, 9000, 205):  # the first: the change to K=2
        steps.observe(2, seconds * US)
    assert steps.priced(MODEL).step_s(2) == pytest.approx(210 * US)


def test_a_k_not_run_is_priced_as_the_ks_run_compare_with_the_model():
    steps = StepsByK()
    _steady(steps, 2, 1.5 * MODEL.step_s(2))
    priced = steps.priced(MODEL)
    assert priced.step_s(5) == pytest.approx(1.5 * MODEL.step_s(5))
    # the target alone has no draft pass and none of the drafting Python: its model's price stands
    assert priced.step_s(0) == pytest.approx(MODEL.step_s(0))


def test_the_target_alone_is_priced_by_its_own_steps_and_theirs_price_no_drafting_k():
    steps = StepsByK()
    _steady(steps, 0, 0.5 * MODEL.step_s(0))
    priced = steps.priced(MODEL)
    assert priced.step_s(0) == pytest.approx(0.5 * MODEL.step_s(0))
    assert priced.step_s(2) == pytest.approx(MODEL.step_s(2))  # K=0's ratio is no drafting K's


def test_weighing_each_token_only_the_target_alone_is_priced_by_its_steps():
    """A rule weighing each token drafts the margins' K, no K of its own to price: its passes' prices
    stand but for the target alone's, which its steps price as they do for a rule drafting whole Ks."""
    steps = StepsByK()
    for k in (0, 2):
        _steady(steps, k, 0.5 * MODEL.step_s(k))
    priced = steps.priced(MODEL, whole=False)
    assert priced.verify_s[0] == pytest.approx(0.5 * MODEL.verify_s[0])
    assert priced.verify_s[1:] == MODEL.verify_s[1:]


def test_the_target_alone_is_tried_against_a_k_its_own_steps_price():
    """K=1 priced by the ratio of K=2's steps (on the tiny pair, dearer by their graph builds) is no K to
    weigh K=0's own price against: K=0 waits until K=1's steps price it."""
    steps, alphas = StepsByK(), lambda: [0.9] * MODEL.k_max
    _steady(steps, 2, 2 * MODEL.step_s(2))
    priced = steps.priced(MODEL)
    assert steps.tried(1, priced, alphas) == 1
    for _ in range(ALONE_AFTER):
        steps.observe(1, MODEL.step_s(1))
    priced = steps.priced(MODEL)
    assert steps.tried(1, priced, alphas) == 0


def test_a_short_request_keeps_its_drafts():
    """Not before ALONE_AFTER steps: a 6-token answer whose first steps tried K=0 drafted nothing."""
    steps, alphas = StepsByK(), lambda: [0.9] * MODEL.k_max
    _steady(steps, 2, 2 * MODEL.step_s(2))  # K=1's neighbour priced: no try of it
    for _ in range(ALONE_AFTER - 1 - (MIN_STEPS + 1)):
        steps.observe(1, MODEL.step_s(1))
    priced = steps.priced(MODEL)
    assert steps.tried(1, priced, alphas) == 1
    steps.observe(1, MODEL.step_s(1))
    steps.priced(MODEL)
    assert steps.tried(1, priced, alphas) == 0


def test_a_rule_drafting_tries_the_target_alone_once_whatever_the_model_says():
    """While a rule drafts, the target's one-token pass is never timed: the model may price it far
    dearer than it runs, so it is tried (TRY_STEPS steps), once until FORGET_STEPS pass."""
    steps = StepsByK()
    dear_alone = StepCosts(MODEL.draft_step_s, (5 * MODEL.verify_s[1], *MODEL.verify_s[1:]))
    alphas = lambda: [0.9] * MODEL.k_max
    for _ in range(ALONE_AFTER):
        steps.observe(1, MODEL.step_s(1))
    for k in (2, 3):  # the neighbours within TRY_WITHIN are tried first
        _steady(steps, k, dear_alone.step_s(k))
    priced = steps.priced(dear_alone)
    tried = [steps.tried(2, priced, alphas) for _ in range(TRY_STEPS + 1)]
    assert tried == [0] * TRY_STEPS + [2]
    steps.priced(dear_alone)
    assert steps.tried(2, priced, alphas) == 2  # not again: tried lately


def test_a_k_no_longer_run_keeps_how_its_steps_compared_with_the_model():
    """The model follows the machine's speed; the ratio keeps what is that K's own (its graph builds)."""
    steps = StepsByK()
    _steady(steps, 1, MODEL.step_s(1))
    steps.priced(MODEL)
    slower = StepCosts(2 * MODEL.draft_step_s, tuple(2 * v for v in MODEL.verify_s))  # the machine now
    for _ in range(300):  # long past STALE_STEPS at K=2, whose steps cost 1.4x the model
        steps.observe(2, 1.4 * slower.step_s(2))
    priced = steps.priced(slower)
    assert priced.step_s(1) == pytest.approx(slower.step_s(1))  # K=1's own ratio, 1.0: not K=2's 1.4
    assert priced.step_s(3) == pytest.approx(1.4 * slower.step_s(3))


def test_a_deeper_k_never_run_is_priced_as_the_nearest_deeper_k_not_as_k1():
    """K=1 changes no draft pass's shape and a deeper K two a step: on the tiny pair K=1's steps ran at
    0.44x the model and K=2, 3 and 5 at 1.03-1.15x, and K=4, priced by K=1's ratio (the median of the
    fresh drafting Ks), looked the cheapest tokens: the rule drafted 4 deep at 0.8x K=1's tokens a second."""
    steps = StepsByK()
    for k, ratio in ((2, 1.03), (3, 1.15), (5, 1.06)):
        _steady(steps, k, ratio * MODEL.step_s(k))
        steps.priced(MODEL)
    _steady(steps, 1, 0.7 * MODEL.step_s(1))  # the only K run lately
    priced = steps.priced(MODEL)
    assert priced.step_s(1) == pytest.approx(0.7 * MODEL.step_s(1))
    assert priced.step_s(4) == pytest.approx(1.06 * MODEL.step_s(4))  # the nearest of its kind, the deeper at a tie
    assert priced.step_s(8) == pytest.approx(1.06 * MODEL.step_s(8))
    assert priced.step_s(0) == pytest.approx(MODEL.step_s(0))  # never another's ratio


def test_a_deeper_k_never_run_takes_the_ratio_of_the_nearest_deeper_k_below_or_above_it():
    steps = StepsByK()
    for k, ratio in ((3, 1.1), (6, 1.3)):
        _steady(steps, k, ratio * MODEL.step_s(k))
        steps.priced(MODEL)
    _steady(steps, 1, 0.7 * MODEL.step_s(1))
    priced = steps.priced(MODEL)
    for k, ratio in ((2, 1.1), (4, 1.1), (5, 1.3), (7, 1.3), (16, 1.3)):
        assert priced.step_s(k) == pytest.approx(ratio * MODEL.step_s(k)), k


def test_a_deeper_k_is_priced_by_k1_where_no_deeper_one_ran():
    steps = StepsByK()
    _steady(steps, 1, 0.75 * MODEL.step_s(1))
    assert steps.priced(MODEL).step_s(3) == pytest.approx(0.75 * MODEL.step_s(3))


def _run(
    policy: AutoK, truth, steps: int, alpha: float = 0.9, seed: int = 3, model: StepCosts = MODEL, rng=None
) -> list[int]:
    """Lone steps repriced by the passes' `model` every 4th, each taking `truth(k)`; the Ks drafted (a
    probe's step counted as K=0). `rng`: one that runs on from an earlier call (else a new one of `seed`)."""
    rng, chosen = rng if rng is not None else np.random.default_rng(seed), []
    for step in range(steps):
        if step % 4 == 0:
            policy.reprice(StepCosts(model.draft_step_s, model.verify_s))  # the step loop's new pricing
        k = policy.next_k()
        accepted = next((i for i in range(k) if rng.random() > alpha), k)
        policy.observe(k, accepted, 0.3 * truth(k), 0.7 * truth(k))
        chosen.append(0 if policy.probing else k)
    return chosen


def test_a_lone_rule_drafts_the_k_whose_steps_run_fastest_not_the_one_its_passes_price_best():
    """On the tiny pair a step at K >= 2 changes its draft passes' shape twice (llama.cpp builds its
    graph again, ~30 us each) and one at K=1 does not: priced by its passes, K=2-3 looked best where
    K=1 made 1.2-1.4x their tokens a second. Priced by its steps, the rule finds K=1 (it tries the
    shallower Ks its steps have not priced) and keeps it."""
    truth = lambda k: MODEL.step_s(k) + (100 * US if k >= 2 else 0.0)
    policy = AutoK(MODEL, prior_alpha=0.9, confidence_stops=True)
    chosen = _run(policy, truth, 300)
    assert Counter(chosen[-100:])[1] >= 90


def test_a_lone_rule_settles_on_the_target_alone_where_its_steps_run_faster_than_drafting():
    """The passes' model prices the target's one-token pass 2.5x dearer than it runs (it is never timed
    while drafting) and every drafting step runs 150 us over its passes (its Python): drafting made
    0.65-0.75x of the target alone. The rule tries K=0, prices it by its steps and stays there but for
    its probes."""
    model = StepCosts(MODEL.draft_step_s, (2.5 * MODEL.verify_s[0], *MODEL.verify_s[1:]))
    truth = lambda k: MODEL.step_s(k) + (150 * US if k else 0.0)
    policy = AutoK(model, prior_alpha=0.8, confidence_stops=True)
    chosen = _run(policy, truth, 400, alpha=0.8, model=model)
    assert Counter(chosen[-100:])[0] >= 90


def test_where_its_passes_price_it_right_the_rule_drafts_as_deep_as_before():
    """No graph builds to pay: the steps cost what their passes do, and the best K is the model's."""
    policy = AutoK(MODEL, prior_alpha=0.9, confidence_stops=True)
    chosen = _run(policy, MODEL.step_s, 300)
    assert best_k(0.9, MODEL) == 3
    assert 2 <= Counter(chosen[-100:]).most_common(1)[0][0] <= 4


def test_a_rule_weighing_each_token_keeps_its_passes_prices():
    """Where a draft step costs milliseconds (the demo pair: confidence stops, token by token) its
    steps' K is the margins' choice, not a price to learn: the passes' prices stand."""
    policy = AutoK(CPU, prior_alpha=0.9, confidence_stops=True)
    policy.reprice(CPU)
    for _ in range(20):  # fewer than ALONE_AFTER: no step tries the target alone
        k = policy.next_k()
        policy.observe(min(k, 2), 1, 0.5, 0.5)  # far dearer than priced
    policy.reprice(StepCosts(CPU.draft_step_s, CPU.verify_s))
    assert policy.costs.verify_s == pytest.approx(CPU.verify_s)


def test_a_probe_is_no_step_of_the_rules_own():
    """The step loop explores a lone slot whose rule does not draft (engine/batch_k.py): a probe's one
    token is not its rule drafting, one drafted by the rule at K=1 is."""
    policy = AutoK(MODEL, prior_alpha=0.9, confidence_stops=True)
    policy.reprice(MODEL)
    policy.probing = PROBE_ACCEPTANCE
    policy.observe(1, 1, 50 * US, 150 * US)
    assert policy.own_drafted == 0
    policy.probing = ""
    policy.observe(1, 1, 50 * US, 150 * US)
    assert policy.own_drafted == 1


def test_a_ratio_taken_long_ago_is_forgotten_and_its_k_tried_again():
    """A K whose ratio was taken in a busy spell must not stay out for good."""
    steps = StepsByK()
    for _ in range(MIN_STEPS + 1):
        steps.observe(1, 3 * MODEL.step_s(1))  # busy
    steps.priced(MODEL)
    for _ in range(FORGET_STEPS + 1):
        steps.observe(3, MODEL.step_s(3))
    priced = steps.priced(MODEL)
    assert priced.step_s(1) == pytest.approx(MODEL.step_s(1))  # as K=3's steps compare: 1.0
    alphas = lambda: [0.9] * MODEL.k_max
    assert steps.tried(3, priced, alphas) == 1  # tried again


def test_a_k_priced_in_a_busy_moment_is_priced_again_by_the_steps_after_a_probe():
    """A busy moment priced the drafting steps at 2.5x what they run at, and the rule went to K=0. That
    price stays while K=0 runs (FORGET_STEPS), and each probe alone pays a catch-up: the tiny pair sat at
    K=0 for 300-700 of 1,000 steps where K=1 made 1.3x its tokens. A probe whose draft is accepted goes on
    for a few steps at its K where that K's own steps are older than REMEASURE_STEPS, and they price it
    again: the rule drafts again long before the busy price would be forgotten."""
    rng = np.random.default_rng(5)
    policy = AutoK(MODEL, prior_alpha=0.9, confidence_stops=True)
    _run(policy, MODEL.step_s, 100, rng=rng)
    busy = _run(policy, lambda k: (2.5 if k else 1.0) * MODEL.step_s(k), 100, rng=rng)
    assert Counter(busy[-50:])[0] >= 40  # the target alone, while drafting costs 2.5x
    quiet = _run(policy, MODEL.step_s, 2 * REMEASURE_STEPS + 4 * PROBE_EVERY, rng=rng)
    assert 2 * REMEASURE_STEPS + 4 * PROBE_EVERY < FORGET_STEPS
    assert sum(k > 0 for k in quiet[-REMEASURE_STEPS:]) >= 0.8 * REMEASURE_STEPS


def test_a_probe_prices_again_only_a_k_whose_own_steps_are_old():
    steps = StepsByK()
    _steady(steps, 1, MODEL.step_s(1))
    steps.remeasure(1)
    assert steps.trial() == 0  # priced by its steps just now: nothing to try
    for _ in range(REMEASURE_STEPS + 1):
        steps.observe(0, MODEL.step_s(0))
    steps.remeasure(1)
    assert [steps.trial() for _ in range(TRY_STEPS + 1)] == [1] * TRY_STEPS + [0]


@pytest.mark.parametrize(("costs", "priced_again"), [(MODEL, True), (CPU, False)])
def test_an_accepted_probe_prices_its_k_again_only_where_steps_are_priced_whole(costs, priced_again):
    """A rule weighing each token (a draft step of milliseconds: CPU) drafts the margins' K, priced by its
    passes: steps after a probe would price nothing, and are not run."""
    policy = AutoK(costs, prior_alpha=0.9, confidence_stops=True)
    policy.reprice(costs)
    policy.next_k()  # whether it weighs each token
    while policy._steps.trial():  # a K its steps have not priced yet, tried (`tried`): done with
        pass
    policy.probing = PROBE_ACCEPTANCE
    policy.observe(1, 1, costs.draft_step_s, costs.verify_s[1])
    assert policy._steps.trial() == (1 if priced_again else 0)


def _at_zero(steps: StepsByK, n: int) -> None:
    for _ in range(n):
        steps.observe(0, MODEL.step_s(0))


def _remeasured(steps: StepsByK, k: int) -> bool:
    """A probe at `k` accepted: whether steps at `k` follow to price it again (each then run)."""
    steps.remeasure(k)
    ran = False
    while tried := steps.trial():
        steps.observe(tried, MODEL.step_s(tried))
        ran = True
    return ran


def test_re_measures_back_off_until_the_rule_drafts_again():
    """Where the steps after a probe find drafting still does not pay, each re-measure waits twice as long
    as the last (a catch-up each: an EAGLE-3 head's reads every position K=0 skipped); once the rule drafts
    by its own choice, the wait is REMEASURE_STEPS again."""
    steps = StepsByK()
    _steady(steps, 1, MODEL.step_s(1))
    _at_zero(steps, REMEASURE_STEPS + 1)
    assert _remeasured(steps, 1)
    _at_zero(steps, REMEASURE_STEPS + 1)
    assert not _remeasured(steps, 1)  # twice as long now
    _at_zero(steps, REMEASURE_STEPS)
    assert _remeasured(steps, 1)
    _steady(steps, 1, MODEL.step_s(1))  # the rule drafts again
    _at_zero(steps, REMEASURE_STEPS + 1)
    assert _remeasured(steps, 1)


def test_a_probe_prices_again_a_k_too_few_of_whose_steps_ran():
    """A K with fewer than MIN_STEPS steady steps has no price of its own: a probe accepted at it runs it
    again at once, not REMEASURE_STEPS later. At the tiny pair's first request, K=1 ran two steady steps,
    was priced by K=2's ratio (its steps build llama.cpp's graphs anew), lost to K=0 and sat there ~60 steps."""
    steps = StepsByK()
    for _ in range(MIN_STEPS):  # the first pays the change of K
        steps.observe(1, MODEL.step_s(1))
    _at_zero(steps, 8)
    assert _remeasured(steps, 1)
