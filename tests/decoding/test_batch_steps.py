"""One K for every slot of a batch step, priced by what the step costs the whole batch."""

import pytest

from ollama_spec.decoding.batch_steps import best_shared_k, further, pass_seconds, step_k
from ollama_spec.decoding.k_policy import AutoK
from ollama_spec.decoding.k_tuning import DRAFT_GAIN_MARGIN
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


class ReadPositions(list):
    """Acceptance by position that records which positions the planner read."""

    read: set

    def __getitem__(self, index):
        positions = range(len(self))[index] if isinstance(index, slice) else [index]
        self.read.update(positions)
        return super().__getitem__(index)


def test_the_plan_reads_only_the_columns_its_search_reaches():
    deep = StepCosts(draft_step_s=0.004, verify_s=tuple(0.030 + 0.007 * n for n in range(1, 34)))
    slots = [ReadPositions([0.9, 0.5, 0.1] + [0.05] * 29) for _ in range(4)]
    for slot in slots:
        slot.read = set()
    best_shared_k(slots, deep, DRAFT_GAIN_MARGIN)
    assert max(max(slot.read) for slot in slots) < 8  # of 32: the columns past the first few cannot pay


def test_more_slots_draft_less_where_every_token_of_a_pass_costs_and_as_much_where_none_does():
    alphas = [0.8] * 8
    ks = [best_shared_k([alphas] * n, CPU, DRAFT_GAIN_MARGIN) for n in (1, 2, 4, 8)]
    assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1]
    assert {best_shared_k([alphas] * n, GPU, DRAFT_GAIN_MARGIN) for n in (1, 4, 8)} == {8}


def test_a_verify_pass_is_priced_by_the_tokens_it_computes():
    # a pass's fixed part is most of it (the tiny pair's), and each sequence brings 2 tokens at least: the
    # target alone's pass of 4 sequences costs what K=1's does, and only the draft's pass is K=1's more
    small = StepCosts(draft_step_s=0.00003, verify_s=tuple(0.0002 + 0.00003 * n for n in range(1, 10)))
    slots = [[0.6] * 8] * 4
    assert best_shared_k(slots, small, DRAFT_GAIN_MARGIN, 8) == 0  # priced at 4 tokens, K=0 looks cheap
    assert best_shared_k(slots, small, DRAFT_GAIN_MARGIN, 8, least_width=2) == 1


def test_a_weak_slot_lowers_the_batch_k_but_does_not_stop_it():
    good, weak = [0.9] * 8, [0.1] * 8
    both = best_shared_k([good, weak], CPU, 0.0)
    assert 1 <= both < best_shared_k([good, good], CPU, 0.0)


def test_policies_beside_others_draft_the_shared_k_whole_and_alone_their_own():
    one, two = AutoK(CPU, 0.8, confidence_stops=True), AutoK(CPU, 0.8, confidence_stops=True)
    k = step_k([one, two], CPU, DRAFT_GAIN_MARGIN, CPU.k_max)
    assert k == best_shared_k([one.alphas(), two.alphas()], CPU, DRAFT_GAIN_MARGIN) >= 1
    one.shared_k = two.shared_k = k
    assert one.next_k() == two.next_k() == k
    assert all(one.keep_drafting(i, 0.0) for i in range(k))  # no stop by margin: the column is paid
    one.shared_k = None  # alone again: its own rule, token by token (K is only the most it may draft)
    assert one.next_k() == CPU.k_max


def test_beside_others_a_shared_k_of_zero_still_probes():
    prices = StepCosts(0.004, tuple(0.030 * n for n in range(1, 10)))  # every token a full pass
    policies = [AutoK(prices, 0.3) for _ in range(2)]
    assert step_k(policies, prices, DRAFT_GAIN_MARGIN, prices.k_max) == 0
    policies[0].shared_k = 0
    ks = [policies[0].next_k() for _ in range(40)]
    assert set(ks) == {0, 1} and ks.count(1) >= 2  # K=0 for the batch, and a probe now and then


def test_a_step_beside_others_learns_acceptance_not_costs():
    """Timed whole, a shared step's seconds are every slot's: not what this request's steps cost."""
    policy = AutoK(CPU, 0.8)
    policy.shared_k = 3
    costs = policy.costs
    for _ in range(20):
        policy.observe(3, 0, 0.5, 0.5)  # far dearer than alone, and every draft rejected
    assert policy.costs == costs and policy.alphas()[0] < 0.5


def test_a_fresh_slot_takes_the_others_acceptance_until_it_has_its_own():
    seasoned = AutoK(GPU, 0.8)
    for _ in range(40):  # its drafts past the first are rejected
        seasoned.observe(3, 1, 0.012, 0.05)
    alone = best_shared_k([seasoned.alphas(), seasoned.alphas()], GPU, DRAFT_GAIN_MARGIN)
    fresh = AutoK(GPU, 0.8)  # its prior would ask for more
    assert best_shared_k([seasoned.alphas(), fresh.alphas()], GPU, DRAFT_GAIN_MARGIN) > alone
    assert step_k([seasoned, fresh], GPU, DRAFT_GAIN_MARGIN, GPU.k_max) == alone


class Drafted:
    """A slot drafting beside others: its drafts' survival so far (by their margins), its α by position."""

    def __init__(self, survivals, alpha=0.8):
        self.survivals, self._alphas = [1.0, *survivals], [alpha] * 16

    def alphas(self):
        return self._alphas


def priced(costs):
    from ollama_spec.decoding.pass_prices import PassPrices

    return PassPrices(prior=costs)


def test_sure_drafts_draft_on_past_the_planned_k_and_hesitant_ones_stop_the_batch():
    """After each draft pass the batch drafts on while a further run of columns pays at the step's rate:
    deep where every slot's drafts so far are sure, shallow where they hesitate."""
    prices, rate = priced(CPU), 4 * 3.0 / (2 * 0.004 + 0.030 + 0.007 * 12)  # 4 slots, K=2 planned
    sure = [Drafted([0.98, 0.96], alpha=0.95) for _ in range(4)]
    assert further(sure, prices, 4, 4, rate, cap=8) is None
    hesitant = [Drafted([0.3, 0.05], alpha=0.3) for _ in range(4)]
    width = further(hesitant, prices, 4, 4, rate, cap=8)
    assert width is not None and width < 2  # the second column does not pay its verify rows: left out


def test_a_column_is_verified_where_its_rows_cost_nothing():
    """Where a verify pass costs what one token's does (a GPU), every drafted column pays its rows: the
    batch stops drafting for want of acceptance, never drops a column it drafted."""
    prices, rate = priced(GPU), 4 * 2.5 / (3 * 0.001 + 0.020)
    drafted = [Drafted([0.5, 0.2, 0.05], alpha=0.2) for _ in range(4)]
    assert further(drafted, prices, 4, 4, rate, cap=8) == 3


def test_the_batch_stops_at_its_cap():
    prices = priced(GPU)
    sure = [Drafted([1.0] * 4) for _ in range(2)]
    assert further(sure, prices, 2, 2, 1.0, cap=4) == 4
    assert further(sure, prices, 2, 2, 1.0, cap=8) is None


class _Seasoned:
    observed = 100

    def __init__(self, alphas):
        self._alphas = alphas

    def alphas(self):
        return self._alphas


def test_a_deeper_k_pays_the_draft_passes_of_another_shape_its_steps_run():
    """A step at K >= 2 runs two draft passes of another shape than the pass before each (pass_line.RESHAPED):
    where the passes alone put K=2 just ahead of K=1, what those cost more puts K=1 ahead, and K=1 pays none."""
    from ollama_spec.decoding.batch_steps import plan_step
    from ollama_spec.decoding.pass_prices import PassPrices

    prices = PassPrices(prior=StepCosts(draft_step_s=60e-6, verify_s=tuple(200e-6 + 25e-6 * n for n in range(9))))
    slots = [_Seasoned([0.9] * 8), _Seasoned([0.9] * 8)]
    assert plan_step(slots, prices, 0.0, 8)[0] >= 2
    assert plan_step(slots, prices, 0.0, 8, reshape_s=60e-6)[0] == 1
    one_only = [_Seasoned([0.9, 0.0, 0.0, 0.0]), _Seasoned([0.9, 0.0, 0.0, 0.0])]  # no second token pays
    assert plan_step(one_only, prices, 0.0, 8)[0] == plan_step(one_only, prices, 0.0, 8, reshape_s=1.0)[0] == 1
