"""LoadedModel on a real (tiny) GGUF: what the slot pool relies on when it saves and restores cells."""

import time

import numpy as np

from ollama_spec.llama import host_memory
from ollama_spec.llama.model import LoadedModel, LoadSettings


def test_a_saved_sequence_restored_in_another_slot_continues_as_the_original(tiny_models):
    target, _ = tiny_models
    with LoadedModel(target.path, LoadSettings(n_ctx=512, n_threads=1, n_seq=2)) as model:
        text = model.tokenize("The lighthouse keeper found a bottle on the rocks", add_bos=True, special=False)
        model.eval(text, seq=0)
        state = model.save_sequence(0)
        assert isinstance(state, bytes | bytearray) and len(state) > 0
        assert model.restore_sequence(1, bytes(state), text)  # a copy read back, as a head's part comes
        assert model.restore_sequence(1, state, text)  # the saved bytes read in place
        assert model.cached_of(1) == text
        # the restored cells, not a re-read: the next row is the one the original sequence gives
        original, restored = model.eval([42], seq=0), model.eval([42], seq=1)
        np.testing.assert_allclose(restored, original, rtol=1e-5, atol=1e-5)


def test_a_save_into_host_memory_made_ready_for_it_is_restored_in_place(tiny_models, monkeypatch):
    """llama/host_memory.py: a freed slot's save goes to memory touched beforehand, read back from there."""
    monkeypatch.setattr(host_memory, "MIN_READY_BYTES", 1)  # the tiny model's cells are a few kB
    target, _ = tiny_models
    with LoadedModel(target.path, LoadSettings(n_ctx=512, n_threads=1, n_seq=2)) as model:
        text = model.tokenize("The lighthouse keeper found a bottle on the rocks", add_bos=True, special=False)
        model.eval(text, seq=0)
        model.expect_save(0, most=1 << 30)
        deadline = time.monotonic() + 10
        while not model._cache.host.spare and time.monotonic() < deadline:
            time.sleep(0.005)
        state = model.save_sequence(0)
        assert isinstance(state, memoryview) and len(state) > 0
        assert model.restore_sequence(1, state, text)
        original, restored = model.eval([42], seq=0), model.eval([42], seq=1)
        np.testing.assert_allclose(restored, original, rtol=1e-5, atol=1e-5)


def test_a_lone_verify_pass_among_slots_runs_as_it_comes(tiny_models, monkeypatch):
    """With slots, passes are laid out so that a sequence's rows are those it gets alone (passes.py);
    one sequence's verify batch is already such a pass, and runs without an Entry a token, with the
    rows the laid-out pass gives. A pass the layout pads (one token) still goes through it."""
    with LoadedModel(tiny_models[0].path, LoadSettings(n_ctx=512, n_threads=1, n_seq=4)) as model:
        model.eval([1, 300, 301, 302], seq=1)
        laid_out = model.decode_many([(1, [5, 6, 7], 3), (2, [8, 9], 2)])[0]  # beside another: laid out
        model.truncate(4, seq=1)
        passes = []
        decode = model._decode
        monkeypatch.setattr(model, "_decode", lambda entries: (passes.append(len(entries)), decode(entries)))
        alone = model.eval([5, 6, 7], logits="all", seq=1)
        assert passes == []
        np.testing.assert_array_equal(alone, laid_out)
        model.eval([8], seq=1)
        assert passes == [2]


def test_a_drafts_sequence_attends_over_its_own_stream_and_its_passes_go_as_they_come(tiny_models, monkeypatch):
    """A draft (rows not isolated) with slots has a KV stream per sequence too: a row's logits are the
    ones it gets with the other slots empty, whatever they hold. Its one token per slot in consecutive
    slots is one pass as it comes; slots with a gap between them are laid out (padding the gap)."""
    settings = LoadSettings(n_ctx=512, n_threads=1, n_seq=3, isolated_rows=False)
    text = list(range(300, 340))
    with LoadedModel(tiny_models[1].path, settings) as alone, LoadedModel(tiny_models[1].path, settings) as beside:
        alone.eval(text, seq=0)
        beside.eval([7] * 200, seq=1)  # another slot's cached prompt
        beside.eval(text, seq=0)
        np.testing.assert_allclose(beside.eval([42], seq=0), alone.eval([42], seq=0), rtol=1e-4, atol=1e-4)
        laid_out = []
        plan = beside._layout.passes
        monkeypatch.setattr(beside._layout, "passes", lambda items: laid_out.append(plan(items)) or laid_out[-1])
        beside.decode_many([(0, [5], 1), (1, [6], 1)])  # as they come: nothing laid out
        beside.decode_many([(0, [5], 1), (2, [6], 1)])
        assert [[(e.seq, e.item) for e in entries] for entries in laid_out[0]] == [[(0, 0), (1, None), (2, 1)]]
        assert beside.cached_of(1) == [7] * 200 + [6]  # the padding cut off again


def test_one_sequence_longer_than_a_batch_is_read_in_chunks_beside_slots(tiny_models):
    """A draft's (rows not isolated) one sequence of more tokens than a batch takes is n_batch chunks,
    not one pass as it comes; its last row is the one the target reads alone."""
    settings = LoadSettings(n_ctx=512, n_threads=1, n_seq=2, isolated_rows=False, n_batch=64)
    text = list(range(300, 400))
    with LoadedModel(tiny_models[1].path, settings) as beside, LoadedModel(tiny_models[1].path, settings) as alone:
        (read,) = beside.decode_many([(1, text, 1)])
        assert beside.cached_of(1) == text
        np.testing.assert_allclose(read, alone.eval(text, seq=1), rtol=1e-4, atol=1e-4)


def test_a_verify_batch_of_consecutive_slots_runs_as_it_comes(tiny_models, monkeypatch):
    """Slots' verify batches of equally many tokens each are the pass the layout makes of them
    (passes.taken_whole): it runs without an Entry a token, each slot's rows a slice of the pass's,
    the rows the laid-out pass gives, each token cached where the layout caches it."""
    with LoadedModel(tiny_models[0].path, LoadSettings(n_ctx=512, n_threads=1, n_seq=4)) as model:
        for seq in (1, 2):
            model.eval([1, 300 + seq, 301, 302], seq=seq)
        items = [(1, [5, 6, 7], 3), (2, [8, 9, 10], 2)]
        passes = []
        decode = model._decode
        monkeypatch.setattr(model, "_decode", lambda entries: (passes.append(len(entries)), decode(entries)))
        whole = [rows.copy() for rows in model.decode_many(items)]
        assert passes == []
        assert [model.cached_of(seq)[4:] for seq in (1, 2)] == [[5, 6, 7], [8, 9, 10]]
        for seq in (1, 2):
            model.truncate(4, seq=seq)
        monkeypatch.setattr(model._layout, "whole", lambda items: False)  # the layout's way: an Entry a token
        laid_out = model.decode_many(items)
        assert passes == [6]
        assert [rows.shape[0] for rows in whole] == [3, 2]
        for rows, expected in zip(whole, laid_out):
            np.testing.assert_array_equal(rows, expected)
