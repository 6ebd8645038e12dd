from pathlib import Path

import pytest

from ollama_spec.decoding.parameters import refusal
from ollama_spec.errors import InvalidSetting
from ollama_spec.models.modelfile import PRESETS_DIR, find_modelfile, load_modelfile, parse_modelfile, shipped_presets
from ollama_spec.prompting.messages import ChatMessage

PATH = Path("/presets/x.Modelfile")

EXPECTED_PAIRS = {
    "llama3.1-70b": ("llama3.1:70b", "llama3.2:1b"),
    "llama3.3-70b": ("llama3.3:70b", "llama3.2:1b"),
    "llama3.1-8b": ("llama3.1:8b", "llama3.2:1b"),
    "qwen2.5-32b": ("qwen2.5:32b", "qwen2.5:0.5b"),
    "qwen2.5-coder-32b": ("qwen2.5-coder:32b", "qwen2.5-coder:0.5b"),
    "demo": ("synth-target", "synth-draft"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_PAIRS))
def test_every_shipped_preset_parses(name):
    preset = load_modelfile(name, refusal)
    assert (preset.model, preset.draft) == EXPECTED_PAIRS[name]
    assert preset.parameters["num_speculative_tokens"] == "auto" and preset.parameters["num_ctx"] >= 4096
    assert preset.parameters["stop"] and preset.system


def test_the_shipped_list_is_complete_and_the_checkout_links_to_it():
    assert shipped_presets() == sorted(EXPECTED_PAIRS)
    checkout = Path(__file__).parents[2] / "modelfiles"
    assert checkout.resolve() == PRESETS_DIR.resolve()


def test_a_path_or_a_name_finds_the_file(tmp_path):
    assert find_modelfile("demo") == PRESETS_DIR / "demo.Modelfile"
    own = tmp_path / "mine"
    own.write_text("FROM a\n")
    assert find_modelfile(str(own)) == own
    with pytest.raises(InvalidSetting, match="no Modelfile 'nope': give a path, or one of the shipped presets: demo"):
        find_modelfile("nope")


def test_ollama_syntax():
    text = '''# a comment
from llama3.1:8b
Draft  llama3.2:1b
PARAMETER temperature 0.25
parameter stop "<|eot_id|>"
PARAMETER stop <|start_header_id|>
PARAMETER num_speculative_tokens 6
SYSTEM """You are
a pirate."""
TEMPLATE "{{ .Prompt }}"
LICENSE """MIT"""
MESSAGE user Is it blue?
MESSAGE assistant "Yes."
REQUIRES 0.5.0
'''
    preset = parse_modelfile(text, PATH)
    assert preset.model == "llama3.1:8b" and preset.draft == "llama3.2:1b"
    assert preset.parameters == {
        "temperature": 0.25,
        "stop": ["<|eot_id|>", "<|start_header_id|>"],
        "num_speculative_tokens": 6,
    }
    assert preset.system == "You are\na pirate." and preset.template == "{{ .Prompt }}"
    assert preset.license == ("MIT",)
    assert preset.messages == (ChatMessage("user", "Is it blue?"), ChatMessage("assistant", "Yes."))


def test_parameters_ollama_dropped_are_skipped_as_ollama_create_skips_them():
    preset = parse_modelfile(
        "FROM a\nPARAMETER mirostat 1\nPARAMETER mirostat_eta 0.1\nPARAMETER use_mmap false\n"
        "PARAMETER draft_num_predict 4\nPARAMETER penalize_newline true\n",
        PATH,
    )
    assert preset.deprecated == ("mirostat", "mirostat_eta", "penalize_newline")
    assert preset.parameters == {"use_mmap": False, "draft_num_predict": 4}
    with pytest.raises(InvalidSetting, match="PARAMETER use_mmap must be true or false, got 'sometimes'"):
        parse_modelfile("FROM a\nPARAMETER use_mmap sometimes\n", PATH)


def test_a_gguf_path_is_relative_to_the_modelfile():
    preset = parse_modelfile("FROM ./big.gguf\nDRAFT /abs/small.gguf\n", PATH)
    assert preset.model == "/presets/big.gguf" and preset.draft == "/abs/small.gguf"


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("FROM a\nFRUM b\n", 2, "unknown directive 'FRUM'; use one of FROM, DRAFT"),
        ("FROM a\n\nPARAMETER top_k 0.5\n", 3, "PARAMETER top_k must be an integer, got '0.5'"),
        ("FROM a\nPARAMETER temperature hot\n", 2, "PARAMETER temperature must be a number, got 'hot'"),
        ("FROM a\nPARAMETER num_speculative_tokens 0\n", 2, "must be a positive integer or 'auto', got '0'"),
        ("FROM a\nPARAMETER warp_speed 9\n", 2, "unknown PARAMETER 'warp_speed'"),
        ("FROM a\nPARAMETER\n", 2, "expected a directive and its value, got 'PARAMETER'"),
        ("FROM a\nPARAMETER top_k\n", 2, "PARAMETER needs a name and a value"),
        ("FROM a\nMESSAGE robot hi\n", 2, "MESSAGE role must be one of system, user, assistant, got 'robot'"),
        ('FROM a\nSYSTEM """never\nclosed\n', 2, 'unterminated """ string'),
        ('FROM a\nSYSTEM "x" y\n', 2, "unexpected text after the closing \": 'y'"),
        ("FROM a\nADAPTER ./lora-dir\n", 2, "ADAPTER needs a GGUF LoRA file"),
        ("FROM a\nRENDERER qwen3\n", 2, "RENDERER is not supported by ollama-spec"),
        ("FROM a\n= b\n", 2, "expected a directive and its value, got '= b'"),
        ("FROM \n", 1, "FROM needs a model name"),
    ],
)
def test_errors_name_the_file_and_line(text, line, message):
    with pytest.raises(InvalidSetting) as caught:
        parse_modelfile(text, PATH)
    assert str(caught.value).startswith(f"{PATH}, line {line}: ") and message in str(caught.value)


def test_adapters_are_paths_from_the_modelfiles_folder():
    preset = parse_modelfile("FROM a\nADAPTER ./lora.gguf\nADAPTER /abs/second.gguf\n", PATH)
    assert preset.adapters == (PATH.parent / "lora.gguf", Path("/abs/second.gguf"))


def test_no_from_is_an_error():
    with pytest.raises(InvalidSetting, match="no FROM line"):
        parse_modelfile("DRAFT b\n", PATH)


def test_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "bad.Modelfile"
    path.write_bytes(b"FROM a\nSYSTEM \xff\n")
    with pytest.raises(InvalidSetting, match=r"bad.Modelfile, line 2: not UTF-8 text"):
        load_modelfile(str(path))


@pytest.mark.parametrize(
    "parameter, message",
    [
        ("num_ctx 0", "PARAMETER num_ctx must be a positive integer, got '0'"),
        ("ngram_size 0", "PARAMETER ngram_size must be a positive integer, got '0'"),
        ("temperature nan", "PARAMETER temperature must be >= 0, got 'nan'"),
        ("temperature -0.1", "PARAMETER temperature must be >= 0, got '-0.1'"),
        ("top_k -1", "PARAMETER top_k must be >= 0 (0 turns it off), got '-1'"),
        ("top_p nan", "PARAMETER top_p must be in (0, 1], got 'nan'"),
        ("top_p 0", "PARAMETER top_p must be in (0, 1], got '0'"),
        ("min_p 1.5", "PARAMETER min_p must be in [0, 1], got '1.5'"),
        ("draft_p_min 5", "PARAMETER draft_p_min must be in [0, 1), got '5'"),
        ("draft_p_min 1", "PARAMETER draft_p_min must be in [0, 1), got '1'"),
        ("repeat_penalty 0", "PARAMETER repeat_penalty must be in 0.001..1000 (1 turns it off), got '0'"),
        ("repeat_last_n -2", "PARAMETER repeat_last_n must be -1 (the whole text), 0 (off) or more, got '-2'"),
        ("presence_penalty inf", "PARAMETER presence_penalty must be a finite number, got 'inf'"),
        ("frequency_penalty nan", "PARAMETER frequency_penalty must be a finite number, got 'nan'"),
    ],
)
def test_values_the_settings_refuse_are_refused_as_the_file_is_read(parameter, message):
    with pytest.raises(InvalidSetting) as caught:
        parse_modelfile(f"FROM a\nPARAMETER {parameter}\n", PATH, refusal)
    assert str(caught.value) == f"{PATH}, line 2: {message}"


def test_the_ranges_are_the_callers_and_checked_in_the_files_order():
    # models/ types the values as Ollama does; what they may be is the settings' rule, handed in
    assert parse_modelfile("FROM a\nPARAMETER temperature -0.1\n", PATH).parameters == {"temperature": -0.1}
    with pytest.raises(InvalidSetting, match="line 2: PARAMETER temperature must be >= 0"):
        parse_modelfile("FROM a\nPARAMETER temperature -0.1\nPARAMETER nope 1\n", PATH, refusal)


def test_values_at_the_edges_of_the_ranges_are_read():
    text = (
        "FROM a\nPARAMETER temperature 0\nPARAMETER top_k 0\nPARAMETER top_p 1\nPARAMETER min_p 0\n"
        "PARAMETER draft_p_min 0.999\nPARAMETER repeat_penalty 0.001\nPARAMETER repeat_last_n -1\n"
        "PARAMETER num_ctx 1\nPARAMETER seed -1\nPARAMETER presence_penalty -2\n"
    )
    assert parse_modelfile(text, PATH, refusal).parameters == {
        "temperature": 0.0,
        "top_k": 0,
        "top_p": 1.0,
        "min_p": 0.0,
        "draft_p_min": 0.999,
        "repeat_penalty": 0.001,
        "repeat_last_n": -1,
        "num_ctx": 1,
        "seed": -1,
        "presence_penalty": -2.0,
    }
