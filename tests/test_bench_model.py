"""Leviathan et al.'s predicted speed-up, the -k parser and prompt files: pure, no models."""

import pytest

from ollama_spec.bench.model import (
    efficiency,
    expected_tokens_per_step,
    predicted_speedup,
    predicted_speedup_from_step_length,
)
from ollama_spec.bench.prompts import BUILTIN_PROMPTS, load_prompts
from ollama_spec.bench.settings import BenchSettings, parse_k_list
from ollama_spec.errors import InvalidSetting


def test_expected_tokens_is_the_geometric_sum():
    a, k = 0.7, 4
    assert expected_tokens_per_step(a, k) == pytest.approx(sum(a**i for i in range(k + 1)))
    assert expected_tokens_per_step(0.0, 5) == 1.0
    assert expected_tokens_per_step(1.0, 5) == 6.0  # the limit, no division by zero


def test_predicted_speedup_matches_the_paper_when_a_batch_costs_one_step():
    # Leviathan et al., eq. 1: (1 - a^(k+1)) / ((1 - a)(k c + 1))
    a, k, c = 0.8, 5, 0.05
    assert predicted_speedup(a, k, c, 1.0) == pytest.approx((1 - a**6) / ((1 - a) * (k * c + 1)))


def test_a_costlier_verify_batch_lowers_the_prediction_in_proportion():
    a, k, c = 0.8, 4, 0.1
    assert predicted_speedup(a, k, c, 1.5) == pytest.approx(predicted_speedup(a, k, c, 1.0) * (k * c + 1) / (k * c + 1.5))


def test_nothing_accepted_free_drafts_and_unit_verify_is_no_speedup():
    assert predicted_speedup(0.0, 3, 0.0, 1.0) == pytest.approx(1.0)


def test_efficiency():
    assert efficiency(1.8, 2.0) == pytest.approx(0.9)
    assert efficiency(1.0, 0.0) == 0.0


@pytest.mark.parametrize("bad", [(-0.1, 0.1, 1.0), (1.1, 0.1, 1.0), (0.5, -1.0, 1.0), (0.5, 0.1, 0.0)])
def test_impossible_inputs_are_refused(bad):
    a, c, v = bad
    with pytest.raises(ValueError):
        predicted_speedup(a, 3, c, v)


def test_k_list():
    assert parse_k_list("4, 1,2,4") == ((1, 2, 4), False)
    assert parse_k_list("auto,3,1") == ((1, 3), True) and parse_k_list("AUTO") == ((), True)
    for bad in ("0,x", "", "1,,2", "-1", "2.5", "auto,0"):
        with pytest.raises(InvalidSetting, match="comma-separated list of positive integers"):
            parse_k_list(bad)


def test_settings_refuse_nonsense():
    with pytest.raises(InvalidSetting, match="--runs"):
        BenchSettings(runs=0)
    with pytest.raises(InvalidSetting, match="--max-tokens"):
        BenchSettings(max_tokens=1)
    assert BenchSettings(max_tokens=8000).context == 9024


def test_builtin_prompts_cover_the_kinds():
    assert {p.name for p in BUILTIN_PROMPTS} >= {"code", "factual", "explanation", "translation", "creative"}
    indonesian = next(p for p in BUILTIN_PROMPTS if "microservices" in p.prompt)
    assert indonesian.prompt == "Jelaskan arsitektur microservices vs monolith dan kapan harus migrasi."
    assert indonesian.system == "Anda pakar arsitektur perangkat lunak."


def test_prompt_file_json_lines_and_plain_lines(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text('# a comment\n{"prompt": "Hi", "system": "Be brief.", "name": "greeting"}\n\n'
                    'Plain text prompt\n"{not json"\n', encoding="utf-8")
    prompts = load_prompts(path)
    assert [(p.name, p.prompt, p.system) for p in prompts] == [
        ("greeting", "Hi", "Be brief."), ("prompt 2", "Plain text prompt", None), ("prompt 3", '"{not json"', None)]


@pytest.mark.parametrize("text, message", [
    ("", "holds no prompts"),
    ("{bad json\n", "line 1: not valid JSON"),
    ('ok\n{"system": "x"}\n', 'line 2: needs a "prompt" string'),
])
def test_bad_prompt_files(tmp_path, text, message):
    path = tmp_path / "p.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InvalidSetting, match=message):
        load_prompts(path)


def test_step_length_variant_equals_the_iid_model_when_fed_its_own_estimate():
    a, k, c, v = 0.75, 6, 0.08, 2.4
    assert predicted_speedup_from_step_length(expected_tokens_per_step(a, k), k, c, v) == pytest.approx(
        predicted_speedup(a, k, c, v))
