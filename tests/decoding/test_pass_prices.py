"""What a pass costs, learned from the step loop's own passes; a calibration only their prior."""

import itertools
import math

import numpy as np
import pytest

from ollama_spec.decoding.batch_steps import best_shared_k
from ollama_spec.decoding.pass_prices import (
    RECOST_PASSES,
    RECOST_S,
    STALE_PASSES,
    PassPrices,
    least_squares,
    pass_seconds,
)
from ollama_spec.decoding.step_costs import StepCosts, expected_tokens_for_each_k

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


@pytest.mark.parametrize("pass_s", [RECOST_S / 24.9, RECOST_S / 2.1])
def test_the_costs_are_worked_out_again_once_enough_passes_and_time_went_by(pass_s):
    """Sub-millisecond passes (the tiny pair's, a GPU's small pair) are priced again once they took
    RECOST_S, not every RECOST_PASSES: that pricing and the lone rule's after it were half of -k auto's
    Python a step. Passes of milliseconds are priced again every RECOST_PASSES, as before."""
    prices = PassPrices(prior=BUSY)
    prices.observe(False, 1, pass_s)
    first = prices.step_costs(4)
    seen = 1
    while prices.step_costs(4) is first:
        prices.observe(False, 1 + seen % 3, pass_s)
        seen += 1
    assert seen - 1 == max(RECOST_PASSES, math.ceil(RECOST_S / pass_s))


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
    for tokens in range(4, 37, 4):  # each size the 4 slots' step runs, K = 0..8
        prices.observe(False, tokens, 0.020 * tokens / 4)  # each token a quarter of a pass
    assert best_shared_k(alphas, prices, 0.1, 8) < 4


def test_after_a_busy_spell_the_shared_k_follows_the_quiet_machine_within_a_few_dozen_steps():
    """A busy spell during the load and the first steps (each pass 20 ms dearer: a core taken, the
    calibration timed then too) drives the batch's K to 0; once the machine is quiet, the passes the
    loop runs (the probes a slot makes at K=0 included) bring it back near the best K within
    STALE_PASSES steps and a few more, rather than after every busy value has decayed pass by pass."""
    slots, alphas = 4, [[0.8] * 8] * 4

    def target(tokens, busy):
        return 0.010 + 0.0004 * tokens + busy

    def draft(rows, busy):
        return 0.001 + 0.0001 * rows + busy

    def rate(k):  # tokens a second at K on the quiet machine
        return slots * expected_tokens_for_each_k(alphas[0])[k] / (k * draft(slots, 0) + target(slots * (k + 1), 0))

    prices = PassPrices(prior=StepCosts(draft(1, 0.02), tuple(target(n, 0.02) for n in range(1, 10))))
    chosen, at_zero = [], 0
    for step in range(60):
        busy = 0.02 if step < 30 else 0.0
        k = best_shared_k(alphas, prices, 0.1, 8)
        chosen.append(k)
        at_zero = at_zero + 1 if k == 0 else 0
        if k == 0 and at_zero % 8 == 0:  # a slot's probe: one draft token, each sequence's verify padded to 2
            prices.observe(True, 1, draft(1, busy))
            prices.observe(False, 2 * slots, target(2 * slots, busy))
            continue
        for _ in range(k):
            prices.observe(True, slots, draft(slots, busy))
        prices.observe(False, slots * (k + 1), target(slots * (k + 1), busy))
    best = max(rate(k) for k in range(9))
    assert chosen[29] == 0  # busy: drafting did not pay
    assert all(rate(k) >= 0.95 * best for k in chosen[30 + STALE_PASSES + 4 :])


@pytest.mark.parametrize("prior", [None, BUSY])
def test_a_pass_not_run_lately_keeps_its_price_as_the_machine_moved_since(prior):
    """A lone slot that stops drafting because a draft token's Python makes it dear must not find the
    draft cheap again (the calibration's decode, or a share of the target) once its passes go stale:
    the last price holds, moved as the target's passes moved since."""
    prices = PassPrices(prior=prior)
    for _ in range(3):
        prices.step_costs(4)  # the loop prices each step (a lone slot every few)
        prices.observe(True, 1, 0.004)  # a draft token: its decode and its Python
        prices.observe(False, 2, 0.010)
    for _ in range(STALE_PASSES + 4):  # K=0: the target alone
        prices.step_costs(4)
        prices.observe(False, 1, 0.009)
    assert prices.draft_pass(1) == pytest.approx(0.004, rel=0.1)  # the sizes seen differ in shape from the prior
    assert prices.target_pass(2) == pytest.approx(0.010, rel=0.1)
    for _ in range(STALE_PASSES):  # the machine got twice as slow
        prices.step_costs(4)
        prices.observe(False, 1, 0.018)
    assert prices.draft_pass(1) == pytest.approx(0.008, rel=0.1)
    assert prices.target_pass(2) == pytest.approx(0.020, rel=0.1)


def test_a_lone_slots_verify_costs_are_a_line_not_each_sizes_noise():
    """Each size's price comes from few passes timed on a shared CPU: one size cheaper than a smaller
    one would read as drafts that cost nothing. The costs a lone slot is priced by rise with the
    batch, as the passes do on the whole."""
    prices = PassPrices()
    timed = {1: 0.131, 2: 0.162, 3: 0.193, 4: 0.098, 5: 0.136, 6: 0.161, 7: 0.363, 8: 0.192}  # ms, one run
    for _ in range(3):
        for size, ms in timed.items():
            prices.observe(False, size, ms / 1000)
    verify = prices.step_costs(7, drafts=False).verify_s
    assert all(b >= a for a, b in itertools.pairwise(verify))
    assert verify[3] > verify[0]  # 4 tokens cost more than 1
    assert sum(verify) == pytest.approx(sum(timed.values()) / 1000, rel=0.05)  # the line through them


def test_a_size_not_run_rises_from_the_sizes_run_as_the_prior_rises_not_as_scaled():
    """The calibration times llama.cpp's calls alone; the loop's passes carry the Python around them, the
    same at every size. Scaled by a ratio, the prior's rise would be as many times too steep, and every
    deeper drafting shape too dear (the tiny pair, where that Python is most of a pass): a size not run
    is priced on the line through the sizes that ran, by the prior's shape."""
    calibrated = StepCosts(draft_step_s=0.00005, verify_s=tuple(0.0001 + 0.00006 * n for n in range(1, 18)))
    python = 0.0002  # a pass's Python, whatever its size

    def passes(tokens):
        return pass_seconds(calibrated, tokens) + python

    prices = PassPrices(prior=calibrated)
    for _ in range(5):
        for tokens in (4, 8):  # 4 slots at K=0 and a probe's K=1
            prices.observe(False, tokens, passes(tokens))
    for tokens in (12, 16, 24):
        assert prices.target_pass(tokens) == pytest.approx(passes(tokens), rel=0.05)


# the tiny pair's passes on one thread, as the loop times them (seconds): a target pass and a draft row
def _tiny_target(tokens):
    return 0.0002 + 0.00001 * tokens


def _tiny_draft(rows):
    return 0.00003 + 0.000005 * rows


def _steady(prices, slots, k, steps=6):
    """`steps` steps of `slots` slots at K=k, each pass at its price."""
    for _ in range(steps):
        for _ in range(k):
            prices.observe(True, slots, _tiny_draft(slots))
        prices.observe(False, slots * (k + 1), _tiny_target(slots * (k + 1)))


def test_a_pass_the_process_was_descheduled_in_does_not_move_its_sizes_price():
    """Another process ran during one pass (20 times its price, as two busy processes on two cores make
    now and then): its size's price stays what its other passes say."""
    prices = PassPrices(prior=StepCosts(_tiny_draft(1), tuple(_tiny_target(n) for n in range(1, 18))))
    _steady(prices, 4, 2)
    before = prices.target_pass(12), prices.draft_pass(4)
    prices.observe(True, 4, 20 * _tiny_draft(4))
    prices.observe(False, 12, 20 * _tiny_target(12))
    assert (prices.target_pass(12), prices.draft_pass(4)) == pytest.approx(before, rel=1e-9)
    for _ in range(2):  # two more: the machine is slower now, not one pass
        prices.observe(True, 4, 2 * _tiny_draft(4))
        prices.observe(False, 12, 2 * _tiny_target(12))
    assert prices.target_pass(12) == pytest.approx(2 * before[0])


def test_the_first_pass_of_a_size_counts_at_most_twice_its_price():
    """A size not run lately (a K tried once, a probe's) has only its one pass to go by: descheduled, it
    counts as OUTLIER_FACTOR times what the size was priced at; one faster than priced counts as timed."""
    prices = PassPrices(prior=StepCosts(_tiny_draft(1), tuple(_tiny_target(n) for n in range(1, 18))))
    _steady(prices, 4, 0)
    priced = prices.target_pass(16)
    prices.observe(False, 16, 20 * priced)
    assert prices.target_pass(16) == pytest.approx(2 * priced)
    priced = prices.target_pass(20)
    prices.observe(False, 20, priced / 3)
    assert prices.target_pass(20) == pytest.approx(priced / 3)


def test_a_descheduled_pass_does_not_turn_the_batch_away_from_drafting():
    """4 slots drafting at the K that pays: a pass of that K's shapes descheduled now and then leaves the K
    as it was (a K left for a dear price is not run again to correct it)."""
    alphas = [[0.9] * 8] * 4
    prior = StepCosts(_tiny_draft(1), tuple(_tiny_target(n) for n in range(1, 37)))
    prices = PassPrices(prior=prior)
    for _ in range(3):  # the prior's K, then the K its passes say
        k = best_shared_k(alphas, prices, 0.1, 8)
        _steady(prices, 4, k, steps=3)
    assert k == best_shared_k(alphas, prices, 0.1, 8) > 0
    for descheduled in range(k + 1):  # a step with one of its draft passes, or its target pass, descheduled
        for column in range(k):
            prices.observe(True, 4, (20 if column == descheduled else 1) * _tiny_draft(4))
        prices.observe(False, 4 * (k + 1), (20 if descheduled == k else 1) * _tiny_target(4 * (k + 1)))
        assert best_shared_k(alphas, prices, 0.1, 8) == k


def test_least_squares_is_numpys_weighted_fit():
    """The one line fit both the verify line and the rise of sizes not seen go by."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(2, 20))
        xs, ys, ws = rng.uniform(1, 40, n), rng.uniform(0.0001, 0.01, n), rng.choice([0.2, 1.0], n)
        mean_x, mean_y, slope = least_squares(zip(xs, ys, ws))
        want_slope, want_intercept = np.polyfit(xs, ys, 1, w=np.sqrt(ws))
        assert slope == pytest.approx(want_slope, rel=1e-6, abs=1e-12)
        assert mean_y - slope * mean_x == pytest.approx(want_intercept, rel=1e-6, abs=1e-12)
    assert least_squares([(3.0, 0.5, 1.0), (3.0, 0.7, 1.0)])[2] == 0.0  # no spread: no slope


def test_a_stale_size_moves_by_the_last_scale_noted_by_its_pass():
    """`_moved` finds the machine's speed as noted when the size last ran (the last scale noted at or
    before that pass) by bisection: the same as reading the notes back from the newest."""
    rng = np.random.default_rng(3)
    prices = PassPrices(prior=StepCosts(0.00005, tuple(0.0002 + 0.00001 * n for n in range(1, 37))))
    for _ in range(300):
        size = int(rng.choice([4, 8, 12, 16, 20, 24]))
        prices.step_costs(8)  # notes the scale now and then
        prices.observe(False, size, (0.0002 + 0.00001 * size) * float(rng.uniform(0.5, 3.0)))
        now = prices._target_scale()  # noted first where worked out afresh
        for seen in (4, 8, 12, 16, 20, 24):
            last = prices._target.last(seen)
            if last is None:
                continue
            then = next((scale for noted, scale in reversed(prices._scales) if noted <= last[1]), None)
            want = last[0] * now / then if then else None
            assert prices._moved(last) == (pytest.approx(want) if want else None)


def test_a_lone_slots_target_alone_is_its_own_price_not_the_foot_of_a_steep_line():
    """The verify line's foot is no price of a pass alone: while a lone slot drafts 4-6 tokens, a shared
    CPU's noise on those few close sizes (here 5 at 100 us, 7 at 260: a true rise of 10 us a token, seen
    as 80) puts the line's foot far under what the target alone took when it last ran, and drafting
    then looks no faster than the target alone (the tiny pair, its drafts paying 1.4x: K=0 for
    stretches). The target alone is priced by its own passes, fresh or as the machine moved since,
    unless the line says dearer."""
    prices = PassPrices()
    for _ in range(3):
        prices.observe(False, 1, 110e-6)
    assert prices.step_costs(8).verify_s[0] == pytest.approx(110e-6)  # run lately: its own price
    for size, seconds in itertools.islice(itertools.cycle([(6, 165e-6), (5, 100e-6), (7, 260e-6)]), 3 * STALE_PASSES):
        prices.observe(False, size, seconds)
    assert prices.step_costs(8).verify_s[0] == pytest.approx(110e-6)  # the machine's speed has not moved
