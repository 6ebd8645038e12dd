"""Flash attention timed for a pair with slots on a CPU: both kinds timed in throw-away contexts over the
target's weights, the faster one loaded, the choice cached and said."""

import json

import pytest

from ollama_spec.engine.calibration import StepCostCache
from ollama_spec.engine.engine import Engine
from ollama_spec.engine.flash_choice import PROBE_TEXT
from ollama_spec.llama import load_params
from ollama_spec.llama.flash_probe import time_flash_attention
from ollama_spec.llama.loading import LoadSettings, load_weights
from ollama_spec.llama.model import LoadedModel
from tests.conftest import engine_settings


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch):
    monkeypatch.setattr(load_params, "gpu_offload_supported", lambda: False)


def load(tiny_models, **settings):
    notes: list[str] = []
    engine = Engine(tiny_models[0], tiny_models[1], engine_settings(n_ctx=256, **settings), notice=notes.append)
    return engine, [n for n in notes if "flash attention" in n]


def test_slots_time_it_once_then_take_it_from_the_cache(tiny_models, own_cache):
    first, timing = load(tiny_models, parallel=2)
    with first:
        kind = first.flash_attention
        assert kind in ("on", "off") and timing
        assert first.target.settings.flash_attention == first.draft.settings.flash_attention == kind
        assert "timed:" in str(first.flash_choice) and "ms on" in str(first.flash_choice)
    second, timing = load(tiny_models, parallel=2)
    with second:
        assert second.flash_attention == kind and not timing
        assert "cached" in str(second.flash_choice)


def test_the_cached_kind_is_the_one_loaded(tiny_models, own_cache):
    with load(tiny_models, parallel=2)[0] as engine:
        kind = engine.flash_attention
    path = StepCostCache().path
    entries = json.loads(path.read_text())
    other = "on" if kind == "off" else "off"
    for entry in entries.values():
        if "flash_attention" in entry:
            entry["flash_attention"] = other
    path.write_text(json.dumps(entries))
    with load(tiny_models, parallel=2)[0] as engine:
        assert engine.flash_attention == engine.target.settings.flash_attention == other


def test_what_the_user_asks_for_is_not_timed(tiny_models, own_cache):
    engine, timing = load(tiny_models, parallel=2, flash_attention="on")
    with engine:
        assert engine.flash_attention == "on" and not timing


def test_one_slot_is_not_timed(tiny_models, own_cache):
    engine, timing = load(tiny_models)
    with engine:
        assert engine.flash_attention == "off" and not timing


def test_the_probe_times_both_kinds_and_leaves_the_weights_to_their_model(tiny_models):
    path = tiny_models[0].path
    settings = LoadSettings(n_ctx=256, n_threads=1, n_seq=3)
    weights = load_weights(path, settings)
    timings = time_flash_attention(path, weights, settings, PROBE_TEXT, width=4, depth=64, repeats=2)
    assert set(timings) == {"on", "off"} and all(len(t) == 2 and min(t) > 0 for t in timings.values())
    with LoadedModel(path, settings, weights) as model, LoadedModel(path, settings) as fresh:
        prompt = model.tokenize(PROBE_TEXT, add_bos=model.add_bos, special=False)
        assert (model.eval(prompt, logits="all") == fresh.eval(prompt, logits="all")).all()


def test_the_served_pair_says_its_flash_attention(tiny_models, own_cache):
    from ollama_spec.server.serving.settings import ServerSettings
    from ollama_spec.server.serving.state import ServerState

    engine, _ = load(tiny_models, parallel=2)
    with engine:
        state = ServerState(engine, ServerSettings())
        try:
            said = str(state.serving)
        finally:
            state.close()
        assert f"2 slots, flash attention {engine.flash_attention} (timed: a 4-token" in said


def test_a_choice_timed_in_a_busy_spell_is_used_but_not_cached(tiny_models, own_cache, busy_spell):
    """A busy spell at load tips a close pair either way: the choice stands for this process, says why it
    is not kept, and the next load, quiet, times it again and caches it."""
    engine, timing = load(tiny_models, parallel=2)
    with engine:
        assert timing and engine.flash_attention in ("on", "off")
        assert "busy" in str(engine.flash_choice) and "not cached" in str(engine.flash_choice)
    busy_spell.calm()
    again, timing = load(tiny_models, parallel=2)
    with again:
        assert timing and "busy" not in str(again.flash_choice)
    third, timing = load(tiny_models, parallel=2)
    with third:
        assert not timing and "cached" in str(third.flash_choice)
