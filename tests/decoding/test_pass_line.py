"""What a pass costs beside other slots: one line through a model's recent passes."""

import math
import random
import statistics

import pytest

from ollama_spec.decoding.pass_line import MIN_PASSES, LinePrices, PassLine
from ollama_spec.decoding.pass_prices import PassPrices


def target(tokens: int) -> float:
    """The demo pair's target on the simulated clock: 35 ms a pass and 4 ms a token."""
    return 0.035 + 0.004 * tokens


def noisy(seconds: float, rng: random.Random) -> float:
    """A shared CPU: ±15 % a pass, and 3 % of the passes descheduled (3×)."""
    return seconds * math.exp(rng.gauss(0.0, 0.15)) * (3.0 if rng.random() < 0.03 else 1.0)


def test_the_line_through_noisy_passes_prices_every_size_near_its_cost_and_in_order():
    rng, line = random.Random(3), PassLine()
    for _ in range(200):
        tokens = 8 * rng.randint(1, 7)
        line.observe(tokens, noisy(target(tokens), rng))
    priced = [line.at(8 * width) for width in range(1, 8)]
    assert priced == sorted(priced)
    for width, seconds in enumerate(priced, 1):
        assert seconds == pytest.approx(target(8 * width), rel=0.08)


def test_without_enough_passes_or_sizes_that_spread_the_prices_stand():
    prices = PassPrices()
    prices.observe(False, 8, target(8))
    lines = LinePrices(prices)
    for _ in range(MIN_PASSES - 1):
        lines.observe(False, 16, 2 * target(16))
    assert lines.target_pass(16) == prices.target_pass(16)  # too few
    lines.observe(False, 16, 2 * target(16))
    assert lines.target_pass(16) == prices.target_pass(16)  # one size: no slope
    for _ in range(MIN_PASSES):
        lines.observe(False, 32, 2 * target(32))
    assert lines.target_pass(24) == pytest.approx(2 * target(24))
    assert lines.draft_pass(8) == prices.draft_pass(8)  # no draft pass seen


def test_passes_told_without_a_price_asked_give_the_line_of_passes_taken_in_one_by_one():
    """A lone slot tells every pass and asks no price: they are taken in when one is asked, in order,
    to the same line (each winsorized by its size's passes before it)."""
    rng = random.Random(5)
    passes = [(tokens, noisy(target(tokens), rng)) for tokens in (8 * rng.randint(1, 7) for _ in range(40))]
    asked_each_time, asked_once = PassLine(), PassLine()
    for tokens, seconds in passes:
        asked_each_time.observe(tokens, seconds)
        asked_each_time.line()
        asked_once.observe(tokens, seconds)
    assert asked_once.line() == pytest.approx(asked_each_time.line())
    assert asked_once.at(20) == pytest.approx(asked_each_time.at(20))


def test_each_number_of_sequences_in_a_pass_has_a_line_of_its_own():
    """Passes of fewer sequences, as slots come and go, cost more a token (each sequence's Python): on one
    line with the batch's they laid it flat, and deeper Ks looked as cheap as K=1."""

    def four(tokens: int) -> float:  # 4 sequences: their passes of K=1 and K=2
        return 0.0003 + 0.00004 * tokens

    passes = [(8, four(8), 4)] * 30 + [(12, four(12), 4)] * 5 + [(4, 0.0006, 2)] * 12
    apart, together = LinePrices(PassPrices()), LinePrices(PassPrices())
    for tokens, seconds, sequences in passes:
        apart.observe(False, tokens, seconds, sequences)
        together.observe(False, tokens, seconds)
    assert apart.beside(4).target_pass(16) == pytest.approx(four(16))
    assert together.target_pass(16) < 0.85 * four(16)


@pytest.mark.parametrize(("seed", "descheduled"), [(seed, share) for seed in range(4) for share in (0.4, 0.6)])
def test_a_busy_machine_prices_passes_near_what_they_cost_and_never_under_nothing(seed, descheduled):
    """A machine kept busy: a share of the passes descheduled (2-30x), nearly all of one size. Winsorized by
    the line itself, the cap rose with every capped pass and the line settled at several times the passes'
    cost (the tiny pair's draft passes beside 4 slots with two busy processes: 0.15 ms priced 0.8-1.3 ms, and
    the plan said K=0 at 36 % of the steps); its foot once fell below 0, every cheap pass was then capped
    under nothing, and the line ran off to -1e33 s. Capped by the fastest of each size's last passes, the
    line stays near their cost; one whose foot would be below 0 goes through the origin."""
    rng = random.Random(seed)
    line, priced = PassLine(), []
    for step in range(5000):
        size = 4 if rng.random() < 0.9 else rng.choice([1, 2, 3])
        seconds = (80e-6 + 10e-6 * size) * (rng.uniform(2, 30) if rng.random() < descheduled else 1.0)
        line.observe(size, seconds)
        if (fitted := line.line()) is not None:
            assert fitted[0] >= 0 and fitted[1] >= 0 and line.at(1) > 0
            if step > 100:
                priced.append(line.at(4))
    # a 4-row pass costs 120 us: 1.2x (0.4 descheduled) and 1.7x (0.6) as the median pricing here
    assert 100e-6 <= statistics.median(priced) <= 1.8 * 120e-6 and max(priced) <= 6 * 120e-6


def _draft_passes(lines: LinePrices, rows: int, *seconds_reshaped: tuple[float, bool]) -> None:
    """Draft passes told to the prices (as the engine's costs are) and to the lines (as BatchK's are)."""
    for seconds, reshaped in seconds_reshaped:
        lines.prices.observe(True, rows, seconds)
        lines.observe(True, rows, seconds, reshaped=reshaped)


def test_a_draft_pass_of_another_shape_costs_what_the_fastest_such_pass_took_above_its_price():
    """A step at K >= 2 changes its draft passes' shape twice, and llama.cpp builds its graph again for each:
    what that costs more is read from the passes of another shape than the one before them (RESHAPED)."""
    lines = LinePrices(PassPrices())
    _draft_passes(lines, 2, (190e-6, True))
    assert lines.reshape_s(2) == 0.0  # one such pass: no price of it yet
    _draft_passes(lines, 2, (185e-6, True), (300e-6, True), *[(150e-6, False)] * 5)
    assert lines.reshape_s(2) == pytest.approx(35e-6)  # the fastest of them, over the draft pass's price
    assert lines.reshape_s(3) == 0.0  # none of three rows ran


def test_passes_of_another_shape_long_ago_price_nothing():
    from ollama_spec.decoding.pass_line import RESHAPED_STALE

    lines = LinePrices(PassPrices())
    _draft_passes(lines, 2, (190e-6, True), (185e-6, True), *[(150e-6, False)] * 3)
    assert lines.reshape_s(2) > 0
    for _ in range(RESHAPED_STALE):
        lines.observe(True, 2, 150e-6)
    assert lines.reshape_s(2) == 0.0
