"""Sliding-window models (Gemma 3 here; Gemma 2, gpt-oss, Cohere 2 alike), through the real llama.cpp.

A window of 16 tokens makes every run here go far past it: speculation must stay lossless when
rejected drafts are cut back and when a next request reuses part of the cache, and the memory
plan must count the second attention mask llama.cpp builds for the window layers.
"""

import re
from dataclasses import replace

import pytest
from llama_cpp import Llama

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine, Request
from ollama_spec.llama import log as llama_log
from ollama_spec.llama import model as runtime
from ollama_spec.models.gguf_info import read_model_info
from ollama_spec.models.resolve import resolve_model
from ollama_spec.planning.kv_cache import has_sliding_window, kv_cache_bytes
from ollama_spec.planning.needs import model_needs
from ollama_spec.synthetic.layout import write_model
from ollama_spec.synthetic.tokenizer import build_vocabulary
from tests.builders.gemma import gemma3_tensors, write_gemma3_gguf
from tests.conftest import engine_settings
from tests.planning.test_memory import MIB, _llama_cpp_buffers

GREEDY = SamplingSettings(temperature=0.0)
PROMPT = "Once upon a time there was a small village by the sea where everyone knew each other's names"


@pytest.fixture(scope="module")
def gemma_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma") / "models"
    vocab = build_vocabulary(512, 200)
    tensors = gemma3_tensors(vocab, n_layer=4, draft_layers=2)
    for name, layers in (("gemma-target", 4), ("gemma-draft", 2)):
        path = write_gemma3_gguf(root.parent / f"{name}.gguf", name=name, vocab=vocab, tensors=tensors, n_layer=layers)
        write_model(root, name, path)
    return root


@pytest.fixture(scope="module")
def gemma_models(gemma_store):
    return resolve_model("gemma-target", str(gemma_store)), resolve_model("gemma-draft", str(gemma_store))


def _run(engine, request, **kwargs):
    generation = engine.generate(request, **kwargs)
    "".join(generation)
    return generation.result


def test_drafted_greedy_output_is_the_targets_far_past_the_window(gemma_models, monkeypatch):
    """1,000 tokens: the target's window cache (16 + 512 tokens, 768 cells) goes round its cells
    again and again while rejected drafts are cut back, and never has to start over."""
    request = Request(
        PROMPT, raw=True, max_tokens=1000, ignore_eos=True, sampling=GREEDY, speculation=SpeculationSettings(6)
    )
    reference = Llama(str(gemma_models[0].path), n_ctx=2048, n_threads=1, verbose=False)
    expected = reference(PROMPT, max_tokens=1000, temperature=0.0)["choices"][0]["text"]
    with Engine(*gemma_models, engine_settings()) as engine:
        alone = _run(engine, request, use_draft=False).tokens
        cut_to = []
        truncate = engine.target.truncate
        monkeypatch.setattr(
            engine.target, "truncate", lambda n: truncate(n) or cut_to.append((n, engine.target.n_past))
        )
        drafted = _run(engine, request)
        text = engine.target.detokenize(drafted.tokens)
    assert len(cut_to) > 100 and all(kept == asked for asked, kept in cut_to[1:])  # after the first: the prompt
    assert 0 < drafted.speculation.accepted < drafted.speculation.drafted  # rejected drafts were cut back
    assert drafted.tokens == alone and len(alone) == 1000 and len(set(alone)) > 10
    assert text == expected


def test_a_cache_cut_back_past_the_window_answers_as_a_fresh_one(gemma_models):
    """After a long answer, a request sharing only the prompt cuts the cache back by 900 tokens.
    llama.cpp sizes a window cache to the window and a batch (16 + 512 tokens here, 768 cells) and
    reuses the cells of tokens no later token can see: after the cut, those are the ones the window
    layers need again. So the cache must be full-size, or the answer changes."""
    short = Request(
        PROMPT, raw=True, max_tokens=100, ignore_eos=True, sampling=GREEDY, speculation=SpeculationSettings(4)
    )
    longer = replace(short, prompt=PROMPT + " and the boats came home at night", max_tokens=900)
    with Engine(*gemma_models, engine_settings()) as fresh:
        expected = _run(fresh, short).tokens
    with Engine(*gemma_models, engine_settings()) as engine:
        _run(engine, longer)
        assert _run(engine, short).tokens == expected  # cut back to the prompts' shared prefix
        again = _run(engine, short)  # cut back to the prompt: the whole earlier answer goes
    assert again.speculation.prompt_cached > 0 and again.tokens == expected


@pytest.mark.parametrize("n_ctx", [512, 4096])
@pytest.mark.parametrize("pattern", [2, [True, True, False, True]])  # every 2nd layer global; layer 2 global
def test_the_plan_sizes_the_targets_window_cache_and_the_drafts_full_one(tmp_path, n_ctx, pattern):
    vocab = build_vocabulary(512, 200)
    path = write_gemma3_gguf(
        tmp_path / "g.gguf",
        name="g",
        vocab=vocab,
        n_layer=4,
        window_pattern=pattern,
        tensors=gemma3_tensors(vocab, n_layer=4, draft_layers=2),
    )
    info = read_model_info(path)
    for window_cache in (True, False):
        llama_log.clear_log()
        settings = runtime.LoadSettings(n_ctx=n_ctx, n_threads=1, window_cache=window_cache)
        with runtime.LoadedModel(path, settings):
            pass
        logged = sum(
            float(m.group(1))
            for line in llama_log.recent_log()
            if (m := re.search(r"KV buffer size = +([\d.]+) MiB", line))
        )
        planned = kv_cache_bytes(info, n_ctx, window_cache=window_cache) / MIB
        assert planned == pytest.approx(logged, abs=0.011)  # llama.cpp logs each cache to 0.01 MiB
    window = kv_cache_bytes(info, 4096, window_cache=True)
    assert window < kv_cache_bytes(info, 4096) and kv_cache_bytes(info, 512, window_cache=True) == kv_cache_bytes(
        info, 512
    )  # a context shorter than the window and a batch: one size


@pytest.mark.parametrize("flash_attention", ["off", "on"])
def test_the_plan_counts_the_window_layers_mask(gemma_models, flash_attention):
    path = gemma_models[0].path
    info = read_model_info(path)
    assert has_sliding_window(info)
    estimate = model_needs(info, 4096, flash_attention=flash_attention == "on").compute / MIB
    logged = _llama_cpp_buffers(path, 4096, flash_attention=flash_attention)["compute"]
    assert estimate == pytest.approx(logged, rel=0.02)


def test_check_says_what_the_window_layers_keep(invoke, gemma_store):
    shown = invoke("check", "gemma-target", "-d", "gemma-draft", "--ctx", "8192", "--models-dir", gemma_store)
    assert shown.exit_code == 0, shown.output
    target, draft = [line for line in shown.output.splitlines() if "KV cache" in line]
    assert target.endswith("(8192 tokens, f16; window layers keep 768 tokens)")  # 16 + 512, padded to 256
    assert draft.endswith("(8192 tokens, f16)")  # the draft keeps every position


def test_show_gives_the_window(invoke, gemma_store, tiny_store):
    shown = invoke("show", "gemma-target", "--models-dir", gemma_store)
    assert shown.exit_code == 0 and "    sliding_window       16\n" in shown.output
    assert "sliding_window" not in invoke("show", "tiny-target", "--models-dir", tiny_store).output
