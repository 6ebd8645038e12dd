"""The flash attention probe: a few tokens read, their cells repeated to the depth timed, and rounds
that stop once the medians' choice is settled."""

import math
from typing import ClassVar

import pytest

from ollama_spec.llama import flash_probe
from ollama_spec.llama.flash_probe import READ_CELLS, median_range, settled, time_flash_attention
from ollama_spec.llama.load_params import flash_attention_from_timings
from ollama_spec.llama.loading import LoadSettings, load_weights
from ollama_spec.llama.model import LoadedModel

TEXT = "The quick brown fox jumps over the lazy dog while the sun sets slowly over the hills. "
WIDTH = 4


class Counted(LoadedModel):
    """A real model that notes every batch it is given (each as its items' token counts)."""

    batches: ClassVar[list[list[int]]] = []

    def decode_many(self, items):
        Counted.batches.append([len(tokens) for _, tokens, _ in items])
        return super().decode_many(items)


@pytest.fixture
def probe(tiny_models, monkeypatch):
    """time_flash_attention over the tiny target with 3 slots, its batches noted."""
    monkeypatch.setattr(flash_probe, "LoadedModel", Counted)
    Counted.batches = []
    path = tiny_models[0].path
    settings = LoadSettings(n_ctx=256, n_threads=1, n_seq=3, isolated_rows=True)
    weights = load_weights(path, settings)

    def run(depth=128, repeats=3, decide=None):
        return time_flash_attention(path, weights, settings, TEXT, WIDTH, depth, repeats, decide=decide)

    yield run
    weights.close()


def timed(batches):
    """The batches after the probe's one read."""
    return batches[1:]


def test_the_probe_reads_a_few_tokens_not_the_depth_in_each_kind(probe):
    probe(depth=128, repeats=1)
    read, *rest = Counted.batches
    assert read == [READ_CELLS]  # not 128 in each kind
    assert rest == [[WIDTH], [WIDTH] * 3] * 2  # then only the timed batches


def test_the_probe_times_every_shape_in_every_round_without_a_rule(probe):
    timings = probe(repeats=3)
    assert set(timings) == {"on", "off"} and all(len(t) == 2 and min(t) > 0 for t in timings.values())
    assert timed(Counted.batches) == [[WIDTH], [WIDTH] * 3] * 2 * 3


def test_the_probe_stops_once_the_rounds_left_cannot_change_the_choice(probe):
    probe(repeats=3, decide=lambda on, off: "on")  # settled after two rounds, whatever they time
    assert len(timed(Counted.batches)) == 2 * 2 * 2


def test_one_round_settles_nothing(probe):
    probe(repeats=2, decide=lambda on, off: "on")
    assert len(timed(Counted.batches)) == 2 * 2 * 2


def test_the_tiny_pairs_slots_run_faster_without_flash_attention(probe):
    timings = probe(depth=256, decide=flash_attention_from_timings)
    assert flash_attention_from_timings(timings["on"], timings["off"]) == "off"


def test_the_median_of_three_lies_between_two_samples_whatever_the_third():
    assert median_range([0.2, 0.1], 3) == (0.1, 0.2)
    assert median_range([0.3, 0.1, 0.2], 3) == (0.2, 0.2)
    assert median_range([0.3], 3) == (-math.inf, math.inf)
    assert median_range([1.0, 3.0, 2.0], 4) == (1.5, 2.5)  # an even count averages the middle two


def test_settled_where_both_ends_of_the_ranges_give_one_kind():
    decide = flash_attention_from_timings
    # the tiny pair's shapes: flash attention 2-3x the time, well past the 1.1 threshold
    assert settled(decide, [[0.70e-3, 0.75e-3], [2.0e-3, 2.2e-3]], [[0.23e-3, 0.25e-3], [0.9e-3, 1.0e-3]], 3)
    # the demo pair's: alike within a few per cent, well inside it (a tie keeps llama.cpp's choice)
    assert settled(decide, [[0.043, 0.044], [0.088, 0.089]], [[0.043, 0.045], [0.085, 0.086]], 3)
    # a busy moment spreads one shape's samples across the threshold: the third round decides
    assert not settled(decide, [[0.043, 0.080], [0.088, 0.089]], [[0.043, 0.045], [0.085, 0.086]], 3)
    assert not settled(decide, [[0.7e-3], [2.0e-3]], [[0.23e-3], [0.9e-3]], 3)
