"""A head sequence's state as bytes (a slot's prefix in host RAM) comes back as it was."""

import numpy as np

from ollama_spec.llama.head_rows import RowIO, _Sequence, pack_state, unpack_state


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


def test_rows_in_are_copied_into_scratch_rows_whose_structs_are_made_once():
    io = RowIO(4, rows=3)
    first = io.embds([np.full(4, 1.0, np.float32), np.full(4, 2.0, np.float32)])
    second = io.embds(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert first is second  # no llama_embd made per call
    rows = [np.ctypeslib.as_array(second[i].data, shape=(4,)) for i in range(3)]
    assert all(second[i].n_rows == 1 and second[i].n_embd == 4 for i in range(3))
    np.testing.assert_array_equal(np.stack(rows), np.arange(12, dtype=np.float32).reshape(3, 4))
    wide = io.embds(np.ones((5, 4), np.float32))  # more rows than the scratch: structs of their own
    assert len(wide) == 5 and np.ctypeslib.as_array(wide[4].data, shape=(4,)).tolist() == [1.0] * 4


def test_a_buffer_is_viewed_once_per_address_as_wide_as_its_most_rows():
    io = RowIO(4, rows=1)
    buffer = np.arange(24, dtype=np.float32)
    address = buffer.ctypes.data
    two = io.view(address, 2, 4)
    np.testing.assert_array_equal(two, buffer[:8].reshape(2, 4))
    assert io.view(address, 1, 4).base is two.base  # the same view, cut to the rows asked
    six = io.view(address, 6, 4)  # more rows than seen there: viewed again, as wide
    np.testing.assert_array_equal(six, buffer.reshape(6, 4))
    assert io.view(address, 2, 4).base is six.base
    np.testing.assert_array_equal(io.view(address, 2, 12), buffer.reshape(2, 12))  # another width: its own
    assert io.view(None, 2, 4) is None
