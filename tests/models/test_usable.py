"""Models that cannot be a target or a draft are refused by pair, check and generate before any load."""

from __future__ import annotations

import shutil

import pytest

from ollama_spec.errors import UnusableModel
from ollama_spec.llama.backends import llama_cpp_knows
from ollama_spec.models.gguf_info import read_model_info
from ollama_spec.models.usable import require_usable, usability_problems
from ollama_spec.synthetic.layout import write_model as store_model
from tests.gguf_bytes import header, write_model


@pytest.fixture
def store(tiny_store, tmp_path):
    root = tmp_path / "models"
    shutil.copytree(tiny_store, root)
    for name in ("embed-a", "embed-b"):  # architecture and layers, but no vocabulary at all
        store_model(root, name, write_model(tmp_path / f"{name}.gguf", {"llama.block_count": 2}))
    return root


def test_problems_name_everything_missing(tmp_path):
    bare = tmp_path / "bare.gguf"
    bare.write_bytes(header())
    assert usability_problems(read_model_info(bare), llama_cpp_knows) == (
        "no architecture (general.architecture)",
        "no vocabulary (tokenizer.ggml.tokens)",
        "no layers (block_count)",
        "no tensors",
    )
    odd = read_model_info(
        write_model(
            tmp_path / "odd.gguf",
            {"notanarch.block_count": 1, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]},
            arch="notanarch",
        )
    )
    assert usability_problems(odd, llama_cpp_knows) == ("architecture 'notanarch', which this llama.cpp does not know",)
    deep = read_model_info(write_model(tmp_path / "deep.gguf", {"llama.block_count": 600}))
    assert "600 layers, more than llama.cpp's 512" in usability_problems(deep, llama_cpp_knows)


@pytest.mark.parametrize(
    "keys, problem",
    [
        ({}, "no tokenizer model (tokenizer.ggml.model)"),
        ({"tokenizer.ggml.model": "none"}, "no vocabulary (tokenizer.ggml.tokens)"),
        ({"tokenizer.ggml.model": "notatok"}, "tokenizer 'notatok', which this llama.cpp does not know"),
        (
            {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "notapre"},
            "pre-tokenizer 'notapre', which this llama.cpp does not know",
        ),
    ],
)
def test_tokenizers_llama_cpp_cannot_load(tmp_path, keys, problem):
    metadata = {"llama.block_count": 1, "tokenizer.ggml.tokens": ["a", "b"]} | keys
    assert usability_problems(read_model_info(write_model(tmp_path / "m.gguf", metadata)), llama_cpp_knows) == (
        problem,
    )


def test_runnable_models_pass(tiny_models):
    for model in tiny_models:
        require_usable(model.name, model.info, "target", llama_cpp_knows)


def test_pair_refuses_two_models_without_vocabulary(invoke, store):
    result = invoke("pair", "embed-a", "embed-b", "--models-dir", store)
    assert result.exit_code == 1
    assert result.output == (
        "Error: embed-a:latest cannot be the target: it has no vocabulary (tokenizer.ggml.tokens)\n"
    )
    result = invoke("pair", "tiny-target", "embed-b", "--models-dir", store)
    assert result.output == "Error: embed-b:latest cannot be the draft: it has no vocabulary (tokenizer.ggml.tokens)\n"


def test_check_refuses_before_sizing(invoke, store):
    result = invoke("check", "tiny-target", "--draft", "embed-a:latest", "--models-dir", store)
    assert result.exit_code == 1
    assert result.output == (
        "Error: embed-a:latest cannot be the draft: it has no vocabulary (tokenizer.ggml.tokens)\n"
    )


def test_generate_fails_early_and_says_why(invoke, store, monkeypatch):
    from ollama_spec.llama import model as runtime

    def no_load(*args, **kwargs):
        raise AssertionError("nothing may load")

    monkeypatch.setattr(runtime.LoadedModel, "__init__", no_load)
    for args in (["embed-a", "hi"], ["embed-a", "hi", "--no-check"], ["tiny-target", "-d", "embed-b", "hi"]):
        result = invoke("generate", *args, "--models-dir", store)
        assert result.exit_code == 1, result.output
        assert "cannot be the" in result.output and "no vocabulary (tokenizer.ggml.tokens)" in result.output


def test_unknown_architecture_is_refused_before_load(invoke, tmp_path):
    path = write_model(
        tmp_path / "odd.gguf",
        {"notanarch.block_count": 1, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]},
        arch="notanarch",
    )
    result = invoke("generate", path, "hi", "--no-check")
    assert result.output == (
        "Error: odd.gguf cannot be the target: it has architecture 'notanarch', which this llama.cpp does not know\n"
    )
    with pytest.raises(UnusableModel):
        require_usable("odd", read_model_info(path), "draft", llama_cpp_knows)


def test_ollamas_own_gpt_oss_layout_is_named_with_a_way_out(tmp_path):
    oss = write_model(
        tmp_path / "oss.gguf",
        {"gptoss.block_count": 1, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]},
        arch="gptoss",
    )
    (problem,) = usability_problems(read_model_info(oss), llama_cpp_knows)
    assert "Ollama's own layout of gpt-oss" in problem and "hf.co/ggml-org/gpt-oss-20b-GGUF" in problem


def test_a_vision_tower_in_the_model_file_is_refused_before_load(invoke, tmp_path):
    """Ollama stores gemma3 and other multimodal models as one file; llama.cpp would fail on its
    tensor count ("wrong number of tensors") after pair and check had passed."""
    import numpy as np

    from ollama_spec.synthetic.tokenizer import build_vocabulary
    from tests.builders.gemma import gemma3_tensors, write_gemma3_gguf

    vocab = build_vocabulary(300, 20)
    tensors = gemma3_tensors(vocab, n_layer=2, draft_layers=2)
    tower = {
        "v.patch_embd.weight": np.zeros((8, 8), np.float32),
        "mm.input_projection.weight": np.zeros((8, 64), np.float32),
    }
    root = tmp_path / "models"
    for name, extra in (("gemma3", tower), ("gemma3-text", {})):
        path = write_gemma3_gguf(tmp_path / f"{name}.gguf", name=name, vocab=vocab, tensors=tensors | extra, n_layer=2)
        store_model(root, name, path)
    for command in (("pair", "gemma3", "gemma3-text"), ("check", "gemma3"), ("generate", "gemma3", "hi", "--no-check")):
        result = invoke(*command, "--models-dir", root)
        assert result.exit_code == 1 and result.output.startswith(
            "Error: gemma3:latest cannot be the target: it has a vision or audio tower in its file (2 tensors)"
        ), result.output
        assert "GGUF made for llama.cpp" in result.output and "Traceback" not in result.output
    shown = invoke("show", "gemma3", "--models-dir", root)
    assert shown.exit_code == 0 and "note: generate, chat and serve refuse it: it has a vision" in shown.output
    assert invoke("generate", "gemma3-text", "hi", "-n", "2", "--models-dir", root).exit_code == 0


def test_what_llama_cpp_knows_is_the_callers_to_say(tmp_path):
    odd = read_model_info(
        write_model(
            tmp_path / "odd.gguf",
            {"notanarch.block_count": 1, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]},
            arch="notanarch",
        )
    )
    assert usability_problems(odd, lambda name: True) == ()
    assert usability_problems(odd, {"gpt2"}.__contains__) == (
        "architecture 'notanarch', which this llama.cpp does not know",
    )
