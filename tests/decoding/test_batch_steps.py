"""One K for every slot of a batch step, priced by what the step costs the whole batch."""

import gc

import pytest

from ollama_spec.decoding.batch_steps import BatchSteps, best_shared_k, pass_seconds
from ollama_spec.decoding.k_policy import DRAFT_GAIN_MARGIN, AutoK
from ollama_spec.decoding.step_costs import StepCosts, best_drafting_k

# a CPU: a verify pass of n tokens costs 30 ms + 7 ms a token (the demo pair's, roughly)
CPU = StepCosts(draft_step_s=0.004, verify_s=tuple(0.030 + 0.007 * n for n in range(1, 10)))
GPU = StepCosts(draft_step_s=0.001, verify_s=(0.020,) * 9)


def test_passes_longer_than_the_calibrated_ones_follow_the_line_of_the_longest():
    assert pass_seconds(CPU, 3) == CPU.verify_s[2]
    assert pass_seconds(CPU, 36) == pytest.approx(0.030 + 0.007 * 36)
    assert pass_seconds(GPU, 40) == 0.020


def test_one_slot_comes_out_of_the_single_slot_rule():
    for alpha in (0.3, 0.6, 0.9):
        alphas = [alpha] * CPU.k_max
        k, rate = best_drafting_k(alphas, CPU)
        lone = k if rate >= (1 + DRAFT_GAIN_MARGIN) / CPU.verify_s[0] else 0
        assert best_shared_k([alphas], CPU, DRAFT_GAIN_MARGIN) == lone


def test_more_slots_draft_less_where_every_token_of_a_pass_costs_and_as_much_where_none_does():
    alphas = [0.8] * 8
    ks = [best_shared_k([alphas] * n, CPU, DRAFT_GAIN_MARGIN) for n in (1, 2, 4, 8)]
    assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1]
    assert {best_shared_k([alphas] * n, GPU, DRAFT_GAIN_MARGIN) for n in (1, 4, 8)} == {8}


def test_a_weak_slot_lowers_the_batch_k_but_does_not_stop_it():
    good, weak = [0.9] * 8, [0.1] * 8
    both = best_shared_k([good, weak], CPU, 0.0)
    assert 1 <= both < best_shared_k([good, good], CPU, 0.0)


def test_policies_beside_others_draft_the_batch_k_whole_and_alone_their_own():
    batch = BatchSteps(CPU)
    one = AutoK(CPU, 0.8, confidence_stops=True, batch=batch)
    assert batch.step_k(DRAFT_GAIN_MARGIN) is None  # alone: its own rule, token by token
    two = AutoK(CPU, 0.8, confidence_stops=True, batch=batch)
    k = one.next_k()
    assert k == two.next_k() == best_shared_k([one.alphas(), two.alphas()], CPU, DRAFT_GAIN_MARGIN) >= 1
    assert all(one.keep_drafting(i, 0.0) for i in range(k))  # no stop by margin: the column is paid
    two.leave()
    assert batch.step_k(DRAFT_GAIN_MARGIN) is None
    assert BatchSteps().step_k(0.0) is None  # nothing calibrated yet: each slot decides alone


def test_beside_others_a_batch_k_of_zero_still_probes():
    batch = BatchSteps(StepCosts(0.004, tuple(0.030 * n for n in range(1, 10))))  # every token a full pass
    policies = [AutoK(batch.prices, 0.3, batch=batch) for _ in range(2)]
    ks = [policies[0].next_k() for _ in range(40)]
    assert set(ks) == {0, 1} and ks.count(1) >= 2  # K=0 for the batch, and a probe now and then


def test_policies_leave_when_their_request_ends_or_is_dropped():
    batch = BatchSteps(CPU)
    one, two = AutoK(CPU, batch=batch), AutoK(CPU, batch=batch)
    assert len(batch) == 2
    one.leave()
    del two  # a request that failed before it could leave
    gc.collect()
    assert len(batch) == 0


def test_one_decision_a_step_whatever_each_slot_learned_in_between():
    """Slots ask in turn after the same verify pass, each having learned from its own: had each decided
    on what it knew when it asked, two slots could draft two Ks, and the shorter pays padding."""
    batch = BatchSteps(CPU)
    one, two = AutoK(CPU, 0.8, batch=batch), AutoK(CPU, 0.8, batch=batch)
    first = one.next_k()
    for _ in range(30):
        one.observe(first, 0, 0.004 * first, 0.05)  # slot one's drafts all rejected since
    assert two.next_k() == first  # the same step: the same K
    assert one.next_k() < first  # the next step decides again, on what both know now


def test_a_fresh_slot_takes_the_others_acceptance_until_it_has_its_own():
    batch = BatchSteps(GPU)
    seasoned = AutoK(GPU, 0.8, batch=batch)
    for _ in range(40):  # its drafts past the first are rejected
        seasoned.observe(3, 1, 0.012, 0.05)
    alone = best_shared_k([seasoned.alphas(), seasoned.alphas()], GPU, DRAFT_GAIN_MARGIN)
    fresh = AutoK(GPU, 0.8, batch=batch)  # its prior would ask for more
    assert best_shared_k([seasoned.alphas(), fresh.alphas()], GPU, DRAFT_GAIN_MARGIN) > alone
    assert fresh.next_k() == alone
