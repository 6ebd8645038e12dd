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


def test_expected_tokens_worked_by_hand():
    # a = 0.7, K = 4: 1 + 0.7 + 0.49 + 0.343 + 0.2401
    assert expected_tokens_per_step(0.7, 4) == pytest.approx(2.7731)
    # a = 0.5, K = 1: the draft's token is kept half the time, the target's own always: 1.5
    assert expected_tokens_per_step(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens_per_step(0.0, 5) == 1.0
    assert expected_tokens_per_step(1.0, 5) == 6.0  # the limit, no division by zero


def test_predicted_speedup_worked_by_hand_when_a_batch_costs_one_step():
    # a = 0.8, K = 5: 1 + .8 + .64 + .512 + .4096 + .32768 = 3.68928 tokens per step,
    # for 5 draft steps at c = 0.05 and one batch at 1.0: 1.25 target steps -> 2.951424x
    assert predicted_speedup(0.8, 5, 0.05, 1.0) == pytest.approx(2.951424)


def test_a_costlier_verify_batch_worked_by_hand():
    # a = 0.8, K = 4: 3.3616 tokens per step; 4 x 0.1 + 1.5 = 1.9 target steps -> 1.76926x
    # (with a one-step batch it would be 3.3616 / 1.4 = 2.40114x)
    assert predicted_speedup(0.8, 4, 0.1, 1.5) == pytest.approx(1.7692632, rel=1e-6)
    assert predicted_speedup(0.8, 4, 0.1, 1.0) == pytest.approx(2.4011429, rel=1e-6)


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
    path.write_text(
        '# a comment\n{"prompt": "Hi", "system": "Be brief.", "name": "greeting"}\n\nPlain text prompt\n"{not json"\n',
        encoding="utf-8",
    )
    prompts = load_prompts(path)
    assert [(p.name, p.prompt, p.system) for p in prompts] == [
        ("greeting", "Hi", "Be brief."),
        ("prompt 2", "Plain text prompt", None),
        ("prompt 3", '"{not json"', None),
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "holds no prompts"),
        ("{bad json\n", "line 1: not valid JSON"),
        ('ok\n{"system": "x"}\n', 'line 2: needs a "prompt" string'),
    ],
)
def test_bad_prompt_files(tmp_path, text, message):
    path = tmp_path / "p.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InvalidSetting, match=message):
        load_prompts(path)


def test_step_length_variant_uses_the_measured_tokens_per_step():
    # A run with 60 % of tried drafts accepted at K = 5, but in bursts: 3.0 tokens per step measured,
    # where independent acceptances predict 1 + .6 + .36 + .216 + .1296 + .07776 = 2.38336.
    # Cost per step: 5 x 0.1 + 1.5 = 2.0 target steps.
    assert predicted_speedup_from_step_length(3.0, 5, 0.1, 1.5) == pytest.approx(1.5)
    assert predicted_speedup(0.6, 5, 0.1, 1.5) == pytest.approx(1.19168)
    with pytest.raises(ValueError):
        predicted_speedup_from_step_length(3.0, 5, 0.1, 0.0)
