"""Flash attention's "auto": concrete per backend, and where only a timing can tell, chosen from timings."""

import pytest

from ollama_spec.llama import load_params
from ollama_spec.llama.load_params import MEASURE, choose_flash_attention, flash_attention_from_timings


@pytest.fixture
def cpu_only(monkeypatch):
    monkeypatch.setattr(load_params, "gpu_offload_supported", lambda: False)


def test_a_lone_slot_on_a_cpu_runs_without_flash_attention(cpu_only):
    assert choose_flash_attention("auto") == "off"


def test_several_slots_on_a_cpu_are_for_a_timing_to_settle(cpu_only):
    assert choose_flash_attention("auto", n_seq=4) == MEASURE


def test_what_the_user_asks_for_stands(cpu_only):
    assert choose_flash_attention("off", n_seq=4) == "off"
    assert choose_flash_attention("on", n_seq=4) == "on"
    assert choose_flash_attention("on") == "on"


def test_a_quantized_cache_needs_it_on(cpu_only):
    assert choose_flash_attention("auto", "q8_0", n_seq=4) == "on"


def test_on_a_gpu_llama_cpp_chooses(monkeypatch):
    monkeypatch.setattr(load_params, "gpu_offload_supported", lambda: True)
    assert choose_flash_attention("auto", n_seq=4) == "auto"
    assert choose_flash_attention("auto", gpu_layers=0, n_seq=4) == MEASURE  # all on the CPU after all


# (lone slot's verify batch, all slots') in seconds, as the demo store's pairs timed them on a 2-core CPU
TINY_ON, TINY_OFF = (0.00071, 0.00245), (0.00023, 0.00067)
DEMO_ON, DEMO_OFF = (0.184, 0.333), (0.193, 0.446)


def test_a_pair_whose_batches_it_slows_gets_it_off():
    assert flash_attention_from_timings(TINY_ON, TINY_OFF) == "off"


def test_a_pair_whose_batches_it_speeds_gets_it_on():
    assert flash_attention_from_timings(DEMO_ON, DEMO_OFF) == "on"


def test_each_shape_counts_by_its_ratio_not_its_seconds():
    # the full batch gains 10 % of a long pass, the lone one loses 50 % of a short one: the lone
    # stream's rate would halve for a tenth more throughput at full load
    assert flash_attention_from_timings((0.0015, 0.090), (0.0010, 0.100)) == "off"
    assert flash_attention_from_timings((0.0010, 0.050), (0.0011, 0.100)) == "on"


def test_llama_cpps_choice_stands_unless_it_is_clearly_slower():
    # a tie, or a few per cent either way (what a busy moment does to a timing), keeps it on
    assert flash_attention_from_timings((0.1, 0.2), (0.1, 0.2)) == "on"
    assert flash_attention_from_timings((0.105, 0.21), (0.1, 0.2)) == "on"
    assert flash_attention_from_timings((0.12, 0.24), (0.1, 0.2)) == "off"


def test_the_same_shapes_are_timed_both_ways():
    with pytest.raises(ValueError):
        flash_attention_from_timings((0.1,), (0.1, 0.2))
    with pytest.raises(ValueError):
        flash_attention_from_timings((), ())
