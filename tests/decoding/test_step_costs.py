"""The cost model of a step on hand-made cost curves: expected tokens, α as tried, the best K."""

import pytest

from ollama_spec.decoding.step_costs import (
    StepCosts,
    best_k,
    best_k_by_position,
    estimate_alpha,
    expected_tokens_by_position,
    expected_tokens_per_step,
    median_costs,
)

# A GPU: a batch of up to 9 tokens costs what one does; the draft step is 1/20 of a target step.
GPU = StepCosts(draft_step_s=0.001, verify_s=(0.020,) * 9)
# A CPU: every token in the batch costs ~40 % of a step more (like the 2-core runs in the issue).
CPU = StepCosts(draft_step_s=0.004, verify_s=tuple(0.030 * (1 + 0.4 * n) for n in range(9)))
# A draft as slow as the target: drafting never pays.
SLOW_DRAFT = StepCosts(draft_step_s=0.030, verify_s=(0.030,) * 9)


def test_expected_tokens_worked_by_hand():
    assert expected_tokens_per_step(0.5, 1) == 1.5  # 1 + 0.5
    assert expected_tokens_per_step(0.5, 3) == 1.875  # 1 + 0.5 + 0.25 + 0.125
    assert expected_tokens_per_step(1.0, 4) == 5
    assert expected_tokens_per_step(0.0, 8) == 1


def test_best_k_on_hand_made_cost_curves():
    # GPU, α = 0.8: E/(K·1 + 20) ms rises until K=8: E(8) = 4.33 over 28 ms beats E(7) = 4.16 over 27.
    assert best_k(0.8, GPU) == 8
    # CPU, α = 0.8 (tokens per ms): alone 1/30 = 0.0333; K=1: 1.8/(4 + 42) = 0.0391;
    # K=2: 2.44/(8 + 54) = 0.0394; K=3: 2.952/(12 + 66) = 0.0378.
    assert best_k(0.8, CPU) == 2
    # Barely-matched pair on the CPU: K=1 gives 1.2/46 = 0.0261 < 1/30 = 0.0333 alone.
    assert best_k(0.2, CPU) == 0
    assert best_k(0.95, SLOW_DRAFT) == 0


def test_alpha_is_estimated_from_tried_tokens_not_drafted():
    # 3 steps of K=4: [accept all], [2 accepted then a rejection], [rejection at once]
    assert estimate_alpha(accepted=6, rejections=2) == 0.75  # 6 of 8 tried; 6 of 12 drafted is 0.5
    assert estimate_alpha(0, 0) is None


def test_expected_tokens_by_position_worked_by_hand():
    assert expected_tokens_by_position([0.5, 0.5, 0.5], 3) == expected_tokens_per_step(0.5, 3)
    assert expected_tokens_by_position([0.9, 0.5, 0.2], 3) == pytest.approx(1 + 0.9 + 0.45 + 0.09)
    assert expected_tokens_by_position([0.9, 0.5], 0) == 1


def test_acceptance_falling_along_the_draft_shortens_it():
    """The same pooled α (0.8) and the GPU's flat verify costs: one α says draft 8; acceptance that
    falls past the third position says stop there."""
    flat = [0.8] * 8
    falling = [0.95, 0.9, 0.85, 0.1, 0.1, 0.1, 0.1, 0.1]
    assert best_k_by_position(flat, GPU) == 8 == best_k(0.8, GPU)
    assert best_k_by_position(falling, GPU) == 3


def test_pricings_are_taken_at_their_median_size_by_size_the_lower_of_two():
    """One pricing far off the others (a busy spell) moves nothing; of an even count, the lower middle."""
    pricings = [StepCosts(d, (v, 2 * v)) for d, v in ((0.004, 0.010), (0.002, 0.030), (0.003, 0.011), (0.009, 0.012))]
    assert median_costs(pricings) == StepCosts(0.003, (0.011, 0.022))
    assert median_costs(pricings[:3]) == StepCosts(0.003, (0.011, 0.022))
    assert median_costs([*pricings[:2], StepCosts(0.001, (0.005,))]).verify_s == (0.010,)  # the sizes all price
