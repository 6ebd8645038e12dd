"""A SentencePiece vocabulary (Mistral, Llama 2, Gemma) end to end: "▁" spaces, byte-fallback
tokens that spell one character in several, control tokens that the text around them touches.

The synthetic pair answers any chat with " Hello naïve中文,🙂.", whose ï, 中, 文 and 🙂 only
byte tokens spell (ollama_spec/synthetic/sentencepiece.py).
"""

import json

import llama_cpp
import pytest

from ollama_spec.bench.runner import native_prompt_text
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine, Request
from ollama_spec.models.resolve import resolve_model
from tests.builders.sentencepiece import ANSWER, build_spm_pair, vocabulary_only
from tests.conftest import engine_settings

GREEDY = SamplingSettings(temperature=0.0)


@pytest.fixture(scope="module")
def spm_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("spm") / "models"
    vocab = llama_cpp.Llama(str(vocabulary_only(root.parent / "vocab.gguf")), vocab_only=True, verbose=False)
    answer = vocab.tokenize(ANSWER.encode(), add_bos=False, special=False)
    vocab.close()
    build_spm_pair(root, answer)
    return root


def test_drafted_answer_streams_characters_spelled_by_byte_tokens_whole(invoke, spm_store):
    args = ("Hi there", "-t", "0", "-n", "40", "--threads", "1", "--models-dir", spm_store)
    drafted = invoke("generate", "spm-target", "-d", "spm-draft", *args, "--json")
    alone = invoke("generate", "spm-target", *args, "--json")
    assert drafted.exit_code == alone.exit_code == 0, drafted.output
    assert json.loads(drafted.stdout)["text"] == json.loads(alone.stdout)["text"] == " " + ANSWER
    streamed = invoke("generate", "spm-target", "-d", "spm-draft", *args)
    assert streamed.stdout.strip() == ANSWER and "\ufffd" not in streamed.stdout


def test_pairing_with_a_byte_level_bpe_model_is_refused(invoke, spm_store, tiny_store):
    import shutil

    shutil.copytree(tiny_store, spm_store, dirs_exist_ok=True)
    result = invoke("pair", "spm-target", "tiny-draft", "--models-dir", spm_store)
    assert result.exit_code == 1 and "'llama'" in result.output and "'gpt2'" in result.output


def test_bench_hands_native_binaries_text_that_reads_back_as_the_prompt(spm_store, tiny_models):
    """llama.cpp's binaries take the prompt as text; the plain text of "[INST] Hi there [/INST]"
    reads back with an extra "▁" after [INST]."""
    for target in (resolve_model("spm-target", str(spm_store)), tiny_models[0]):
        with Engine(target, None, engine_settings()) as engine:
            for prompt in ("Hi there", "naïve 中文 🙂"):
                tokens = engine.prompt_tokens(Request(prompt=prompt, sampling=GREEDY))
                text = native_prompt_text(engine.target, tokens)
                assert engine.target.tokenize(text, add_bos=True, special=True) == tokens, (target.name, text)
