"""The passes several sequences' evaluations are laid out in (llama/passes.py), without llama.cpp."""

from unittest import mock

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ollama_spec.llama import passes
from ollama_spec.llama.passes import DEFAULT_PASS_ROWS, PassCosts, piece_size, plan_passes

ROOM = 4096


def plan(items, piece=63, room=lambda seq: ROOM, limit=512, **kwargs):
    return plan_passes(items, piece, room, limit, **kwargs)


def layout(passes):
    """Per pass: each sequence's (real tokens, padding) counts."""
    out = []
    for entries in passes:
        seqs = {}
        for entry in entries:
            real, pad = seqs.get(entry.seq, (0, 0))
            seqs[entry.seq] = (real + (entry.item is not None), pad + (entry.item is None))
        out.append(seqs)
    return out


def test_verify_batches_of_other_lengths_are_padded_to_one_pass_of_equal_lengths():
    passes = plan([(2, [1, 2, 3], 3), (0, [4] * 7, 7), (1, [5], 1)])
    assert layout(passes) == [{0: (7, 0), 1: (1, 6), 2: (3, 4)}]
    assert [entry.seq for entry in passes[0]] == [0] * 7 + [1] * 7 + [2] * 7  # sequence by sequence


def test_a_prompt_read_beside_verify_batches_gets_a_pass_of_its_own_for_the_rest_of_it():
    items = [(0, [1] * 7, 7), (1, [2] * 7, 7), (2, [3] * 7, 7), (3, [4] * 50, 1)]
    assert layout(plan(items)) == [{0: (7, 0), 1: (7, 0), 2: (7, 0), 3: (7, 0)}, {3: (43, 0)}]
    # where a pass costs more than 170 rows of it, padding the others to 50 costs less
    assert layout(plan(items, pass_rows=500)) == [{0: (7, 43), 1: (7, 43), 2: (7, 43), 3: (50, 0)}]


def test_pass_costs_tell_a_pass_from_a_row_once_passes_of_two_sizes_were_timed():
    costs = PassCosts()
    assert costs.pass_rows == DEFAULT_PASS_ROWS
    for rows in (4, 28, 7, 28, 4):
        costs.observe(rows, 0.036 + 0.008 * rows)  # the synth target on 2 cores: 36 ms a pass, 8 ms a row
    assert costs.pass_rows == pytest.approx(4.5)


def test_a_sequence_between_two_others_takes_padding_only():
    assert layout(plan([(0, [1], 1), (3, [2], 1)])) == [{0: (1, 0), 1: (0, 1), 2: (0, 1), 3: (1, 0)}]


def test_one_token_alone_gets_a_second_row_and_a_second_row_of_logits():
    [entries] = plan([(1, [9], 1)])
    assert [(e.item, e.logits, e.row) for e in entries] == [(0, True, True), (None, True, False)]


def test_a_long_prompt_goes_in_pieces_under_the_tiled_kernels_threshold_with_its_last_rows_read():
    passes = plan([(0, list(range(150)), 1)])
    assert [len(entries) for entries in passes] == [63, 63, 24]
    rows = [entry for entries in passes for entry in entries if entry.row]
    assert [entry.token for entry in rows] == [149]
    assert sum(entry.logits for entry in passes[-1]) == 2  # a second row read, not returned


def test_rows_go_to_the_items_that_asked_for_them_in_order():
    passes = plan([(0, [10, 11, 12], 2), (1, [20, 21], 1)])
    rows = [(entry.item, entry.token) for entries in passes for entry in entries if entry.row]
    assert rows == [(0, 11), (0, 12), (1, 21)]


def test_no_layout_for_two_items_of_one_sequence_no_room_for_padding_or_too_big_a_pass():
    assert plan([(0, [1], 1), (0, [2], 1)]) is None
    assert plan([(0, [1] * 5, 5), (1, [2], 1)], room=lambda seq: 3 if seq == 1 else ROOM) is None
    assert plan([(0, [1] * 5, 5), (1, [2], 1)], limit=8) is None


def test_without_flash_attention_each_sequence_brings_two_rows():
    assert layout(plan([(0, [1], 1), (1, [2], 1)], min_rows=2)) == [{0: (1, 1), 1: (1, 1)}]


def test_pieces_fit_every_sequence_in_the_batch_under_64_rows():
    assert piece_size(512, 4) == 63
    assert piece_size(512, 16) == 32


def test_a_drafts_rows_are_padded_only_as_llama_cpps_streams_need():
    """Without `exact` (a draft's rows): a lone token is one row, a lone row of logits stays one, and
    the padding that keeps a pass's sequences consecutive and equally long stays."""
    [entries] = plan([(1, [9], 1)], exact=False)
    assert [(e.item, e.logits, e.row) for e in entries] == [(0, True, True)]
    catch_up = [(0, [1, 2], 1), (1, [3, 4, 5, 6], 1), (3, [7], 1)]
    assert layout(plan(catch_up, exact=False, pass_rows=500)) == [{0: (2, 2), 1: (4, 0), 2: (0, 4), 3: (1, 3)}]
    [entries] = plan([(0, [1], 1), (1, [2], 1)], exact=False)
    assert sum(entry.logits for entry in entries) == 2


def test_a_drafts_pieces_are_not_held_under_the_tiled_kernels_threshold():
    assert piece_size(512, 4, exact=False) == 128
    assert piece_size(512, 1, exact=False) == 512


@given(
    st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=5),  # (tokens, rows) a sequence
    st.integers(0, 3),  # the first sequence
    st.integers(1, 8),  # piece
    st.integers(1, 3),  # min_rows
    st.booleans(),  # exact
    st.integers(0, 8),  # room left in the last sequence's stream
    st.integers(4, 40),  # limit
)
@example([(3, 1)], 0, 8, 1, True, 8, 40)  # one sequence, one row of logits: a second one read
@example([(2, 2), (2, 2)], 1, 8, 3, True, 8, 40)  # fewer tokens than a pass takes: padded
@example([(2, 2), (2, 2)], 0, 8, 1, True, 1, 40)  # no room for the last sequence's tokens: no layout
def test_a_pass_that_needs_nothing_laid_out_is_the_one_the_layout_makes(
    shapes, first, piece, min_rows, exact, last_room, limit
):
    """plan_passes takes items of consecutive sequences with equally many tokens each as they come, without
    laying them out pass by pass: where it does, its pass is the one the layout makes of them."""
    shapes = [(shapes[0][0], min(rows, shapes[0][0])) for _, rows in shapes]  # equally long, as a verify batch
    items = [(first + i, list(range(10 * i, 10 * i + n)), rows) for i, (n, rows) in enumerate(shapes)]
    room = lambda seq: last_room if seq == items[-1][0] else 100
    taken = plan_passes(items, piece, room, limit, min_rows=min_rows, exact=exact)
    with mock.patch.object(passes, "taken_whole", return_value=False):  # every pass laid out
        laid_out = plan_passes(items, piece, room, limit, min_rows=min_rows, exact=exact)
    assert taken == laid_out
