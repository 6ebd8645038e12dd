"""The EAGLE-3 head beside a loaded target: the unbound calls found at run time (or one line naming the
version that has them), the head's layers, a GGUF that is no head refused, and the head's cache
following the target's passes and cuts."""

import pytest

from ollama_spec.errors import ModelLoadError
from ollama_spec.llama import head_calls
from ollama_spec.llama.eagle3 import Eagle3Head
from ollama_spec.llama.model import LoadedModel, LoadSettings
from tests.builders.eagle3_heads import TARGET_LAYERS, build_heads


@pytest.fixture(scope="module")
def heads(tiny_models, tmp_path_factory):
    return build_heads(tiny_models[0].path, tmp_path_factory.mktemp("heads"))


@pytest.fixture
def target(tiny_models):
    with LoadedModel(tiny_models[0].path, LoadSettings(n_ctx=1024, n_threads=1)) as model:
        yield model


def test_the_calls_are_found_in_this_build():
    calls = head_calls.head_calls()
    assert calls.set_layer_inp is not None and calls.target_layer_ids_n is not None


def test_a_build_without_the_calls_says_which_version_has_them(monkeypatch):
    head_calls.head_calls.cache_clear()
    monkeypatch.setattr(head_calls, "find_symbol", lambda *args: None)
    try:
        with pytest.raises(head_calls.MissingHeadCalls, match=r"lacks llama_set_embeddings_layer_inp.*>= 0\.3\.36"):
            head_calls.head_calls()
    finally:
        head_calls.head_calls.cache_clear()


def test_the_head_reads_the_layers_its_gguf_names(heads, target):
    head = Eagle3Head(heads["random"], target)
    try:
        assert head.layers == TARGET_LAYERS and target.observer is head
    finally:
        head.close()
    assert target.observer is None


def test_a_model_that_is_no_head_is_refused(tiny_models, target):
    with pytest.raises(ModelLoadError, match="is a llama model, not an EAGLE-3 head"):
        Eagle3Head(tiny_models[1].path, target)


def test_the_heads_cache_follows_the_targets_passes_and_cuts(heads, target):
    head = Eagle3Head(heads["crafted"], target)
    try:
        prompt = target.tokenize("The quick brown fox jumps", add_bos=True, special=False)
        target.eval(prompt)
        state = head._state[0]
        # pairs (t[P+1], g[P]) for every position but the last, whose g waits for the next token
        assert state.end == len(prompt) - 1 and state.pending[0] == len(prompt) - 1
        sequence = head.sequence(0)
        logits = sequence.start(len(prompt), 42)
        assert logits.shape == (target.n_vocab,)
        sequence.step(int(logits.argmax()))
        sequence.finish(len(prompt))
        assert state.end == len(prompt)  # the pair that completed the boundary reads the target's token
        target.eval([42, 7, 9])  # a verify pass of the boundary token and two drafts
        target.truncate(len(prompt) + 2)  # the second draft rejected
        assert state.end == len(prompt) + 1 and state.pending[0] == len(prompt) + 1
        assert sequence.start(len(prompt) + 1, 3) is None  # the head waits at another boundary
    finally:
        head.close()
