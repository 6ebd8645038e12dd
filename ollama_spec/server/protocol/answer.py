"""A streamed answer split the way the APIs return it: a thinking model's thinking apart, and tool
calls held back and read from the text."""

from __future__ import annotations

from collections.abc import Sequence

from ollama_spec.engine.engine import Engine, Request
from ollama_spec.prompting.messages import ToolCall
from ollama_spec.prompting.thinking import ThinkingSplit, opened_by_prompt, partial_suffix, template_thinks
from ollama_spec.prompting.tools import (
    BLOCK,
    OPENING,
    CallPiece,
    ForcedCallText,
    could_be_tool_call,
    cut_tool_call,
    parse_tool_calls,
    tool_names,
)
from ollama_spec.server.protocol.draft_spans import HeldMarks, Marks, joined


class HeldForToolCalls:
    """A streamed answer, held back where it may be a tool call (when tools were offered): from the
    start while the whole answer may still be one (a bare JSON call), and from a <tool_call> marker
    on, after text. What `push` returns goes out now; `finish` gives the calls and the rest."""

    def __init__(self, tools: Sequence[dict]):
        self.names = tool_names(list(tools)) if tools else []
        self.at_start = True
        self.held = ""

    def push(self, text: str) -> str:
        if not self.names:
            return text
        self.held += text
        if self.at_start:
            if could_be_tool_call(self.held):
                return ""
            self.at_start = False
        at = self.held.find(OPENING)
        if at < 0:
            at = len(self.held) - partial_suffix(self.held, OPENING)
        text, self.held = self.held[:at], self.held[at:]
        return text

    def finish(self, cut: bool = False) -> tuple[str, list[ToolCall]]:
        """(text still to send, the calls in the held text); `cut`: the answer's length ended it, so a
        call begun and not finished is returned as a cut call."""
        held, self.held = self.held, ""
        if not self.names or not held:
            return held, []
        rest, calls = parse_tool_calls(held, self.names)
        if not calls and cut and self.at_start and (call := cut_tool_call(held, self.names)) is not None:
            return "", [call]
        return rest, calls


class AnswerParts:
    """A streamed answer as the APIs return it: thinking, content, and tool calls read from the content.

    The `_marked` methods take and give the text's draft marks too (show_draft: draft_spans.py): the
    marks of the content they return, or None where they cannot be told. `forced`: a grammar forces
    one call, so it is read as it is written too, for streams to send in pieces (`call_pieces`)."""

    def __init__(self, tools: Sequence[dict] = (), thinking: ThinkingSplit | None = None, forced: bool = False):
        self.calls, self.thinking = HeldForToolCalls(tools), thinking
        self._thinking_marks, self._calls_marks = HeldMarks(), HeldMarks()  # each stage's held text, marked
        self._forced = ForcedCallText(self.calls.names) if forced and self.calls.names else None
        self._pieces: list[CallPiece] = []

    def call_pieces(self) -> list[CallPiece]:
        """The forced call's pieces written since last asked (none without a forced call)."""
        pieces, self._pieces = self._pieces, []
        return pieces

    def _content(self, text: str) -> str:
        """The content after the thinking, to the tool-call stage (and the forced call's reader)."""
        if self._forced is not None and text:
            self._pieces += self._forced.push(text)
        return self.calls.push(text) if text else ""

    def push(self, text: str) -> tuple[str, str]:
        """(thinking, content) to send now."""
        return self.push_marked(text, None)[:2]

    def push_marked(self, text: str, marks: Marks | None) -> tuple[str, str, Marks | None]:
        thought = ""
        if self.thinking:
            thought, content = self.thinking.push(text)
            text, marks = content, self._thinking_marks.take(text, marks, content, self.thinking.held)
        content = self._content(text)
        return thought, content, self._calls_marks.take(text, marks, content, self.calls.held)

    def finish(self, cut: bool = False) -> tuple[str, str, list[ToolCall]]:
        """(thinking, content) still to send, and the tool calls (`cut`: see HeldForToolCalls.finish)."""
        return self.finish_marked(cut)[:3]

    def finish_marked(self, cut: bool = False) -> tuple[str, str, list[ToolCall], Marks | None]:
        thought, text, marks = "", "", ()
        if self.thinking:
            thought, text = self.thinking.finish()
            marks = self._thinking_marks.take("", (), text, "")
        sent = self._content(text)
        sent_marks = self._calls_marks.take(text, marks, sent, self.calls.held)
        held = self._calls_marks.release()
        rest, calls = self.calls.finish(cut)
        return thought, sent + rest, calls, joined(sent_marks, _rest_marks(held, rest, calls))

    def whole(self, text: str, cut: bool = False) -> tuple[str, str, list[ToolCall]]:
        """A whole answer: its thinking, its content (around the calls) and its tool calls."""
        return self.whole_marked(text, None, cut)[:3]

    def whole_marked(
        self, text: str, marks: Marks | None, cut: bool = False
    ) -> tuple[str, str, list[ToolCall], Marks | None]:
        thought, content, content_marks = self.push_marked(text, marks)
        more_thought, rest, calls, rest_marks = self.finish_marked(cut)
        return thought + more_thought, content + rest, calls, joined(content_marks, rest_marks)


def _rest_marks(held: tuple[str, Marks] | None, rest: str, calls: list[ToolCall]) -> Marks | None:
    """The marks of the text HeldForToolCalls.finish gives back from what it held: all of it (no call),
    none of it (a bare JSON call), or what parse_tool_calls leaves around <tool_call> blocks, found
    here the way it finds it (blocks cut out, then the ends stripped) and checked against it."""
    if held is None:
        return None
    text, marks = held
    if rest == text:
        return marks
    if not rest:
        return ()
    if not calls:
        return None
    kept, at = [], 0
    for block in BLOCK.finditer(text):
        kept += range(at, block.start())
        at = block.end()
    kept += range(at, len(text))
    left = "".join(text[i] for i in kept)
    start, end = len(left) - len(left.lstrip()), len(left.rstrip())
    return tuple(marks[i] for i in kept[start:end]) if left[start:end] == rest else None


def answer_parts(engine: Engine, request: Request, forced: bool = False) -> AnswerParts:
    """How this request's answer is split for the client: a thinking model's thinking apart (unless
    it was told not to think), tool calls held back when tools were offered (`forced`: the grammar
    forces one, read as it is written)."""
    thinking = None
    if not request.raw and request.think is not False and template_thinks(engine.target_model.info.chat_template):
        end = engine.target.detokenize(engine.prompt_tokens(request)[-8:], special=True)
        thinking = ThinkingSplit(thinking=opened_by_prompt(end))
    return AnswerParts(request.tools, thinking, forced)
