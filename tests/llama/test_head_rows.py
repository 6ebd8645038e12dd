"""A head sequence's state as bytes (a slot's prefix in host RAM) comes back as it was."""

import numpy as np

from ollama_spec.llama.head_rows import _Sequence, pack_state, unpack_state


def test_a_state_comes_back_from_its_bytes():
    rng = np.random.default_rng(0)
    state = _Sequence(pending=(9, rng.random(8, np.float32)), rows=(7, rng.random((3, 8), np.float32)), end=7)
    back, cells = unpack_state(pack_state(state, b"cells"), 8)
    assert cells == b"cells" and back.end == 7 and back.drafting is None
    assert back.pending[0] == 9 and np.array_equal(back.pending[1], state.pending[1])
    assert back.rows[0] == 7 and np.array_equal(back.rows[1], state.rows[1])


def test_an_empty_state_comes_back_empty():
    back, cells = unpack_state(pack_state(_Sequence(), b""), 8)
    assert (back.pending, back.rows, back.end, cells) == (None, None, 0, b"")
