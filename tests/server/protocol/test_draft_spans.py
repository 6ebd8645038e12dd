"""show_draft's marks and spans (protocol/draft_spans.py): a stage's held text mirrored with its marks,
lost (None) rather than misplaced when its output is not where it should be."""

from ollama_spec.engine.engine import Result
from ollama_spec.server.protocol.draft_spans import HeldMarks, draft_spans, joined, result_marks, spans_field

T, F = True, False


def test_spans_are_half_open_offsets_of_the_drafted_runs():
    assert draft_spans((T, T, F, T, F, F, T)) == [[0, 2], [3, 4], [6, 7]]
    assert draft_spans((F, F)) == [] and draft_spans(()) == []
    assert draft_spans(None) is None  # unknown: null, never a guess


def test_the_field_only_when_asked():
    assert spans_field(False, (T,)) == {}
    assert spans_field(True, (T, F)) == {"draft_spans": [[0, 1]]}
    assert spans_field(True, None) == {"draft_spans": None}


def test_what_a_stage_lets_out_takes_the_marks_from_just_before_what_it_holds():
    held = HeldMarks()
    assert held.take("ab<t", (T, F, T, T), "ab", "<t") == (T, F)  # "<t" may open a tag: held
    assert held.take("x", (F,), "<tx", "") == (T, T, F)
    assert held.take("", (), "", "") == ()
    assert held.release() == ("", ())


def test_output_that_is_not_where_it_should_be_loses_the_marks_for_good():
    held = HeldMarks()
    assert held.take("abc", (T, T, F), "cab", "") is None  # rewritten text: its marks cannot be told
    assert held.take("d", (T,), "d", "") is None  # nor can any later ones
    assert held.release() is None
    assert HeldMarks().take("ab", None, "ab", "") is None  # not asked for
    assert HeldMarks().take("ab", (T,), "ab", "") is None  # marks that do not cover the text


def test_joined_marks_are_unknown_if_any_part_is():
    assert joined((T,), (), (F, T)) == (T, F, T)
    assert joined((T,), None) is None


def test_a_results_marks_only_when_they_cover_its_text():
    assert result_marks(Result(text="abc", drafted=[T, F, T])) == (T, F, T)
    assert result_marks(Result(text="abc")) is None  # iterated without pieces(): no marks
    assert result_marks(Result()) == ()
