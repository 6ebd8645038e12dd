"""The step-cost cache: calibrations, what runs learned beside them, and acceptance by margin."""

from ollama_spec.decoding.step_costs import StepCosts
from ollama_spec.engine.calibration import StepCostCache

CALIBRATED = StepCosts(0.002, (0.030, 0.036, 0.040))
LEARNED = StepCosts(0.0025, (0.031, 0.035, 0.039))


def test_learned_costs_sit_beside_the_calibration_until_a_new_calibration(tmp_path):
    cache = StepCostCache(tmp_path / "costs.json")
    cache.put("pair", CALIBRATED)
    cache.put_learned("pair", LEARNED)
    cache.put_acceptance("pair", (0.5, 0.6, 0.7, 0.8, 0.9, 1.0))
    assert cache.get("pair") == CALIBRATED and cache.get_learned("pair") == LEARNED
    cache.put("pair", LEARNED)  # measured again: what was learned from the old one goes
    assert cache.get("pair") == LEARNED and cache.get_learned("pair") is None
    assert cache.get_acceptance("pair") == (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)  # not a cost: it stays
    assert cache.get("other") is None and cache.get_learned("other") is None


def test_a_damaged_cache_only_costs_a_calibration(tmp_path):
    path = tmp_path / "costs.json"
    path.write_text('{"pair": {"verify_s": "fast", "acceptance_by_margin": [2, 0.5]}, "x": 3')
    cache = StepCostCache(path)
    assert cache.get("pair") is None and cache.get_acceptance("pair") is None
    path.write_text('{"pair": {"draft_step_s": 0.002, "verify_s": [0.03], "acceptance_by_margin": [2, 0, 0, 0, 0, 0]}}')
    assert cache.get("pair") == StepCosts(0.002, (0.03,)) and cache.get_acceptance("pair") is None
    cache.put("pair", CALIBRATED)
    assert cache.get("pair") == CALIBRATED


def test_the_file_is_parsed_again_only_when_it_changed(tmp_path, monkeypatch):
    import json

    parses = []
    real_loads = json.loads
    monkeypatch.setattr(json, "loads", lambda text: parses.append(1) or real_loads(text))
    path = tmp_path / "costs.json"
    cache, other = StepCostCache(path), StepCostCache(path)
    cache.put("pair", CALIBRATED)
    parses.clear()
    for _ in range(5):
        assert cache.get("pair") == CALIBRATED and cache.get_acceptance("pair") is None
    assert len(parses) == 1
    other.put_learned("pair", LEARNED)  # another process writes: the next read sees it
    assert cache.get_learned("pair") == LEARNED and len(parses) == 3  # other's own read, then cache's


def test_a_caller_changing_what_it_read_does_not_change_the_next_read(tmp_path):
    path = tmp_path / "costs.json"
    cache = StepCostCache(path)
    cache.put("pair", CALIBRATED)
    cache._read()["pair"] = {}  # what put/forget do before they write
    assert cache.get("pair") == CALIBRATED
