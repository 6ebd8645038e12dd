"""A streamed answer split the way the APIs return it: a thinking model's thinking apart, and tool
calls held back and read from the text."""

from __future__ import annotations

from collections.abc import Sequence

from ollama_spec.engine.engine import Engine, Request
from ollama_spec.prompting.messages import ToolCall
from ollama_spec.prompting.thinking import ThinkingSplit, opened_by_prompt, partial_suffix, template_thinks
from ollama_spec.prompting.tools import OPENING, could_be_tool_call, cut_tool_call, parse_tool_calls, tool_names


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
    """A streamed answer as the APIs return it: thinking, content, and tool calls read from the content."""

    def __init__(self, tools: Sequence[dict] = (), thinking: ThinkingSplit | None = None):
        self.calls, self.thinking = HeldForToolCalls(tools), thinking

    def push(self, text: str) -> tuple[str, str]:
        """(thinking, content) to send now."""
        thought, text = self.thinking.push(text) if self.thinking else ("", text)
        return thought, self.calls.push(text) if text else ""

    def finish(self, cut: bool = False) -> tuple[str, str, list[ToolCall]]:
        """(thinking, content) still to send, and the tool calls (`cut`: see HeldForToolCalls.finish)."""
        thought, text = self.thinking.finish() if self.thinking else ("", "")
        sent = self.calls.push(text) if text else ""
        rest, calls = self.calls.finish(cut)
        return thought, sent + rest, calls

    def whole(self, text: str, cut: bool = False) -> tuple[str, str, list[ToolCall]]:
        """A whole answer: its thinking, its content (around the calls) and its tool calls."""
        thought, content = self.push(text)
        more_thought, rest, calls = self.finish(cut)
        return thought + more_thought, content + rest, calls


def answer_parts(engine: Engine, request: Request) -> AnswerParts:
    """How this request's answer is split for the client: a thinking model's thinking apart (unless
    it was told not to think), tool calls held back when tools were offered."""
    thinking = None
    if not request.raw and request.think is not False and template_thinks(engine.target_model.info.chat_template):
        end = engine.target.detokenize(engine.prompt_tokens(request)[-8:], special=True)
        thinking = ThinkingSplit(thinking=opened_by_prompt(end))
    return AnswerParts(request.tools, thinking)
