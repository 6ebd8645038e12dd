"""A sequence's saved cells taken apart and written again deeper, in either V layout: what llama.cpp
takes back, holding what a read of the same tokens holds."""

from dataclasses import replace

import numpy as np
import pytest

from ollama_spec.llama.loading import LoadSettings, load_weights
from ollama_spec.llama.model import LoadedModel
from ollama_spec.llama.saved_cells import read_saved_cells

TOKENS = [5, 17, 3, 42, 9, 11, 23, 7]


@pytest.fixture(params=[True, False], ids=["target rows", "draft rows"])
def pair(request, tiny_models):
    """Two contexts over one model's weights, flash attention on (V by cell) and off (V transposed)."""
    path = tiny_models[0].path
    settings = LoadSettings(n_ctx=64, n_threads=1, n_seq=3, isolated_rows=request.param)
    weights = load_weights(path, settings)
    on = LoadedModel(path, replace(settings, flash_attention="on"), weights, borrowed=True)
    off = LoadedModel(path, replace(settings, flash_attention="off"), weights)
    yield on, off
    on.close()
    off.close()


@pytest.mark.parametrize("kind", ["on", "off"])
def test_cells_written_back_as_they_are_make_the_same_bytes(pair, kind):
    model = pair[0] if kind == "on" else pair[1]
    model.eval(TOKENS)
    state = model.save_sequence(0)
    assert bytes(read_saved_cells(state).deepened(len(TOKENS), v_trans=kind == "off")) == bytes(state)


@pytest.mark.parametrize("direction", ["on to off", "off to on"])
def test_cells_moved_to_the_other_layout_hold_what_reading_the_tokens_there_does(pair, direction):
    source, target = pair if direction == "on to off" else pair[::-1]
    source.eval(TOKENS)
    cells = read_saved_cells(source.save_sequence(0)).deepened(len(TOKENS), v_trans=target is pair[1])
    assert target.restore_sequence(2, cells, TOKENS)
    moved = target.eval([TOKENS[0]], seq=2)
    target.eval(TOKENS, seq=1)
    read = target.eval([TOKENS[0]], seq=1)
    np.testing.assert_allclose(moved, read, atol=1e-3)


def test_deepened_cells_fill_a_sequence_to_the_depth_asked(pair):
    on, off = pair
    on.eval(TOKENS)
    saved = read_saved_cells(on.save_sequence(0))
    depth = 50
    for model, v_trans in ((on, False), (off, True)):
        assert model.restore_sequence(1, saved.deepened(depth, v_trans), [TOKENS[0]] * depth)
        model.eval([TOKENS[0]] * 4, seq=1)  # a pass after them, at positions depth..depth+3
        assert model.n_past == len(TOKENS) if model is on else model.n_past == 0
        assert len(model.cached_of(1)) == depth + 4
    assert not off.restore_sequence(1, saved.deepened(depth, v_trans=False), [TOKENS[0]] * depth)


@pytest.mark.parametrize("state", [b"", b"\x00" * 7, b"not cells at all, just bytes"])
def test_what_is_not_one_caches_cells_is_not_taken(state):
    assert read_saved_cells(state) is None


def test_cells_cut_short_are_not_taken(pair):
    pair[0].eval(TOKENS)
    state = bytes(pair[0].save_sequence(0))
    assert read_saved_cells(state) is not None
    assert read_saved_cells(state[:-1]) is None and read_saved_cells(state + b"\x00") is None
