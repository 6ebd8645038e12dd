"""`show_draft`: which characters of an answer's content came from accepted draft tokens, sent as
`draft_spans`, [start, end) offsets into the content of the chunk (or the whole answer) they go with.

Each character of the generated text carries a mark (drafted or not) from the generation's runs
(Generation.pieces). The marks travel beside the text through the stages that hold text back or
take it out (a thinking model's tags, tool calls: answer.py), so that the spans describe the content
actually sent. Where a stage's output cannot be lined up with its input, the marks are None from
then on and the spans sent are null: unknown, never guessed.
"""

from __future__ import annotations

from itertools import groupby

from ollama_spec.engine.engine import Result
from ollama_spec.server.serving.worker import Marks


class HeldMarks:
    """The marks of the text one stage of AnswerParts holds back.

    Both stages (ThinkingSplit, HeldForToolCalls) hold an end of what they were given, and what they
    let out comes from just before that end; `take` finds the marks of what was let out there,
    checking that the text there is the text let out, so a stage that changes its ways loses the
    marks (None) instead of misplacing them."""

    def __init__(self) -> None:
        self.text, self.marks = "", ()
        self.lost = False

    def take(self, given: str, marks: Marks | None, out: str, held: str) -> Marks | None:
        """The marks of `out`, which the stage let out when given `given` (with `marks`), now that it
        holds `held`; None once they cannot be told."""
        if marks is not None and not self.lost and len(marks) == len(given):
            text, all_marks = self.text + given, self.marks + marks
            end = len(text) - len(held)
            if len(out) <= end and text[end:] == held and text[end - len(out) : end] == out:
                self.text, self.marks = held, all_marks[end:]
                return all_marks[end - len(out) : end]
        self.lost = True
        return None

    def release(self) -> tuple[str, Marks] | None:
        """The held text and its marks (None once lost), for the stage's finish, which empties it."""
        held = None if self.lost else (self.text, self.marks)
        self.text, self.marks = "", ()
        return held


def joined(*marks: Marks | None) -> Marks | None:
    """The marks of texts sent together: None if any of them is unknown."""
    return None if any(m is None for m in marks) else sum(marks, ())


def result_marks(result: Result) -> Marks | None:
    """The marks of a whole generated text (Result.drafted, filled by Generation.pieces); None when
    the generation was not iterated for them."""
    return tuple(result.drafted) if len(result.drafted) == len(result.text) else None


def draft_spans(marks: Marks | None) -> list[list[int]] | None:
    """The drafted characters as [start, end) offsets, as JSON sends them; None (null) when unknown."""
    if marks is None:
        return None
    spans, at = [], 0
    for drafted, run in groupby(marks):
        n = len(list(run))
        if drafted:
            spans.append([at, at + n])
        at += n
    return spans


def spans_field(asked: bool, marks: Marks | None) -> dict:
    """`draft_spans` for a chunk or an answer, when asked for."""
    return {"draft_spans": draft_spans(marks)} if asked else {}
