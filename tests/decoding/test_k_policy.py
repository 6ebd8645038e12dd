"""Choosing K: fixed, or AutoK on hand-made cost curves, with α estimated from simulated steps."""

import itertools
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from ollama_spec.decoding.acceptance import MARGIN_EDGES, AcceptanceByMargin, AcceptanceByPosition, AlphaEstimator
from ollama_spec.decoding.k_fixed import FixedK
from ollama_spec.decoding.k_policy import AutoK
from ollama_spec.decoding.k_tuning import (
    DRAFT_GAIN_MARGIN,
    DRAFT_KEEP_MARGIN,
    EXPLORE_EVERY,
    PROBE_ACCEPTANCE,
    PROBE_CEILING_EVERY,
    PROBE_COSTS,
    PROBE_EVERY,
    PROBE_MAX_EVERY,
    STOPS_MIN_DRAFT_S,
    stops_min_draft_s,
)
from ollama_spec.decoding.step_costs import StepCosts, best_drafting_k, best_k, best_k_by_position
from ollama_spec.engine.calibration import batch_sizes_to_time
from tests.decoding.test_step_costs import CPU, GPU, SLOW_DRAFT


@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.85])
def test_alpha_estimator_recovers_a_known_alpha(alpha):
    rng = np.random.default_rng(7)
    estimator, exact = AlphaEstimator(prior=0.5), AlphaEstimator(prior=0.5, weight=0.0, decay=1.0)
    estimates = []
    for _ in range(3000):
        k = int(rng.integers(1, 9))
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        estimator.observe(k, accepted)
        exact.observe(k, accepted)
        estimates.append(estimator.alpha)
    assert abs(exact.alpha - alpha) < 0.02
    assert abs(np.mean(estimates[500:]) - alpha) < 0.02  # the decayed estimate tracks it without bias


def test_auto_k_follows_alpha_and_probes_while_drafting_does_not_pay():
    policy = AutoK(CPU, prior_alpha=0.8)
    assert policy.next_k() == 2
    for _ in range(60):  # the draft keeps missing: K goes to 0
        policy.observe(policy.next_k() or 1, 0, 0.004, 0.040)
    assert policy.estimator.alpha < 0.1
    ks = [policy.next_k() for _ in range(PROBE_EVERY)]
    assert ks[:-1] == [0] * (PROBE_EVERY - 1) and ks[-1] == 1  # one probe to notice if α comes back
    for _ in range(60):
        k = policy.next_k() or 1
        policy.observe(k, k, 0.004 * k, 0.030 * (1 + 0.4 * k))  # now every tried draft is accepted
    assert policy.next_k() >= 2


def test_auto_k_learns_step_costs_from_what_it_sees():
    policy = AutoK(GPU, prior_alpha=0.8)
    for _ in range(40):  # verify batches of 9 turn out to cost 5 target steps here
        policy.observe(8, 8, 0.008, 0.100)
    assert policy.costs.verify_s[8] == pytest.approx(0.100, rel=0.05)
    assert policy.next_k() < 8


def test_auto_k_can_keep_its_calibrated_costs():
    """Seeded sampling: K must not follow the clock, or the same seed writes different text."""
    policy = AutoK(GPU, prior_alpha=0.8, learn_costs=False)
    for _ in range(40):
        policy.observe(8, 8, 0.008, 0.100)
    assert policy.costs.verify_s == pytest.approx(GPU.verify_s) and policy.next_k() == 8


def test_auto_k_tries_neighbours_and_climbs_to_a_k_its_calibration_made_look_dear():
    """Only the costs of the Ks tried are updated: without tries of K+1, a stale curve stays stale."""
    stale = StepCosts(0.004, tuple(0.040 * (1 + 0.5 * n) for n in range(9)))  # each token in a batch dear
    true_verify = [0.040 * (1 + 0.05 * n) for n in range(9)]  # the GPU it really runs on: batches cheap
    rng = np.random.default_rng(0)
    policy = AutoK(stale, prior_alpha=0.8)
    start = best_k(0.8, stale)
    ks = []
    for _ in range(1200):
        k = policy.next_k()
        ks.append(k)
        accepted = 0
        while accepted < k and rng.random() < 0.8:
            accepted += 1
        policy.observe(k, accepted, 0.004 * k, true_verify[k])
    assert start <= 2 and ks[EXPLORE_EVERY - 1] == start + 1  # the first try is one more
    assert best_k(0.8, policy.costs) >= start + 4  # its costs climbed towards the real ones
    frozen = AutoK(stale, prior_alpha=0.8, learn_costs=False)
    assert {frozen.next_k() for _ in range(3 * EXPLORE_EVERY)} == {start}  # seeded sampling: no tries


def test_acceptance_by_margin_recovers_each_bands_alpha():
    rng = np.random.default_rng(3)
    truth = [0.3, 0.5, 0.7, 0.85, 0.95, 0.99]  # one α per band, rising with the margin
    centres = [0.01, 0.03, 0.07, 0.15, 0.3, 0.7]
    assert [AcceptanceByMargin.band(m) for m in centres] == list(range(len(MARGIN_EDGES) + 1))
    estimator = AcceptanceByMargin(decay=1.0)
    for _ in range(4000):
        margins = [float(rng.choice(centres)) for _ in range(6)]
        accepted = 0
        while accepted < len(margins) and rng.random() < truth[AcceptanceByMargin.band(margins[accepted])]:
            accepted += 1
        estimator.observe(margins, accepted)  # the tokens after the first rejection teach nothing
    assert [estimator.alpha(m) for m in centres] == pytest.approx(truth, abs=0.03)


def test_keep_drafting_stops_at_a_hesitant_token_on_a_cpu_and_not_on_a_gpu():
    policy = AutoK(CPU, prior_alpha=0.8, confidence_stops=True)
    assert policy.next_k() == CPU.k_max  # K is only the most it may draft
    assert policy.keep_drafting(0, 0.9) and policy.keep_drafting(1, 0.9)  # sure tokens pay their way
    assert not policy.keep_drafting(2, 0.001)  # a coin toss does not pay for 40 % of a target step
    gpu = AutoK(GPU, prior_alpha=0.8, confidence_stops=True)
    gpu.next_k()
    assert all(gpu.keep_drafting(n, 0.001) for n in range(8))  # in a batch that costs nothing more it does
    gpu.next_k()
    gpu._survival = 0.01  # but a draft step (1/20 of a target step) for a token that will not count does not pay
    assert not gpu.keep_drafting(3, None)
    fixed = AutoK(CPU, prior_alpha=0.8)  # without confidence stops: K drafts, whatever the margins
    assert fixed.next_k() == 2 and fixed.keep_drafting(1, 0.001)
    assert FixedK(3).keep_drafting is None  # nothing to ask: the proposer need not work margins out


def draft(policy, k, margins):
    """How many tokens a draft model drafts this step, asked as DraftModelProposer asks, and how many
    draft steps it ran (the first always runs: it reads the last accepted token)."""
    ask = policy.keep_drafting or (lambda drafted, margin: True)
    n, steps = 0, 1
    while n < min(k, len(margins)) and ask(n, margins[n]):
        n += 1
        if n == k or n == len(margins) or not ask(n, None):
            break
        steps += 1
    return n, steps


def replay(policy, matches, margins, costs):
    """Modelled seconds to emit a text whose draft token at each position matches (or not) the target's."""
    position, seconds = 0, 0.0
    while position < len(matches):
        n, steps = draft(policy, policy.next_k(), margins[position:])
        accepted = 0
        while accepted < n and matches[position + accepted]:
            accepted += 1
        seconds += steps * costs.draft_step_s + costs.verify_s[n]
        policy.observe(n, accepted, steps * costs.draft_step_s, costs.verify_s[n])
        position += accepted + 1
    return seconds


def test_confidence_stops_beat_every_fixed_k_where_margins_tell_misses_from_hits():
    """A draft that misses only where it hesitates (margin < 0.02, one token in eight): stopping
    there beats the best fixed K, which either stops short of sure runs or pays for the misses."""
    rng = np.random.default_rng(5)
    hesitant = rng.random(2000) < 0.125
    margins = np.where(hesitant, 0.01, 0.5)
    matches = ~hesitant | (rng.random(2000) < 0.3)
    cpu = StepCosts(0.003, tuple(0.030 * (1 + 0.1 * n) for n in range(17)))
    fixed = min(replay(FixedK(k), matches, margins, cpu) for k in range(1, 17))
    stops = replay(AutoK(cpu, confidence_stops=True, learn_costs=False), matches, margins, cpu)
    assert stops < 0.93 * fixed  # 0.88 of it here; drafting to K=16 every step would take 1.17


def test_a_probe_drafts_its_token_whatever_the_margin():
    policy = AutoK(SLOW_DRAFT, prior_alpha=0.9, confidence_stops=True)
    ks = [policy.next_k() for _ in range(PROBE_EVERY)]
    assert ks[-1] == 1 and policy.keep_drafting(0, 0.0)


def test_a_policy_carries_what_an_earlier_one_learned():
    earlier = AutoK(CPU, confidence_stops=True)
    for _ in range(100):
        earlier.next_k()
        assert earlier.keep_drafting(0, 0.5)
        earlier.observe(1, 1, 0.004, 0.042)
    later = AutoK(CPU, confidence_stops=True)
    later.carry_over(earlier)
    assert later.by_margin.alpha(0.5) == earlier.by_margin.alpha(0.5) > 0.95
    # the pair's acceptance, overall and by position, as learned (this text's soon outweighs it)
    assert later.estimator.alpha == pytest.approx(earlier.estimator.alpha, abs=0.01) and later.estimator.alpha > 0.95
    assert later.alphas() == pytest.approx(earlier.alphas(), abs=0.01)
    assert later.rate == AutoK(CPU).rate  # the text's own
    later.next_k()
    later.keep_drafting(0, 0.5)
    later.observe(1, 0, 0.004, 0.04)
    assert later.by_margin.alpha(0.5) < earlier.by_margin.alpha(0.5)  # copies, not shared
    assert later.estimator.alpha < earlier.estimator.alpha and later.alphas()[0] < earlier.alphas()[0]


def test_a_policy_carries_the_prices_the_step_loop_gave_an_earlier_one():
    """A pricing (step_costs, then the rule's own steps and the median of the last ones) took ~60 us of a
    0.4 ms step on the tiny pair, and every request's policy was priced afresh: it takes the earlier one's,
    so that the same prices again change nothing. One never priced leaves the next to price its own."""
    priced = StepCosts(CPU.draft_step_s / 2, tuple(0.8 * v for v in CPU.verify_s))
    earlier = AutoK(CPU, confidence_stops=True)
    earlier.reprice(priced)
    later = AutoK(CPU, confidence_stops=True)
    later.carry_over(earlier)
    assert later.costs == earlier.costs and later.costs != CPU and later._priced
    assert later.rate == pytest.approx(AutoK(CPU).rate / 0.8, rel=0.02)  # afresh, in the new prices' seconds
    moved = []
    later._steps.priced = lambda costs, whole: moved.append(costs) or costs
    later.reprice(priced)
    assert moved == []  # the same prices: nothing worked out again
    unpriced = AutoK(CPU, confidence_stops=True)
    unpriced.carry_over(AutoK(CPU, confidence_stops=True))
    assert not unpriced._priced and unpriced.costs.verify_s == AutoK(CPU).costs.verify_s


def test_a_policy_starts_from_the_pairs_acceptance_not_the_last_texts_end():
    earlier = AutoK(CPU, confidence_stops=True)
    for step in range(120):  # an answer whose last 20 steps the draft gets wrong
        earlier.next_k()
        earlier.keep_drafting(0, 0.5)
        earlier.observe(1, int(step < 100), 0.004, 0.042)
    later = AutoK(CPU, confidence_stops=True)
    later.carry_over(earlier)
    assert earlier.estimator.alpha < 0.5 and later.estimator.alpha > 0.7
    assert earlier.alphas()[0] < 0.5 and later.alphas()[0] > 0.7


def test_calibration_times_every_batch_auto_may_choose_and_some_larger_ones():
    assert batch_sizes_to_time(17) == list(range(1, 18))  # K up to 16, the default bound
    assert batch_sizes_to_time(26) == [*range(1, 18), 21, 25, 26]
    assert batch_sizes_to_time(4) == [1, 2, 3, 4]


def test_confidence_stops_learn_that_batches_are_cheaper_than_calibrated():
    """A busy machine while the batches were timed: each drafted token looked a whole step dear."""
    true_verify = [0.030 * (1 + 0.05 * n) for n in range(17)]
    stale = StepCosts(0.002, tuple(0.030 * (1 + 1.0 * n) for n in range(17)))
    policy = AutoK(stale, prior_alpha=0.95, confidence_stops=True)
    drafted = []
    for _ in range(300):
        n, steps = draft(policy, policy.next_k(), [0.5] * 16)
        drafted.append(n)
        policy.observe(n, n, 0.002 * steps, true_verify[n])
    assert max(drafted[:3]) <= 4  # the dear batches stop it early at first
    assert np.mean(drafted[-50:]) > 12  # measured, they are cheap: long drafts through sure text
    assert policy.costs.verify_s[16] == pytest.approx(true_verify[16], rel=0.05)
    frozen = AutoK(stale, prior_alpha=0.95, confidence_stops=True, learn_costs=False)
    first = draft(frozen, frozen.next_k(), [0.5] * 16)[0]
    frozen.observe(first, first, 0.002, true_verify[first])
    assert first <= 4 and frozen.costs == AutoK(stale, learn_costs=False).costs  # seeded sampling: no clock


def test_one_noisy_batch_size_is_no_cliff():
    """Batches of 7 timed 20 % dear (one noisy size): the policy must not stop at 6 for it."""
    smooth = [0.030 * (1 + 0.1 * n) for n in range(17)]
    noisy = StepCosts(0.003, tuple(v * (1.2 if n == 6 else 1) for n, v in enumerate(smooth)))
    policy = AutoK(noisy, prior_alpha=0.95, confidence_stops=True)
    assert draft(policy, policy.next_k(), [0.9] * 16)[0] > 7


def test_a_token_that_makes_the_verify_batch_no_dearer_is_taken():
    """As calibrated, a batch of 9 costs less than one of 8 (llama.cpp's kernels): stop at 8, not 7."""
    verify = [0.030 * (1 + 0.1 * n) for n in range(17)]
    bumpy = list(verify)
    bumpy[7] = bumpy[8] + 0.001
    for curve, expected in ((verify, False), (bumpy, True)):
        policy = AutoK(StepCosts(0.003, tuple(curve)), prior_alpha=0.9, confidence_stops=True)
        policy.next_k()
        policy._survival = 0.05  # after some hesitant tokens: another hesitant one would not pay
        assert policy.keep_drafting(7, 0.001) is expected


def _simulate_falling(policy, steps, rng, alphas):
    for _ in range(steps):
        k = policy.next_k()
        accepted = 0
        while accepted < k and rng.random() < alphas[min(accepted, len(alphas) - 1)]:
            accepted += 1
        policy.observe(k, accepted, 0.001 * k, 0.020)


def test_acceptance_by_position_recovers_each_positions_alpha():
    rng = np.random.default_rng(3)
    truth = [0.9, 0.8, 0.6, 0.4, 0.3, 0.3, 0.3, 0.3]
    by_position = AcceptanceByPosition(decay=1.0)
    for _ in range(5000):
        accepted = 0
        while accepted < 8 and rng.random() < truth[accepted]:
            accepted += 1
        by_position.observe(8, accepted)
    got = by_position.alphas(5, pooled=0.5)
    assert got == pytest.approx(truth[:5], abs=0.04)
    assert by_position.alpha(20, pooled=0.5) == 0.5  # never reached: the pooled α


def test_auto_k_learns_where_acceptance_falls_and_drafts_that_far():
    rng = np.random.default_rng(5)
    policy = AutoK(GPU, prior_alpha=0.8, learn_costs=False)
    assert policy.next_k() == 8
    _simulate_falling(policy, 400, rng, [0.97, 0.95, 0.9, 0.02])
    assert policy.alphas()[3] < 0.3 and min(policy.alphas()[:3]) > 0.8
    assert policy.next_k() <= 4


def test_probes_back_off_while_drafting_keeps_not_paying():
    waits = _probe_waits(AutoK(CPU, prior_alpha=0.8), 600, lambda k: 0, CPU)  # every tried draft rejected
    probes = waits[1:]  # after the first step (K=2) taught it α is low
    assert probes[0] == PROBE_EVERY and probes[1] == 2 * PROBE_EVERY
    assert max(probes) == PROBE_MAX_EVERY and probes[-1] == PROBE_MAX_EVERY


def test_probes_come_often_again_once_a_probe_finds_drafting_pays():
    policy = AutoK(CPU, prior_alpha=0.8)
    for _ in range(300):
        k = policy.next_k()
        policy.observe(k, 0, 0.004 * k, 0.030 * (1 + 0.4 * k))
    ks = []
    for _ in range(400):  # the text turned easy: every tried draft is accepted
        k = policy.next_k()
        ks.append(k)
        policy.observe(k, k, 0.004 * k, 0.030 * (1 + 0.4 * k))
    assert ks.index(1) < PROBE_MAX_EVERY and ks[-1] >= 2


def test_a_probe_that_paid_for_itself_keeps_probes_frequent():
    """A calibration that made drafting look dear (a busy moment): the probes' own timings say
    otherwise, so they keep coming every PROBE_EVERY steps while the costs are relearned."""
    stale = StepCosts(0.002, tuple(0.030 * (1 + 1.0 * n) for n in range(9)))
    timed = StepCosts(0.002, tuple(0.030 * (1 + 0.05 * n) for n in range(9)))  # what the steps take
    waits = _probe_waits(AutoK(stale, prior_alpha=0.95), 5 * PROBE_EVERY, lambda k: k, timed)
    assert waits[0] == PROBE_EVERY and max(waits) <= PROBE_EVERY and len(waits) > 5


def test_one_outlier_step_cannot_lock_the_target_alone_out():
    """A 130 ms pause while K was 0 (the target alone costs 3 ms): unbounded, it made K=0 look
    dearer than any drafting step, so K=0 was never chosen again and never relearned."""
    costs = StepCosts(0.001, tuple(0.003 * (1 + 0.5 * n) for n in range(9)))
    policy = AutoK(costs, prior_alpha=0.3)
    assert policy.next_k() == 0
    policy.observe(0, 0, 0.0, 0.130)
    assert policy.costs.verify_s[0] <= policy.costs.verify_s[1]
    assert policy.next_k() == 0
    learned = AutoK(StepCosts(0.001, (0.130, *costs.verify_s[1:])), prior_alpha=0.1)  # saved by an older run
    assert learned.costs.verify_s[0] <= costs.verify_s[1] and learned.next_k() == 0


def test_a_probes_catch_up_is_not_learned_as_the_draft_step():
    """After K=0 steps the probe's draft reads every token it skipped in one batch: that time is the
    catch-up's, not what a draft step costs."""
    policy = AutoK(SLOW_DRAFT, prior_alpha=0.9)
    while policy.next_k() == 0:
        policy.observe(0, 0, 0.0, 0.030)
    before = policy.costs.draft_step_s
    policy.observe(1, 1, 0.300, 0.031)  # the probe: 10 draft steps' worth of catch-up
    assert policy.costs.draft_step_s == before
    while policy.next_k() == 0:
        policy.observe(0, 0, 0.0, 0.030)
    policy.observe(1, 1, 0.010, 0.031)  # a probe whose catch-up was quick: the draft step is cheaper
    assert policy.costs.draft_step_s < before


def test_probes_bring_a_draft_step_learned_far_too_dear_back_down():
    """An earlier run saved a draft step 10x dear: K=0 follows, and only the probes can say otherwise."""
    saved = StepCosts(0.040, CPU.verify_s)
    policy = AutoK(saved, prior_alpha=0.9)
    ks = []
    for _ in range(400):
        k = policy.next_k()
        ks.append(k)
        policy.observe(k, k, 0.004 * max(k, 1), CPU.verify_s[k])  # every tried draft accepted, steps as on CPU
    assert ks[0] == 0 and policy.costs.draft_step_s < 0.008 and ks[-1] >= 2


def test_the_wait_between_probes_carries_to_the_next_request():
    earlier = AutoK(CPU, prior_alpha=0.8)
    for _ in range(300):
        k = earlier.next_k()
        earlier.observe(k, 0, 0.004 * k, 0.030 * (1 + 0.4 * k))
    later = AutoK(CPU, prior_alpha=0.1)
    later.carry_over(earlier)
    ks = [later.next_k() for _ in range(PROBE_MAX_EVERY)]
    assert ks.count(1) == 1 and ks[-1] == 1  # the first probe after 64 steps, not 8


def test_a_gain_within_the_models_error_is_not_taken():
    """The weak pair's costs (target 26 ms, a batch of 2 34 ms, draft step 6.5 ms) at α 0.6: K=1 is
    modelled at 1.04x the target alone, inside the model's error; measured it lost. K=0."""
    weak = StepCosts(0.0065, (0.026, 0.034, *(0.034 + 0.005 * n for n in range(1, 8))))
    assert best_k(0.6, weak) == 1
    assert AutoK(weak, prior_alpha=0.6).next_k() == 0
    assert AutoK(weak, prior_alpha=0.9).next_k() > 0  # a clear gain is taken


def test_a_probe_that_paid_is_followed_by_another_at_once():
    """After text the draft could not follow (a quote), each probe that pays for itself is followed by
    the next at once, not 8 steps later, until α says draft: a paying probe costs less than the target
    alone would have."""
    policy = AutoK(CPU, prior_alpha=0.8)
    for _ in range(30):  # the draft fails: K falls to 0, probes back off
        k = policy.next_k()
        policy.observe(k, 0, 0.004 * k, 0.030 * (1 + 0.4 * k))
    ks = []
    for _ in range(40):  # the text turns easy, and a probe costs less than its two tokens alone
        k = policy.next_k()
        ks.append(k)
        policy.observe(k, k, 0.001 * k, 0.030 * (1 + 0.2 * k))
    first = ks.index(1)
    assert ks[first + 1] >= 1  # the next step probes (or drafts) again at once
    assert max(ks) >= 2  # and drafting resumes within the 40 steps
    unpaid = AutoK(CPU, prior_alpha=0.8)
    for _ in range(30):
        k = unpaid.next_k()
        unpaid.observe(k, 0, 0.004 * k, 0.030 * (1 + 0.4 * k))
    assert [unpaid.next_k() for _ in range(3)] == [0, 0, 0]  # one that did not pay: the wait stands


def _probe_waits(policy: AutoK, steps: int, accepted: Callable[[int], int], costs: StepCosts) -> list[int]:
    """The steps between probes (K > 0 steps) over `steps` steps timed as `costs` says."""
    waits, since = [], 0
    for _ in range(steps):
        k = policy.next_k()
        since += 1
        if k:
            waits.append(since)
            since = 0
        policy.observe(k, accepted(k), costs.draft_step_s * k, costs.verify_s[k])
    return waits


def test_probes_all_but_stop_where_no_acceptance_could_make_drafting_pay():
    """A draft as dear as the target: even with every draft accepted K=0 wins, so once the probes have
    backed off without paying, one comes only every PROBE_CEILING_EVERY steps."""
    policy = AutoK(SLOW_DRAFT, prior_alpha=0.9)
    waits = _probe_waits(policy, 3500, lambda k: 0, SLOW_DRAFT)
    backing_off = [PROBE_EVERY * 2**i for i in range(8) if PROBE_EVERY * 2**i < PROBE_MAX_EVERY]
    assert waits[: len(backing_off)] == backing_off  # 8, 16, ... each timed as not paying
    rest = waits[len(backing_off) :]
    assert rest == [PROBE_CEILING_EVERY] * len(rest) and len(rest) >= 2


def test_probes_keep_coming_where_drafting_would_pay_at_a_better_acceptance():
    """The CPU's costs with every draft rejected: acceptance could still make drafting pay, so the probes
    stay at every PROBE_MAX_EVERY steps."""
    waits = _probe_waits(AutoK(CPU, prior_alpha=0.8), 1200, lambda k: 0, CPU)
    assert waits[-1] == PROBE_MAX_EVERY and max(waits) == PROBE_MAX_EVERY


def test_a_probe_that_paid_halves_the_wait_for_the_next():
    """With α ≈ 0.5 about half the probes pay by chance: each halves the wait, it does not return to every
    8th step (which kept such a pair probing 8 % of its steps, each a loss)."""
    policy = AutoK(CPU, prior_alpha=0.8)
    _probe_waits(policy, 300, lambda k: 0, CPU)  # backed off to PROBE_MAX_EVERY
    assert policy._probe_every == PROBE_MAX_EVERY
    cheap = StepCosts(0.001, tuple(0.030 * (1 + 0.1 * n) for n in range(9)))  # a probe that pays for itself
    while policy.next_k() == 0:
        policy.observe(0, 0, 0.0, CPU.verify_s[0])
    policy.observe(1, 1, cheap.draft_step_s, cheap.verify_s[1])
    assert policy._probe_every == PROBE_MAX_EVERY // 2


def test_the_kept_drafting_choice_is_what_working_it_out_again_gives():
    """next_k keeps the best drafting K between drafting steps: at every step its choice to draft or
    not is still the one best_k_by_position makes from the acceptance and costs of that moment."""
    rng = np.random.default_rng(7)
    policy = AutoK(CPU, prior_alpha=0.6)
    decisions, drafting = set(), False
    for step in range(2000):
        alpha = 0.9 if (step // 150) % 2 else 0.3  # easy and hard stretches: K moves both ways
        margin = DRAFT_KEEP_MARGIN if drafting else DRAFT_GAIN_MARGIN  # kept up while it beats K=0 at all
        fresh = best_k_by_position(policy.alphas(), policy.costs, margin)
        k = policy.next_k()
        assert (fresh == 0) == (k == 0 or bool(policy.probing))
        drafting = k > 0 and not policy.probing
        decisions.add(fresh > 0)
        accepted = next((i for i in range(k) if rng.random() > alpha), k)
        policy.observe(k, accepted, 0.004 * k, 0.030 * (1 + 0.4 * k) * rng.uniform(0.8, 1.2))
    assert decisions == {True, False}


def test_a_probe_asks_for_the_acceptance_only_where_some_acceptance_would_pay():
    """Where no acceptance would make drafting pay, a probe asks only what the steps cost (its guess,
    from the text's end, is not the draft's): what it finds is not learned as the draft's acceptance."""
    cpu = AutoK(CPU, prior_alpha=0.3)  # drafting would pay at a better acceptance
    while cpu.next_k() == 0:
        cpu.observe(0, 0, 0.0, CPU.verify_s[0])
    assert cpu.probing == PROBE_ACCEPTANCE
    slow = AutoK(SLOW_DRAFT, prior_alpha=0.9)  # no acceptance pays
    while slow.next_k() == 0:
        slow.observe(0, 0, 0.0, SLOW_DRAFT.verify_s[0])
    assert slow.probing == PROBE_COSTS
    before = slow.alphas()
    slow.observe(1, 0, SLOW_DRAFT.draft_step_s, SLOW_DRAFT.verify_s[1])
    assert slow.alphas() == before


def test_a_lookup_at_k0_is_priced_by_its_verify_batch():
    """Where a batch costs little more than one token, the whole lookup is verified; where each token
    in a batch costs 0.4 of a step (a CPU), only as much as beats the target alone by the margin; where
    tokens are as dear as steps (a quantized target on a CPU), none. FixedK, with no costs, verifies
    all of it where one token is expected accepted."""
    alphas = [0.9, 0.8, 0.6, 0.5, 0.4]
    assert AutoK(GPU).lookup_worth(alphas) == 5
    assert AutoK(CPU).lookup_worth(alphas) == 2  # (1 + .9 + .72) / 1.8 = 1.46 per step, the best
    dear = StepCosts(0.004, tuple(0.030 * (1 + n) for n in range(9)))
    assert AutoK(dear).lookup_worth(alphas) == 0
    assert AutoK(CPU).lookup_worth([0.1, 0.1]) == 0
    assert AutoK(CPU).lookup_worth([]) == 0
    assert FixedK(0).lookup_worth(alphas) == 5 and FixedK(0).lookup_worth([0.5, 0.3]) == 0


def test_drafting_once_taken_up_is_kept_while_it_beats_the_target_alone():
    """The weak pair's costs: a gain under DRAFT_GAIN_MARGIN is too close to take drafting up (see
    test_a_gain_within_the_models_error_is_not_taken); once taken up, as rejections bring α down it
    is kept while it beats the target alone at all (each step at K=0 learns nothing more of the
    acceptance), and left when it does not."""
    weak = StepCosts(0.0065, (0.026, 0.034, *(0.034 + 0.005 * n for n in range(1, 8))))
    policy = AutoK(weak, prior_alpha=0.9)
    kept_in_band = left = 0
    k = policy.next_k()
    assert k > 0
    while not left:
        policy.observe(k, 0, 0.0065 * k, weak.verify_s[k])  # every draft rejected
        _, rate = best_drafting_k(policy.alphas(), policy.costs)
        gain = rate * weak.verify_s[0]
        k = policy.next_k()
        if 1.0 < gain < 1 + DRAFT_GAIN_MARGIN:
            assert k > 0
            kept_in_band += 1
        elif gain <= 1.0:
            assert k == 0 or policy.probing
            left += 1
    assert kept_in_band >= 1


def test_a_draft_step_too_cheap_to_weigh_each_token_drafts_the_k_chosen():
    """Weighing each token costs Python a token; a draft step of 40 us (the tiny pair's, itself mostly
    Python) drafts the K its acceptance by position says, with nothing to ask per token (no margins
    worked out); a dearer one keeps its confidence stops."""
    cheap = StepCosts(40e-6, tuple(100e-6 + 20e-6 * n for n in range(17)))
    policy = AutoK(cheap, prior_alpha=0.9, confidence_stops=True)
    k = policy.next_k()
    assert 1 <= k < cheap.k_max and policy.keep_drafting is None
    assert k == best_k_by_position(policy.alphas(), cheap, DRAFT_GAIN_MARGIN)
    dear = AutoK(CPU, prior_alpha=0.9, confidence_stops=True)
    assert dear.next_k() == CPU.k_max and dear.keep_drafting is not None


def test_a_new_policy_weighs_its_tokens_only_where_its_draft_step_is_dear_enough_before_its_first_step():
    """Beside other slots the batch drafts past its K only where every slot weighs its drafts
    (engine/batch_k.py); a request's policy before its first drafting step (its prompt's step) said it
    did whatever its costs, and every bench round's 8 requests, started together, drafted to K=16 on
    the tiny pair for their first steps."""
    cheap = StepCosts(40e-6, tuple(100e-6 + 20e-6 * n for n in range(17)))
    assert AutoK(cheap, prior_alpha=0.9, confidence_stops=True).keep_drafting is None
    assert AutoK(CPU, prior_alpha=0.9, confidence_stops=True).keep_drafting is not None


def test_one_pricing_far_off_does_not_stop_drafting_and_one_that_pays_takes_it_up():
    """Alone, the step loop prices the steps again every few steps from a few passes of each size: on a
    shared CPU one pricing can make drafting look dear (the tiny pair: a verify line rising 38 us a
    token where it rose 9, a draft step 235 us where it took 40). While drafting, the rule decides by
    the median of its last pricings, so one or two such pricings in a row do not stop it; at K=0 one
    pricing that says drafting pays takes it up."""
    cheap = StepCosts(40e-6, tuple(110e-6 + 10e-6 * n for n in range(9)))
    dear = StepCosts(235e-6, tuple(110e-6 + 38e-6 * n for n in range(9)))
    policy = AutoK(cheap, prior_alpha=0.9, confidence_stops=True)
    for costs in (
        cheap,
        replace(cheap),
        dear,
        replace(cheap),
        replace(dear),
        *(replace(cheap) for _ in range(3)),
        dear,
        dear,
    ):
        policy.reprice(costs)
        k = policy.next_k()
        assert k >= 1 and not policy.probing
        policy.observe(k, k, 40e-6 * k, cheap.verify_s[k])
    for _ in range(3):  # dear for good: drafting stops
        policy.reprice(replace(dear))
        k = policy.next_k()
        policy.observe(k, k, 40e-6 * k, cheap.verify_s[k]) if k else policy.observe(0, 0, 0.0, 110e-6)
    assert policy.next_k() == 0
    policy.reprice(replace(cheap))
    assert policy.next_k() >= 1


def test_a_lone_rule_repriced_through_noise_keeps_its_k():
    """A lone rule priced again at every step, each pricing ±10 % around the same costs (a shared CPU's
    passes), where several Ks make nearly the same rate: every change of K costs llama.cpp a graph
    rebuild, so K moves only where another beats it by SWITCH_MARGIN, or has been the best for
    SWITCH_STEPS steps in a row. Following each pricing, K changed 372 times in 700 steps; now 220, of
    which up to 175 are its explorations (one neighbour every EXPLORE_EVERY drafting steps, and back)."""
    k_max, steps = 8, 700
    target, draft = (lambda n: 100e-6 + 10e-6 * n), (lambda rows: 20e-6 + 5e-6 * rows)
    truth = StepCosts(draft(1), tuple(target(n) for n in range(1, k_max + 2)))
    rng, noise = np.random.default_rng(0), np.random.default_rng(50)
    policy, ks = AutoK(truth, 0.9, confidence_stops=True), []
    for _ in range(100 + steps):
        spread = lambda: float(np.exp(noise.normal(0.0, 0.1)))  # one draw per price
        policy.reprice(StepCosts(draft(1) * spread(), tuple(target(n) * spread() for n in range(1, k_max + 2))))
        k = policy.next_k()
        accepted = 0
        while accepted < k and rng.random() < 0.9:
            accepted += 1
        policy.observe(k, accepted, draft(1) * k, target(k + 1))
        ks.append(k)
    ks = ks[100:]
    assert min(ks) >= 1
    changes = sum(a != b for a, b in itertools.pairwise(ks))
    assert changes <= 2 * steps // EXPLORE_EVERY + steps // 10


def test_how_dear_a_draft_step_must_be_to_weigh_each_token_grows_with_the_vocabulary():
    """Weighing a token reads its row of logits: the H200 run's 1B-shaped draft (1.38 ms a step, Llama 3's
    128,256 tokens) drafts whole steps, as the tiny pair does; the same step over the demo pair's 3,072
    tokens is dear enough to weigh each token."""
    assert stops_min_draft_s(3072) == STOPS_MIN_DRAFT_S == 0.0005
    assert stops_min_draft_s(128256) == pytest.approx(2.565e-3, rel=1e-3)
    gpu = StepCosts(1.38e-3, tuple(4.6e-3 * ratio for ratio in (1, 1.10, 1.23, 1.42, 1.55, 1.71, 1.88, 2.04, 2.07)))
    whole = AutoK(gpu, prior_alpha=0.9, confidence_stops=True, stops_min_draft_s=stops_min_draft_s(128256))
    k = whole.next_k()
    assert 1 <= k < gpu.k_max and whole.keep_drafting is None
    weighed = AutoK(gpu, prior_alpha=0.9, confidence_stops=True, stops_min_draft_s=stops_min_draft_s(3072))
    assert weighed.next_k() == gpu.k_max and weighed.keep_drafting is not None


def _beside(policy: AutoK, k: int) -> AutoK:
    policy.shared_k, policy.exploring = k, False  # as the step loop's BatchK.choose sets them
    return policy


def test_a_step_beside_others_learns_the_acceptance_a_step_alone_does():
    """Beside others `observe` takes a shorter way (nothing of its own is timed or chosen): the acceptance
    by position, α and the probe wait move as they do for a step alone."""
    cheap = StepCosts(STOPS_MIN_DRAFT_S / 4, CPU.verify_s)  # a draft step too cheap to weigh each token
    alone, beside = AutoK(cheap, confidence_stops=True), _beside(AutoK(cheap, confidence_stops=True), 3)
    rng = np.random.default_rng(5)
    for _ in range(40):
        alone.next_k()
        assert beside.next_k() == 3 and beside.keep_drafting is None  # drafts the batch's K whole
        accepted = int(rng.integers(0, 4))
        alone.observe(3, accepted, 0.001, 0.004)
        beside.observe(3, accepted, 0.001, 0.004)
    assert beside.alphas() == pytest.approx(alone.alphas())
    assert beside.estimator.alpha == pytest.approx(alone.estimator.alpha)
    assert (beside.observed, beside.last_drafted, beside.own_drafted) == (40, 3, 0)
    assert beside.costs == AutoK(cheap).costs  # nothing learned of costs: the loop prices the batch's passes


def test_a_step_beside_others_after_a_weighed_one_learns_no_stale_margins():
    """A step that weighed its tokens (a dear draft step) keeps their margins; the next, beside others at a
    cheap draft step, drafts whole and must not teach the margin bands the step before's."""
    dear = StepCosts(STOPS_MIN_DRAFT_S * 2, CPU.verify_s)
    policy = _beside(AutoK(dear, confidence_stops=True), 2)
    policy.next_k()
    assert policy.keep_drafting is not None
    policy.keep_drafting(0, 0.01)  # a drafted token in the lowest margin band
    policy.observe(1, 0, 0.001, 0.004)
    policy.reprice(StepCosts(STOPS_MIN_DRAFT_S / 4, CPU.verify_s))  # the draft step now cheap
    bands = policy.by_margin.bands
    policy.next_k()
    policy.observe(2, 2, 0.001, 0.004)
    assert policy.by_margin.bands == bands


def test_whether_tokens_are_weighed_follows_a_new_pricing_at_once():
    """`keep_drafting` (read by the step loop before a step's first draft pass) follows the draft step's
    price as soon as it is priced, not from the policy's next `next_k`."""
    policy = AutoK(StepCosts(STOPS_MIN_DRAFT_S / 4, CPU.verify_s), confidence_stops=True)
    assert policy.keep_drafting is None
    policy.reprice(StepCosts(STOPS_MIN_DRAFT_S * 2, CPU.verify_s))
    assert policy.keep_drafting is not None
