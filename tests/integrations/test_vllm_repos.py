"""Ollama names → Hugging Face repositories (vllm_repos), and the pair check from the table alone."""

import json

import pytest

from ollama_spec.errors import IncompatibleDraft, InvalidModelName, NoHfRepo
from ollama_spec.integrations.vllm_repos import REPOS_FILE, check_pair, load_table, to_hf
from ollama_spec.models.modelfile import load_modelfile, shipped_presets


@pytest.mark.parametrize(
    ("name", "repo"),
    [
        ("llama3.1:70b", "meta-llama/Llama-3.1-70B-Instruct"),
        ("llama3.1:8b", "meta-llama/Llama-3.1-8B-Instruct"),
        ("llama3.1", "meta-llama/Llama-3.1-8B-Instruct"),  # latest
        ("llama3.2:1b", "meta-llama/Llama-3.2-1B-Instruct"),
        ("llama3.2:3b", "meta-llama/Llama-3.2-3B-Instruct"),
        ("llama3.2:latest", "meta-llama/Llama-3.2-3B-Instruct"),
        ("llama3.3:70b", "meta-llama/Llama-3.3-70B-Instruct"),
        ("qwen2.5:32b", "Qwen/Qwen2.5-32B-Instruct"),
        ("qwen2.5:0.5b", "Qwen/Qwen2.5-0.5B-Instruct"),
        ("qwen2.5-coder:32b", "Qwen/Qwen2.5-Coder-32B-Instruct"),
        ("qwen2.5-coder:0.5b", "Qwen/Qwen2.5-Coder-0.5B-Instruct"),
        ("registry.ollama.ai/library/llama3.1:70b", "meta-llama/Llama-3.1-70B-Instruct"),
        ("library/llama3.3", "meta-llama/Llama-3.3-70B-Instruct"),
        ("Llama3.1:70B", "meta-llama/Llama-3.1-70B-Instruct"),  # Ollama matches names case-insensitively
    ],
)
def test_library_names_map_to_the_original_repositories(name, repo):
    assert to_hf(name).repo == repo
    assert to_hf(name).notes == ()


@pytest.mark.parametrize(
    ("name", "repo", "quant"),
    [
        ("llama3.1:70b-instruct-q4_K_M", "meta-llama/Llama-3.1-70B-Instruct", "q4_K_M"),
        ("llama3.2:1b-instruct-q8_0", "meta-llama/Llama-3.2-1B-Instruct", "q8_0"),
        ("llama3.1:8b-instruct-fp16", "meta-llama/Llama-3.1-8B-Instruct", "fp16"),
        ("llama3.1:8b-text-q4_0", "meta-llama/Llama-3.1-8B", "q4_0"),
        ("qwen2.5-coder:32b-base-q4_K_M", "Qwen/Qwen2.5-Coder-32B", "q4_K_M"),
        ("qwen2.5:7b-instruct-iq2_xs", "Qwen/Qwen2.5-7B-Instruct", "iq2_xs"),
    ],
)
def test_a_quantization_tag_names_the_same_model(name, repo, quant):
    model = to_hf(name)
    assert model.repo == repo
    assert model.notes == (f"{quant} is Ollama's quantization of {repo}: vLLM loads the original weights",)


def test_text_and_base_tags_name_the_pretrained_weights():
    assert to_hf("llama3.1:70b-text").repo == "meta-llama/Llama-3.1-70B"
    assert to_hf("qwen2.5:0.5b-base").repo == "Qwen/Qwen2.5-0.5B"


def test_a_repository_id_is_taken_as_it_is():
    model = to_hf("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4")
    assert model.repo == "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4"
    assert model.tokenizer is None and model.vocab_size is None
    assert model.notes == ("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4: passed to vLLM as it is",)


def test_a_repository_in_the_table_keeps_what_the_table_knows():
    model = to_hf("Qwen/Qwen2.5-Coder-7B-Instruct")
    assert model.repo == "Qwen/Qwen2.5-Coder-7B-Instruct" and model.name == model.repo
    assert (model.tokenizer, model.vocab_size, model.parameters) == ("qwen2", 152064, 7.0)


def test_what_the_table_knows_about_a_model():
    model = to_hf("llama3.1:70b")
    assert (model.tokenizer, model.vocab_size, model.parameters, model.gated) == ("llama3", 128256, 70.0, True)
    assert to_hf("qwen2.5:0.5b").parameters == 0.5 and not to_hf("qwen2.5:0.5b").gated


def test_a_gguf_repository_on_hugging_face_is_refused_with_what_to_pass():
    with pytest.raises(
        NoHfRepo,
        match="hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M is a GGUF repository "
        "on Hugging Face, and vLLM loads original",
    ):
        to_hf("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M")
    with pytest.raises(NoHfRepo, match="base_model"):
        to_hf("huggingface.co/bartowski/Llama-3.2-1B-Instruct-GGUF")


@pytest.mark.parametrize(
    ("name", "says"),
    [
        (
            "mistral:7b",
            (
                "no Hugging Face repository is known for mistral:7b (known: llama3.1, llama3.2, llama3.3, "
                "qwen2.5, qwen2.5-coder); pass a Hugging Face repository as org/name instead"
            ),
        ),
        ("someone/llama3.1:70b", "no Hugging Face repository is known for someone/llama3.1:70b (known:"),
        (
            "llama3.1:13b",
            ("no Hugging Face repository is known for llama3.1:13b: llama3.1 sizes known are 8b, 70b, 405b; pass"),
        ),
        ("llama3.1:70b-chat", "tag part 'chat' is neither instruct/text/base nor a quantization"),
        ("llama3.3:70b-text", "llama3.3:70b has no base weights listed"),
    ],
)
def test_unknown_names_say_no_mapping_is_known_and_how_to_pass_a_repository(name, says):
    with pytest.raises(NoHfRepo) as caught:
        to_hf(name)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_an_invalid_name_is_refused_as_ollama_would():
    with pytest.raises(InvalidModelName):
        to_hf("llama3.1:")


def test_a_pair_of_one_family_passes_and_compares_vocab_sizes():
    same = check_pair(to_hf("llama3.1:70b"), to_hf("llama3.2:1b"))
    assert same.known and same.same_vocab_size
    padded = check_pair(to_hf("qwen2.5:32b"), to_hf("qwen2.5:0.5b"))  # 152,064 vs 151,936 in config.json
    assert padded.known and not padded.same_vocab_size
    assert check_pair(to_hf("qwen2.5-coder:32b"), to_hf("qwen2.5-coder:7b")).same_vocab_size


def test_a_draft_of_another_family_is_refused():
    with pytest.raises(
        IncompatibleDraft,
        match=r"qwen2.5:0.5b \(Qwen/Qwen2.5-0.5B-Instruct\) cannot draft for "
        r"llama3.1:70b .*different tokenizers \(qwen2 vs llama3\)",
    ):
        check_pair(to_hf("llama3.1:70b"), to_hf("qwen2.5:0.5b"))


def test_a_pair_with_an_unknown_repository_is_left_to_vllm():
    pair = check_pair(to_hf("org/some-model"), to_hf("llama3.2:1b"))
    assert not pair.known and pair.same_vocab_size


def test_every_shipped_preset_pair_has_a_mapping():
    presets = [load_modelfile(name) for name in shipped_presets() if name != "demo"]  # demo: synthetic models
    assert len(presets) >= 5
    for preset in presets:
        check_pair(to_hf(preset.model), to_hf(preset.draft))


def test_the_table_is_well_formed_and_ships_as_package_data():
    table = json.loads(REPOS_FILE.read_text(encoding="utf-8"))["families"]
    assert table == load_table()
    for family, entry in table.items():
        assert entry["latest"] in entry["sizes"], family
        for label, size in entry["sizes"].items():
            assert set(size) <= {"instruct", "base", "vocab_size"} and size["vocab_size"] > 0, (family, label)
            assert all(
                "/" in size[v] and not size[v].lower().endswith("gguf") for v in ("instruct", "base") if v in size
            )
    pyproject = (REPOS_FILE.parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert '"modelfiles/*.json"' in pyproject
