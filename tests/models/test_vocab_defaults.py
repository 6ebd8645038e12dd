"""A header without add_bos_token or BOS/EOS ids is read with llama.cpp's defaults (src/llama-vocab.cpp)."""

import pytest

from ollama_spec.models.compat import check_compatibility
from ollama_spec.models.gguf_info import read_model_info
from ollama_spec.models.vocab_defaults import vocab_defaults
from tests.gguf_bytes import write_model

TOKENS = [f"t{i}" for i in range(200)]


def model(path, **keys):
    metadata = {"tokenizer.ggml.tokens": TOKENS} | {f"tokenizer.ggml.{k}": v for k, v in keys.items()}
    return read_model_info(write_model(path, metadata))


@pytest.mark.parametrize(
    "tokenizer, pre, add_bos, add_eos, bos, eos",
    [
        ("llama", None, True, False, 1, 2),  # SentencePiece
        ("gpt2", "llama-bpe", True, False, 11, 11),  # Llama 3
        ("gpt2", "qwen2", False, False, 11, 11),
        ("gpt2", None, False, False, 11, 11),
        ("gpt2", "tekken", True, False, 11, 11),
        ("gpt2", "glm4", False, False, None, 11),
        ("bert", None, True, False, 101, None),
        ("t5", None, False, True, None, 1),
        ("rwkv", None, False, False, None, None),
    ],
)
def test_defaults_per_tokenizer(tmp_path, tokenizer, pre, add_bos, add_eos, bos, eos):
    keys = {"model": tokenizer} | ({"pre": pre} if pre else {})
    info = model(tmp_path / "m.gguf", **keys)
    assert (info.add_bos, info.add_eos, info.bos_id, info.eos_id) == (add_bos, add_eos, bos, eos)


def test_the_header_wins_over_defaults_and_ids_past_the_vocabulary_are_ignored(tmp_path):
    info = model(tmp_path / "m.gguf", model="llama", add_bos_token=False, bos_token_id=5, eos_token_id=10**6)
    assert (info.add_bos, info.bos_id, info.eos_id) == (False, 5, 2)  # llama.cpp: "bad special token", default


def test_gemma4_always_adds_bos(tmp_path):
    assert model(tmp_path / "m.gguf", model="gpt2", pre="gemma4", add_bos_token=False).add_bos is True
    assert vocab_defaults("gemma4", None).add_bos is True


def test_a_pair_llama_cpp_accepts_is_accepted_when_one_header_leaves_the_flags_out(tmp_path):
    explicit = model(
        tmp_path / "t.gguf", model="llama", add_bos_token=True, add_eos_token=False, bos_token_id=1, eos_token_id=2
    )
    implicit = model(tmp_path / "d.gguf", model="llama")  # same values, from llama.cpp's defaults
    assert check_compatibility(explicit, implicit).ok
    different = model(tmp_path / "x.gguf", model="llama", add_bos_token=False)
    assert not check_compatibility(explicit, different).ok
