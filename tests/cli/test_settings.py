"""cli/settings.py: parsed options (and where each came from) onto the core's settings, without click running."""

import pytest
from click.core import ParameterSource

from ollama_spec.cli.settings import Options, placement_settings, sampling_settings, speculation_settings
from ollama_spec.decoding.loop import MAX_NUM_SPECULATIVE_TOKENS
from ollama_spec.errors import InvalidSetting

SAMPLING = {
    "temperature": None,
    "top_k": None,
    "top_p": None,
    "min_p": None,
    "seed": None,
    "repeat_penalty": None,
    "repeat_last_n": None,
    "presence_penalty": None,
    "frequency_penalty": None,
}
SPECULATION = {"draft": "tiny-draft", "k": None, "draft_p_min": 0.0, "ngram_size": 4}
PLACEMENT = {"rpc": None, "tensor_split": None, "split_mode": None, "main_gpu": None}


def test_a_flag_wins_over_the_models_params_and_those_over_the_defaults():
    options = Options(SAMPLING | {"temperature": 0.0, "repeat_penalty": 1.3})
    settings = sampling_settings({"temperature": 0.7, "top_k": 7, "repeat_penalty": 1.1}, options)
    assert (settings.temperature, settings.top_k, settings.top_p) == (0.0, 7, 0.9)
    assert settings.penalties.repeat_penalty == 1.3 and settings.penalties.repeat_last_n == 64


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (ParameterSource.DEFAULT, 6),  # -k left at auto: the model's draft_num_predict
        (ParameterSource.COMMANDLINE, None),  # -k auto given: auto
        (ParameterSource.DEFAULT_MAP, None),  # a preset's num_speculative_tokens auto
    ],
)
def test_k_left_unset_takes_the_models_draft_num_predict(source, expected):
    options = Options(SPECULATION, {"k": source})
    assert speculation_settings({"draft_num_predict": 6}, options).num_speculative_tokens == expected


@pytest.mark.parametrize(
    ("source", "said"),
    [
        (ParameterSource.COMMANDLINE, "-k 9000"),
        (ParameterSource.DEFAULT_MAP, "the preset's num_speculative_tokens 9000"),
    ],
)
def test_a_k_past_one_verify_batch_is_capped_and_says_whose_it_was(source, said, capsys):
    options = Options(SPECULATION | {"k": 9000}, {"k": source})
    assert speculation_settings({}, options).num_speculative_tokens == MAX_NUM_SPECULATIVE_TOKENS
    assert capsys.readouterr().err.startswith(f"note: {said} is capped to {MAX_NUM_SPECULATIVE_TOKENS}")


def test_ngram_is_a_proposer_not_a_model():
    assert speculation_settings({}, Options(SPECULATION | {"draft": "NGram"})).proposer == "ngram"


def test_rpc_from_the_environment_drops_blank_items_a_flag_does_not():
    values = PLACEMENT | {"rpc": "10.0.0.2:50052,, ", "tensor_split": "3,1"}
    placement = placement_settings(Options(values, {"rpc": ParameterSource.ENVIRONMENT}))
    assert placement.rpc_servers == ("10.0.0.2:50052",) and placement.tensor_split == (3.0, 1.0)
    with pytest.raises(InvalidSetting, match="--rpc"):
        placement_settings(Options(values, {"rpc": ParameterSource.COMMANDLINE}))


def test_given_means_on_the_command_line():
    options = Options(
        {"target": "x", "k": 3}, {"target": ParameterSource.DEFAULT_MAP, "k": ParameterSource.COMMANDLINE}
    )
    assert not options.given("target") and options.given("k") and not options.given("absent")
