"""How a streamed answer is split for the APIs (AnswerParts): thinking, content and tool calls, the
same however the text arrives."""

import pytest

from ollama_spec.prompting.messages import ToolCall
from ollama_spec.prompting.thinking import ThinkingSplit
from ollama_spec.server.core.answer import AnswerParts

TOOLS = [{"type": "function", "function": {"name": "get_weather"}}]
CASES = [
    # answer, (thinking, content, calls)
    ('{"name": "get_weather", "arguments": {"city": "Oslo"}}', ("", "", [ToolCall("get_weather", {"city": "Oslo"})])),
    (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',
        ("", "Let me check.\n", [ToolCall("get_weather", {})]),
    ),
    ("Plain <b>text</b>, then <tool", ("", "Plain <b>text</b>, then <tool", [])),
    (
        '<tool_call>{"name": "fly", "arguments": {}}</tool_call>',  # not an offered tool: text
        ("", '<tool_call>{"name": "fly", "arguments": {}}</tool_call>', []),
    ),
    (
        '<think>Weather needs a tool.</think>\n\n{"name": "get_weather", "arguments": {}}',
        ("Weather needs a tool.", "", [ToolCall("get_weather", {})]),
    ),
]


def split(answer, size):
    parts = AnswerParts(TOOLS, ThinkingSplit())
    thinking = content = ""
    for start in range(0, len(answer), size):
        a, b = parts.push(answer[start : start + size])
        thinking, content = thinking + a, content + b
    a, b, calls = parts.finish()
    return thinking + a, content + b, calls


@pytest.mark.parametrize("answer, expected", CASES)
def test_the_same_parts_however_the_answer_arrives(answer, expected):
    for size in (1, 2, 3, 8, 1000):
        assert split(answer, size) == expected, size
    assert AnswerParts(TOOLS, ThinkingSplit()).whole(answer) == expected


def test_a_possible_call_is_never_sent_as_text():
    parts = AnswerParts(TOOLS)
    assert parts.push('{"name": "get_') == ("", "")  # may be a call: held
    assert parts.push("Sure, ") == ("", "")  # still one JSON-looking answer: held until it cannot be
    parts = AnswerParts(TOOLS)
    assert parts.push("Sure, <tool_c") == ("", "Sure, ")  # a marker may be arriving: it is held
    assert parts.push("all>") == ("", "")


def test_without_tools_nothing_is_held():
    parts = AnswerParts()
    assert parts.push('{"name": "get_weather"') == ("", '{"name": "get_weather"')
    assert parts.finish() == ("", "", [])
