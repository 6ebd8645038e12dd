"""What a pass costs, learned from the step loop's own passes; a calibration only their prior."""

import pytest

from ollama_spec.decoding.batch_steps import best_shared_k
from ollama_spec.decoding.pass_prices import PassPrices, pass_seconds
from ollama_spec.decoding.step_costs import StepCosts

# timed while the machine was busy: everything twice what it costs now
BUSY = StepCosts(draft_step_s=0.008, verify_s=tuple(2 * (0.030 + 0.007 * n) for n in range(1, 10)))


def test_a_calibration_taken_while_busy_does_not_outlive_the_first_passes():
    prices = PassPrices(prior=BUSY)
    assert prices.target_pass(4) == pytest.approx(pass_seconds(BUSY, 4))  # nothing seen: the prior
    prices.observe(False, 2, BUSY.verify_s[1] / 2)  # one target pass, at half the calibrated time
    prices.observe(True, 1, BUSY.draft_step_s / 2)
    # sizes not seen yet keep the calibration's shape, at the machine's speed now
    assert prices.target_pass(6) == pytest.approx(BUSY.verify_s[5] / 2)
    assert prices.draft_pass(4) == pytest.approx(BUSY.draft_step_s * pass_seconds(BUSY, 4) / BUSY.verify_s[0] / 2)
    assert prices.step_costs(3).verify_s == pytest.approx(tuple(t / 2 for t in BUSY.verify_s[:4]))


def test_a_size_seen_follows_its_recent_passes():
    prices = PassPrices(prior=BUSY)
    for _ in range(30):
        prices.observe(False, 4, 0.050)
    assert prices.target_pass(4) == pytest.approx(0.050)
    for _ in range(30):  # the machine got busy
        prices.observe(False, 4, 0.200)
    assert prices.target_pass(4) == pytest.approx(0.200, rel=0.01)


def test_without_any_prior_the_first_target_pass_sets_the_scale():
    prices = PassPrices()
    assert not prices.known
    prices.observe(False, 1, 0.010)
    assert prices.known and prices.target_pass(1) == 0.010
    assert prices.target_pass(5) > prices.target_pass(2) > 0.010  # a CPU's shape until passes say otherwise
    assert prices.step_costs(4, drafts=False).draft_step_s == 0.0  # a lookup runs no draft pass


def test_the_shared_k_is_priced_by_the_passes_seen():
    """Where the passes say every token of a verify pass is dear, the batch drafts less than the
    calibration (cheap tokens) would have it."""
    cheap = StepCosts(0.001, (0.020,) * 9)
    alphas = [[0.8] * 8] * 4
    prices = PassPrices(prior=cheap)
    assert best_shared_k(alphas, prices, 0.1, 8) == best_shared_k(alphas, cheap, 0.1) == 8
    for tokens in range(4, 37):
        prices.observe(False, tokens, 0.020 * tokens / 4)  # each token a quarter of a pass
    assert best_shared_k(alphas, prices, 0.1, 8) < 4
