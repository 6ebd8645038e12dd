"""The EAGLE-3 head beside a loaded target: the unbound calls found at run time (or one line naming the
version that has them), the head's layers, a GGUF that is no head refused, and the head's cache
following the target's passes and cuts."""

import ctypes
import dataclasses

import llama_cpp
import numpy as np
import pytest
from gguf import GGUFReader

from ollama_spec.errors import ModelLoadError
from ollama_spec.llama import eagle3, head_calls, head_rows
from ollama_spec.llama.eagle3 import Eagle3Head
from ollama_spec.llama.model import LoadedModel, LoadSettings
from ollama_spec.synthetic.eagle3_head import write_eagle3_head
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
    monkeypatch.setattr(head_calls, "find_symbol", lambda *args, **kwargs: None)
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
        # the pass's pairs (t[P+1], g[P]) wait for the first draft step; the last g for the next token
        assert state.end == 0 and state.rows[0] == 0 and len(state.rows[1]) == len(prompt)
        assert state.pending[0] == len(prompt) - 1
        sequence = head.sequence(0)
        logits = sequence.start(len(prompt), 42)
        assert logits.shape == (target.n_vocab,)
        assert state.end == len(prompt)  # the waiting pairs and the first step, in one pass
        sequence.step(int(logits.argmax()))
        sequence.finish(len(prompt))
        assert state.end == len(prompt)  # the pair that completed the boundary reads the target's token
        target.eval([42, 7, 9])  # a verify pass of the boundary token and two drafts
        target.truncate(len(prompt) + 2)  # the second draft rejected
        assert state.end == len(prompt) and state.pending[0] == len(prompt) + 1
        assert sequence.start(len(prompt) + 1, 3) is None  # the head waits at another boundary
        target.eval([5])  # no draft step came between: the pairs wait on, with the new pass's
        assert state.end == len(prompt) and state.pending[0] == len(prompt) + 2
        assert state.rows[0] == len(prompt) and len(state.rows[1]) == 3
        sequence.start(len(prompt) + 3, 6)
        assert state.end == len(prompt) + 3  # all of them, and the step, in one pass
    finally:
        head.close()


def test_draft_steps_and_verify_passes_make_no_view_or_struct_per_row(heads, target, monkeypatch):
    """After the first step, the head reads llama.cpp's buffers through views made once per address and
    hands its rows in through structs made once: no numpy view of a ctypes pointer and no llama_embd
    array per pass (each cost more than the pass itself on a small head); and it builds its batches
    with calls that keep the GIL, not llama-cpp-python's, each of which lets it go. The target's passes
    of one sequence reach the head as one run of positions, without an Entry a token."""
    head = Eagle3Head(heads["crafted"], target)
    try:
        prompt = target.tokenize("The quick brown fox jumps", add_bos=True, special=False)
        target.eval(prompt)
        sequence = head.sequence(0)
        sequence.step(int(sequence.start(len(prompt), 42).argmax()))
        sequence.finish(len(prompt))
        made = []

        def as_array(*args, **kwargs):
            made.append("a numpy view of a ctypes pointer")
            raise AssertionError(made[-1])

        def embd_rows(rows):
            made.append("a llama_embd array")
            return head_rows.embd_rows.__wrapped__(rows)

        embd_rows.__wrapped__ = head_rows.embd_rows
        monkeypatch.setattr(np.ctypeslib, "as_array", as_array)
        monkeypatch.setattr(head_rows, "embd_rows", embd_rows)
        monkeypatch.setattr(eagle3, "embd_rows", embd_rows, raising=False)
        monkeypatch.setattr(target, "_decode", lambda entries: made.append("a target pass of Entries"))
        for name in dir(llama_cpp):
            if name.startswith("llama_batch_ext_") and name not in ("llama_batch_ext_init", "llama_batch_ext_free"):
                monkeypatch.setattr(llama_cpp, name, lambda *args, name=name: made.append(name))
        n, last = len(prompt), 42
        for token in (7, 9, 11):  # a verify pass of the boundary token and two drafts, the first accepted
            target.eval([last, token, 5])
            target.truncate(n + 2)
            n, last = n + 2, token + 1  # the target's own token after the accepted draft
            sequence.step(int(sequence.start(n, last).argmax()))
            sequence.finish(n)
        assert made == []
    finally:
        head.close()


def test_the_calls_a_heads_batch_is_built_with_keep_the_gil():
    quick = head_calls.quick_calls()
    calls = [getattr(quick, field.name) for field in dataclasses.fields(quick)]
    calls += [head_calls.head_calls().logits_ith_at, head_calls.head_calls().layer_inp_at]
    assert all(call._flags_ & ctypes._FUNCFLAG_PYTHONAPI for call in calls)
    assert not llama_cpp.llama_process._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # a pass lets other threads run


def test_each_cached_position_pairs_the_next_token_with_its_g(tiny_models, target, tmp_path):
    """The bag head's logits are S·codes·m/rms(m), m the mean of the codes of the tokens its cache
    pairs at positions 0..P: after a prompt read in two passes and a draft step, exactly t[1..P+1]."""
    path = tmp_path / "bag.gguf"
    write_eagle3_head(path, tiny_models[0].path, "bag", target_layers=TARGET_LAYERS)
    tensors = {t.name: np.array(t.data) for t in GGUFReader(path).tensors}
    half = tensors["token_embd.weight"].shape[1] // 2
    codes, output = tensors["token_embd.weight"][:, half:], tensors["output.weight"][:, half:]

    def bag_logits(tokens):
        m = codes[tokens].mean(axis=0)
        return output @ (m / np.sqrt((m @ m) / (2 * half) + 1e-5))

    head = Eagle3Head(path, target)
    try:
        prompt = target.tokenize("The quick brown fox jumps over the lazy dog", add_bos=True, special=False)
        target.eval(prompt[:5])
        target.eval(prompt[5:])  # the pair at the first pass's last position waits for this one's first token
        logits = head.sequence(0).start(len(prompt), 42)
        # position P holds t[P+1]; the draft step's own position reads 42 (V is cached as f16: 1e-3)
        np.testing.assert_allclose(logits, bag_logits([*prompt[1:], 42]), atol=0.01)
        assert np.abs(logits - bag_logits([*prompt[:-1], 42])).max() > 0.05  # shifted by one: another bag
        head.sequence(0).finish(len(prompt))
        target.eval([42, 7, 9])  # verified: 7 accepted, 9 rejected
        target.truncate(len(prompt) + 2)
        logits = head.sequence(0).start(len(prompt) + 2, 11)
        np.testing.assert_allclose(logits, bag_logits([*prompt[1:], 42, 7, 11]), atol=0.01)
    finally:
        head.close()


def test_each_g_is_encoded_from_its_own_positions_rows(tiny_models, tmp_path):
    """With two sequences read in the same passes, each position's g is fc of that position's own
    captured rows: here fc reads layer 0's input alone, the target's embedding of the token."""
    path = tmp_path / "first-layer.gguf"
    write_eagle3_head(path, tiny_models[0].path, "random", target_layers=TARGET_LAYERS, fc_first_layer_only=True)
    fc = next(np.array(t.data) for t in GGUFReader(path).tensors if t.name == "fc.weight")
    embd = next(np.array(t.data) for t in GGUFReader(tiny_models[0].path).tensors if t.name == "token_embd.weight")
    with LoadedModel(tiny_models[0].path, LoadSettings(n_ctx=256, n_threads=1, n_seq=2)) as target:
        head = Eagle3Head(path, target)
        try:
            texts = ["Once upon a time", "The quick brown fox jumps over the lazy dog"]  # the first padded
            prompts = [target.tokenize(text, add_bos=True, special=False) for text in texts]
            target.decode_many([(seq, prompt, 1) for seq, prompt in enumerate(prompts)])
            assert all(head._state[seq].raw for seq in (0, 1))  # the captured rows wait until a draft needs g
            head._settle([0, 1])
            for seq, prompt in enumerate(prompts):
                first, rows = head._state[seq].rows
                positions = range(first, len(prompt))
                expected = embd[[prompt[p] for p in positions]] @ fc[:, : embd.shape[1]].T
                np.testing.assert_allclose(rows, expected, rtol=1e-4, atol=1e-4)
        finally:
            head.close()


def test_a_probe_reads_a_window_of_the_pairs_the_head_lacks_and_leaves_them_waiting(heads, target):
    """Steps at K=0 leave the head lacking the pairs of every position since it last drafted; a probe
    reads only the last `window` of them (placed after what the cache holds) and drops them again, so
    the next full draft reads them all as if no probe had come."""
    text = " ".join(["The quick brown fox jumps over the lazy dog"] * 3)
    prompt = target.tokenize(text, add_bos=True, special=False)
    assert len(prompt) > 20
    full = []
    for probe_first in (True, False):
        target.truncate(0)
        head = Eagle3Head(heads["crafted"], target)
        try:
            target.eval(prompt)
            state, sequence = head._state[0], head.sequence(0)
            process, calls = head._process, []
            head._process = lambda kind, n, calls=calls, process=process: calls.append((kind, n)) or process(kind, n)
            if probe_first:
                assert sequence.begin(len(prompt), 8)
                sequence.step(42)
                sequence.finish(len(prompt))
                assert calls == [(llama_cpp.LLAMA_PROCESS_TYPE_ENCODE, 9), (llama_cpp.LLAMA_PROCESS_TYPE_DECODE, 9)]
                assert state.end == 0 and state.raw and len(state.rows[1]) == len(prompt)
                assert state.pending[0] == len(prompt) - 1
            logits = sequence.start(len(prompt), 42)
            assert state.end == len(prompt)
            full.append(logits.copy())
            sequence.finish(len(prompt))
        finally:
            head.close()
    assert np.array_equal(full[0], full[1])


def test_steps_at_k_zero_grow_the_waiting_rows_in_place(heads, target, monkeypatch):
    """Each step at K=0 adds its captured row to the rows waiting for the next draft without copying
    those already kept (a copy a step copied every kept row, at every step), also after a cut; the
    draft that then reads them all gives the logits of rows grown by copies, bit for bit."""
    prompt = target.tokenize("The quick brown fox jumps over the lazy dog", add_bos=True, special=False)
    drafts = []
    for in_place in (True, False):
        target.truncate(0)
        if not in_place:
            monkeypatch.setattr(eagle3, "append_rows", lambda state, kept, new, most: np.vstack([kept, new]))
        head = Eagle3Head(heads["crafted"], target)
        try:
            target.eval(prompt)
            state, addresses = head._state[0], []
            for token in (5, 9, 13, 17):
                target.eval([token])
                addresses.append(state.rows[1].ctypes.data)
            target.eval([21, 23, 25])  # a verify pass whose last draft is rejected: cut back by one
            target.truncate(len(prompt) + 6)
            for token in (27, 29, 31):
                target.eval([token])
                addresses.append(state.rows[1].ctypes.data)
            assert state.raw and state.end == 0 and len(state.rows[1]) == len(prompt) + 9
            if in_place:
                assert len(set(addresses[1:])) == 1  # one buffer, from the second step on
            drafts.append(head.sequence(0).start(len(prompt) + 9, 33).copy())
            head.sequence(0).finish(len(prompt) + 9)
        finally:
            head.close()
    assert np.array_equal(drafts[0], drafts[1])


def test_an_idle_sequence_follows_only_the_passes_a_probe_reads(heads, target):
    """Told that it will not draft for some steps (the K policy at K=0), the head leaves the passes
    before the last `keep` of them unfollowed; the probe then reads its window from those it followed
    and drafts what it drafts after following every pass, bit for bit."""
    prompt = target.tokenize("The quick brown fox jumps over the lazy dog", add_bos=True, special=False)
    tokens, window, keep = list(range(5, 45)), 8, 10
    probes, followed = [], []
    for idle in (False, True):
        target.truncate(0)
        head = Eagle3Head(heads["crafted"], target)
        try:
            target.eval(prompt)
            sequence, features = head.sequence(0), head._features
            calls = []
            head._features = lambda *args, calls=calls, features=features: calls.append(1) or features(*args)
            for i, token in enumerate(tokens):
                if idle:
                    sequence.idle(len(prompt) + i, len(tokens) - i, keep)
                target.eval([token])
            followed.append(len(calls))
            n = len(prompt) + len(tokens)
            assert sequence.begin(n, window)
            probes.append(sequence.step(3).copy())
            sequence.finish(n)
            target.eval([4])  # after the probe the head follows again, its rows from where it woke
            state = head._state[0]
            assert state.rows[0] == (n - keep if idle else 0) and state.rows[0] + len(state.rows[1]) == n + 1
        finally:
            head.close()
    assert followed == [len(tokens), keep]
    assert np.array_equal(probes[0], probes[1])


def test_a_draft_sooner_than_an_idle_sequence_was_told_wakes_it(heads, target):
    """A draft that comes before the steps the head was told of are over (a re-priced K policy) finds
    no g at the boundary: nothing is drafted, and the head follows every pass again from there."""
    prompt = target.tokenize("The quick brown fox jumps over the lazy dog", add_bos=True, special=False)
    head = Eagle3Head(heads["crafted"], target)
    try:
        target.eval(prompt)
        sequence = head.sequence(0)
        sequence.idle(len(prompt), 100, 10)
        for i, token in enumerate((5, 6, 7)):
            target.eval([token])
        n = len(prompt) + 3
        assert not sequence.begin(n)  # the last pass went unfollowed
        target.eval([8])
        assert sequence.start(n + 1, 9) is not None
        sequence.finish(n + 1)
    finally:
        head.close()
